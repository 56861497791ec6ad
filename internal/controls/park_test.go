package controls_test

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// evicting is a clock that does what an engine parking its runs does: a
// wait of the run's own control at least min long ends the goroutine
// (runtime.Goexit) instead of sleeping. It notes every wait it is asked
// for.
type evicting struct {
	*controlstest.Clock
	min time.Duration

	mu      sync.Mutex
	waits   []controls.Wait
	evicted []controls.Wait
}

func (c *evicting) Sleep(ctx context.Context, d time.Duration) error {
	w, ok := controls.WaitOf(ctx)
	c.mu.Lock()
	if ok {
		c.waits = append(c.waits, w)
	}
	evict := ok && w.Path == "" && d >= c.min && ctx.Err() == nil
	if evict {
		c.evicted = append(c.evicted, w)
	}
	c.mu.Unlock()
	if evict {
		runtime.Goexit()
	}
	return c.Clock.Sleep(ctx, d)
}

// execute runs spec's control on its own goroutine, as an engine does, and
// reports its outcome, or false when the goroutine ended in a wait.
func execute(env *controls.Env, spec *stubbornv1.ControlSpec) (controls.Outcome, bool) {
	var (
		out      controls.Outcome
		returned bool
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		out = controls.Execute(context.Background(), env, "task", spec)
		returned = true
	}()
	<-done
	return out, returned
}

func TestAnEvictedBackoffResumesFromItsJournal(t *testing.T) {
	spec := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
		Target: "d", MaxWait: durationpb.New(time.Hour),
	}}}
	busy := controlstest.Reply{Err: &controls.CallError{Code: codes.Unavailable, Message: "busy", HasHint: true, RetryHint: 10 * time.Second}}
	answers := map[int32]controlstest.Reply{1: busy, 2: controlstest.OK("ok")}
	d := &byAttempt{answers: answers, info: controls.DelegateInfo{Idempotent: true}}
	clock := &evicting{Clock: controlstest.NewClock(), min: time.Second}
	var journal []*stubbornv1.RunEvent
	rec := func(ev *stubbornv1.RunEvent, _ *stubbornv1.ControlState) {
		journal = append(journal, proto.CloneOf(ev))
	}

	st := &stubbornv1.ControlState{RunId: "r", TaskBrief: "task", Control: spec}
	tr := controls.NewReplayTracker(st, clock, rec, nil)
	tr.Start()
	_, returned := execute(&controls.Env{Delegates: d, Tracker: tr, Clock: clock}, spec)
	require.False(t, returned, "the control's goroutine ended in its wait")
	until := clock.Now().Add(10 * time.Second)
	assert.Equal(t, []controls.Wait{{Until: until}}, clock.evicted, "the run's own backoff, and until when")
	assert.Empty(t, clock.Sleeps(), "an evicted run does not wait")
	assert.Equal(t, []string{"run_started", "attempt_started", "attempt_finished", "failure_analyzed", "backoff_scheduled"}, kinds(journal),
		"nothing follows the backoff, not even run_finished")
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF, tr.Snapshot().GetStatus())

	// Driven again 9.5s into the wait: the replay waits the last half
	// second (too short to evict), then goes on.
	require.NoError(t, clock.Clock.Sleep(context.Background(), 9500*time.Millisecond))
	recorded := append([]*stubbornv1.RunEvent(nil), journal...)
	journal = nil
	tr2 := controls.NewReplayTracker(proto.CloneOf(recorded[0].GetRunStarted().GetState()), clock, rec, recorded)
	tr2.Start()
	out, returned := execute(&controls.Env{Delegates: d, Tracker: tr2, Clock: clock}, spec)
	require.True(t, returned)
	tr2.Finish(out.Status, out.Result, out.Winner, out.Reason, out.Code)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, out.Status, out.Reason)
	assert.Equal(t, []time.Duration{9500 * time.Millisecond, 500 * time.Millisecond}, clock.Sleeps())
	assert.Equal(t, []int32{1, 2}, d.called(), "attempt 1 is not made again")
	assert.Equal(t, []string{"attempt_started", "attempt_finished", "run_finished"}, kinds(journal))
	fin := journal[len(journal)-1].GetRunFinished().GetState()
	assert.Equal(t, int32(2), fin.GetAttempts())
	assert.Len(t, fin.GetFailureHistory(), 1)
}

