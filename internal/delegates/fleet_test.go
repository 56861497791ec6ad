package delegates

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/fleetguard/fleetguardtest"
)

// fleetGuards returns a replica's guards of d on the fleet of n, on clock.
func fleetGuards(t *testing.T, n *fleetguardtest.NATS, replica string, clock *controlstest.Clock, d Delegate) *Guards {
	t.Helper()
	g := newGuards(t, clock, d)
	g.UseFleet(n.Fleet(t, replica, clock.Now))
	return g
}

// call admits one call and ends it with err; it returns Admit's error.
func call(g *Guards, err error) error {
	done, aerr := g.Admit(context.Background(), "d")
	if aerr != nil {
		return aerr
	}
	done(nil, err)
	return nil
}

func refusedBy(err error) stubbornv1.RefusedBy {
	ce, _ := err.(*controls.CallError)
	if ce == nil {
		return stubbornv1.RefusedBy_REFUSED_BY_UNSPECIFIED
	}
	return ce.RefusedBy
}

// A breaker that one replica's failures open refuses on the other replica
// within a second, which says who opened it; after the cooldown the fleet
// lets probes calls through in all, whose answers close it everywhere.
func TestFleetBreakerIsTheFleets(t *testing.T) {
	n := fleetguardtest.StartNATS(t)
	clock := controlstest.NewClock()
	d := Delegate{Name: "d", CircuitBreaker: &CircuitBreaker{ConsecutiveFailures: 3, Cooldown: Duration(10 * time.Second), Probes: 2}}
	g1, g2 := fleetGuards(t, n, "r1", clock, d), fleetGuards(t, n, "r2", clock, d)
	var trs []Transition
	var mu sync.Mutex
	g2.OnTransition = func(_ string, tr Transition) { mu.Lock(); trs = append(trs, tr); mu.Unlock() }

	for range 3 {
		require.NoError(t, call(g1, transientErr))
	}
	require.Eventually(t, func() bool {
		return refusedBy(call(g2, nil)) == stubbornv1.RefusedBy_REFUSED_BY_CIRCUIT_BREAKER
	}, time.Second, 5*time.Millisecond, "r2 refuses within 1s of r1 opening the breaker")
	err := call(g2, nil)
	assert.Contains(t, err.Error(), "opened by replica r1")
	assert.True(t, g2.BreakerOpen("d"), "what a balance weighs: the fleet's breaker")
	assert.True(t, StandingGuards{Guards: g2}.Standing("d").Open, "a balance on r2 leaves d out")
	desc := &stubbornv1.DelegateDescription{}
	g2.describe("d", desc)
	assert.Equal(t, stubbornv1.BreakerState_BREAKER_STATE_OPEN, desc.GetCircuitBreaker())
	assert.Equal(t, "r1", desc.GetCircuitBreakerOpenedBy())
	assert.Equal(t, stubbornv1.GuardScope_GUARD_SCOPE_FLEET, desc.GetGuardScope())
	assert.Contains(t, desc.GetCircuitBreakerReason(), "3 transient failures in a row")
	mu.Lock()
	require.NotEmpty(t, trs, "r2's metrics hear of the opening")
	assert.Equal(t, breakerOpen, trs[0].To)
	assert.Contains(t, trs[0].Why, "r1")
	assert.True(t, trs[0].Fleet, "the metrics say it is the fleet's breaker")
	assert.Equal(t, "r1", trs[0].OpenedBy)
	mu.Unlock()

	// The cooldown over: two probes in all, one through each replica.
	require.NoError(t, clock.Sleep(context.Background(), 10*time.Second))
	p1, err := g1.Admit(context.Background(), "d")
	require.NoError(t, err)
	p2, err := g2.Admit(context.Background(), "d")
	require.NoError(t, err)
	for _, g := range []*Guards{g1, g2} {
		_, err := g.Admit(context.Background(), "d")
		assert.Equal(t, stubbornv1.RefusedBy_REFUSED_BY_CIRCUIT_BREAKER, refusedBy(err), "a third probe")
		assert.Contains(t, err.Error(), "probe")
	}
	assert.Contains(t, p1(nil, nil), "this call was a probe")
	assert.Contains(t, p2(nil, nil), "half-open → closed")
	require.Eventually(t, func() bool { return call(g1, nil) == nil && call(g2, nil) == nil }, time.Second, 5*time.Millisecond)
}

