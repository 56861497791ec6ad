package jsstore

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// openJetStreams starts an embedded NATS server and returns a function
// that opens a store on it with cfg, each with a connection of its own as
// each server has.
func openJetStreams(t *testing.T) func(cfg JetStreamConfig) store.Store {
	t.Helper()
	e, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	return func(cfg JetStreamConfig) store.Store {
		nc, err := nats.Connect("", nats.InProcessServer(e.Server))
		require.NoError(t, err)
		s, err := NewJetStream(runstest.Ctx(t), nc, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
}

// publishes counts the messages published on the NATS server of store s
// (a *JetStream) whose subject names a run, by subject.
type publishes struct {
	mu       sync.Mutex
	subjects []string
}

func countPublishes(t *testing.T, nc *nats.Conn) *publishes {
	t.Helper()
	p := &publishes{}
	for _, subject := range []string{"stubborn.events.>", "$KV.>"} {
		sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
			p.mu.Lock()
			p.subjects = append(p.subjects, m.Subject)
			p.mu.Unlock()
		})
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	require.NoError(t, nc.Flush())
	return p
}

// of returns how many messages were published on subjects that start
// with prefix and name run id.
func (p *publishes) of(prefix, id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, s := range p.subjects {
		if strings.HasPrefix(s, prefix) && strings.Contains(s, id) {
			n++
		}
	}
	return n
}

// TestAOneAttemptRunIsTwoJournalWrites: a run that calls one delegate once
// is claimed by its journal's first write and let go of by its last: two
// journal messages, no owners entry, no saved state (issue 32). With
// ClaimInOwners (a rolling upgrade from the layout before) it claims and
// releases an owners entry as that layout did.
func TestAOneAttemptRunIsTwoJournalWrites(t *testing.T) {
	for _, tc := range []struct {
		name              string
		inOwners, saveEnd bool
		owners, states    int
	}{
		{"claimed in its journal", false, false, 0, 0},
		{"claimed in the owners bucket", true, false, 2, 0},
		// Its final state saved too (a rolling upgrade): no owners entry
		// is written for it (PutState writes one only for a state that
		// is not final).
		{"saving final states", false, true, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir()})
			require.NoError(t, err)
			t.Cleanup(e.Close)
			watch, err := nats.Connect("", nats.InProcessServer(e.Server))
			require.NoError(t, err)
			t.Cleanup(watch.Close)
			nc, err := nats.Connect("", nats.InProcessServer(e.Server))
			require.NoError(t, err)
			store, err := NewJetStream(runstest.Ctx(t), nc, JetStreamConfig{ClaimInOwners: tc.inOwners, SaveFinalStates: tc.saveEnd})
			require.NoError(t, err)
			t.Cleanup(func() { _ = store.Close() })
			pubs := countPublishes(t, watch)
			d := controlstest.NewDelegates(map[string][]controlstest.Reply{"d": {controlstest.OK("fine")}})
			m := runstest.NewManager(t, d, runs.Config{Store: store, Owner: "a"})

			st, err := runstest.Start(m, runstest.Ctx(t), "x", runstest.RetrySpec(1), nil)
			require.NoError(t, err)
			id := st.GetRunId()
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, runstest.Final(t, runstest.WatchAll(t, m, id, 0)).GetStatus())
			// The listing index, off the run's path: its end, and its
			// start too when the run outlived the indexer's 20 ms (a
			// loaded machine, -race); the end is then a create that finds
			// the entry (refused) and an update — or, when the read after
			// the refusal does not see the entry yet, up to three more
			// tries (indexer.put's bound): five publishes at most.
			require.Eventually(t, func() bool { return pubs.of("$KV.stubborn_index.", id) >= 1 }, 10*time.Second, 5*time.Millisecond,
				"the listing index is written off the run's path")
			require.NoError(t, watch.Flush())
			time.Sleep(50 * time.Millisecond) // a release written after the end would be seen by now
			assert.LessOrEqual(t, pubs.of("$KV.stubborn_index.", id), 5, "index writes: its end, perhaps its start, within indexer.put's tries")
			assert.Equal(t, 2, pubs.of("stubborn.events.", id), "journal writes: before the call and after it")
			assert.Equal(t, tc.owners, pubs.of("$KV.stubborn_owners.", id), "owners bucket writes")
			assert.Equal(t, tc.states, pubs.of("$KV.stubborn_runs.", id), "state writes (the journal has the end)")

			got, err := m.Get(runstest.Ctx(t), id)
			require.NoError(t, err)
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, got.GetStatus())
			driver, err := store.Driver(runstest.Ctx(t), id)
			require.NoError(t, err)
			assert.Empty(t, driver, "a finished run has no driver")
		})
	}
}

