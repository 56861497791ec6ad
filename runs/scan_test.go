package runs_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/controls"
	"github.com/stubbornhq/stubborn/controls/controlstest"
	"github.com/stubbornhq/stubborn/runs"
)

// countingOwners counts the listings of every run's driver.
type countingOwners struct {
	runs.Store
	listed atomic.Int64
}

func (c *countingOwners) Owners(ctx context.Context, fn func(runID, owner string) bool) error {
	c.listed.Add(1)
	return c.Store.Owners(ctx, fn)
}

func TestDriversAreListedOnlyWhenAServerStopsBeating(t *testing.T) {
	// Long enough that a loaded machine does not miss a beat (one every
	// lease/3): a missed one would count as b stopping.
	const lease = time.Second
	store := runs.NewMemory(lease)
	counted := &countingOwners{Store: store}
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {{Hang: true}, controlstest.OK("x")}})
	d.SetInfo("a", controls.DelegateInfo{Idempotent: true})
	a := newManager(t, d, runs.Config{Store: counted, Lease: lease, Owner: "a", Clock: controls.RealClock{}})
	b, err := runs.New(runs.Config{Delegates: d, Store: store, Lease: lease, Owner: "b", Clock: controls.RealClock{}})
	require.NoError(t, err)
	st, err := b.Start(context.Background(), "brief", chain("a"), nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(d.Calls()) == 1 }, 5*time.Second, time.Millisecond)

	time.Sleep(5 * lease / 2) // five scans' time: b beats all along
	assert.Equal(t, int64(1), counted.listed.Load(), "only the first scan lists the drivers")

	b.Kill()
	evs := watchAll(t, a, st.GetRunId(), 0)
	assert.Contains(t, kinds(evs), "run_resumed", "a took b's run over once b stopped beating")
	final(t, evs)
	assert.GreaterOrEqual(t, counted.listed.Load(), int64(2))
}

// staleAlive answers its first liveness question with yes, as a replica
// that has not yet expired a heartbeat would.
type staleAlive struct {
	runs.Store
	asked atomic.Bool
}

func (s *staleAlive) Alive(ctx context.Context, owner string) (bool, error) {
	if !s.asked.Swap(true) {
		return true, nil
	}
	return s.Store.Alive(ctx, owner)
}

func TestAStaleLivenessReadIsLookedAtAgain(t *testing.T) {
	const lease = 200 * time.Millisecond
	store := runs.NewMemory(lease)
	stale := &staleAlive{Store: store}
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {{Hang: true}, controlstest.OK("x")}})
	d.SetInfo("a", controls.DelegateInfo{Idempotent: true})
	a := newManager(t, d, runs.Config{Store: stale, Lease: lease, Owner: "a", Clock: controls.RealClock{}})
	b, err := runs.New(runs.Config{Delegates: d, Store: store, Lease: lease, Owner: "b", Clock: controls.RealClock{}})
	require.NoError(t, err)
	st, err := b.Start(context.Background(), "brief", chain("a"), nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(d.Calls()) == 1 }, 5*time.Second, time.Millisecond)
	b.Kill()
	evs := watchAll(t, a, st.GetRunId(), 0)
	assert.Contains(t, kinds(evs), "run_resumed", "taken over on a later scan")
	assert.True(t, stale.asked.Load())
}

func TestAServerThatCameAndWentUnseenIsTakenOverAtTheNextFullScan(t *testing.T) {
	const lease = 100 * time.Millisecond // full scans every 10 × lease/2
	store := runs.NewMemory(lease)
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {{Hang: true}, controlstest.OK("x")}})
	d.SetInfo("a", controls.DelegateInfo{Idempotent: true})
	a := newManager(t, d, runs.Config{Store: store, Lease: lease, Owner: "a", Clock: controls.RealClock{}})
	b, err := runs.New(runs.Config{Delegates: d, Store: store, Lease: lease, Owner: "b", Clock: controls.RealClock{}})
	require.NoError(t, err)
	st, err := b.Start(context.Background(), "brief", chain("a"), nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(d.Calls()) == 1 }, 5*time.Second, time.Millisecond)
	b.Close() // leaves at once: a may never have listed b's heartbeat
	evs := watchAll(t, a, st.GetRunId(), 0)
	assert.Contains(t, kinds(evs), "run_resumed")
}