// A probe's failure opens the fleet's breaker again, for a new cooldown.
func TestFleetProbeFailureReopens(t *testing.T) {
	n := fleetguardtest.StartNATS(t)
	clock := controlstest.NewClock()
	d := Delegate{Name: "d", CircuitBreaker: &CircuitBreaker{ConsecutiveFailures: 1, Cooldown: Duration(5 * time.Second)}}
	g1, g2 := fleetGuards(t, n, "r1", clock, d), fleetGuards(t, n, "r2", clock, d)
	require.NoError(t, call(g1, transientErr))
	require.Eventually(t, func() bool { return call(g2, nil) != nil }, time.Second, 5*time.Millisecond)
	require.NoError(t, clock.Sleep(context.Background(), 5*time.Second))
	require.NoError(t, call(g2, transientErr), "r2's probe")
	require.Eventually(t, func() bool {
		rec, _ := g1.fleet.Breaker("d")
		return rec.OpenedBy == "r2" && rec.Epoch == 2
	}, time.Second, 5*time.Millisecond)
	err := call(g1, nil)
	assert.Equal(t, stubbornv1.RefusedBy_REFUSED_BY_CIRCUIT_BREAKER, refusedBy(err))
	assert.Contains(t, err.Error(), "a probe call failed")
}

// Probes taken by a replica that never reports them are offered again a
// cooldown later: the fleet's breaker does not stay half-open for good.
func TestFleetLostProbeOfferedAgain(t *testing.T) {
	n := fleetguardtest.StartNATS(t)
	clock := controlstest.NewClock()
	d := Delegate{Name: "d", CircuitBreaker: &CircuitBreaker{ConsecutiveFailures: 1, Cooldown: Duration(5 * time.Second)}}
	g1, g2 := fleetGuards(t, n, "r1", clock, d), fleetGuards(t, n, "r2", clock, d)
	require.NoError(t, call(g1, transientErr))
	require.Eventually(t, func() bool { return call(g2, nil) != nil }, time.Second, 5*time.Millisecond)
	require.NoError(t, clock.Sleep(context.Background(), 5*time.Second))
	_, err := g1.Admit(context.Background(), "d") // a probe never reported
	require.NoError(t, err)
	require.Error(t, call(g2, nil))
	require.NoError(t, clock.Sleep(context.Background(), 5*time.Second))
	require.NoError(t, call(g2, nil), "the lost probe offered again")
}

// Replicas sharing a delegate's requests_per_minute send it at most that
// many calls within a minute, however the calls spread over them.
func TestFleetRateLimitIsTheFleets(t *testing.T) {
	n := fleetguardtest.StartNATS(t)
	clock := controlstest.NewClock()
	zero := Duration(0)
	d := Delegate{Name: "d", RequestsPerMinute: 40, MaxQueueWait: &zero}
	gs := []*Guards{fleetGuards(t, n, "r1", clock, d), fleetGuards(t, n, "r2", clock, d), fleetGuards(t, n, "r3", clock, d)}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for i := range 90 {
		wg.Go(func() {
			if err := call(gs[i%3], nil); err == nil {
				admitted.Add(1)
			} else {
				assert.Equal(t, stubbornv1.RefusedBy_REFUSED_BY_RATE_LIMIT, refusedBy(err))
			}
		})
	}
	wg.Wait()
	assert.EqualValues(t, 40, admitted.Load(), "the fleet's 40 a minute, not 40 a replica")
	desc := &stubbornv1.DelegateDescription{}
	gs[2].describe("d", desc)
	assert.EqualValues(t, 40, desc.GetRequestsLastMinute())
	// What a balance weighs: the fleet's use as last read, not this
	// replica's own share of it.
	reqs, _, rpm, _, ok := gs[2].RateUsage("d")
	require.True(t, ok)
	assert.EqualValues(t, 40, reqs)
	assert.EqualValues(t, 40, rpm)
	// Past the window (and the lease's life), the budget is back.
	require.NoError(t, clock.Sleep(context.Background(), 62*time.Second))
	assert.NoError(t, call(gs[0], nil))
}