// Every wait a tracker makes says what it waits for, at which path; only
// the run's own control's (path "") may be evicted.
func TestWaitsSayWhatTheyAwait(t *testing.T) {
	clock := &evicting{Clock: controlstest.NewClock(), min: time.Second}
	start := clock.Now()
	tr := controls.NewReplayTracker(&stubbornv1.ControlState{RunId: "r"}, clock, nil, nil)
	tr.Backoff("chain[0]", 2, time.Hour, time.Hour, false)
	require.NoError(t, tr.WaitBackoff(context.Background(), clock), "a nested control's wait is slept")
	tr.Backoff("", 3, 500*time.Millisecond, time.Second, false)
	require.NoError(t, tr.WaitBackoff(context.Background(), clock), "too short to evict")
	d, timedOut, err := tr.AwaitDecision(context.Background(), "", "why", stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED, 800*time.Millisecond)
	require.NoError(t, err)
	assert.True(t, timedOut, "the fake clock sleeps the whole timeout")
	assert.Equal(t, stubbornv1.Decision_DECISION_FAIL, d)
	assert.Equal(t, []controls.Wait{
		{Path: "chain[0]", Until: start.Add(time.Hour)},
		{Until: start.Add(time.Hour + 500*time.Millisecond)},
		{Until: start.Add(time.Hour + 1300*time.Millisecond), Decision: true},
	}, clock.waits)
	assert.Empty(t, clock.evicted)

	t.Run("not once the run's context ended", func(t *testing.T) {
		tr := controls.NewReplayTracker(&stubbornv1.ControlState{RunId: "r"}, clock, nil, nil)
		tr.Backoff("", 2, time.Hour, time.Hour, false)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		assert.ErrorIs(t, tr.WaitBackoff(ctx, clock), context.Canceled)
		assert.Empty(t, clock.evicted)
	})
}

func TestADecisionForAnEvictedWaitIsTakenByItsReplay(t *testing.T) {
	spec := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
		Target: "d", Attempts: ptr(int32(0)),
	}}}
	answers := map[int32]controlstest.Reply{1: controlstest.Fail(codes.Unavailable, "down"), 2: controlstest.OK("ok")}
	d := &byAttempt{answers: answers, info: controls.DelegateInfo{Idempotent: true}}
	clock := &evicting{Clock: controlstest.NewClock(), min: time.Second}
	var journal []*stubbornv1.RunEvent
	rec := func(ev *stubbornv1.RunEvent, _ *stubbornv1.ControlState) {
		journal = append(journal, proto.CloneOf(ev))
	}
	tr := controls.NewReplayTracker(&stubbornv1.ControlState{RunId: "r", TaskBrief: "task", Control: spec}, clock, rec, nil)
	tr.Start()
	_, returned := execute(&controls.Env{Delegates: d, Tracker: tr, Clock: clock}, spec)
	require.False(t, returned)
	assert.Equal(t, []controls.Wait{{Decision: true}}, clock.evicted, "no timeout: no end to the wait")
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, tr.Snapshot().GetStatus())
	require.NoError(t, tr.Decide(stubbornv1.Decision_DECISION_RETRY, nil), "the evicted tracker still awaits its decision")
	assert.Equal(t, []string{"decision_requested", "decision_received"}, kinds(journal)[len(journal)-2:], "and records it")
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_RUNNING, tr.Snapshot().GetStatus())
	assert.ErrorIs(t, tr.Decide(stubbornv1.Decision_DECISION_FAIL, nil), controls.ErrNotAwaitingDecision, "once")

	recorded := append([]*stubbornv1.RunEvent(nil), journal...)
	journal = nil
	tr2 := controls.NewReplayTracker(proto.CloneOf(recorded[0].GetRunStarted().GetState()), clock, rec, recorded)
	tr2.Start()
	out, returned := execute(&controls.Env{Delegates: d, Tracker: tr2, Clock: clock}, spec)
	require.True(t, returned)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, out.Status, out.Reason)
	assert.Equal(t, []int32{1, 2}, d.called())
	assert.Equal(t, []string{"backoff_scheduled", "attempt_started", "attempt_finished"}, kinds(journal),
		"the decision is the journal's")
}

func TestADecisionIsTakenWhileItsWaitSleeps(t *testing.T) {
	clock := controlstest.NewClock()
	clock.Block = true // the timeout never fires by itself: ctx ends the wait
	tr := controls.NewReplayTracker(&stubbornv1.ControlState{RunId: "r"}, clock, nil, nil)
	go func() {
		for tr.Decide(stubbornv1.Decision_DECISION_FAIL, nil) != nil {
			time.Sleep(time.Millisecond)
		}
	}()
	d, timedOut, err := tr.AwaitDecision(context.Background(), "", "why", stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED, 500*time.Millisecond)
	require.NoError(t, err)
	assert.False(t, timedOut)
	assert.Equal(t, stubbornv1.Decision_DECISION_FAIL, d)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _, err = tr.AwaitDecision(ctx, "", "why", stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED, 0)
	assert.ErrorIs(t, err, context.Canceled)
}
