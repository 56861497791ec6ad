package runs_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
	"github.com/stubbornhq/stubborn/internal/runs/memstore"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// countingOwners counts the listings of every run's driver.
type countingOwners struct {
	store.Store
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
	store := memstore.NewMemory(lease)
	counted := &countingOwners{Store: store}
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {{Hang: true}, controlstest.OK("x")}})
	d.SetInfo("a", controls.DelegateInfo{Idempotent: true})
	a := runstest.NewManager(t, d, runs.Config{Store: counted, Lease: lease, Owner: "a", Clock: controls.RealClock{}})
	b, err := runs.New(runs.Config{Delegates: d, Store: store, Lease: lease, Owner: "b", Clock: controls.RealClock{}})
	require.NoError(t, err)
	st, err := runstest.Start(b, context.Background(), "brief", runstest.Chain("a"), nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(d.Calls()) == 1 }, 5*time.Second, time.Millisecond)

	time.Sleep(5 * lease / 2) // five scans' time: b beats all along
	assert.Equal(t, int64(1), counted.listed.Load(), "only the first scan lists the drivers")

	b.Kill()
	evs := runstest.WatchAll(t, a, st.GetRunId(), 0)
	assert.Contains(t, kinds(evs), "run_resumed", "a took b's run over once b stopped beating")
	runstest.Final(t, evs)
	assert.GreaterOrEqual(t, counted.listed.Load(), int64(2))
}

// staleAlive answers its first liveness question with yes, as a replica
// that has not yet expired a heartbeat would.
type staleAlive struct {
	store.Store
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
	store := memstore.NewMemory(lease)
	stale := &staleAlive{Store: store}
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {{Hang: true}, controlstest.OK("x")}})
	d.SetInfo("a", controls.DelegateInfo{Idempotent: true})
	a := runstest.NewManager(t, d, runs.Config{Store: stale, Lease: lease, Owner: "a", Clock: controls.RealClock{}})
	b, err := runs.New(runs.Config{Delegates: d, Store: store, Lease: lease, Owner: "b", Clock: controls.RealClock{}})
	require.NoError(t, err)
	st, err := runstest.Start(b, context.Background(), "brief", runstest.Chain("a"), nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(d.Calls()) == 1 }, 5*time.Second, time.Millisecond)
	b.Kill()
	evs := runstest.WatchAll(t, a, st.GetRunId(), 0)
	assert.Contains(t, kinds(evs), "run_resumed", "taken over on a later scan")
	assert.True(t, stale.asked.Load())
}

func TestAServerThatCameAndWentUnseenIsTakenOverAtTheNextFullScan(t *testing.T) {
	const lease = 100 * time.Millisecond // full scans every 10 × lease/2
	store := memstore.NewMemory(lease)
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {{Hang: true}, controlstest.OK("x")}})
	d.SetInfo("a", controls.DelegateInfo{Idempotent: true})
	a := runstest.NewManager(t, d, runs.Config{Store: store, Lease: lease, Owner: "a", Clock: controls.RealClock{}})
	b, err := runs.New(runs.Config{Delegates: d, Store: store, Lease: lease, Owner: "b", Clock: controls.RealClock{}})
	require.NoError(t, err)
	st, err := runstest.Start(b, context.Background(), "brief", runstest.Chain("a"), nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(d.Calls()) == 1 }, 5*time.Second, time.Millisecond)
	b.Close() // leaves at once: a may never have listed b's heartbeat
	evs := runstest.WatchAll(t, a, st.GetRunId(), 0)
	assert.Contains(t, kinds(evs), "run_resumed")
}

// silent never beats: its server is never seen alive by the others.
type silent struct{ store.Store }

func (silent) Beat(context.Context, string) error { return nil }

// countingLive counts the listings of the heartbeats (one a scan).
type countingLive struct {
	store.Store
	listed atomic.Int64
}

func (c *countingLive) Live(ctx context.Context, fn func(owner string, left bool)) error {
	c.listed.Add(1)
	return c.Store.Live(ctx, fn)
}

// A server that closes leaves: the others take its runs over at their next
// scan, although they never saw it beat (it closed within lease/2 of
// starting), instead of at their next full scan ten scans later.
func TestAServerThatLeftIsTakenOverAtTheNextScan(t *testing.T) {
	const lease = 200 * time.Millisecond
	store := memstore.NewMemory(lease)
	counted := &countingLive{Store: store}
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {{Hang: true}, controlstest.OK("x")}})
	d.SetInfo("a", controls.DelegateInfo{Idempotent: true})
	a := runstest.NewManager(t, d, runs.Config{Store: counted, Lease: lease, Owner: "a", Clock: controls.RealClock{}})
	// The second listing of the heartbeats comes after the first scan
	// listed the drivers: b's run, started after, is not in it.
	require.Eventually(t, func() bool { return counted.listed.Load() >= 2 }, 5*time.Second, time.Millisecond, "a's first scan")
	b, err := runs.New(runs.Config{Delegates: d, Store: silent{store}, Lease: lease, Owner: "b", Clock: controls.RealClock{}})
	require.NoError(t, err)
	st, err := runstest.Start(b, context.Background(), "brief", runstest.Chain("a"), nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(d.Calls()) == 1 }, 5*time.Second, time.Millisecond)
	b.Close()
	left := counted.listed.Load()
	evs := runstest.WatchAll(t, a, st.GetRunId(), 0)
	assert.Contains(t, kinds(evs), "run_resumed")
	runstest.Final(t, evs)
	assert.LessOrEqual(t, counted.listed.Load()-left, int64(3), "taken over within the scans after b left, not at the full scan")
}

// liveness lists Live as owner → "beating" or "left".
func liveness(t *testing.T, s store.Store) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, s.Live(runstest.Ctx(t), func(owner string, left bool) {
		out[owner] = map[bool]string{false: "beating", true: "left"}[left]
	}))
	return out
}

// Every store: a server that beats is alive and listed; once it leaves it
// is dead at once and listed as left for a lease, then not at all.
func TestStoresTellBeatingFromLeft(t *testing.T) {
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			const lease = time.Second // the shortest heartbeat TTL JetStream keeps
			s := open(t, lease)()
			ctx := runstest.Ctx(t)
			require.NoError(t, s.Beat(ctx, "a"))
			require.NoError(t, s.Beat(ctx, "b"))
			alive, err := s.Alive(ctx, "a")
			require.NoError(t, err)
			assert.True(t, alive)
			assert.Equal(t, map[string]string{"a": "beating", "b": "beating"}, liveness(t, s))

			require.NoError(t, s.Leave(ctx, "a"))
			alive, err = s.Alive(ctx, "a")
			require.NoError(t, err)
			assert.False(t, alive, "dead once it left")
			assert.Equal(t, map[string]string{"a": "left", "b": "beating"}, liveness(t, s))

			require.Eventually(t, func() bool { return len(liveness(t, s)) == 0 }, 10*time.Second, 50*time.Millisecond,
				"neither a beat nor a departure outlives the lease")
			require.NoError(t, s.Beat(ctx, "a"))
			assert.Equal(t, map[string]string{"a": "beating"}, liveness(t, s), "a server that comes back beats again")
		})
	}
}