// A lease's unused calls go back to the fleet with the replica's next lease.
func TestFleetUnusedLeaseGivenBack(t *testing.T) {
	n := fleetguardtest.StartNATS(t)
	clock := controlstest.NewClock()
	zero := Duration(0)
	d := Delegate{Name: "d", RequestsPerMinute: 60, MaxQueueWait: &zero} // leases of 3
	g1, g2 := fleetGuards(t, n, "r1", clock, d), fleetGuards(t, n, "r2", clock, d)
	require.NoError(t, call(g1, nil)) // r1 leases 3, uses 1
	for range 57 {
		require.NoError(t, call(g2, nil))
	}
	require.Error(t, call(g2, nil), "r1 holds the last 2")
	require.NoError(t, clock.Sleep(context.Background(), 2*time.Second)) // r1's lease expired
	// Its next lease gives the 2 back in the same write, which leaves
	// room for 2 more.
	require.NoError(t, call(g1, nil))
	require.NoError(t, call(g1, nil))
	require.Error(t, call(g1, nil))
	require.Error(t, call(g2, nil))
}

// Cut off from the fleet's store, a replica guards with its own counts
// (and says so), and never refuses every call; back, it obeys the fleet's
// state again.
func TestFleetFallbackAndRejoin(t *testing.T) {
	n := fleetguardtest.StartNATS(t)
	clock := controlstest.NewClock()
	d := Delegate{Name: "d", CircuitBreaker: &CircuitBreaker{ConsecutiveFailures: 2, Cooldown: Duration(time.Hour)}, RequestsPerMinute: 100}
	g1 := fleetGuards(t, n, "r1", clock, d)
	n.Shutdown()
	require.Eventually(t, func() bool { up, _ := g1.fleet.Scope(); return !up }, 5*time.Second, 10*time.Millisecond)
	desc := &stubbornv1.DelegateDescription{}
	g1.describe("d", desc)
	assert.Equal(t, stubbornv1.GuardScope_GUARD_SCOPE_LOCAL, desc.GetGuardScope())
	assert.NotEmpty(t, desc.GetGuardScopeReason())
	for range 5 {
		require.NoError(t, call(g1, nil), "its own counts let calls through")
	}
	n.Restart(t)
	g2 := fleetGuards(t, n, "r2", clock, d)
	require.NoError(t, call(g2, transientErr))
	require.NoError(t, call(g2, transientErr))
	require.Eventually(t, func() bool {
		return refusedBy(call(g1, nil)) == stubbornv1.RefusedBy_REFUSED_BY_CIRCUIT_BREAKER
	}, 15*time.Second, 20*time.Millisecond, "r1 rejoins and obeys the breaker r2 opened")
	g1.describe("d", desc)
	assert.Equal(t, stubbornv1.GuardScope_GUARD_SCOPE_FLEET, desc.GetGuardScope())
	assert.Equal(t, "r2", desc.GetCircuitBreakerOpenedBy())
}

// Cut off, a replica that opens its own breaker names itself as the one
// that opened it.
func TestFleetCutOffOpensItsOwnBreaker(t *testing.T) {
	n := fleetguardtest.StartNATS(t)
	clock := controlstest.NewClock()
	d := Delegate{Name: "d", CircuitBreaker: &CircuitBreaker{ConsecutiveFailures: 2, Cooldown: Duration(time.Hour)}}
	g1 := fleetGuards(t, n, "r1", clock, d)
	n.Shutdown()
	require.Eventually(t, func() bool { up, _ := g1.fleet.Scope(); return !up }, 5*time.Second, 10*time.Millisecond)
	desc := &stubbornv1.DelegateDescription{}
	g1.describe("d", desc)
	assert.Empty(t, desc.GetCircuitBreakerOpenedBy(), "closed: opened by no one")
	require.NoError(t, call(g1, transientErr))
	require.NoError(t, call(g1, transientErr))
	desc = &stubbornv1.DelegateDescription{}
	g1.describe("d", desc)
	assert.Equal(t, stubbornv1.GuardScope_GUARD_SCOPE_LOCAL, desc.GetGuardScope())
	assert.Equal(t, stubbornv1.BreakerState_BREAKER_STATE_OPEN, desc.GetCircuitBreaker(), "its own breaker opened")
	assert.Equal(t, "r1", desc.GetCircuitBreakerOpenedBy())
}

