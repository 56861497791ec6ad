// Package storetest is the contract test suite of store.Store: every store
// runs it (Run), so that the engine, which is the same over every store,
// meets the same behaviour in production (jsstore) as in its tests
// (memstore). Each subtest is one clause of the contract in runs/store,
// named after it.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// Opener opens a store whose owners count as dead lease after their last
// beat. Each call of the function it returns opens another view of that
// one store, as each server has its own connection to a shared store (a
// store in memory returns itself); the views are closed when t ends.
type Opener func(t *testing.T, lease time.Duration) func() store.Store

// Break is a clause a store is known to break: Run asserts that it still
// does, so that the day it is fixed the entry must go (a known break
// never hides a new one, nor outlives its fix).
type Break struct {
	// Clause is the subtest's name under TestContract, e.g.
	// "States/RawStateOfUnknownRunIsNil".
	Clause string
	// Why says what the store does instead, for the test's log.
	Why string
}

// Lease is the lease of the stores the suite opens, but for the clause of
// a lease's expiry: long enough that no owner's beat expires while a
// clause runs on a loaded machine.
const Lease = 5 * time.Second

// ShortLease is the lease of the store on which an owner that stops
// beating is seen dead.
const ShortLease = 300 * time.Millisecond

// wait bounds what the suite waits for a store to do by itself (an index
// written, a deletion told over NATS, a beat expiring).
const wait = 10 * time.Second

// Run runs the contract suite against the store open opens. known lists
// the clauses the store is known to break (see Break).
func Run(t *testing.T, open Opener, known ...Break) {
	k := &knownBreaks{m: map[string]string{}, used: map[string]bool{}}
	for _, b := range known {
		k.m[b.Clause] = b.Why
	}
	c := &suite{open: open, known: k, root: t.Name() + "/"}
	t.Run("Journal", c.journal)
	t.Run("States", c.states)
	t.Run("Ownership", c.ownership)
	t.Run("Commands", c.commands)
	t.Run("Keys", c.keys)
	t.Run("Deletion", c.deletion)
	t.Run("Listing", c.listing)
	t.Run("Transient", c.transient)
	t.Run("Close", c.close)
	for clause := range k.m {
		if !k.used[clause] {
			t.Errorf("known break %q names no clause of the suite that checks for known breaks", clause)
		}
	}
}

type suite struct {
	open  Opener
	known *knownBreaks
	root  string // Run's test's name, and a slash: a clause's name follows
}

// knownBreaks are the clauses a store is known to break.
type knownBreaks struct {
	mu   sync.Mutex
	m    map[string]string
	used map[string]bool
}

// holds asserts a clause that a store may be known to break (Break): it
// fails when the clause breaks and is not listed, and when it holds and
// is.
func (c *suite) holds(t *testing.T, ok bool, msg string, args ...any) {
	t.Helper()
	clause := strings.TrimPrefix(t.Name(), c.root)
	c.known.mu.Lock()
	why, listed := c.known.m[clause]
	c.known.used[clause] = true
	c.known.mu.Unlock()
	switch {
	case ok && listed:
		t.Errorf("clause %s holds now: remove its known break (%s)", clause, why)
	case !ok && listed:
		t.Logf("known break of the contract: %s (%s)", fmt.Sprintf(msg, args...), why)
	case !ok:
		t.Errorf("clause %s breaks: "+msg, append([]any{clause}, args...)...)
	}
}

// views opens the shared store and returns a function that opens a view
// of it.
func (c *suite) views(t *testing.T, lease time.Duration) func() store.Store {
	return c.open(t, lease)
}

// ctx is a context for one clause: no call of a store may hang the suite.
func ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var ids atomic.Int64

// runID is a new run id, as the API makes them (a key for every store).
func runID(t *testing.T) string {
	return fmt.Sprintf("contract-%d-%d", time.Now().UnixNano()%1_000_000_000, ids.Add(1))
}

// controlState is a run's state as the engine saves it: what a listing
// reads (id, tenant, creation time) and a status.
func controlState(id, tenant string, status stubbornv1.RunStatus) *stubbornv1.ControlState {
	now := timestamppb.Now()
	return &stubbornv1.ControlState{RunId: id, Tenant: tenant, Status: status, CreateTime: now, UpdateTime: now}
}

func encodeState(t *testing.T, st *stubbornv1.ControlState) []byte {
	t.Helper()
	b, err := proto.Marshal(st)
	require.NoError(t, err)
	return b
}

// journalOf is a run's journal of n events (n >= 1): run_started, then
// run_resumed, and, when finished, run_finished last.
func journalOf(t *testing.T, id, tenant string, n int, finished bool) []store.Event {
	t.Helper()
	evs := make([]store.Event, 0, n)
	for seq := int64(1); seq <= int64(n); seq++ {
		ev := &stubbornv1.RunEvent{RunId: id, Seq: seq, Time: timestamppb.Now()}
		switch {
		case seq == 1:
			ev.Kind = &stubbornv1.RunEvent_RunStarted{RunStarted: &stubbornv1.RunStarted{State: controlState(id, tenant, stubbornv1.RunStatus_RUN_STATUS_RUNNING)}}
		case finished && seq == int64(n):
			ev.Kind = &stubbornv1.RunEvent_RunFinished{RunFinished: &stubbornv1.RunFinished{State: controlState(id, tenant, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED)}}
		default:
			ev.Kind = &stubbornv1.RunEvent_RunResumed{RunResumed: &stubbornv1.RunResumed{Owner: "a", Reason: fmt.Sprintf("resume %d", seq)}}
		}
		enc, err := store.EncodeEvent(ev)
		require.NoError(t, err)
		evs = append(evs, enc)
	}
	return evs
}

