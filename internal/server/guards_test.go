package server_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// describeDelegate returns ListDelegates' entry for name.
func describeDelegate(t *testing.T, ctx context.Context, c stubbornv1.ControlServiceClient, name string) *stubbornv1.DelegateDescription {
	t.Helper()
	list, err := c.ListDelegates(ctx, &stubbornv1.ListDelegatesRequest{})
	require.NoError(t, err)
	for _, d := range list.GetDelegates() {
		if d.GetName() == name {
			return d
		}
	}
	t.Fatalf("no delegate %q", name)
	return nil
}

// A delegate that fails 10 times in a row, under concurrent runs, opens its
// circuit breaker: later runs skip it without calling it (a fallback chain
// goes on to the next delegate, a retry fails at once), and after the
// cooldown one probe call closes it again.
func TestCircuitBreakerEndToEnd(t *testing.T) {
	var failing atomic.Bool
	failing.Store(true)
	var calls atomic.Int64
	fragile := demo.NewScripted(func(_ context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		calls.Add(1)
		if failing.Load() {
			return nil, status.Error(codes.Unavailable, "fragile: down")
		}
		return &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{Text: "fragile: " + req.GetBrief()}}, nil
	})
	const cooldown = 300 * time.Millisecond
	e := startWith(t, setup{
		extra: map[string]stubbornv1.DelegateServiceServer{"fragile": fragile},
		configure: func(c *delegates.Config) {
			for i := range c.Delegates {
				if c.Delegates[i].Name == "fragile" {
					c.Delegates[i].CircuitBreaker = &delegates.CircuitBreaker{ConsecutiveFailures: 10, Cooldown: delegates.Duration(cooldown)}
				}
			}
		},
	})
	ctx := testCtx(t)
	assert.Equal(t, stubbornv1.BreakerState_BREAKER_STATE_CLOSED, describeDelegate(t, ctx, e.client, "fragile").GetCircuitBreaker())
	chainRun := func(brief string) *stubbornv1.ControlState {
		res, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: brief, FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"fragile", "echo"}}})
		require.NoError(t, err)
		runToEnd(t, ctx, e.client, res.GetRunId())
		st, err := e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: res.GetRunId()})
		require.NoError(t, err)
		return st.GetState()
	}

	// Ten concurrent runs, ten failures of fragile: the breaker opens.
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() {
			st := chainRun(fmt.Sprintf("first %d", i))
			assert.Equal(t, "echo", st.GetWinner())
		})
	}
	wg.Wait()
	require.EqualValues(t, 10, calls.Load())
	d := describeDelegate(t, ctx, e.client, "fragile")
	require.Equal(t, stubbornv1.BreakerState_BREAKER_STATE_OPEN, d.GetCircuitBreaker())
	assert.Equal(t, "10 transient failures in a row", d.GetCircuitBreakerReason())

	// Open: fragile is skipped, never called.
	for i := range 5 {
		st := chainRun(fmt.Sprintf("while open %d", i))
		assert.Equal(t, "echo", st.GetWinner())
		first := st.GetAttemptLog()[0]
		assert.Equal(t, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SKIPPED, first.GetOutcome())
		assert.Equal(t, stubbornv1.RefusedBy_REFUSED_BY_CIRCUIT_BREAKER, first.GetError().GetRefusedBy())
		assert.Equal(t, stubbornv1.FailureSource_FAILURE_SOURCE_CIRCUIT_BREAKER, st.GetFailureHistory()[0].GetSource())
	}
	res, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "retry it", Retry: &stubbornv1.RetrySpec{Target: "fragile"}})
	require.NoError(t, err)
	runToEnd(t, ctx, e.client, res.GetRunId())
	st, err := e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: res.GetRunId()})
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, st.GetState().GetStatus())
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_NOT_RETRIED, st.GetState().GetStatusReasonCode())
	assert.Contains(t, st.GetState().GetStatusReason(), "circuit breaker open (10 transient failures in a row)")
	assert.EqualValues(t, 10, calls.Load(), "no call while open")

	// After the cooldown one probe goes, answers, and closes it.
	failing.Store(false)
	require.Eventually(t, func() bool {
		return describeDelegate(t, ctx, e.client, "fragile").GetCircuitBreaker() == stubbornv1.BreakerState_BREAKER_STATE_HALF_OPEN
	}, 10*time.Second, 20*time.Millisecond)
	probe := chainRun("probe")
	assert.Equal(t, "fragile", probe.GetWinner())
	assert.EqualValues(t, 11, calls.Load(), "one probe")
	assert.Equal(t, stubbornv1.BreakerState_BREAKER_STATE_CLOSED, describeDelegate(t, ctx, e.client, "fragile").GetCircuitBreaker())
	assert.Equal(t, "fragile", chainRun("closed again").GetWinner())
	assert.EqualValues(t, 12, calls.Load())
}

// retry.retry_on is checked at submission.
func TestRetryOnValidated(t *testing.T) {
	e := start(t, delegates.Limits{})
	ctx := testCtx(t)
	_, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "x", Retry: &stubbornv1.RetrySpec{
		Target: "echo", RetryOn: &stubbornv1.RetryOn{GrpcCodes: []string{"UNAVAILBLE"}, HttpStatuses: []int32{200}},
	}})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	assert.ErrorContains(t, err, `retry.retry_on.grpc_codes[0]: "UNAVAILBLE" is not a gRPC code name`)
	assert.ErrorContains(t, err, "retry.retry_on.http_statuses[0]: must be between 400 and 599, got 200")
}
