package controls_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/stubbornhq/stubborn/controls"
	"github.com/stubbornhq/stubborn/controls/controlstest"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

func TestAParkedRetryResumesFromItsJournal(t *testing.T) {
	spec := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
		Target: "d", MaxWait: durationpb.New(time.Hour),
	}}}
	busy := controlstest.Reply{Err: &controls.CallError{Code: codes.Unavailable, Message: "busy", HasHint: true, RetryHint: 10 * time.Second}}
	answers := map[int32]controlstest.Reply{1: busy, 2: controlstest.OK("ok")}
	d := &byAttempt{answers: answers, info: controls.DelegateInfo{Idempotent: true}}
	clock := controlstest.NewClock()
	var journal []*stubbornv1.RunEvent
	rec := func(ev *stubbornv1.RunEvent, _ *stubbornv1.ControlState) {
		journal = append(journal, proto.CloneOf(ev))
	}

	st := &stubbornv1.ControlState{RunId: "r", TaskBrief: "task", Control: spec}
	tr := controls.NewReplayTracker(st, clock, rec, nil)
	tr.ParkWaits(time.Second)
	tr.Start()
	controls.Execute(context.Background(), &controls.Env{Delegates: d, Tracker: tr, Clock: clock}, "task", spec)
	until, parked := tr.Parked()
	require.True(t, parked, "a wait of 10s parks at 1s")
	assert.Equal(t, clock.Now().Add(10*time.Second), until)
	assert.Empty(t, clock.Sleeps(), "a parked run does not wait")
	tr.Finish(stubbornv1.RunStatus_RUN_STATUS_CANCELLED, nil, "", "stopped")
	assert.Equal(t, []string{"run_started", "attempt_started", "attempt_finished", "failure_analyzed", "backoff_scheduled"}, kinds(journal),
		"nothing follows the backoff, not even run_finished")
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF, tr.Snapshot().GetStatus())

	// Woken 9.5s into the wait: the replay waits the last half second (too
	// short to park again), then goes on.
	require.NoError(t, clock.Sleep(context.Background(), 9500*time.Millisecond))
	recorded := append([]*stubbornv1.RunEvent(nil), journal...)
	journal = nil
	tr2 := controls.NewReplayTracker(proto.CloneOf(recorded[0].GetRunStarted().GetState()), clock, rec, recorded)
	tr2.ParkWaits(time.Second)
	live := 0
	tr2.OnLive(func() { live++ })
	tr2.Start()
	assert.Zero(t, live, "run_started comes from the journal")
	out := controls.Execute(context.Background(), &controls.Env{Delegates: d, Tracker: tr2, Clock: clock}, "task", spec)
	tr2.Finish(out.Status, out.Result, out.Winner, out.Reason)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, out.Status, out.Reason)
	assert.Equal(t, 1, live)
	assert.Equal(t, []time.Duration{9500 * time.Millisecond, 500 * time.Millisecond}, clock.Sleeps())
	assert.Equal(t, []int32{1, 2}, d.called(), "attempt 1 is not made again")
	assert.Equal(t, []string{"attempt_started", "attempt_finished", "run_finished"}, kinds(journal))
	fin := journal[len(journal)-1].GetRunFinished().GetState()
	assert.Equal(t, int32(2), fin.GetAttempts())
	assert.Len(t, fin.GetFailureHistory(), 1)
}

func TestOnlyTheRunsOwnLongBackoffsPark(t *testing.T) {
	clock := controlstest.NewClock()
	for _, c := range []struct {
		name   string
		path   string
		wait   time.Duration
		parked bool
	}{
		{"own, long", "", 5 * time.Second, true},
		{"own, exactly the minimum", "", time.Second, true},
		{"own, short", "", 999 * time.Millisecond, false},
		{"nested in a preset", "chain[0]", time.Hour, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr := controls.NewReplayTracker(&stubbornv1.ControlState{RunId: "r"}, clock, nil, nil)
			tr.ParkWaits(time.Second)
			tr.Backoff(c.path, 2, c.wait, c.wait, false)
			err := tr.WaitBackoff(context.Background(), clock)
			_, parked := tr.Parked()
			assert.Equal(t, c.parked, parked)
			if c.parked {
				assert.ErrorIs(t, err, controls.ErrParked)
			} else {
				assert.NoError(t, err)
			}
		})
	}
	t.Run("never without ParkWaits", func(t *testing.T) {
		tr := controls.NewReplayTracker(&stubbornv1.ControlState{RunId: "r"}, clock, nil, nil)
		tr.Backoff("", 2, time.Hour, time.Hour, false)
		assert.NoError(t, tr.WaitBackoff(context.Background(), clock))
	})
	t.Run("never once the run's context ended", func(t *testing.T) {
		tr := controls.NewReplayTracker(&stubbornv1.ControlState{RunId: "r"}, clock, nil, nil)
		tr.ParkWaits(time.Second)
		tr.Backoff("", 2, time.Hour, time.Hour, false)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		assert.ErrorIs(t, tr.WaitBackoff(ctx, clock), context.Canceled)
		_, parked := tr.Parked()
		assert.False(t, parked)
	})
}