// sameEvents asserts got are want: seqs, ids, ends and bytes.
func sameEvents(t *testing.T, want, got []store.Event) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		assert.Equal(t, want[i].RunID, got[i].RunID, "event %d's run", i)
		assert.Equal(t, want[i].Seq, got[i].Seq, "event %d's seq", i)
		assert.Equal(t, want[i].Finished, got[i].Finished, "event %d's end", i)
		assert.Equal(t, want[i].Data, got[i].Data, "event %d's bytes", i)
	}
}

func (c *suite) journal(t *testing.T) {
	view := c.views(t, Lease)
	// s and o are two views of the store: o reads what s writes, as
	// another server would.
	s, o := view(), view()

	t.Run("AppendConsecutiveThenEvents", func(t *testing.T) {
		ctx, id := ctx(t), runID(t)
		evs := journalOf(t, id, "t1", 4, false)
		w := &store.Writer{}
		require.NoError(t, s.Append(ctx, w, evs[0]))
		require.NoError(t, s.Append(ctx, w, evs[1:]...), "several events in one call")
		got, err := s.Events(ctx, id, 0)
		require.NoError(t, err)
		sameEvents(t, evs, got)
		got, err = s.Events(ctx, id, 2)
		require.NoError(t, err)
		sameEvents(t, evs[2:], got)
		got, err = s.Events(ctx, id, 4)
		require.NoError(t, err)
		assert.Empty(t, got, "no event after the last")
	})

	t.Run("AppendOfNonConsecutiveEventsFails", func(t *testing.T) {
		ctx, id := ctx(t), runID(t)
		evs := journalOf(t, id, "t1", 4, false)
		w := &store.Writer{}
		assert.Error(t, s.Append(ctx, w, evs[0], evs[2]), "seq 1 then 3")
		assert.Error(t, s.Append(ctx, w, evs[1], evs[0]), "seq 2 then 1")
		other := journalOf(t, runID(t), "t1", 2, false)
		assert.Error(t, s.Append(ctx, w, evs[0], other[1]), "events of two runs")
		got, err := s.Events(ctx, id, 0)
		require.NoError(t, err)
		assert.Empty(t, got, "a refused append writes nothing")
		assert.Zero(t, w.Cursor, "nor moves its writer")
	})

	t.Run("StaleWriterGetsConflictAndWritesNothing", func(t *testing.T) {
		ctx, id := ctx(t), runID(t)
		a, b := s, o
		evs := journalOf(t, id, "t1", 3, false)
		wa := &store.Writer{}
		require.NoError(t, a.Append(ctx, wa, evs[0]))
		wb := &store.Writer{}
		got, err := b.JournalFrom(ctx, id, wb)
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.NoError(t, b.Append(ctx, wb, evs[1]))
		// a's view ends at seq 1: b wrote since. Seq 3 follows the
		// journal, but not a's view of it.
		cursor := wa.Cursor
		err = a.Append(ctx, wa, evs[2])
		require.ErrorIs(t, err, store.ErrConflict)
		assert.Equal(t, cursor, wa.Cursor, "a refused append moves its writer")
		got, err = a.Events(ctx, id, 0)
		require.NoError(t, err)
		sameEvents(t, evs[:2], got)
	})

	t.Run("CursorMovesOnEachAppend", func(t *testing.T) {
		ctx, id := ctx(t), runID(t)
		evs := journalOf(t, id, "t1", 4, false)
		w := &store.Writer{}
		require.NoError(t, s.Append(ctx, w, evs[0]))
		first := w.Cursor
		assert.NotZero(t, first, "the journal is not empty after a write")
		require.NoError(t, s.Append(ctx, w, evs[1:3]...))
		second := w.Cursor
		assert.NotEqual(t, first, second)
		require.NoError(t, s.Append(ctx, w, evs[3]))
		assert.NotEqual(t, second, w.Cursor)
	})

	t.Run("JournalFromReturnsAllAndSetsWriter", func(t *testing.T) {
		ctx, id := ctx(t), runID(t)
		evs := journalOf(t, id, "t1", 4, false)
		require.NoError(t, o.Append(ctx, &store.Writer{}, evs[:3]...))
		w := &store.Writer{}
		got, err := s.JournalFrom(ctx, id, w)
		require.NoError(t, err)
		sameEvents(t, evs[:3], got)
		require.NoError(t, s.Append(ctx, w, evs[3]), "a writer resumed from the journal appends to it")
		got, err = s.Events(ctx, id, 0)
		require.NoError(t, err)
		sameEvents(t, evs, got)
	})

	t.Run("NilWriterUsesTheStoresViewAfterEvents", func(t *testing.T) {
		ctx, id := ctx(t), runID(t)
		evs := journalOf(t, id, "t1", 3, false)
		a, b := s, o
		require.NoError(t, a.Append(ctx, &store.Writer{}, evs[:2]...))
		_, err := b.Events(ctx, id, 0)
		require.NoError(t, err)
		require.NoError(t, b.Append(ctx, nil, evs[2]), "Events made b's view current")
		got, err := a.Events(ctx, id, 0)
		require.NoError(t, err)
		sameEvents(t, evs, got)

		if a == b {
			return // one view (a store in memory): never stale
		}
		// A view that has not read since another view wrote is stale.
		id2 := runID(t)
		more := journalOf(t, id2, "t1", 3, false)
		require.NoError(t, a.Append(ctx, nil, more[0]))
		_, err = b.Events(ctx, id2, 0)
		require.NoError(t, err)
		require.NoError(t, b.Append(ctx, nil, more[1]))
		require.ErrorIs(t, a.Append(ctx, nil, more[2]), store.ErrConflict)
	})

	t.Run("FollowDeliversRecordedThenNewUntilFinished", func(t *testing.T) {
		ctx, id := ctx(t), runID(t)
		evs := journalOf(t, id, "t1", 4, true)
		w := &store.Writer{}
		require.NoError(t, s.Append(ctx, w, evs[:2]...))
		var mu sync.Mutex
		var got []store.Event
		done := make(chan error, 1)
		go func() {
			done <- o.Follow(ctx, id, 0, func(ev store.Event) error {
				mu.Lock()
				defer mu.Unlock()
				got = append(got, ev)
				return nil
			})
		}()
		seen := func(n int) func() bool {
			return func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= n }
		}
		require.Eventually(t, seen(2), wait, 10*time.Millisecond, "the recorded events")
		require.NoError(t, s.Append(ctx, w, evs[2]))
		require.Eventually(t, seen(3), wait, 10*time.Millisecond, "a new event")
		require.NoError(t, s.Append(ctx, w, evs[3]))
		select {
		case err := <-done:
			require.NoError(t, err, "Follow returns nil after run_finished")
		case <-time.After(wait):
			t.Fatal("Follow did not return after run_finished")
		}
		mu.Lock()
		defer mu.Unlock()
		sameEvents(t, evs, got)
		assert.True(t, got[3].Finished)

		// From after k: only the events after it.
		var tail []store.Event
		require.NoError(t, s.Follow(ctx, id, 2, func(ev store.Event) error { tail = append(tail, ev); return nil }))
		sameEvents(t, evs[2:], tail)
	})

	t.Run("FollowReturnsWhenCtxEnds", func(t *testing.T) {
		id := runID(t)
		evs := journalOf(t, id, "t1", 1, false)
		require.NoError(t, s.Append(ctx(t), &store.Writer{}, evs...))
		fctx, cancel := context.WithCancel(ctx(t))
		done := make(chan error, 1)
		var n atomic.Int32
		go func() {
			done <- s.Follow(fctx, id, 0, func(store.Event) error { n.Add(1); return nil })
		}()
		require.Eventually(t, func() bool { return n.Load() == 1 }, wait, 10*time.Millisecond)
		cancel()
		select {
		case err := <-done:
			assert.ErrorIs(t, err, context.Canceled)
		case <-time.After(wait):
			t.Fatal("Follow did not return when its context ended")
		}
	})

	t.Run("FollowStopsWhenFnFails", func(t *testing.T) {
		ctx, id := ctx(t), runID(t)
		evs := journalOf(t, id, "t1", 3, false)
		require.NoError(t, s.Append(ctx, &store.Writer{}, evs...))
		stop := errors.New("enough")
		calls := 0
		err := s.Follow(ctx, id, 0, func(store.Event) error { calls++; return stop })
		require.ErrorIs(t, err, stop)
		assert.Equal(t, 1, calls)
	})

	t.Run("EventLimitWithinMaxEventBytes", func(t *testing.T) {
		limit := s.EventLimit()
		assert.Positive(t, limit)
		assert.LessOrEqual(t, limit, store.MaxEventBytes)
	})

	t.Run("JournalLostOfNeverWrittenRunIsFalse", func(t *testing.T) {
		ctx := ctx(t)
		lost, why, err := s.JournalLost(ctx, runID(t))
		require.NoError(t, err)
		assert.False(t, lost, why)
		// Claimed but never written (its server stopped in between).
		id := runID(t)
		require.NoError(t, s.Claim(ctx, id, "a", encodeState(t, controlState(id, "t1", stubbornv1.RunStatus_RUN_STATUS_RUNNING))))
		lost, why, err = s.JournalLost(ctx, id)
		require.NoError(t, err)
		assert.False(t, lost, why)
	})

	t.Run("DataKeptAsGiven", func(t *testing.T) {
		ctx, id := ctx(t), runID(t)
		evs := journalOf(t, id, "t1", 3, true)
		want := make([][]byte, len(evs))
		for i, ev := range evs {
			want[i] = append([]byte(nil), ev.Data...)
		}
		require.NoError(t, s.Append(ctx, &store.Writer{}, evs...))
		for i, ev := range evs {
			assert.Equal(t, want[i], ev.Data, "Append changed event %d's Data", i)
		}
		got, err := o.Events(ctx, id, 0)
		require.NoError(t, err)
		require.Len(t, got, len(want))
		for i := range got {
			assert.Equal(t, want[i], got[i].Data, "event %d read back", i)
		}
	})
}

