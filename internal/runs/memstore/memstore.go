package memstore

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// Memory is a Store in memory: everything is lost with the process. Several
// Managers in one process may share one, as replicas share JetStream.
//
// It keeps finished runs up to its limits (SetLimits; by default the
// DefaultMemoryRuns latest), forgetting the oldest first, as JetStream's
// retention does: a server that runs for long must not grow without bound.
type Memory struct {
	lease time.Duration

	maxFinished int           // finished runs kept
	retention   time.Duration // how long a finished run is kept; 0: no age limit
	clock       func() time.Time
	finished    []finishedRun // oldest first
	// pruned are the runs pruned last, so that a finished run's state,
	// saved a moment after its run_finished, does not come back once the
	// run is pruned.
	pruned      map[string]struct{}
	prunedOrder []string
	mu          sync.Mutex
	events      map[string][]store.Event // the journals of runs not finished
	journals    map[string]packed        // finished runs' journals (pack.go)
	states      map[string][]byte        // encoded: pointer-free, nothing for the GC to scan
	owners      map[string]string
	beats       map[string]time.Time
	left        map[string]time.Time // when each owner left (Leave), for a lease
	changed     chan struct{}        // closed and cleared by the next append; made by a follower that waits
	servers     map[string]func(context.Context, *store.Command) (*stubbornv1.ControlState, error)
	maxStale    time.Duration
	// keys are the idempotency keys (keys.go), each for keyWin.
	keys   memoryKeys
	keyWin atomic.Int64
	// forget are told of each run deleted (delete.go).
	forget []func(string)
	// deleted are the tombstones of the runs deleted, oldest first in
	// deletedOrder (tombstone.go).
	deleted      map[string]struct{}
	deletedOrder []string
	// feed tells the followers of the states saved (feed.go).
	feed feed
}

var _ store.Store = (*Memory)(nil)

// finishedRun is a finished run in a Memory store, for its limits.
type finishedRun struct {
	id string
	at time.Time
}

// DefaultMemoryRuns is how many finished runs a Memory store keeps unless
// told otherwise: about 110 MB of runs of one attempt (a finished run is
// its packed journal, which its final state shares: pack.go).
const DefaultMemoryRuns = 100_000

// NewMemory returns an empty in-memory store whose owners count as dead
// lease after their last beat. It keeps the DefaultMemoryRuns latest
// finished runs.
func NewMemory(lease time.Duration) *Memory {
	return &Memory{
		lease:       lease,
		maxFinished: DefaultMemoryRuns,
		clock:       time.Now,
		events:      map[string][]store.Event{},
		journals:    map[string]packed{},
		states:      map[string][]byte{},
		owners:      map[string]string{},
		beats:       map[string]time.Time{},
		left:        map[string]time.Time{},
		servers:     map[string]func(context.Context, *store.Command) (*stubbornv1.ControlState, error){},
	}
}

