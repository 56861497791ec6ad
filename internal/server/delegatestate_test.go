package server_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// ListDelegates over gRPC shows what the console's Delegates page needs: an
// open circuit breaker's end of cooldown, the calls and tokens a rate limit
// counted in the last minute, and the latest failed calls (newest first,
// with their run, attempt, code and a cut message; a call the breaker
// refused is not one).
func TestListDelegatesShowsBreakerRateUseAndFailures(t *testing.T) {
	clock := controlstest.NewClock()
	long := strings.Repeat("x", 400)
	fragile := demo.NewScripted(func(context.Context, *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		return nil, status.Error(codes.Unavailable, "fragile: down "+long)
	})
	usage, err := structpb.NewValue(map[string]any{"usage": map[string]any{"total_tokens": 42}})
	require.NoError(t, err)
	model := demo.NewScripted(func(context.Context, *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		return &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{Text: "ok", Data: usage}}, nil
	})
	e := startWith(t, setup{
		clock: clock,
		extra: map[string]stubbornv1.DelegateServiceServer{"fragile": fragile, "model": model},
		configure: func(c *delegates.Config) {
			for i := range c.Delegates {
				switch c.Delegates[i].Name {
				case "fragile":
					c.Delegates[i].CircuitBreaker = &delegates.CircuitBreaker{ConsecutiveFailures: 2, Cooldown: delegates.Duration(time.Hour)}
				case "echo":
					c.Delegates[i].RequestsPerMinute = 100
				case "model":
					c.Delegates[i].TokensPerMinute = 10_000
				}
			}
		},
	})
	ctx := testCtx(t)
	run := func(target string) string {
		t.Helper()
		res, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "call " + target, Retry: &stubbornv1.RetrySpec{
			Target: target, Attempts: new(int32), OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL,
		}})
		require.NoError(t, err)
		runToEnd(t, ctx, e.client, res.GetRunId())
		return res.GetRunId()
	}

	d := describeDelegate(t, ctx, e.client, "fragile")
	assert.Empty(t, d.GetRecentFailures(), "no call yet")
	assert.Nil(t, d.GetCircuitBreakerOpenUntil(), "closed")

	first, second := run("fragile"), run("fragile")
	refused := run("fragile") // the breaker is open: not sent, not a failure
	got, err := e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: refused})
	require.NoError(t, err)
	require.Equal(t, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SKIPPED, got.GetState().GetAttemptLog()[0].GetOutcome())

	d = describeDelegate(t, ctx, e.client, "fragile")
	require.Equal(t, stubbornv1.BreakerState_BREAKER_STATE_OPEN, d.GetCircuitBreaker())
	assert.Equal(t, "2 transient failures in a row", d.GetCircuitBreakerReason())
	fails := d.GetRecentFailures()
	require.Len(t, fails, 2)
	for i, id := range []string{second, first} { // newest first
		f := fails[i]
		assert.Equal(t, id, f.GetRunId(), "failure %d", i)
		assert.EqualValues(t, 1, f.GetAttempt(), "failure %d", i)
		assert.EqualValues(t, codes.Unavailable, f.GetCode(), "failure %d", i)
		assert.True(t, strings.HasPrefix(f.GetMessage(), "fragile: down xxx"), "failure %d: %q", i, f.GetMessage())
		assert.Contains(t, f.GetMessage(), "bytes cut]", "failure %d", i)
		assert.Less(t, len(f.GetMessage()), 340, "failure %d", i)
		require.NotNil(t, f.GetTime(), "failure %d", i)
	}
	// Open from the second failure, for the cooldown: until an hour after
	// it, on the server's clock.
	until := d.GetCircuitBreakerOpenUntil()
	require.NotNil(t, until)
	assert.False(t, until.AsTime().Before(fails[0].GetTime().AsTime().Add(time.Hour)), "until %v, second failure %v", until.AsTime(), fails[0].GetTime().AsTime())
	assert.False(t, until.AsTime().After(clock.Now().Add(time.Hour)), "until %v, now %v", until.AsTime(), clock.Now())

	// Rate use: the calls (and tokens) within the last minute.
	for range 3 {
		run("echo")
	}
	run("model")
	echo := describeDelegate(t, ctx, e.client, "echo")
	assert.EqualValues(t, 3, echo.GetRequestsLastMinute())
	assert.EqualValues(t, 0, echo.GetTokensLastMinute())
	assert.Empty(t, echo.GetRecentFailures())
	m := describeDelegate(t, ctx, e.client, "model")
	assert.EqualValues(t, 1, m.GetRequestsLastMinute())
	assert.EqualValues(t, 42, m.GetTokensLastMinute())
	list, err := e.client.ListDelegates(ctx, &stubbornv1.ListDelegatesRequest{})
	require.NoError(t, err)
	require.NotNil(t, list.GetServerTime())
	assert.False(t, list.GetServerTime().AsTime().After(clock.Now()))
	assert.False(t, list.GetServerTime().AsTime().Before(fails[0].GetTime().AsTime()))
	// No rate limit: nothing counted.
	assert.EqualValues(t, 0, d.GetRequestsLastMinute())
}