func (c *suite) states(t *testing.T) {
	view := c.views(t, Lease)
	// s and o are two views of the store: o reads what s writes, as
	// another server would.
	s, o := view(), view()

	t.Run("PutStateStateRoundTrip", func(t *testing.T) {
		ctx, id := ctx(t), runID(t)
		want := controlState(id, "t1", stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION)
		want.Attempts = 2
		data := encodeState(t, want)
		kept := append([]byte(nil), data...)
		require.NoError(t, s.PutState(ctx, id, data))
		assert.Equal(t, kept, data, "PutState changed the state it was given")
		got, err := o.State(ctx, id)
		require.NoError(t, err)
		assert.True(t, proto.Equal(want, got), "got %v, want %v", got, want)
		// A later save replaces it.
		want.Attempts = 3
		require.NoError(t, s.PutState(ctx, id, encodeState(t, want)))
		got, err = s.State(ctx, id)
		require.NoError(t, err)
		assert.EqualValues(t, 3, got.GetAttempts())
	})

	t.Run("StateOfUnknownRunIsErrNotFound", func(t *testing.T) {
		_, err := s.State(ctx(t), runID(t))
		require.ErrorIs(t, err, store.ErrNotFound)
	})

	t.Run("StatesVisitsEachRunOnceAndStops", func(t *testing.T) {
		ctx := ctx(t)
		mine := map[string]bool{}
		for range 3 {
			id := runID(t)
			mine[id] = true
			require.NoError(t, s.PutState(ctx, id, encodeState(t, controlState(id, "t1", stubbornv1.RunStatus_RUN_STATUS_RUNNING))))
		}
		seen := map[string]int{}
		require.NoError(t, o.States(ctx, func(st *stubbornv1.ControlState) bool {
			seen[st.GetRunId()]++
			return true
		}))
		for id := range mine {
			assert.Equal(t, 1, seen[id], "run %s visited", id)
		}
		calls := 0
		require.NoError(t, s.States(ctx, func(*stubbornv1.ControlState) bool { calls++; return false }))
		assert.Equal(t, 1, calls, "States goes on after fn returned false")
	})

	t.Run("RawStateOfUnknownRunIsNil", func(t *testing.T) {
		ctx := ctx(t)
		raw, tenant, known, err := s.RawState(ctx, runID(t))
		assert.Nil(t, raw)
		assert.Empty(t, tenant)
		assert.False(t, known)
		// The contract: nil when there is none (no error). The engine's
		// deletion of an unreadable run returns RawState's error.
		c.holds(t, err == nil, "RawState of an unknown run returned error %v", err)
		// And the state saved, as it is saved.
		id := runID(t)
		data := encodeState(t, controlState(id, "t1", stubbornv1.RunStatus_RUN_STATUS_RUNNING))
		require.NoError(t, s.PutState(ctx, id, data))
		raw, _, _, err = s.RawState(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, data, raw)
	})

	t.Run("AdmitSmallOnFreshStore", func(t *testing.T) {
		require.NoError(t, s.Admit(ctx(t), 1<<10))
	})
}

