package store

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

func TestEventStateIsTheEncodingOfTheCarriedState(t *testing.T) {
	st := &stubbornv1.ControlState{
		RunId: "run_x", TaskBrief: "brief", Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED,
		CreateTime: timestamppb.Now(), Winner: "echo",
		AttemptLog: []*stubbornv1.Attempt{{Number: 1, Delegate: "echo", Result: &stubbornv1.Result{Text: "ok"}}},
	}
	for name, ev := range map[string]*stubbornv1.RunEvent{
		"run_started":  {Kind: &stubbornv1.RunEvent_RunStarted{RunStarted: &stubbornv1.RunStarted{State: st}}},
		"run_finished": {Kind: &stubbornv1.RunEvent_RunFinished{RunFinished: &stubbornv1.RunFinished{State: st}}},
	} {
		t.Run(name, func(t *testing.T) {
			ev.RunId, ev.Seq, ev.Time, ev.Path = "run_x", 7, timestamppb.Now(), "chain[0]"
			enc, err := EncodeEvent(ev)
			require.NoError(t, err)
			data := enc.StateBytes()
			require.NotNil(t, data)
			got, err := DecodeState(data)
			require.NoError(t, err)
			assert.True(t, proto.Equal(st, got), "%v", got)
		})
	}
	other, err := EncodeEvent(&stubbornv1.RunEvent{RunId: "run_x", Seq: 2, Kind: &stubbornv1.RunEvent_AttemptStarted{
		AttemptStarted: &stubbornv1.AttemptStarted{Attempt: &stubbornv1.Attempt{Number: 1}},
	}})
	require.NoError(t, err)
	assert.Nil(t, other.StateBytes(), "attempt_started carries no state")
	assert.Nil(t, Event{Data: []byte{0xff}}.StateBytes(), "garbage has no state")
}
