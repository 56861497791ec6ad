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
	var parks []time.Time
	tr.ParkWaits(time.Second, func(until time.Time, decision bool) {
		assert.False(t, decision)
		parks = append(parks, until)
	})
	tr.Start()
	controls.Execute(context.Background(), &controls.Env{Delegates: d, Tracker: tr, Clock: clock}, "task", spec)
	until, parked := tr.Parked()
	require.True(t, parked, "a wait of 10s parks at 1s")
	assert.Equal(t, clock.Now().Add(10*time.Second), until)
	assert.Equal(t, []time.Time{until}, parks, "the driver is told once")
	assert.Empty(t, clock.Sleeps(), "a parked run does not wait")
	tr.Finish(stubbornv1.RunStatus_RUN_STATUS_CANCELLED, nil, "", "stopped", stubbornv1.StatusReason_STATUS_REASON_CANCELLED)
	assert.Equal(t, []string{"run_started", "attempt_started", "attempt_finished", "failure_analyzed", "backoff_scheduled"}, kinds(journal),
		"nothing follows the backoff, not even run_finished")
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF, tr.Snapshot().GetStatus())

	// Woken 9.5s into the wait: the replay waits the last half second (too
	// short to park again), then goes on.
	require.NoError(t, clock.Sleep(context.Background(), 9500*time.Millisecond))
	recorded := append([]*stubbornv1.RunEvent(nil), journal...)
	journal = nil
	tr2 := controls.NewReplayTracker(proto.CloneOf(recorded[0].GetRunStarted().GetState()), clock, rec, recorded)
	tr2.ParkWaits(time.Second, nil)
	live := 0
	tr2.OnLive(func() { live++ })
	tr2.Start()
	assert.Zero(t, live, "run_started comes from the journal")
	out := controls.Execute(context.Background(), &controls.Env{Delegates: d, Tracker: tr2, Clock: clock}, "task", spec)
	tr2.Finish(out.Status, out.Result, out.Winner, out.Reason, out.Code)
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
			tr.ParkWaits(time.Second, nil)
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
		tr.ParkWaits(time.Second, nil)
		tr.Backoff("", 2, time.Hour, time.Hour, false)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		assert.ErrorIs(t, tr.WaitBackoff(ctx, clock), context.Canceled)
		_, parked := tr.Parked()
		assert.False(t, parked)
	})
}

func TestAParkedDecisionIsAnsweredByItsReplay(t *testing.T) {
	spec := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
		Target: "d", Attempts: ptr(int32(0)),
	}}}
	answers := map[int32]controlstest.Reply{1: controlstest.Fail(codes.Unavailable, "down"), 2: controlstest.OK("ok")}
	d := &byAttempt{answers: answers, info: controls.DelegateInfo{Idempotent: true}}
	clock := controlstest.NewClock()
	var journal []*stubbornv1.RunEvent
	rec := func(ev *stubbornv1.RunEvent, _ *stubbornv1.ControlState) {
		journal = append(journal, proto.CloneOf(ev))
	}
	tr := controls.NewReplayTracker(&stubbornv1.ControlState{RunId: "r", TaskBrief: "task", Control: spec}, clock, rec, nil)
	tr.ParkWaits(time.Second, nil)
	tr.Start()
	controls.Execute(context.Background(), &controls.Env{Delegates: d, Tracker: tr, Clock: clock}, "task", spec)
	until, parked := tr.Parked()
	require.True(t, parked)
	assert.True(t, until.IsZero(), "no timeout: no end to the wait")
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, tr.Snapshot().GetStatus())
	assert.ErrorIs(t, tr.Decide(stubbornv1.Decision_DECISION_RETRY), controls.ErrParked, "a parked tracker is decided by its replay")
	assert.Equal(t, "decision_requested", kinds(journal)[len(journal)-1])

	recorded := append([]*stubbornv1.RunEvent(nil), journal...)
	journal = nil
	tr2 := controls.NewReplayTracker(proto.CloneOf(recorded[0].GetRunStarted().GetState()), clock, rec, recorded)
	tr2.ParkWaits(time.Second, nil)
	taken := 0
	tr2.Answer(stubbornv1.Decision_DECISION_RETRY, func() { taken++ })
	tr2.Start()
	out := controls.Execute(context.Background(), &controls.Env{Delegates: d, Tracker: tr2, Clock: clock}, "task", spec)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, out.Status, out.Reason)
	assert.Equal(t, 1, taken)
	assert.Equal(t, []int32{1, 2}, d.called())
	assert.Equal(t, []string{"decision_received", "backoff_scheduled", "attempt_started", "attempt_finished"}, kinds(journal))
}

func TestADecisionDueSoonIsNotParked(t *testing.T) {
	clock := controlstest.NewClock()
	clock.Block = true // the timeout never fires by itself: ctx ends the wait
	tr := controls.NewReplayTracker(&stubbornv1.ControlState{RunId: "r"}, clock, nil, nil)
	tr.ParkWaits(time.Second, nil)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for tr.Decide(stubbornv1.Decision_DECISION_FAIL) != nil {
			time.Sleep(time.Millisecond)
		}
	}()
	d, timedOut, err := tr.AwaitDecision(ctx, "", "why", stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED, 500*time.Millisecond)
	cancel()
	require.NoError(t, err)
	assert.False(t, timedOut)
	assert.Equal(t, stubbornv1.Decision_DECISION_FAIL, d, "decided while waiting, not parked")
	_, parked := tr.Parked()
	assert.False(t, parked)
}