// A breaker a replica opened on its own counts while cut off opens the
// fleet's when it is back: the other replicas, and it, refuse the
// delegate until its cooldown ends, rather than each find it failing
// again.
func TestFleetCutOffBreakerOpensTheFleetsOnRejoin(t *testing.T) {
	n := fleetguardtest.StartNATS(t)
	clock := controlstest.NewClock()
	d := Delegate{Name: "d", CircuitBreaker: &CircuitBreaker{ConsecutiveFailures: 2, Cooldown: Duration(time.Hour)}}
	g1 := fleetGuards(t, n, "r1", clock, d)
	n.Shutdown()
	require.Eventually(t, func() bool { up, _ := g1.fleet.Scope(); return !up }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, call(g1, transientErr))
	require.NoError(t, call(g1, transientErr))
	require.Equal(t, stubbornv1.RefusedBy_REFUSED_BY_CIRCUIT_BREAKER, refusedBy(call(g1, nil)), "its own breaker opened")
	n.Restart(t)
	g2 := fleetGuards(t, n, "r2", clock, d)
	require.Eventually(t, func() bool { up, _ := g1.fleet.Scope(); return up }, 15*time.Second, 20*time.Millisecond, "r1 rejoins")
	assert.Equal(t, stubbornv1.RefusedBy_REFUSED_BY_CIRCUIT_BREAKER, refusedBy(call(g1, nil)), "back, r1 still refuses")
	require.Eventually(t, func() bool {
		return refusedBy(call(g2, nil)) == stubbornv1.RefusedBy_REFUSED_BY_CIRCUIT_BREAKER
	}, 5*time.Second, 20*time.Millisecond, "r2 obeys the breaker r1 opened while cut off")
	desc := &stubbornv1.DelegateDescription{}
	g2.describe("d", desc)
	assert.Equal(t, "r1", desc.GetCircuitBreakerOpenedBy())
}

// Cut off, a replica takes its share of the rate limits (the replicas it
// last saw leasing divide them), counting the calls it sent meanwhile, and
// the fleet's breaker as last seen open still refuses.
func TestFleetFallbackTakesItsShare(t *testing.T) {
	n := fleetguardtest.StartNATS(t)
	clock := controlstest.NewClock()
	zero := Duration(0)
	d := Delegate{Name: "d", RequestsPerMinute: 30, MaxQueueWait: &zero}
	g1, g2 := fleetGuards(t, n, "r1", clock, d), fleetGuards(t, n, "r2", clock, d)
	require.NoError(t, call(g2, nil))
	require.NoError(t, call(g1, nil)) // r1's lease read r2's grant: 2 replicas
	n.Shutdown()
	require.Eventually(t, func() bool { up, _ := g1.fleet.Scope(); return !up }, 5*time.Second, 10*time.Millisecond)
	sent := 0
	for range 30 {
		if call(g1, nil) == nil {
			sent++
		}
	}
	assert.Equal(t, 14, sent, "half of 30, less the call it sent before")

	cb := Delegate{Name: "d", CircuitBreaker: &CircuitBreaker{ConsecutiveFailures: 1, Cooldown: Duration(time.Hour)}}
	n.Restart(t)
	g3, g4 := fleetGuards(t, n, "r3", clock, cb), fleetGuards(t, n, "r4", clock, cb)
	require.NoError(t, call(g3, transientErr))
	require.Eventually(t, func() bool { return call(g4, nil) != nil }, time.Second, 5*time.Millisecond)
	n.Shutdown()
	require.Eventually(t, func() bool { up, _ := g4.fleet.Scope(); return !up }, 5*time.Second, 10*time.Millisecond)
	err := call(g4, nil)
	assert.Equal(t, stubbornv1.RefusedBy_REFUSED_BY_CIRCUIT_BREAKER, refusedBy(err), "the opening it saw stands")
}