func (c *suite) ownership(t *testing.T) {
	view := c.views(t, Lease)
	// s and o are two views of the store: o reads what s writes, as
	// another server would.
	s, o := view(), view()

	t.Run("BeatThenAlive", func(t *testing.T) {
		ctx := ctx(t)
		owner, never := runID(t), runID(t)
		require.NoError(t, s.Beat(ctx, owner))
		alive, err := o.Alive(ctx, owner)
		require.NoError(t, err)
		assert.True(t, alive, "alive after a beat")
		alive, err = s.Alive(ctx, never)
		require.NoError(t, err)
		assert.False(t, alive, "an owner never seen is not alive")
		live := map[string]bool{}
		require.NoError(t, o.Live(ctx, func(o string, left bool) { live[o] = !left }))
		assert.True(t, live[owner], "Live lists an owner that beat")
	})

	t.Run("LeaveThenNotAliveAndLiveSaysLeft", func(t *testing.T) {
		ctx := ctx(t)
		owner := runID(t)
		require.NoError(t, s.Beat(ctx, owner))
		require.NoError(t, s.Leave(ctx, owner))
		alive, err := o.Alive(ctx, owner)
		require.NoError(t, err)
		assert.False(t, alive, "an owner that left is dead at once")
		left, listed := false, false
		require.NoError(t, o.Live(ctx, func(o string, l bool) {
			if o == owner {
				listed, left = true, l
			}
		}))
		assert.True(t, listed, "Live reports an owner that left")
		assert.True(t, left, "as left")
	})

	t.Run("ClaimThenDriver", func(t *testing.T) {
		ctx, id := ctx(t), runID(t)
		require.NoError(t, s.Claim(ctx, id, "a", encodeState(t, controlState(id, "t1", stubbornv1.RunStatus_RUN_STATUS_RUNNING))))
		d, err := o.Driver(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, "a", d)
		d, err = s.Driver(ctx, runID(t))
		require.NoError(t, err)
		assert.Empty(t, d, "a run never claimed has no driver")
	})

	t.Run("ClaimStateIsTheRunsState", func(t *testing.T) {
		ctx, id := ctx(t), runID(t)
		want := controlState(id, "t1", stubbornv1.RunStatus_RUN_STATUS_RUNNING)
		require.NoError(t, s.Claim(ctx, id, "a", encodeState(t, want)))
		got, err := o.State(ctx, id)
		require.NoError(t, err)
		assert.True(t, proto.Equal(want, got), "got %v", got)
	})

	t.Run("SecondClaimIsErrConflict", func(t *testing.T) {
		ctx, id := ctx(t), runID(t)
		require.NoError(t, s.Claim(ctx, id, "a", nil))
		require.ErrorIs(t, o.Claim(ctx, id, "b", nil), store.ErrConflict)
		d, err := s.Driver(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, "a", d, "the first claim stands")
	})

	t.Run("OwnersListsClaims", func(t *testing.T) {
		ctx, id := ctx(t), runID(t)
		require.NoError(t, s.Claim(ctx, id, "a", nil))
		found := ""
		require.NoError(t, o.Owners(ctx, func(r, o string) bool {
			if r == id {
				found = o
			}
			return true
		}))
		assert.Equal(t, "a", found)
		calls := 0
		require.NoError(t, s.Owners(ctx, func(string, string) bool { calls++; return false }))
		assert.Equal(t, 1, calls, "Owners goes on after fn returned false")
	})

	t.Run("TakeOverIsCompareAndSet", func(t *testing.T) {
		ctx, id := ctx(t), runID(t)
		require.NoError(t, s.Claim(ctx, id, "a", nil))
		require.ErrorIs(t, o.TakeOver(ctx, id, "c", "b"), store.ErrConflict, "from is not the driver")
		require.NoError(t, o.TakeOver(ctx, id, "a", "b"))
		d, err := s.Driver(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, "b", d)
		require.ErrorIs(t, s.TakeOver(ctx, id, "a", "c"), store.ErrConflict, "another server got there first")
	})

	t.Run("ReleaseClearsDriver", func(t *testing.T) {
		ctx, id := ctx(t), runID(t)
		require.NoError(t, s.Claim(ctx, id, "a", nil))
		require.NoError(t, s.Release(ctx, id))
		d, err := o.Driver(ctx, id)
		require.NoError(t, err)
		assert.Empty(t, d)
		found := false
		require.NoError(t, s.Owners(ctx, func(r, _ string) bool { found = found || r == id; return true }))
		assert.False(t, found, "Owners lists a released run")
	})

	t.Run("LeaseExpiresWithoutBeats", func(t *testing.T) {
		short := c.views(t, ShortLease)
		ctx, owner := ctx(t), runID(t)
		a, b := short(), short()
		// Alive within the lease: asserted when the answer came within it
		// (a loaded machine may take longer between a beat and a read).
		var start time.Time
		for range 10 {
			start = time.Now()
			require.NoError(t, a.Beat(ctx, owner))
			alive, err := b.Alive(ctx, owner)
			require.NoError(t, err)
			if time.Since(start) < ShortLease {
				require.True(t, alive, "alive within the lease")
				break
			}
		}
		require.Eventually(t, func() bool {
			alive, err := b.Alive(ctx, owner)
			return err == nil && !alive
		}, wait, 20*time.Millisecond, "an owner that stops beating is dead after the lease")
		assert.GreaterOrEqual(t, time.Since(start), ShortLease, "dead before its lease ended")
		listed := false
		require.NoError(t, b.Live(ctx, func(o string, left bool) { listed = listed || o == owner && !left }))
		assert.False(t, listed, "Live lists an owner past its lease")
	})

	t.Run("ClaimsInJournal", func(t *testing.T) {
		ctx, id := ctx(t), runID(t)
		owner := runID(t)
		evs := journalOf(t, id, "t1", 2, true)
		if !s.ClaimsInJournal() {
			// Never asked for marks: it has none to give.
			require.NoError(t, s.Beat(ctx, owner))
			require.NoError(t, s.Append(ctx, &store.Writer{Claimer: owner}, evs[0]))
			require.NoError(t, s.ClaimMarks(ctx, func(o string, _, _ uint64, _ time.Time) {
				t.Errorf("ClaimMarks called fn (%s) on a store whose claims are not in journals", o)
			}))
			require.NoError(t, s.JournalOrphans(ctx, map[string]uint64{owner: 0}, func(r, o string) {
				t.Errorf("JournalOrphans called fn (%s, %s) on a store whose claims are not in journals", r, o)
			}))
			return
		}
		// The journal's first write claims the run; its run_finished lets
		// it go.
		w := &store.Writer{Claimer: owner}
		require.NoError(t, s.Beat(ctx, owner))
		require.NoError(t, s.Append(ctx, w, evs[0]))
		d, err := o.Driver(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, owner, d, "the first write's claimer drives the run")
		orphans := map[string]string{}
		require.NoError(t, o.JournalOrphans(ctx, map[string]uint64{owner: 0}, func(r, o string) { orphans[r] = o }))
		assert.Equal(t, owner, orphans[id], "a run claimed in its journal, not ended, is its claimer's")
		require.Eventually(t, func() bool {
			marked := false
			err := o.ClaimMarks(ctx, func(o string, _, _ uint64, _ time.Time) { marked = marked || o == owner })
			return err == nil && marked
		}, wait, 20*time.Millisecond, "a beating server keeps a mark")
		require.NoError(t, s.Append(ctx, w, evs[1]))
		d, err = s.Driver(ctx, id)
		require.NoError(t, err)
		assert.Empty(t, d, "run_finished lets the claim go")
		orphans = map[string]string{}
		require.NoError(t, s.JournalOrphans(ctx, map[string]uint64{owner: 0}, func(r, o string) { orphans[r] = o }))
		assert.NotContains(t, orphans, id, "a finished run is nobody's orphan")
	})
}

