package runs_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	runstore "github.com/stubbornhq/stubborn/internal/runs/store"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
	"github.com/stubbornhq/stubborn/internal/runs/memstore"
)

// busyFor fails as unavailable, asking the caller to come back after wait:
// the retry waits exactly that long.
func busyFor(wait time.Duration) controlstest.Reply {
	return controlstest.Reply{Err: &controls.CallError{Code: codes.Unavailable, Message: "busy", HasHint: true, RetryHint: wait}}
}

// retryOf is a retry of delegate "d" that waits as long as d asks, up to
// an hour.
func retryOf() *stubbornv1.ControlSpec {
	return &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
		Target: "d", MaxWait: durationpb.New(time.Hour), OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL,
	}}}
}

func idempotentD(replies ...controlstest.Reply) *controlstest.Delegates {
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"d": replies})
	d.SetInfo("d", controls.DelegateInfo{Idempotent: true})
	return d
}

func TestAParkedRunGoesOnAfterItsWait(t *testing.T) {
	d := idempotentD(busyFor(30*time.Millisecond), controlstest.OK("fine"))
	m := runstest.NewManager(t, d, runs.Config{Clock: controls.RealClock{}, ParkAfter: time.Millisecond})
	st, err := runstest.Start(m, context.Background(), "brief", retryOf(), nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return m.Parked() == 1 }, 5*time.Second, time.Millisecond, "the run waits parked")

	evs := runstest.WatchAll(t, m, st.GetRunId(), 0)
	assert.Equal(t, []string{
		"run_started", "attempt_started", "attempt_finished", "failure_analyzed", "backoff_scheduled",
		"attempt_started", "attempt_finished", "run_finished",
	}, kinds(evs), "the journal goes on where it stopped, nothing twice")
	for i, ev := range evs {
		assert.Equal(t, int64(i+1), ev.GetSeq())
	}
	fin := runstest.Final(t, evs)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, fin.GetStatus(), fin.GetStatusReason())
	assert.Equal(t, int32(2), fin.GetAttempts())
	assert.Len(t, fin.GetFailureHistory(), 1)
	assert.Len(t, d.Calls(), 2)
	assert.Zero(t, m.Parked())
}

func TestWaitingRunsHoldNoGoroutine(t *testing.T) {
	const n = 200
	d := idempotentD(busyFor(time.Hour))
	m := runstest.NewManager(t, d, runs.Config{Clock: controls.RealClock{}, ParkAfter: time.Second})
	before := runtime.NumGoroutine()
	ids := make([]string, n)
	for i := range ids {
		st, err := runstest.Start(m, context.Background(), "brief", retryOf(), nil)
		require.NoError(t, err)
		ids[i] = st.GetRunId()
	}
	require.Eventually(t, func() bool { return m.Parked() == n }, 10*time.Second, time.Millisecond)
	// Each run would keep a goroutine while it waits; parked, at most the
	// idle workers (64) stay.
	assert.Less(t, runtime.NumGoroutine()-before, n/2)

	st, err := m.Get(context.Background(), ids[0])
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF, st.GetStatus())
	assert.Equal(t, int32(1), st.GetAttempts())

	// Cancelled while parked, a run replays its journal before it stops:
	// it ends with its whole history, as a run cancelled in its wait does.
	got, err := m.Cancel(runstest.Ctx(t), ids[0])
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_CANCELLED, got.GetStatus())
	assert.Equal(t, "cancelled: cancelled by CancelRun", got.GetStatusReason())
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_CANCELLED, got.GetStatusReasonCode())
	assert.Equal(t, int32(1), got.GetAttempts())
	assert.Len(t, got.GetAttemptLog(), 1)
	assert.Len(t, got.GetFailureHistory(), 1)
	assert.Equal(t, []string{
		"run_started", "attempt_started", "attempt_finished", "failure_analyzed", "backoff_scheduled", "run_finished",
	}, kinds(runstest.WatchAll(t, m, ids[0], 0)))
	assert.Equal(t, n-1, m.Parked())
	assert.Len(t, d.Calls(), n, "nobody was called again")
}

func TestParkedRunsAreLeftToTheNextServer(t *testing.T) {
	store := memstore.NewMemory(time.Second)
	d := idempotentD(busyFor(150*time.Millisecond), controlstest.OK("fine"))
	a, err := runs.New(runs.Config{Delegates: d, Store: store, Owner: "a", ParkAfter: time.Millisecond})
	require.NoError(t, err)
	st, err := runstest.Start(a, context.Background(), "brief", retryOf(), nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return a.Parked() == 1 }, 5*time.Second, time.Millisecond)
	a.Close() // leaves the parked run where it is
	assert.Zero(t, a.Parked())
	assert.Len(t, d.Calls(), 1)

	b := runstest.NewManager(t, d, runs.Config{Store: store, Owner: "b", SoleOwner: true, ParkAfter: time.Millisecond})
	evs := runstest.WatchAll(t, b, st.GetRunId(), 0)
	assert.Equal(t, []string{
		"run_started", "attempt_started", "attempt_finished", "failure_analyzed", "backoff_scheduled",
		"run_resumed", "attempt_started", "attempt_finished", "run_finished",
	}, kinds(evs))
	fin := runstest.Final(t, evs)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, fin.GetStatus(), fin.GetStatusReason())
	assert.Len(t, d.Calls(), 2)
}

