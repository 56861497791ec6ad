package server_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

func TestRaceCancelsSlowLosersForReal(t *testing.T) {
	slowA, slowB := &demo.Slow{Delay: time.Minute}, &demo.Slow{Delay: time.Minute}
	e := startWith(t, setup{extra: map[string]stubbornv1.DelegateServiceServer{"slow-a": slowA, "slow-b": slowB}})
	ctx := testCtx(t)
	s, err := e.client.Run(ctx, &stubbornv1.RunRequest{
		TaskBrief: "race",
		Race:      &stubbornv1.RaceSpec{Candidates: []string{"slow-a", "gate", "slow-b"}},
	})
	require.NoError(t, err)
	// The gate answers only once both slow calls have reached their servers.
	require.Eventually(t, func() bool { return slowA.Started() == 1 && slowB.Started() == 1 }, 10*time.Second, 2*time.Millisecond)
	e.gate.answers <- nil
	st := lastState(t, collect(t, s))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus())
	assert.Equal(t, "gate", st.GetWinner())
	assert.EqualValues(t, 3, st.GetAttempts())
	require.Len(t, st.GetFailureHistory(), 2, "one record per cancelled loser")
	for _, f := range st.GetFailureHistory() {
		assert.Contains(t, f.GetReason(), "another candidate won the race")
	}
	// The losers' servers saw their calls cancelled.
	require.Eventually(t, func() bool { return slowA.Cancelled() == 1 && slowB.Cancelled() == 1 }, 10*time.Second, 5*time.Millisecond)
}

// TestHedgedRaceOverGRPC: race.hedge_delay end to end, on the wall clock,
// with delegates on loopback. The delays that must not pass are a minute
// long, so the outcomes do not depend on the machine's speed.
func TestHedgedRaceOverGRPC(t *testing.T) {
	slowA := &demo.Slow{Delay: time.Minute}
	e := startWith(t, setup{extra: map[string]stubbornv1.DelegateServiceServer{"slow-a": slowA}})
	ctx := testCtx(t)
	run := func(t *testing.T, delay time.Duration, candidates ...string) (*stubbornv1.ControlState, []*stubbornv1.Attempt) {
		t.Helper()
		s, err := e.client.Run(ctx, &stubbornv1.RunRequest{
			TaskBrief: "hedge",
			Race:      &stubbornv1.RaceSpec{Candidates: candidates, HedgeDelay: durationpb.New(delay)},
		})
		require.NoError(t, err)
		evs := collect(t, s)
		var starts []*stubbornv1.Attempt // as the attempt_started events say
		for _, ev := range evs {
			if a := ev.GetAttemptStarted().GetAttempt(); a != nil {
				starts = append(starts, a)
			}
		}
		return lastState(t, evs), starts
	}
	reasons := func(starts []*stubbornv1.Attempt) []stubbornv1.AttemptStartReason {
		var out []stubbornv1.AttemptStartReason
		for _, a := range starts {
			out = append(out, a.GetStartReason())
		}
		return out
	}

	t.Run("a first candidate that answers within the delay: the second is never called", func(t *testing.T) {
		st, starts := run(t, time.Minute, "echo", "slow")
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus())
		assert.Equal(t, "echo", st.GetWinner())
		assert.EqualValues(t, 1, st.GetAttempts())
		assert.Equal(t, []stubbornv1.AttemptStartReason{stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_AT_ONCE}, reasons(starts))
		assert.Zero(t, e.slow.Started(), "slow is never called")
	})
	t.Run("a first candidate that fails: the second starts at once", func(t *testing.T) {
		st, starts := run(t, time.Minute, "broken", "echo")
		assert.Equal(t, "echo", st.GetWinner())
		assert.Equal(t, []stubbornv1.AttemptStartReason{
			stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_AT_ONCE, stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_EARLIER_FAILED,
		}, reasons(starts))
	})
	t.Run("a slow first candidate: the second starts once the delay has passed, and wins", func(t *testing.T) {
		const delay = 50 * time.Millisecond
		st, starts := run(t, delay, "slow-a", "echo")
		assert.Equal(t, "echo", st.GetWinner())
		require.Equal(t, []stubbornv1.AttemptStartReason{
			stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_AT_ONCE, stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_HEDGE_DELAY,
		}, reasons(starts))
		assert.GreaterOrEqual(t, starts[1].GetStartTime().AsTime().Sub(starts[0].GetStartTime().AsTime()), delay)
		require.Len(t, st.GetFailureHistory(), 1)
		assert.Contains(t, st.GetFailureHistory()[0].GetReason(), "another candidate won the race")
		require.Eventually(t, func() bool { return slowA.Cancelled() == 1 }, 10*time.Second, 5*time.Millisecond, "slow-a's call is cancelled")
	})
	t.Run("a negative delay is INVALID_ARGUMENT naming race.hedge_delay", func(t *testing.T) {
		_, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{
			TaskBrief: "hedge", Race: &stubbornv1.RaceSpec{Candidates: []string{"echo"}, HedgeDelay: durationpb.New(-time.Second)},
		})
		assert.Equal(t, codes.InvalidArgument, status.Code(err))
		assert.Contains(t, status.Convert(err).Message(), "race.hedge_delay: must not be negative")
	})
}

func TestPresetNestedInAChainOverGRPC(t *testing.T) {
	one := int32(1)
	e := startWith(t, setup{
		clock: controlstest.NewClock(),
		presets: []delegates.Preset{{
			Name: "flaky-with-retry",
			Spec: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
				Target: "flaky", Attempts: &one, OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL, BaseWait: durationpb.New(time.Millisecond),
			}}},
		}},
	})
	ctx := testCtx(t)
	s, err := e.client.Run(ctx, &stubbornv1.RunRequest{
		TaskBrief:     "find",
		FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"flaky-with-retry", "echo"}},
	})
	require.NoError(t, err)
	evs := collect(t, s)
	st := lastState(t, evs)
	// flaky fails its first two calls: the nested retry (one retry) gives up,
	// and the chain falls back to echo.
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus())
	assert.Equal(t, "echo", st.GetWinner())
	assert.EqualValues(t, 2, st.GetAttempts())
	var nested int
	for _, ev := range evs {
		if a := ev.GetAttemptStarted(); a != nil && a.GetAttempt().GetDelegate() == "flaky" {
			nested++
			assert.Equal(t, "chain[0]", ev.GetPath())
			assert.Equal(t, "chain[0]", a.GetAttempt().GetPath())
		}
		if b := ev.GetBackoffScheduled(); b != nil {
			assert.Equal(t, "chain[0]", ev.GetPath(), "the nested retry's backoff carries its path")
		}
	}
	assert.Equal(t, 2, nested, "the nested retry made a try and one retry")

	// An unknown name is still NOT_FOUND; the preset name is known.
	_, err = e.client.StartRun(ctx, &stubbornv1.StartRunRequest{
		TaskBrief: "x", Retry: &stubbornv1.RetrySpec{Target: "flaky-with-retry"},
	})
	require.NoError(t, err)
}