func (c *suite) commands(t *testing.T) {
	view := c.views(t, Lease)
	// s and o are two views of the store: o reads what s writes, as
	// another server would.
	s, o := view(), view()

	t.Run("ServeThenSendFromAnotherView", func(t *testing.T) {
		ctx, id := ctx(t), runID(t)
		owner := runID(t)
		var got atomic.Pointer[store.Command]
		stop, err := s.Serve(ctx, owner, func(_ context.Context, cmd *store.Command) (*stubbornv1.ControlState, error) {
			got.Store(cmd)
			return controlState(cmd.RunID, "t1", stubbornv1.RunStatus_RUN_STATUS_CANCELLED), nil
		})
		require.NoError(t, err)
		defer stop()
		st, err := o.Send(ctx, owner, &store.Command{RunID: id, Cancel: true})
		require.NoError(t, err)
		assert.Equal(t, id, st.GetRunId(), "Send returns the handler's state")
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_CANCELLED, st.GetStatus())
		require.NotNil(t, got.Load())
		assert.Equal(t, id, got.Load().RunID)
		assert.True(t, got.Load().Cancel)

		// An error of the handler's reaches the sender; ErrNotFound as
		// itself.
		other := runID(t)
		stop2, err := s.Serve(ctx, other, func(context.Context, *store.Command) (*stubbornv1.ControlState, error) {
			return nil, fmt.Errorf("%w: no such run", store.ErrNotFound)
		})
		require.NoError(t, err)
		defer stop2()
		_, err = o.Send(ctx, other, &store.Command{RunID: id})
		require.ErrorIs(t, err, store.ErrNotFound)
	})

	t.Run("SendToUnservedOwnerIsErrNotServing", func(t *testing.T) {
		sctx, cancel := context.WithTimeout(ctx(t), 5*time.Second)
		defer cancel()
		_, err := o.Send(sctx, runID(t), &store.Command{RunID: runID(t), Cancel: true})
		require.ErrorIs(t, err, store.ErrNotServing)
	})

	// Once stop has returned no command reaches the stopped server: the
	// next is ErrNotServing at once (its sender then waits for the run's
	// next driver), not sent into the void until its deadline.
	t.Run("StopEndsServing", func(t *testing.T) {
		ctx := ctx(t)
		for range 20 {
			owner := runID(t)
			stop, err := s.Serve(ctx, owner, func(_ context.Context, cmd *store.Command) (*stubbornv1.ControlState, error) {
				return controlState(cmd.RunID, "t1", stubbornv1.RunStatus_RUN_STATUS_RUNNING), nil
			})
			require.NoError(t, err)
			stop()
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err = o.Send(sctx, owner, &store.Command{RunID: "r"})
			cancel()
			require.ErrorIs(t, err, store.ErrNotServing, "a command sent right after stop")
		}
	})
}