// GetRun and ListRuns say the server's time (on its clock, which stamps
// the runs' events): a client measures a wait in progress on it, not on
// its own clock. A summary carries the start of the run's brief.
func TestServerTimeAndSummaryBrief(t *testing.T) {
	clock := controlstest.NewClock()
	e := startWith(t, setup{clock: clock})
	ctx := testCtx(t)
	long := strings.Repeat("é", 100)
	ids := map[string]string{}
	for _, brief := range []string{"short one", long} {
		res, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: brief, FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}})
		require.NoError(t, err)
		runToEnd(t, ctx, e.client, res.GetRunId())
		ids[res.GetRunId()] = brief
	}
	// The clock moves on after the runs ended: the answers say so.
	_ = clock.Sleep(ctx, 2*time.Minute)
	for id := range ids {
		got, err := e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
		require.NoError(t, err)
		require.NotNil(t, got.GetServerTime())
		assert.False(t, got.GetServerTime().AsTime().Before(got.GetState().GetUpdateTime().AsTime().Add(2*time.Minute)),
			"server_time %v, the run's last change %v", got.GetServerTime().AsTime(), got.GetState().GetUpdateTime().AsTime())
		assert.False(t, got.GetServerTime().AsTime().After(clock.Now()))
	}
	for _, view := range []stubbornv1.RunView{stubbornv1.RunView_RUN_VIEW_SUMMARY, stubbornv1.RunView_RUN_VIEW_FULL} {
		list, err := e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{View: view})
		require.NoError(t, err)
		require.NotNil(t, list.GetServerTime(), "%v", view)
		assert.False(t, list.GetServerTime().AsTime().After(clock.Now()), "%v", view)
		assert.False(t, list.GetServerTime().AsTime().Before(clock.Now().Add(-time.Minute)), "%v", view)
	}
	list, err := e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{View: stubbornv1.RunView_RUN_VIEW_SUMMARY})
	require.NoError(t, err)
	require.Len(t, list.GetSummaries(), 2)
	for _, s := range list.GetSummaries() {
		want := ids[s.GetRunId()]
		if want == long {
			want = strings.Repeat("é", 80) + "…"
		}
		assert.Equal(t, want, s.GetBrief())
	}
}

// TestADelegatesRecentFailuresAreItsCallersOwn: a failure of tenant a's
// run (its run id, its message) is listed to a, not to b, which may use
// the same delegate.
func TestADelegatesRecentFailuresAreItsCallersOwn(t *testing.T) {
	e := startWith(t, setup{tenants: twoTenants(delegates.Limits{}, delegates.Limits{})})
	ctx := testCtx(t)
	zero := int32(0)
	stream, err := e.client.Run(as(ctx, tokenA), &stubbornv1.RunRequest{TaskBrief: "x", Retry: &stubbornv1.RetrySpec{
		Target: "down", Attempts: &zero, OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL}})
	require.NoError(t, err)
	evs := collect(t, stream)
	runID := evs[0].GetRunId()
	failuresOf := func(token string) []*stubbornv1.DelegateFailure {
		resp, err := e.client.ListDelegates(as(ctx, token), &stubbornv1.ListDelegatesRequest{})
		require.NoError(t, err)
		for _, d := range resp.GetDelegates() {
			if d.GetName() == "down" {
				return d.GetRecentFailures()
			}
		}
		t.Fatal("down is not listed")
		return nil
	}
	got := failuresOf(tokenA)
	require.Len(t, got, 1)
	assert.Equal(t, runID, got[0].GetRunId())
	assert.Empty(t, failuresOf(tokenB), "b sees none of a's runs' failures")
}

