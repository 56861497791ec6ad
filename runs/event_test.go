package runs

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
			data := enc.state()
			require.NotNil(t, data)
			got, err := decodeState(data)
			require.NoError(t, err)
			assert.True(t, proto.Equal(st, got), "%v", got)
		})
	}
	other, err := EncodeEvent(&stubbornv1.RunEvent{RunId: "run_x", Seq: 2, Kind: &stubbornv1.RunEvent_AttemptStarted{
		AttemptStarted: &stubbornv1.AttemptStarted{Attempt: &stubbornv1.Attempt{Number: 1}},
	}})
	require.NoError(t, err)
	assert.Nil(t, other.state(), "attempt_started carries no state")
	assert.Nil(t, Event{Data: []byte{0xff}}.state(), "garbage has no state")
}

func TestBatchLenBoundsCountAndBytes(t *testing.T) {
	ev := func(size int) Event { return Event{Data: make([]byte, size)} }
	small := []Event{ev(10), ev(10), ev(10), ev(10)}
	assert.Equal(t, 3, batchLen(small, 3))
	assert.Equal(t, 4, batchLen(small, 100))
	assert.Equal(t, 1, batchLen(small, 1))
	big := []Event{ev(MaxBatchBytes / 2), ev(MaxBatchBytes / 2), ev(1)}
	assert.Equal(t, 2, batchLen(big, 100), "up to MaxBatchBytes")
	huge := []Event{ev(MaxBatchBytes + 1), ev(1)}
	assert.Equal(t, 1, batchLen(huge, 100), "an event larger than the bound comes alone")
}