func (c *suite) keys(t *testing.T) {
	view := c.views(t, Lease)
	// s and o are two views of the store: o reads what s writes, as
	// another server would.
	s, o := view(), view()
	entry := func(run string) store.KeyEntry {
		return store.KeyEntry{RunID: run, Request: "req-" + run, At: time.Now()}
	}

	t.Run("ReserveKeyOnce", func(t *testing.T) {
		ctx, key := ctx(t), runID(t)
		first := entry(runID(t))
		cur, reserved, err := s.ReserveKey(ctx, key, first)
		require.NoError(t, err)
		assert.True(t, reserved)
		assert.Equal(t, first.RunID, cur.RunID)
		cur2, reserved, err := o.ReserveKey(ctx, key, entry(runID(t)))
		require.NoError(t, err)
		assert.False(t, reserved, "a key reserved within its window")
		assert.Equal(t, first.RunID, cur2.RunID, "the current entry")
		assert.Equal(t, first.Request, cur2.Request)
		assert.Equal(t, cur.Rev, cur2.Rev)
	})

	t.Run("ReplaceKeyWithStaleOldDoesNotReplace", func(t *testing.T) {
		ctx, key := ctx(t), runID(t)
		cur, reserved, err := s.ReserveKey(ctx, key, entry(runID(t)))
		require.NoError(t, err)
		require.True(t, reserved)
		next := entry(runID(t))
		rev, err := o.ReplaceKey(ctx, key, cur, next)
		require.NoError(t, err)
		require.NotZero(t, rev, "replaced over the current entry")
		rev, err = s.ReplaceKey(ctx, key, cur, entry(runID(t)))
		require.NoError(t, err)
		assert.Zero(t, rev, "replaced over a stale entry")
		now, reserved, err := s.ReserveKey(ctx, key, entry(runID(t)))
		require.NoError(t, err)
		assert.False(t, reserved)
		assert.Equal(t, next.RunID, now.RunID, "the replacing entry stands")
	})

	t.Run("DropKeyOfCurrentFreesIt", func(t *testing.T) {
		ctx, key := ctx(t), runID(t)
		cur, _, err := s.ReserveKey(ctx, key, entry(runID(t)))
		require.NoError(t, err)
		stale := cur
		stale.Rev++ // not the current entry: kept
		require.NoError(t, s.DropKey(ctx, key, stale))
		_, reserved, err := s.ReserveKey(ctx, key, entry(runID(t)))
		require.NoError(t, err)
		require.False(t, reserved, "DropKey of another entry dropped the key")
		require.NoError(t, o.DropKey(ctx, key, cur))
		next := entry(runID(t))
		got, reserved, err := s.ReserveKey(ctx, key, next)
		require.NoError(t, err)
		assert.True(t, reserved, "DropKey of the current entry frees the key")
		assert.Equal(t, next.RunID, got.RunID)
	})

	t.Run("ForgetKeyOnlyOfThatRun", func(t *testing.T) {
		ctx, key := ctx(t), runID(t)
		run := runID(t)
		_, _, err := s.ReserveKey(ctx, key, entry(run))
		require.NoError(t, err)
		require.NoError(t, s.ForgetKey(ctx, key, runID(t)))
		_, reserved, err := s.ReserveKey(ctx, key, entry(runID(t)))
		require.NoError(t, err)
		require.False(t, reserved, "ForgetKey of another run dropped the key")
		require.NoError(t, o.ForgetKey(ctx, key, run))
		_, reserved, err = s.ReserveKey(ctx, key, entry(runID(t)))
		require.NoError(t, err)
		assert.True(t, reserved, "ForgetKey of the key's run frees it")
	})

	t.Run("ForgetKeysOfDropsEveryKeyOfTheRun", func(t *testing.T) {
		ctx := ctx(t)
		run, other := runID(t), runID(t)
		k1, k2, k3 := runID(t), runID(t), runID(t)
		for _, k := range []string{k1, k2} {
			_, reserved, err := s.ReserveKey(ctx, k, entry(run))
			require.NoError(t, err)
			require.True(t, reserved)
		}
		_, _, err := s.ReserveKey(ctx, k3, entry(other))
		require.NoError(t, err)
		require.NoError(t, o.ForgetKeysOf(ctx, run))
		for _, k := range []string{k1, k2} {
			_, reserved, err := s.ReserveKey(ctx, k, entry(runID(t)))
			require.NoError(t, err)
			assert.True(t, reserved, "key %s of the run is free", k)
		}
		cur, reserved, err := s.ReserveKey(ctx, k3, entry(runID(t)))
		require.NoError(t, err)
		assert.False(t, reserved, "another run's key stays")
		assert.Equal(t, other, cur.RunID)
	})
}