// kinds names each event's kind.
func kinds(evs []*stubbornv1.RunEvent) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = controlstest.Kind(ev)
	}
	return out
}

func TestCloseCancelsParkedRunsWhenAskedTo(t *testing.T) {
	store := memstore.NewMemory(time.Second)
	d := idempotentD(busyFor(time.Hour))
	m, err := runs.New(runs.Config{Delegates: d, Store: store, CancelOnClose: true, ParkAfter: time.Millisecond})
	require.NoError(t, err)
	st, err := runstest.Start(m, context.Background(), "brief", retryOf(), nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return m.Parked() == 1 }, 5*time.Second, time.Millisecond)
	m.Close()
	got, err := store.State(context.Background(), st.GetRunId())
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_CANCELLED, got.GetStatus())
	assert.Equal(t, "cancelled: server shut down", got.GetStatusReason())
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_CANCELLED, got.GetStatusReasonCode())
	assert.Len(t, got.GetAttemptLog(), 1, "the whole history")
}

// askRetry retries d once the person says so: no retry of its own, a
// short backoff after a decision, and timeout for the decision (0: none).
func askRetry(timeout time.Duration) *stubbornv1.ControlSpec {
	return &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
		Target: "d", Attempts: new(int32), BaseWait: durationpb.New(time.Millisecond), MaxWait: durationpb.New(time.Millisecond),
		DecisionTimeout: durationpb.New(timeout),
	}}}
}

func TestARunAwaitingADecisionIsParkedUntilDecided(t *testing.T) {
	d := idempotentD(controlstest.Fail(codes.Unavailable, "down"), controlstest.OK("fine"))
	m := runstest.NewManager(t, d, runs.Config{Clock: controls.RealClock{}, ParkAfter: time.Millisecond})
	st, err := runstest.Start(m, context.Background(), "brief", askRetry(0), nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return m.Parked() == 1 }, 5*time.Second, time.Millisecond)
	got, err := m.Get(context.Background(), st.GetRunId())
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, got.GetStatus())
	assert.Equal(t, "retries exhausted (0 of 0)", got.GetStatusReason())
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED, got.GetStatusReasonCode())

	got, err = m.Decide(runstest.Ctx(t), st.GetRunId(), stubbornv1.Decision_DECISION_RETRY, nil)
	require.NoError(t, err)
	assert.NotEqual(t, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, got.GetStatus(), "the decision is taken when Decide returns")
	require.NotEmpty(t, got.GetAttemptLog(), "the replayed history is whole")
	assert.Equal(t, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_ERROR, got.GetAttemptLog()[0].GetOutcome())
	evs := runstest.WatchAll(t, m, st.GetRunId(), 0)
	assert.Equal(t, []string{
		"run_started", "attempt_started", "attempt_finished", "failure_analyzed", "decision_requested",
		"decision_received", "backoff_scheduled", "attempt_started", "attempt_finished", "run_finished",
	}, kinds(evs))
	assert.Equal(t, stubbornv1.Decision_DECISION_RETRY, evs[5].GetDecisionReceived().GetDecision())
	fin := runstest.Final(t, evs)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, fin.GetStatus(), fin.GetStatusReason())
	assert.Len(t, d.Calls(), 2)

	_, err = m.Decide(runstest.Ctx(t), st.GetRunId(), stubbornv1.Decision_DECISION_RETRY, nil)
	assert.ErrorIs(t, err, runs.ErrNotAwaitingDecision)
}

// An OK to a DecideRun for a parked run means its decision is in the
// store's journal: it is written before the run is woken, and the replay
// takes it from there.
func TestAParkedRunsDecisionIsWrittenBeforeTheOK(t *testing.T) {
	d := idempotentD(controlstest.Fail(codes.Unavailable, "down"))
	store := memstore.NewMemory(time.Minute)
	m := runstest.NewManager(t, d, runs.Config{Clock: controls.RealClock{}, ParkAfter: time.Millisecond, Store: store})
	st, err := runstest.Start(m, context.Background(), "brief", askRetry(0), nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return m.Parked() == 1 }, 5*time.Second, time.Millisecond)

	got, err := m.Decide(runstest.Ctx(t), st.GetRunId(), stubbornv1.Decision_DECISION_FAIL, nil)
	require.NoError(t, err)
	assert.NotEqual(t, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, got.GetStatus())
	written, err := store.Events(context.Background(), st.GetRunId(), 0)
	require.NoError(t, err)
	var last *stubbornv1.RunEvent
	for _, e := range written {
		_, last, err = runstore.DecodeEvent(e.Data)
		require.NoError(t, err)
		if last.GetDecisionReceived() != nil {
			break
		}
	}
	require.NotNil(t, last.GetDecisionReceived(), "in the journal when Decide answers")
	assert.Equal(t, stubbornv1.Decision_DECISION_FAIL, last.GetDecisionReceived().GetDecision())
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_RUNNING, last.GetStatus())

	fin := runstest.Final(t, runstest.WatchAll(t, m, st.GetRunId(), 0))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, fin.GetStatus())
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_DECISION_FAIL, fin.GetStatusReasonCode())
	assert.Len(t, d.Calls(), 1, "FAIL calls no one")
}