// Append records evs if they are the next events of their run, and the
// journal ends where w's view of it does (w.Cursor is the number of events
// the writer knows of).
func (s *Memory) Append(_ context.Context, w *store.Writer, add ...store.Event) error {
	if err := store.CheckAppend(add); err != nil || len(add) == 0 {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	first, ev := add[0], add[len(add)-1]
	evs := s.events[first.RunID]
	if evs == nil {
		if p, ok := s.journals[first.RunID]; ok {
			// Appended to after its run_finished: never done by the
			// Manager; kept as any journal would.
			evs = p.events(first.RunID, 0)
			delete(s.journals, first.RunID)
			s.events[first.RunID] = evs
		}
	}
	if first.Seq != int64(len(evs))+1 {
		return fmt.Errorf("%w: event %d of run %s, journal has %d", store.ErrConflict, first.Seq, first.RunID, len(evs))
	}
	if w != nil && w.Cursor != uint64(len(evs)) {
		return fmt.Errorf("%w: run %s's journal has %d events, its writer knew of %d", store.ErrConflict, first.RunID, len(evs), w.Cursor)
	}
	if w != nil {
		w.Cursor = uint64(len(evs) + len(add))
	}
	if ev.Finished {
		// An event's encoding is never changed once recorded: the
		// readers that were handed the recorder's own keep them, and
		// the journal is kept packed from now on.
		all := append(evs, add...) // past the length readers were handed
		delete(s.events, first.RunID)
		s.journals[first.RunID] = pack(all)
		s.finished = append(s.finished, finishedRun{ev.RunID, s.clock().UTC()})
		s.pruneLocked()
	} else {
		// An event's encoding is never changed once recorded, so the
		// store keeps and hands out the recorder's own, without copying.
		if evs == nil {
			// A run's journal takes four events or more: room for them at once.
			evs = make([]store.Event, 0, max(len(add), 4))
		}
		s.events[first.RunID] = append(evs, add...)
	}
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
	return nil
}

// SetLimits sets how many finished runs the store keeps (at least 1) and
// for how long after they finished (0: no age limit). Runs beyond either
// limit go, oldest first, as runs finish.
// SetKeyWindow sets how long an idempotency key names its run; 0 means
// DefaultKeyWindow.
func (s *Memory) SetKeyWindow(d time.Duration) { s.keyWin.Store(int64(d)) }

func (s *Memory) keyWindow() time.Duration {
	if d := time.Duration(s.keyWin.Load()); d > 0 {
		return d
	}
	return store.DefaultKeyWindow
}

func (s *Memory) SetLimits(maxFinished int, retention time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.maxFinished = max(maxFinished, 1)
	s.retention = retention
	s.pruneLocked()
}

// pruneLocked forgets the finished runs beyond the limits: their events and
// state. Callers hold s.mu.
func (s *Memory) pruneLocked() {
	now := s.clock()
	n := 0
	for n < len(s.finished) {
		f := s.finished[n]
		if len(s.finished)-n <= s.maxFinished && (s.retention <= 0 || now.Sub(f.at) < s.retention) {
			break
		}
		delete(s.events, f.id)
		delete(s.journals, f.id)
		delete(s.states, f.id)
		s.rememberPrunedLocked(f.id)
		n++
	}
	if n > 0 {
		s.finished = s.finished[n:]
	}
}

// prunedMemory is how many pruned runs PutState recognizes.
const prunedMemory = 4096

func (s *Memory) rememberPrunedLocked(id string) {
	if s.pruned == nil {
		s.pruned = make(map[string]struct{}, prunedMemory)
	}
	if len(s.prunedOrder) == prunedMemory {
		delete(s.pruned, s.prunedOrder[0])
		s.prunedOrder = s.prunedOrder[1:]
	}
	s.pruned[id] = struct{}{}
	s.prunedOrder = append(s.prunedOrder, id)
}

// Events returns the run's events after seq after.
func (s *Memory) Events(_ context.Context, runID string, after int64) ([]store.Event, error) {
	evs, _ := s.since(runID, after)
	return evs, nil
}

// JournalFrom returns the run's whole journal and sets w's view to its
// end.
func (s *Memory) JournalFrom(_ context.Context, runID string, w *store.Writer) ([]store.Event, error) {
	evs, _ := s.since(runID, 0)
	w.Cursor = uint64(len(evs))
	return evs, nil
}

// EventLimit is store.MaxEventBytes: the memory store takes any event the
// Manager records.
func (s *Memory) EventLimit() int { return store.MaxEventBytes }

// JournalLost is always false: a memory store's journals are never lost
// while its runs' claims stand (both go with the process).
func (s *Memory) JournalLost(context.Context, string) (bool, string, error) { return false, "", nil }

// FinalInJournal is false: State reads the states saved, a finished run's
// final one included.
func (s *Memory) FinalInJournal() bool { return false }

// Admit admits every run: the store makes room itself, forgetting the
// oldest finished runs (SetLimits).
func (s *Memory) Admit(context.Context, int) error { return nil }

// ClaimsInJournal is false: runs are claimed with Claim.
func (s *Memory) ClaimsInJournal() bool { return false }

// ClaimMarks has no marks to give (ClaimsInJournal is false).
func (s *Memory) ClaimMarks(context.Context, func(string, uint64, uint64, time.Time)) error {
	return nil
}

// JournalOrphans has none to give (ClaimsInJournal is false).
func (s *Memory) JournalOrphans(context.Context, map[string]uint64, func(string, string)) error {
	return nil
}

// DropMark has no mark to drop (ClaimsInJournal is false).
func (s *Memory) DropMark(context.Context, string, uint64) error { return nil }

// Summaries reports the index not ok: the memory store keeps none, and the
// Manager lists from the states.
func (s *Memory) Summaries(context.Context, string, func(*stubbornv1.RunSummary) bool) (bool, error) {
	return false, nil
}

// IndexEnd has no index to tell.
func (s *Memory) IndexEnd(string, store.Event) {}

// TenantRuns is store.ErrNoIndex: the Manager lists from the states.
func (s *Memory) TenantRuns(context.Context, []string, func(string, store.ListKey)) error {
	return store.ErrNoIndex
}

// ClaimedRuns is store.ErrNoIndex: the Manager lists from the states.
func (s *Memory) ClaimedRuns(context.Context, []string, func(string, store.ListKey)) error {
	return store.ErrNoIndex
}

func (s *Memory) since(runID string, after int64) ([]store.Event, <-chan struct{}) {
	evs, changed, _, _ := s.sinceOrGone(runID, after)
	return evs, changed
}

// sinceOrGone is since, and also reports a run the store does not know
// (never saved, or pruned), and a finished run with no event after after
// (finished: nothing is coming either).
func (s *Memory) sinceOrGone(runID string, after int64) (_ []store.Event, _ <-chan struct{}, gone, finished bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if after < 0 {
		after = 0
	}
	if p, ok := s.journals[runID]; ok {
		evs := p.events(runID, after)
		return evs, nil, false, len(evs) == 0
	}
	evs, ok := s.events[runID]
	if after >= int64(len(evs)) {
		if !ok {
			if _, saved := s.states[runID]; !saved {
				return nil, nil, true, false
			}
		}
		if len(evs) > 0 && evs[len(evs)-1].Finished {
			return nil, nil, false, true
		}
		if s.changed == nil {
			s.changed = make(chan struct{})
		}
		return nil, s.changed, false, false
	}
	return evs[after:len(evs):len(evs)], nil, false, false
}

// Follow sends the run's events after seq after, then new ones, until
// run_finished; at or past a finished run's last event it returns at once.
func (s *Memory) Follow(ctx context.Context, runID string, after int64, fn func(store.Event) error) error {
	for {
		evs, changed, gone, finished := s.sinceOrGone(runID, after)
		if gone {
			return fmt.Errorf("%w: %q", store.ErrNotFound, runID)
		}
		if finished {
			return nil // nothing after after, and nothing is coming
		}
		for _, ev := range evs {
			if err := fn(ev); err != nil {
				return err
			}
			after = ev.Seq
			if ev.Finished {
				return nil
			}
		}
		if len(evs) > 0 {
			continue
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// PutState saves a snapshot as it is encoded: pointer-free, nothing for the
// garbage collector to scan.
func (s *Memory) PutState(_ context.Context, runID string, state []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, gone := s.pruned[runID]; gone {
		return nil
	}
	if p, ok := s.journals[runID]; ok {
		state = p.share(state)
	}
	s.states[runID] = state
	s.feed.saved(state)
	return nil
}

// State returns a saved snapshot.
func (s *Memory) State(_ context.Context, runID string) (*stubbornv1.ControlState, error) {
	s.mu.Lock()
	data, ok := s.states[runID]
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: %q", store.ErrNotFound, runID)
	}
	return store.ReadState(runID, data)
}

// States calls fn with every snapshot.
func (s *Memory) States(_ context.Context, fn func(*stubbornv1.ControlState) bool) error {
	s.mu.Lock()
	all := make(map[string][]byte, len(s.states))
	for id, data := range s.states {
		all[id] = data
	}
	s.mu.Unlock()
	for id, data := range all {
		st, err := store.DecodeState(data)
		if err != nil {
			// One run that does not decode costs that run only (issue 30).
			slog.Error("listing: a run whose stored state cannot be read is left out (DeleteRun removes it)", "run_id", id, "err", err)
			continue
		}
		if !fn(st) {
			break
		}
	}
	return nil
}

// Beat records that owner is alive now.
func (s *Memory) Beat(_ context.Context, owner string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.beats[owner] = time.Now()
	delete(s.left, owner)
	return nil
}

// Alive reports whether owner beat within the lease.
func (s *Memory) Alive(_ context.Context, owner string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.beats[owner]
	return ok && time.Since(at) < s.lease, nil
}

// Live calls fn with every owner that beat, or left, within the lease.
func (s *Memory) Live(_ context.Context, fn func(owner string, left bool)) error {
	s.mu.Lock()
	var live, left []string
	for owner, at := range s.beats {
		if time.Since(at) < s.lease {
			live = append(live, owner)
		}
	}
	for owner, at := range s.left {
		if time.Since(at) < s.lease {
			left = append(left, owner)
		} else {
			delete(s.left, owner)
		}
	}
	s.mu.Unlock()
	for _, owner := range live {
		fn(owner, false)
	}
	for _, owner := range left {
		fn(owner, true)
	}
	return nil
}

// Leave forgets owner's beats, and says it left for a lease.
func (s *Memory) Leave(_ context.Context, owner string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.beats, owner)
	delete(s.servers, owner)
	s.left[owner] = time.Now()
	return nil
}

// Claim records the driver of a new run.
func (s *Memory) Claim(_ context.Context, runID, owner string, state []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, taken := s.owners[runID]; taken {
		return fmt.Errorf("%w: run %s already has a driver", store.ErrConflict, runID)
	}
	s.owners[runID] = owner
	if _, saved := s.states[runID]; !saved && state != nil {
		s.states[runID] = state
		s.feed.saved(state)
	}
	return nil
}

// Driver returns the run's driver.
func (s *Memory) Driver(_ context.Context, runID string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.owners[runID], nil
}

// Owners calls fn with every driven run.
func (s *Memory) Owners(_ context.Context, fn func(runID, owner string) bool) error {
	s.mu.Lock()
	all := make(map[string]string, len(s.owners))
	for k, v := range s.owners {
		all[k] = v
	}
	s.mu.Unlock()
	for k, v := range all {
		if !fn(k, v) {
			break
		}
	}
	return nil
}

// TakeOver moves a run from one driver to another, if it is still from's.
func (s *Memory) TakeOver(_ context.Context, runID, from, owner string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.owners[runID] != from {
		return fmt.Errorf("%w: run %s is driven by %q, not %q", store.ErrConflict, runID, s.owners[runID], from)
	}
	s.owners[runID] = owner
	return nil
}

// Release forgets a run's driver.
func (s *Memory) Release(_ context.Context, runID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.owners, runID)
	return nil
}

// Serve registers owner's command handler until stop.
func (s *Memory) Serve(ctx context.Context, owner string, handle func(context.Context, *store.Command) (*stubbornv1.ControlState, error)) (func(), error) {
	s.mu.Lock()
	s.servers[owner] = handle
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.servers, owner)
	}, nil
}

// Send calls owner's command handler.
func (s *Memory) Send(ctx context.Context, owner string, cmd *store.Command) (*stubbornv1.ControlState, error) {
	s.mu.Lock()
	handle := s.servers[owner]
	s.mu.Unlock()
	if handle == nil {
		return nil, store.ErrNotServing
	}
	return handle(ctx, cmd)
}

// Transient is false: the memory store answers every call at once.
func (s *Memory) Transient(error) bool { return false }

// Close does nothing.
func (s *Memory) Close() error { return nil }