// TestARunClaimedInItsJournalIsTakenOver: a server dies while a run it
// claimed in its journal (no owners entry yet) is calling; another finds
// the run from the dead server's mark, drives it to its end, and drops
// the mark. Meanwhile any server reads the run's driver and state from its
// journal.
func TestARunClaimedInItsJournalIsTakenOver(t *testing.T) {
	const lease = time.Second
	open := openJetStreams(t)
	g := runstest.NewGated(controls.DelegateInfo{Idempotent: true})
	aStore := open(JetStreamConfig{Lease: lease})
	a, err := runs.New(runs.Config{Delegates: g, Store: aStore, Lease: lease, Owner: "a"})
	require.NoError(t, err)
	bStore := open(JetStreamConfig{Lease: lease})
	b := runstest.NewManager(t, g, runs.Config{Store: bStore, Lease: lease, Owner: "b"})

	st, err := runstest.Start(a, runstest.Ctx(t), "x", runstest.RetrySpec(2), nil)
	require.NoError(t, err)
	id := st.GetRunId()
	require.Eventually(t, func() bool { return g.Called("x") == 1 }, 10*time.Second, time.Millisecond)
	owner, err := OwnersEntryForTest(runstest.Ctx(t), bStore, id)
	require.NoError(t, err)
	require.Empty(t, owner, "claimed in its journal: no owners entry within the claim delay")
	driver, err := bStore.Driver(runstest.Ctx(t), id)
	require.NoError(t, err)
	assert.Equal(t, "a", driver, "the journal's claim names the driver")
	got, err := b.Get(runstest.Ctx(t), id)
	require.NoError(t, err, "another server reads the state from run_started")
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_RUNNING, got.GetStatus())
	marked, err := HasMarkForTest(runstest.Ctx(t), bStore, "a")
	require.NoError(t, err)
	require.True(t, marked, "a server keeps a mark")

	a.Kill()
	require.Eventually(t, func() bool { return b.Owns(id) }, 10*time.Second, 5*time.Millisecond, "b takes the run over from a's mark")
	g.Answer("x", controlstest.OK("fine"))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, runstest.Final(t, runstest.WatchAll(t, b, id, 0)).GetStatus())
	require.Eventually(t, func() bool {
		marked, err := HasMarkForTest(runstest.Ctx(t), bStore, "a")
		return err == nil && !marked
	}, 10*time.Second, 5*time.Millisecond, "a's mark goes once its runs are taken over")
	require.Eventually(t, func() bool {
		owner, err := OwnersEntryForTest(runstest.Ctx(t), bStore, id)
		return err == nil && owner == ""
	}, 10*time.Second, 5*time.Millisecond, "the owners entry of the takeover is released at the end")
}

// TestALongRunGetsAnOwnersEntry: a run that goes on past the claim delay
// (the lease) gets an owners entry from its server, off its path, and it
// is released at the run's end.
func TestALongRunGetsAnOwnersEntry(t *testing.T) {
	const lease = 300 * time.Millisecond
	open := openJetStreams(t)
	g := runstest.NewGated(controls.DelegateInfo{Idempotent: true})
	store := open(JetStreamConfig{Lease: lease})
	m := runstest.NewManager(t, g, runs.Config{Store: store, Lease: lease, Owner: "a"})
	st, err := runstest.Start(m, runstest.Ctx(t), "x", runstest.RetrySpec(1), nil)
	require.NoError(t, err)
	id := st.GetRunId()
	require.Eventually(t, func() bool {
		owner, err := OwnersEntryForTest(runstest.Ctx(t), store, id)
		return err == nil && owner == "a"
	}, 10*time.Second, 5*time.Millisecond, "an owners entry once the run outlives the claim delay")
	g.Answer("x", controlstest.OK("fine"))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, runstest.Final(t, runstest.WatchAll(t, m, id, 0)).GetStatus())
	require.Eventually(t, func() bool {
		owner, err := OwnersEntryForTest(runstest.Ctx(t), store, id)
		return err == nil && owner == ""
	}, 10*time.Second, 5*time.Millisecond, "released at the end")
}