func (c *suite) deletion(t *testing.T) {
	view := c.views(t, Lease)
	// s and o are two views of the store: o reads what s writes, as
	// another server would.
	s, o := view(), view()

	t.Run("DeleteRunRemovesItWhole", func(t *testing.T) {
		ctx, id := ctx(t), runID(t)
		evs := journalOf(t, id, "t1", 3, false)
		require.NoError(t, s.Claim(ctx, id, "a", nil))
		require.NoError(t, s.Append(ctx, &store.Writer{}, evs...))
		require.NoError(t, s.PutState(ctx, id, encodeState(t, controlState(id, "t1", stubbornv1.RunStatus_RUN_STATUS_RUNNING))))
		deleted, err := s.DeletedRun(ctx, id)
		require.NoError(t, err)
		require.False(t, deleted, "a run not deleted")

		require.NoError(t, o.DeleteRun(ctx, id))
		got, err := s.Events(ctx, id, 0)
		require.NoError(t, err, "the events of a run with none are none")
		assert.Empty(t, got, "its journal")
		_, err = s.State(ctx, id)
		require.ErrorIs(t, err, store.ErrNotFound, "its state")
		d, err := s.Driver(ctx, id)
		require.NoError(t, err)
		assert.Empty(t, d, "its driver")
		deleted, err = s.DeletedRun(ctx, id)
		require.NoError(t, err)
		assert.True(t, deleted)
	})

	t.Run("OnForgetCalledWithId", func(t *testing.T) {
		ctx, id := ctx(t), runID(t)
		a, b := s, o
		var mu sync.Mutex
		heard := map[string][]string{}
		for name, v := range map[string]store.Store{"deleter": a, "other": b} {
			v.OnForget(func(r string) {
				mu.Lock()
				defer mu.Unlock()
				heard[name] = append(heard[name], r)
			})
			// A round trip: the view is listening before the deletion.
			_, err := v.DeletedRun(ctx, id)
			require.NoError(t, err)
		}
		require.NoError(t, a.PutState(ctx, id, encodeState(t, controlState(id, "t1", stubbornv1.RunStatus_RUN_STATUS_RUNNING))))
		require.NoError(t, a.DeleteRun(ctx, id))
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(heard["deleter"]) > 0 && len(heard["other"]) > 0
		}, wait, 10*time.Millisecond, "every server that shares the store is told")
		mu.Lock()
		defer mu.Unlock()
		for name, runs := range heard {
			assert.Contains(t, runs, id, "the %s view is told the id", name)
		}
	})
}