// ListDelegates over gRPC says what a delegate's latest call did, for a
// delegate that no health check ever asked: nothing before a call; the
// latest call's time and code, and since when its calls fail (the first
// failure after the latest success); OK once one succeeds, and failing
// again from the next failure. Another tenant sees none of it.
func TestListDelegatesSaysWhatTheLatestCallDid(t *testing.T) {
	clock := controlstest.NewClock()
	var failing atomic.Bool
	flaky := demo.NewScripted(func(context.Context, *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		if failing.Load() {
			return nil, status.Error(codes.Unavailable, "flaky: connection refused")
		}
		return &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{Text: "ok"}}, nil
	})
	e := startWith(t, setup{clock: clock, extra: map[string]stubbornv1.DelegateServiceServer{"flaky": flaky},
		tenants: twoTenants(delegates.Limits{}, delegates.Limits{})})
	ctx := as(testCtx(t), tokenA)
	run := func() {
		t.Helper()
		res, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "call", Retry: &stubbornv1.RetrySpec{
			Target: "flaky", Attempts: new(int32), OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL,
		}})
		require.NoError(t, err)
		runToEnd(t, ctx, e.client, res.GetRunId())
		_ = clock.Sleep(ctx, time.Minute)
	}

	d := describeDelegate(t, ctx, e.client, "flaky")
	require.Equal(t, stubbornv1.DelegateHealth_DELEGATE_HEALTH_UNSPECIFIED, d.GetHealth(), "a retry asks no health")
	assert.Nil(t, d.GetLastCallTime(), "no call yet")
	assert.Nil(t, d.GetFailingSince(), "no call yet")

	failing.Store(true)
	run()
	run()
	d = describeDelegate(t, ctx, e.client, "flaky")
	fails := d.GetRecentFailures()
	require.Len(t, fails, 2)
	require.NotNil(t, d.GetLastCallTime())
	assert.Equal(t, fails[0].GetTime().AsTime(), d.GetLastCallTime().AsTime(), "the latest call is the latest failure")
	assert.EqualValues(t, codes.Unavailable, d.GetLastCallCode())
	require.NotNil(t, d.GetFailingSince())
	assert.Equal(t, fails[1].GetTime().AsTime(), d.GetFailingSince().AsTime(), "failing since the first failure")
	assert.Equal(t, "flaky: connection refused", fails[0].GetMessage())

	failing.Store(false)
	before := clock.Now()
	run()
	d = describeDelegate(t, ctx, e.client, "flaky")
	require.NotNil(t, d.GetLastCallTime())
	assert.False(t, d.GetLastCallTime().AsTime().Before(before), "the success is the latest call")
	assert.EqualValues(t, codes.OK, d.GetLastCallCode())
	assert.Nil(t, d.GetFailingSince(), "it succeeded")

	failing.Store(true)
	run()
	d = describeDelegate(t, ctx, e.client, "flaky")
	require.NotNil(t, d.GetFailingSince())
	assert.Equal(t, d.GetRecentFailures()[0].GetTime().AsTime(), d.GetFailingSince().AsTime(), "failing again since the new failure")
	assert.Equal(t, d.GetLastCallTime().AsTime(), d.GetFailingSince().AsTime())

	b := describeDelegate(t, as(testCtx(t), tokenB), e.client, "flaky")
	assert.Nil(t, b.GetLastCallTime(), "b's runs made no call")
	assert.Nil(t, b.GetFailingSince())
	assert.Empty(t, b.GetRecentFailures())
}
