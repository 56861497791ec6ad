package server_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// badFields returns the fields a google.rpc.BadRequest of an
// INVALID_ARGUMENT names.
func badFields(t *testing.T, err error) []string {
	t.Helper()
	st := status.Convert(err)
	require.Equal(t, codes.InvalidArgument, st.Code(), st.Message())
	var fields []string
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				fields = append(fields, v.GetField())
			}
		}
	}
	return fields
}

func weighted(name string, w int32) *stubbornv1.BalanceTarget {
	return &stubbornv1.BalanceTarget{Name: name, Weight: &w}
}

func targets(names ...string) []*stubbornv1.BalanceTarget {
	out := make([]*stubbornv1.BalanceTarget, len(names))
	for i, n := range names {
		out[i] = &stubbornv1.BalanceTarget{Name: n}
	}
	return out
}

// A balance that is wrong in shape is INVALID_ARGUMENT naming the field,
// within the server's limits; an unknown target is NOT_FOUND naming it.
func TestBalanceIsValidatedNamingTheField(t *testing.T) {
	e := start(t, delegates.Limits{MaxChain: 3, MaxAttempts: 2})
	ctx := testCtx(t)
	three := int32(3)
	zero := int32(0)
	cases := []struct {
		name  string
		spec  *stubbornv1.BalanceSpec
		field string
		words string
	}{
		{"no targets", &stubbornv1.BalanceSpec{}, "balance.targets", "at least one target"},
		{"a target twice", &stubbornv1.BalanceSpec{Targets: targets("echo", "flaky", "echo")}, "balance.targets[2].name", `"echo" is targets[0] already`},
		{"a weight of 0", &stubbornv1.BalanceSpec{Targets: []*stubbornv1.BalanceTarget{weighted("echo", 0)}}, "balance.targets[0].weight", "must be 1 to 1000, got 0"},
		{"a weight over 1000", &stubbornv1.BalanceSpec{Targets: []*stubbornv1.BalanceTarget{weighted("echo", 1), weighted("flaky", 1001)}}, "balance.targets[1].weight", "must be 1 to 1000, got 1001"},
		{"an unknown strategy", &stubbornv1.BalanceSpec{Targets: targets("echo"), Strategy: 99}, "balance.strategy", "unknown strategy 99"},
		{"more targets than max_chain", &stubbornv1.BalanceSpec{Targets: targets("echo", "flaky", "down", "slow")}, "balance.targets", "4 targets, more than the limit of 3 (limits.max_chain)"},
		{"max_attempts over limits.max_attempts", &stubbornv1.BalanceSpec{Targets: targets("echo", "flaky", "down"), MaxAttempts: &three}, "balance.max_attempts", "must be 1 to 2 (limits.max_attempts), got 3"},
		{"max_attempts of 0", &stubbornv1.BalanceSpec{Targets: targets("echo"), MaxAttempts: &zero}, "balance.max_attempts", "must be 1 to 2 (limits.max_attempts), got 0"},
		{"an empty name", &stubbornv1.BalanceSpec{Targets: targets("")}, "balance.targets[0].name", "must name a delegate or a preset"},
		{"a CEL rule that does not compile", &stubbornv1.BalanceSpec{Targets: targets("echo"), FailureWhen: "result.nope("}, "balance.failure_when", "is not a valid CEL expression"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "x", Balance: tc.spec})
			assert.Contains(t, badFields(t, err), tc.field)
			assert.ErrorContains(t, err, tc.field+": "+tc.words)
		})
	}
	_, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "x", Balance: &stubbornv1.BalanceSpec{Targets: targets("echo", "nope")}})
	require.Equal(t, codes.NotFound, status.Code(err), "%v", err)
	assert.ErrorContains(t, err, `balance.targets[1].name: delegate "nope" is not in the registry`)
	_, err = e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "x", Balance: &stubbornv1.BalanceSpec{Targets: targets("echo")},
		Race: &stubbornv1.RaceSpec{Candidates: []string{"echo"}}})
	assert.ErrorContains(t, err, "exactly one of retry, retry_with_learning, fallback_chain, race, balance must be set; got race and balance")
	two := int32(2)
	_, err = e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "x", Balance: &stubbornv1.BalanceSpec{
		Targets: []*stubbornv1.BalanceTarget{weighted("echo", 1000), weighted("flaky", 1)}, MaxAttempts: &two,
		Strategy: stubbornv1.BalanceStrategy_BALANCE_STRATEGY_USAGE,
	}})
	require.NoError(t, err, "at the limits")
}