func (c *suite) listing(t *testing.T) {
	view := c.views(t, Lease)
	// s and o are two views of the store: o reads what s writes, as
	// another server would.
	s, o := view(), view()
	ctx := ctx(t)
	tenant := runID(t)
	// Three runs of tenant: one driven (claimed), one with a state saved,
	// one finished; and one of another tenant.
	claimed, saved, finished, foreign := runID(t), runID(t), runID(t), runID(t)
	require.NoError(t, s.Claim(ctx, claimed, "a", encodeState(t, controlState(claimed, tenant, stubbornv1.RunStatus_RUN_STATUS_RUNNING))))
	require.NoError(t, s.PutState(ctx, saved, encodeState(t, controlState(saved, tenant, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION))))
	require.NoError(t, s.Append(ctx, &store.Writer{}, journalOf(t, finished, tenant, 2, true)...))
	require.NoError(t, s.PutState(ctx, foreign, encodeState(t, controlState(foreign, "other-"+tenant, stubbornv1.RunStatus_RUN_STATUS_RUNNING))))

	// Every store follows its runs (FollowSummaries): first a call with
	// nothing, then until ctx ends.
	fctx, cancel := context.WithCancel(ctx)
	first := make(chan [2]any, 1)
	followed := make(chan error, 1)
	go func() {
		followed <- o.FollowSummaries(fctx, []string{tenant}, func(sum *stubbornv1.RunSummary, deleted string) error {
			select {
			case first <- [2]any{sum, deleted}:
			default:
			}
			return nil
		})
	}()
	select {
	case err := <-followed:
		t.Fatalf("FollowSummaries returned before ctx ended: %v", err)
	case got := <-first:
		assert.Nil(t, got[0], "FollowSummaries's first call has no summary")
		assert.Equal(t, "", got[1], "nor a deleted run")
	case <-time.After(wait):
		t.Fatal("FollowSummaries does not follow")
	}
	cancel()
	select {
	case err := <-followed:
		assert.ErrorIs(t, err, context.Canceled, "FollowSummaries returns when ctx ends")
	case <-time.After(wait):
		t.Fatal("FollowSummaries did not return when ctx ended")
	}
	// Whether the store keeps an index: TenantRuns says so.
	indexed := !errors.Is(s.TenantRuns(ctx, []string{tenant}, func(string, store.ListKey) {}), store.ErrNoIndex)
	mine := []string{claimed, saved, finished}

	t.Run("Summaries", func(t *testing.T) {
		if !indexed {
			ok, err := s.Summaries(ctx, tenant, func(*stubbornv1.RunSummary) bool {
				t.Error("Summaries of a store without an index called fn")
				return true
			})
			require.NoError(t, err)
			assert.False(t, ok, "a store that keeps no index says Summaries are not ok")
			return
		}
		var got map[string]bool
		var ok bool
		var err error
		if !assert.Eventually(t, func() bool {
			got = map[string]bool{}
			ok, err = o.Summaries(ctx, tenant, func(sum *stubbornv1.RunSummary) bool {
				got[sum.GetRunId()] = true
				return true
			})
			return err == nil && ok && len(got) >= len(mine)
		}, wait, 50*time.Millisecond, "the tenant's runs are indexed") {
			t.Fatalf("Summaries: ok %v, err %v, listed %v; the tenant's runs: %v", ok, err, got, mine)
		}
		for _, id := range mine {
			assert.True(t, got[id], "run %s listed", id)
		}
		assert.False(t, got[foreign], "another tenant's run listed")
	})

	lists := func(t *testing.T, name string, list func(context.Context, []string, func(string, store.ListKey)) error, want []string) {
		got := map[string]store.ListKey{}
		err := list(ctx, []string{tenant}, func(id string, key store.ListKey) { got[id] = key })
		if errors.Is(err, store.ErrNoIndex) {
			assert.Empty(t, got, "%s called fn, then said ErrNoIndex", name)
			return
		}
		require.NoError(t, err)
		for _, id := range want {
			if assert.Contains(t, got, id, "%s lists run %s", name, id) {
				assert.Equal(t, id, got[id].ID, "its listing key's id")
				assert.NotZero(t, got[id].Nanos, "its listing key's creation time")
			}
		}
		assert.NotContains(t, got, foreign, "%s lists another tenant's run", name)
	}

	t.Run("TenantRuns", func(t *testing.T) { lists(t, "TenantRuns", o.TenantRuns, mine) })
	t.Run("ClaimedRuns", func(t *testing.T) {
		lists(t, "ClaimedRuns", o.ClaimedRuns, []string{claimed})
	})
}

func (c *suite) transient(t *testing.T) {
	s := c.views(t, Lease)()
	assert.False(t, s.Transient(errors.New("a plain error")))
	assert.False(t, s.Transient(store.ErrConflict), "a conflict is no passing trouble")
	assert.False(t, s.Transient(store.ErrNotFound))
}

func (c *suite) close(t *testing.T) {
	view := c.views(t, Lease)
	a, b := view(), view()
	require.NoError(t, a.Close())
	// The other views go on.
	id := runID(t)
	require.NoError(t, b.PutState(ctx(t), id, encodeState(t, controlState(id, "t1", stubbornv1.RunStatus_RUN_STATUS_RUNNING))))
	_, err := b.State(ctx(t), id)
	require.NoError(t, err)
}
