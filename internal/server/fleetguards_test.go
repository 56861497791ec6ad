package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
	"github.com/stubbornhq/stubborn/internal/fleetguard/fleetguardtest"
)

// Two servers on one fleet: a breaker that opens through one is open in
// the other's ListDelegates, which names the server that opened it and
// says the guards are the fleet's; a server with no fleet says nothing of
// a scope.
func TestListDelegatesShowsTheFleetsBreaker(t *testing.T) {
	n := fleetguardtest.StartNATS(t)
	down := demo.NewScripted(func(context.Context, *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		return nil, status.Error(codes.Unavailable, "down")
	})
	breaker := func(c *delegates.Config) {
		for i := range c.Delegates {
			if c.Delegates[i].Name == "down" {
				c.Delegates[i].CircuitBreaker = &delegates.CircuitBreaker{ConsecutiveFailures: 2, Cooldown: delegates.Duration(time.Hour)}
			}
		}
	}
	a := startWith(t, setup{extra: map[string]stubbornv1.DelegateServiceServer{"down": down}, configure: breaker, fleet: n.Fleet(t, "server-a", nil)})
	b := startWith(t, setup{extra: map[string]stubbornv1.DelegateServiceServer{"down": down}, configure: breaker, fleet: n.Fleet(t, "server-b", nil)})
	alone := startWith(t, setup{extra: map[string]stubbornv1.DelegateServiceServer{"down": down}, configure: breaker})
	ctx := testCtx(t)
	zero := int32(0)
	for range 2 {
		res, err := a.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "x", Retry: &stubbornv1.RetrySpec{
			Target: "down", Attempts: &zero, OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL}})
		require.NoError(t, err)
		runToEnd(t, ctx, a.client, res.GetRunId())
	}
	require.Eventually(t, func() bool {
		d := describeDelegate(t, ctx, b.client, "down")
		return d.GetCircuitBreaker() == stubbornv1.BreakerState_BREAKER_STATE_OPEN
	}, time.Second, 10*time.Millisecond)
	d := describeDelegate(t, ctx, b.client, "down")
	assert.Equal(t, "server-a", d.GetCircuitBreakerOpenedBy())
	assert.Equal(t, stubbornv1.GuardScope_GUARD_SCOPE_FLEET, d.GetGuardScope())
	assert.NotNil(t, d.GetCircuitBreakerOpenUntil())
	d = describeDelegate(t, ctx, alone.client, "down")
	assert.Equal(t, stubbornv1.BreakerState_BREAKER_STATE_CLOSED, d.GetCircuitBreaker())
	assert.Equal(t, stubbornv1.GuardScope_GUARD_SCOPE_UNSPECIFIED, d.GetGuardScope())
	assert.Empty(t, d.GetCircuitBreakerOpenedBy())
}
