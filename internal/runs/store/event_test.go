package store

import (
	"bytes"
	"errors"
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

// TestPackedEventsReadBackAndACutOneFails: EachPacked gives back each
// encoding PackEvents laid out, in order, whatever its length (varints of
// one to three bytes); a packing cut inside an event fails.
func TestPackedEventsReadBackAndACutOneFails(t *testing.T) {
	var evs []Event
	for _, n := range []int{0, 1, 127, 128, 70_000} {
		evs = append(evs, Event{Data: bytes.Repeat([]byte{byte(n)}, n)})
	}
	b := PackEvents(evs)
	var got [][]byte
	require.NoError(t, EachPacked(b, func(d []byte) error { got = append(got, d); return nil }))
	require.Len(t, got, len(evs))
	for i := range evs {
		assert.Equal(t, evs[i].Data, got[i], "event %d", i)
	}
	// Inside the third event's bytes, inside the fourth's two-byte length,
	// and the last byte gone.
	for _, cut := range []int{5, 132, len(b) - 1} {
		assert.Error(t, EachPacked(b[:cut], func([]byte) error { return nil }), "cut at %d", cut)
	}
	stop := errors.New("stop")
	assert.ErrorIs(t, EachPacked(b, func([]byte) error { return stop }), stop)
}