// TestTheLayoutBeforeIsTakenOver: the upgrade path. A server of the layout
// before (every run claimed with an owners entry: ClaimInOwners) dies with
// a run in flight; a server of the new layout takes it over and ends it,
// and the run it starts itself is claimed in its journal.
func TestTheLayoutBeforeIsTakenOver(t *testing.T) {
	const lease = time.Second
	open := openJetStreams(t)
	g := runstest.NewGated(controls.DelegateInfo{Idempotent: true})
	oldStore := open(JetStreamConfig{Lease: lease, ClaimInOwners: true})
	old, err := runs.New(runs.Config{Delegates: g, Store: oldStore, Lease: lease, Owner: "old"})
	require.NoError(t, err)
	st, err := runstest.Start(old, runstest.Ctx(t), "x", runstest.RetrySpec(2), nil)
	require.NoError(t, err)
	id := st.GetRunId()
	owner, err := OwnersEntryForTest(runstest.Ctx(t), oldStore, id)
	require.NoError(t, err)
	require.Equal(t, "old", owner, "the layout before: claimed in the owners bucket")
	require.Eventually(t, func() bool { return g.Called("x") == 1 }, 10*time.Second, time.Millisecond)
	old.Kill()

	store := open(JetStreamConfig{Lease: lease})
	m := runstest.NewManager(t, g, runs.Config{Store: store, Lease: lease, Owner: "new"})
	require.Eventually(t, func() bool { return m.Owns(id) }, 10*time.Second, 5*time.Millisecond)
	g.Answer("x", controlstest.OK("fine"))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, runstest.Final(t, runstest.WatchAll(t, m, id, 0)).GetStatus())

	g.Answer("y", controlstest.OK("fine"))
	st, err = runstest.Start(m, runstest.Ctx(t), "y", runstest.RetrySpec(1), nil)
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, runstest.Final(t, runstest.WatchAll(t, m, st.GetRunId(), 0)).GetStatus())
	owner, err = OwnersEntryForTest(context.Background(), store, st.GetRunId())
	require.NoError(t, err)
	assert.Empty(t, owner, "the new layout's run has no owners entry")
}

// TestAClaimedJournalThatLostItsFirstMessageIsFound: a run claimed in its
// journal, with no owners entry and no saved state, whose first journal
// message is lost (a damaged block) is still found when its server dies
// (every message its copy wrote names it), and ends FAILED as
// unrecoverable instead of staying in flight unseen.
func TestAClaimedJournalThatLostItsFirstMessageIsFound(t *testing.T) {
	const lease = time.Second
	e, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	g := runstest.NewGated(controls.DelegateInfo{})
	a, err := runs.New(runs.Config{Delegates: g, Store: openOn(t, e), Lease: lease, Owner: "a"})
	require.NoError(t, err)
	chain := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"d", "d"}}}}
	g.Answer("x", controlstest.Fail(codes.Unavailable, "down"))
	st, err := runstest.Start(a, runstest.Ctx(t), "x", chain, nil)
	require.NoError(t, err)
	id := st.GetRunId()
	require.Eventually(t, func() bool { return g.Called("x") == 2 }, 10*time.Second, time.Millisecond, "the second delegate is called")
	a.Kill()

	js, err := jetstream.New(e.Conn)
	require.NoError(t, err)
	stream, err := js.Stream(runstest.Ctx(t), "STUBBORN_EVENTS")
	require.NoError(t, err)
	first, err := stream.GetMsg(runstest.Ctx(t), 1, jetstream.WithGetMsgSubject("stubborn.events."+id))
	require.NoError(t, err)
	require.NoError(t, stream.DeleteMsg(runstest.Ctx(t), first.Sequence))

	store := openOn(t, e)
	owner, err := OwnersEntryForTest(runstest.Ctx(t), store, id)
	require.NoError(t, err)
	require.Empty(t, owner, "no owners entry: only the journal says who claimed it")
	b := runstest.NewManager(t, g, runs.Config{Store: store, Lease: lease, Owner: "b", SoleOwner: true})
	require.Eventually(t, func() bool {
		got, err := b.Get(runstest.Ctx(t), id)
		return err == nil && got.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_FAILED &&
			got.GetStatusReasonCode() == stubbornv1.StatusReason_STATUS_REASON_UNRECOVERABLE
	}, 15*time.Second, 10*time.Millisecond, "the run ends FAILED, unrecoverable")
	assert.Equal(t, 2, g.Called("x"), "no delegate is called again")
}

// TestATakeoverThatFindsNoJournalIsNoConflict: a run listed for a dead
// server whose journal a read does not find (a node that lags) is not
// taken for one another server took over (ErrConflict), which would let
// the scan drop that server's mark with the run never driven: the
// takeover fails, and the next scan tries again.
func TestATakeoverThatFindsNoJournalIsNoConflict(t *testing.T) {
	open := openJetStreams(t)
	store := open(JetStreamConfig{Lease: time.Second})
	err := store.TakeOver(runstest.Ctx(t), "run_nojournal", "dead", "me")
	require.Error(t, err)
	assert.NotErrorIs(t, err, runs.ErrConflict)
}