// Cut off past the cooldown of the fleet's opening it last saw, a replica
// does not send every call: its breaker follows that opening, so its own
// probe goes first (one here), the others refused while it is in flight;
// a probe that fails opens its breaker again, one that answers closes it,
// for good.
func TestFleetCutOffPastTheCooldownProbesFirst(t *testing.T) {
	n := fleetguardtest.StartNATS(t)
	clock := controlstest.NewClock()
	d := Delegate{Name: "d", CircuitBreaker: &CircuitBreaker{ConsecutiveFailures: 1, Cooldown: Duration(time.Minute), Probes: 1}}
	g1, g2 := fleetGuards(t, n, "r1", clock, d), fleetGuards(t, n, "r2", clock, d)
	require.NoError(t, call(g1, transientErr))
	require.Eventually(t, func() bool { return call(g2, nil) != nil }, time.Second, 5*time.Millisecond, "r2 sees r1's opening")
	n.Shutdown()
	require.Eventually(t, func() bool { up, _ := g2.fleet.Scope(); return !up }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, clock.Sleep(context.Background(), time.Minute))

	probe, err := g2.Admit(context.Background(), "d")
	require.NoError(t, err, "past the cooldown, a probe")
	err = call(g2, nil)
	assert.Equal(t, stubbornv1.RefusedBy_REFUSED_BY_CIRCUIT_BREAKER, refusedBy(err), "a second call while the probe is in flight")
	assert.Contains(t, err.Error(), "probe")
	desc := &stubbornv1.DelegateDescription{}
	g2.describe("d", desc)
	assert.Equal(t, stubbornv1.GuardScope_GUARD_SCOPE_LOCAL, desc.GetGuardScope())
	assert.Equal(t, "r1", desc.GetCircuitBreakerOpenedBy(), "the opening it follows is r1's")
	probe(nil, transientErr)
	assert.Equal(t, stubbornv1.RefusedBy_REFUSED_BY_CIRCUIT_BREAKER, refusedBy(call(g2, nil)), "the probe failed: open again")

	require.NoError(t, clock.Sleep(context.Background(), time.Minute))
	require.NoError(t, call(g2, nil), "the next probe answers")
	for i := range 3 {
		require.NoError(t, call(g2, nil), "closed on its probe's answer: call %d", i)
	}
}

// A replica's own opening, made while cut off, stands while the fleet's
// store does not answer, even for a call admitted as the fleet was seen up
// a moment before: it does not close it and go through.
func TestFleetOwnOpeningStandsWhileTheStoreIsDown(t *testing.T) {
	n := fleetguardtest.StartNATS(t)
	clock := controlstest.NewClock()
	d := Delegate{Name: "d", CircuitBreaker: &CircuitBreaker{ConsecutiveFailures: 2, Cooldown: Duration(time.Hour)}}
	g := fleetGuards(t, n, "r1", clock, d)
	require.NoError(t, call(g, nil), "the fleet's record read")
	n.Shutdown()
	require.Eventually(t, func() bool { up, _ := g.fleet.Scope(); return !up }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, call(g, transientErr))
	require.NoError(t, call(g, transientErr))
	require.Equal(t, stubbornv1.RefusedBy_REFUSED_BY_CIRCUIT_BREAKER, refusedBy(call(g, nil)), "its own breaker opened")

	set, br, _, _ := g.get("d").parts()
	late := admitted{g: g, name: "d", set: set, br: br, fl: g.fleet} // admitted as the fleet was up
	assert.Contains(t, late.allow(context.Background()), "circuit breaker open")
	assert.Equal(t, stubbornv1.RefusedBy_REFUSED_BY_CIRCUIT_BREAKER, refusedBy(call(g, nil)), "its own opening still stands")
}

// The tokens one replica's answers report count against the fleet's
// tokens_per_minute: once they reach the ledger, another replica's calls
// wait for room, and are refused past max_queue_wait.
func TestFleetTokensPerMinute(t *testing.T) {
	n := fleetguardtest.StartNATS(t)
	clock := controlstest.NewClock()
	zero := Duration(0)
	d := Delegate{Name: "d", TokensPerMinute: 1000, MaxQueueWait: &zero}
	g1, g2 := fleetGuards(t, n, "r1", clock, d), fleetGuards(t, n, "r2", clock, d)
	done, err := g1.Admit(context.Background(), "d")
	require.NoError(t, err)
	data, err := structpb.NewValue(map[string]any{"usage": map[string]any{"total_tokens": 1200}})
	require.NoError(t, err)
	done(&stubbornv1.Result{Data: data}, nil)
	// g2 still holds calls leased before the tokens were reported, at
	// most a lease's (10) within its life; past it, the ledger says no.
	require.NoError(t, clock.Sleep(context.Background(), 2*time.Second))
	require.Eventually(t, func() bool {
		return refusedBy(call(g2, nil)) == stubbornv1.RefusedBy_REFUSED_BY_RATE_LIMIT
	}, 3*time.Second, 20*time.Millisecond, "r2 refused once r1's tokens reach the ledger")
	desc := &stubbornv1.DelegateDescription{}
	g2.describe("d", desc)
	assert.EqualValues(t, 1200, desc.GetTokensLastMinute())
}