// Over gRPC: a balance leaves out a deployment whose breaker opened, says
// so in its pick, and nests in a chain as a preset.
func TestBalanceOverGRPC(t *testing.T) {
	var calls atomic.Int64
	fragile := demo.NewScripted(func(context.Context, *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		calls.Add(1)
		return nil, status.Error(codes.Unavailable, "fragile: down")
	})
	e := startWith(t, setup{
		extra: map[string]stubbornv1.DelegateServiceServer{"fragile": fragile},
		configure: func(c *delegates.Config) {
			for i := range c.Delegates {
				if c.Delegates[i].Name == "fragile" {
					c.Delegates[i].CircuitBreaker = &delegates.CircuitBreaker{ConsecutiveFailures: 1, Cooldown: delegates.Duration(3600e9)}
				}
			}
		},
		presets: []delegates.Preset{{Name: "spread", Spec: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Balance{Balance: &stubbornv1.BalanceSpec{
			Targets: []*stubbornv1.BalanceTarget{weighted("fragile", 1000), weighted("echo", 1)},
		}}}}},
	})
	ctx := testCtx(t)
	run := func(b *stubbornv1.BalanceSpec) *stubbornv1.ControlState {
		t.Helper()
		s, err := e.client.Run(ctx, &stubbornv1.RunRequest{TaskBrief: "hello", Balance: b})
		require.NoError(t, err)
		return lastState(t, collect(t, s))
	}

	// fragile's one failure opens its breaker.
	st := run(&stubbornv1.BalanceSpec{Targets: targets("fragile"), Strategy: stubbornv1.BalanceStrategy_BALANCE_STRATEGY_LEAST_BUSY})
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED, st.GetStatus())
	assert.Equal(t, "the balance's one target failed", st.GetStatusReason())
	require.Len(t, st.GetAttemptLog(), 1)
	assert.Equal(t, stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_BALANCE_PICK, st.GetAttemptLog()[0].GetStartReason())
	assert.Equal(t, "balance least_busy: 0 in flight", st.GetAttemptLog()[0].GetStartDetail())
	assert.NotNil(t, st.GetControl().GetBalance(), "the run's control is the balance")
	require.EqualValues(t, 1, calls.Load())

	// Open: left out, whatever its weight; echo answers.
	st = run(&stubbornv1.BalanceSpec{Targets: []*stubbornv1.BalanceTarget{weighted("fragile", 1000), weighted("echo", 1)}})
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus())
	assert.Equal(t, "echo", st.GetWinner())
	require.Len(t, st.GetAttemptLog(), 1)
	assert.Equal(t, "balance weighted: weight 1 of 1; left out: fragile (circuit breaker open)", st.GetAttemptLog()[0].GetStartDetail())

	// Nothing left: nothing called, and the run says why.
	st = run(&stubbornv1.BalanceSpec{Targets: targets("fragile")})
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED, st.GetStatus())
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_ALL_FAILED, st.GetStatusReasonCode())
	assert.Equal(t, "no target of the balance was called: none could take the call: fragile (circuit breaker open)", st.GetStatusReason())
	assert.Empty(t, st.GetAttemptLog())
	assert.EqualValues(t, 1, calls.Load(), "never called while open")

	// A balance preset in a chain, and a preset as a balance's target.
	s, err := e.client.Run(ctx, &stubbornv1.RunRequest{TaskBrief: "hi", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"spread"}}})
	require.NoError(t, err)
	st = lastState(t, collect(t, s))
	assert.Equal(t, "spread", st.GetWinner())
	require.Len(t, st.GetAttemptLog(), 2)
	assert.Equal(t, "chain[0]", st.GetAttemptLog()[1].GetPath())
	assert.True(t, strings.HasSuffix(st.GetAttemptLog()[1].GetStartDetail(), "left out: fragile (circuit breaker open)"))
	assert.Contains(t, st.GetPresets(), "spread", "the run keeps the preset tree it was accepted with")

	st = run(&stubbornv1.BalanceSpec{Targets: targets("spread", "down"), Strategy: stubbornv1.BalanceStrategy_BALANCE_STRATEGY_LATENCY})
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus())
	assert.Equal(t, "spread", st.GetWinner(), "down fails, if picked first; spread answers through echo")
}

// Over gRPC, the figures are the server's: least_busy sees a call in
// flight, usage a rate limit spent.
func TestBalanceWeighsTheServersTraffic(t *testing.T) {
	zero := delegates.Duration(0)
	e := startWith(t, setup{configure: func(c *delegates.Config) {
		for i := range c.Delegates {
			if c.Delegates[i].Name == "flaky" {
				c.Delegates[i].RequestsPerMinute, c.Delegates[i].MaxQueueWait = 1, &zero
			}
		}
	}})
	ctx := testCtx(t)
	run := func(b *stubbornv1.BalanceSpec) *stubbornv1.ControlState {
		t.Helper()
		s, err := e.client.Run(ctx, &stubbornv1.RunRequest{TaskBrief: "hello", Balance: b})
		require.NoError(t, err)
		return lastState(t, collect(t, s))
	}

	// A call to slow in flight: least_busy picks echo.
	res, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "take your time", Retry: &stubbornv1.RetrySpec{Target: "slow"}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return e.slow.Started() == 1 }, 10*time.Second, 5*time.Millisecond)
	st := run(&stubbornv1.BalanceSpec{Targets: targets("slow", "echo"), Strategy: stubbornv1.BalanceStrategy_BALANCE_STRATEGY_LEAST_BUSY})
	assert.Equal(t, "echo", st.GetWinner())
	assert.Equal(t, "balance least_busy: 0 in flight (others slow 1 in flight)", st.GetAttemptLog()[0].GetStartDetail())
	_, err = e.client.CancelRun(ctx, &stubbornv1.CancelRunRequest{RunId: res.GetRunId()})
	require.NoError(t, err)

	// flaky's one request a minute, spent: usage leaves it out.
	st = run(&stubbornv1.BalanceSpec{Targets: targets("flaky"), Strategy: stubbornv1.BalanceStrategy_BALANCE_STRATEGY_USAGE})
	require.Len(t, st.GetAttemptLog(), 1, "flaky's first call fails, and uses the minute's request")
	assert.Equal(t, "balance usage: 100% of its rate limits left", st.GetAttemptLog()[0].GetStartDetail())
	st = run(&stubbornv1.BalanceSpec{Targets: targets("flaky", "echo"), Strategy: stubbornv1.BalanceStrategy_BALANCE_STRATEGY_USAGE})
	assert.Equal(t, "echo", st.GetWinner())
	assert.Equal(t, "balance usage: 100% of its rate limits left; left out: flaky (rate limits spent)", st.GetAttemptLog()[0].GetStartDetail())
}