func TestAParkedDecisionTimesOut(t *testing.T) {
	d := idempotentD(controlstest.Fail(codes.Unavailable, "down"))
	m := runstest.NewManager(t, d, runs.Config{Clock: controls.RealClock{}, ParkAfter: time.Millisecond})
	st, err := runstest.Start(m, context.Background(), "brief", askRetry(100*time.Millisecond), nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return m.Parked() == 1 }, 5*time.Second, time.Millisecond)
	fin := runstest.Final(t, runstest.WatchAll(t, m, st.GetRunId(), 0))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, fin.GetStatus())
	assert.Equal(t, "no decision within 100ms", fin.GetStatusReason())
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_DECISION_TIMEOUT, fin.GetStatusReasonCode())
	assert.Len(t, d.Calls(), 1)
}

func TestDecidingARunParkedInBackoffIsRefused(t *testing.T) {
	d := idempotentD(busyFor(time.Hour))
	m := runstest.NewManager(t, d, runs.Config{Clock: controls.RealClock{}, ParkAfter: time.Millisecond})
	st, err := runstest.Start(m, context.Background(), "brief", retryOf(), nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return m.Parked() == 1 }, 5*time.Second, time.Millisecond)
	_, err = m.Decide(runstest.Ctx(t), st.GetRunId(), stubbornv1.Decision_DECISION_RETRY, nil)
	assert.ErrorIs(t, err, runs.ErrNotAwaitingDecision)
	assert.Equal(t, 1, m.Parked(), "it still waits, parked")
}

// A woken run goes on as it was decided when it parked, whatever has
// changed since: the time left before its deadline, the retry budget,
// whether its failed call had been sent (not in the journal). Each case
// also runs without parking, which must agree.
func TestAWokenRunKeepsWhatWasDecided(t *testing.T) {
	notSent := controlstest.Reply{Err: &controls.CallError{Code: codes.Unavailable, Message: "connection refused", NotSent: true, HasHint: true, RetryHint: 50 * time.Millisecond}}
	cases := map[string]struct {
		replies []controlstest.Reply
		info    controls.DelegateInfo
		opts    *stubbornv1.RunOptions
		budgets func(t *testing.T) controls.Budgets
	}{
		"the wait is most of the time left": {
			// 800 ms are left after the wait for the woken run's replay
			// and call: a loaded CI machine with -race took over 400.
			replies: []controlstest.Reply{busyFor(1200 * time.Millisecond), controlstest.OK("fine")},
			info:    controls.DelegateInfo{Idempotent: true},
			opts:    &stubbornv1.RunOptions{RunTimeout: durationpb.New(2 * time.Second)},
		},
		"a retry budget with one retry in it": {
			replies: []controlstest.Reply{busyFor(50 * time.Millisecond), controlstest.OK("fine")},
			info:    controls.DelegateInfo{Idempotent: true},
			budgets: func(t *testing.T) controls.Budgets {
				b, err := controls.NewBudgetSet(3, 0.1)
				require.NoError(t, err)
				return b
			},
		},
		"a call that was not sent, to a delegate that is not idempotent": {
			replies: []controlstest.Reply{notSent, controlstest.OK("fine")},
		},
	}
	for name, c := range cases {
		for _, park := range []time.Duration{-1, time.Millisecond} {
			t.Run(fmt.Sprintf("%s/ParkAfter=%v", name, park), func(t *testing.T) {
				d := controlstest.NewDelegates(map[string][]controlstest.Reply{"d": c.replies})
				d.SetInfo("d", c.info)
				cfg := runs.Config{Clock: controls.RealClock{}, ParkAfter: park}
				if c.budgets != nil {
					cfg.Budgets = c.budgets(t)
				}
				m := runstest.NewManager(t, d, cfg)
				st, err := runstest.Start(m, context.Background(), "brief", retryOf(), c.opts)
				require.NoError(t, err)
				fin := runstest.Final(t, runstest.WatchAll(t, m, st.GetRunId(), 0))
				assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, fin.GetStatus(), fin.GetStatusReason())
				assert.Len(t, d.Calls(), 2)
			})
		}
	}
}
