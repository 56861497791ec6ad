package server_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/stubbornhq/stubborn/controls/controlstest"
	"github.com/stubbornhq/stubborn/delegates"
	"github.com/stubbornhq/stubborn/delegates/demo"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
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
