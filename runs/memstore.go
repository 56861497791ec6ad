package runs

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
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
	events      map[string][]Event
	states      map[string][]byte // encoded: pointer-free, nothing for the GC to scan
	owners      map[string]string
	beats       map[string]time.Time
	left        map[string]time.Time // when each owner left (Leave), for a lease
	changed     chan struct{}        // closed and cleared by the next append; made by a follower that waits
	servers     map[string]func(context.Context, *Command) (*stubbornv1.ControlState, error)
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
}

var _ Store = (*Memory)(nil)

// finishedRun is a finished run in a Memory store, for its limits.
type finishedRun struct {
	id string
	at time.Time
}

// DefaultMemoryRuns is how many finished runs a Memory store keeps unless
// told otherwise: about 200 MB of runs with one or two attempts.
const DefaultMemoryRuns = 100_000

// NewMemory returns an empty in-memory store whose owners count as dead
// lease after their last beat. It keeps the DefaultMemoryRuns latest
// finished runs.
func NewMemory(lease time.Duration) *Memory {
	return &Memory{
		lease:       lease,
		maxFinished: DefaultMemoryRuns,
		clock:       time.Now,
		events:      map[string][]Event{},
		states:      map[string][]byte{},
		owners:      map[string]string{},
		beats:       map[string]time.Time{},
		left:        map[string]time.Time{},
		servers:     map[string]func(context.Context, *Command) (*stubbornv1.ControlState, error){},
	}
}

// Append records evs if they are the next events of their run.
func (s *Memory) Append(_ context.Context, add ...Event) error {
	if err := checkAppend(add); err != nil || len(add) == 0 {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	first, ev := add[0], add[len(add)-1]
	evs := s.events[first.RunID]
	if first.Seq != int64(len(evs))+1 {
		return fmt.Errorf("%w: event %d of run %s, journal has %d", ErrConflict, first.Seq, first.RunID, len(evs))
	}
	// An event's encoding is never changed once recorded, so the store
	// keeps and hands out the recorder's own, without copying.
	s.events[first.RunID] = append(evs, add...)
	if ev.Finished {
		s.finished = append(s.finished, finishedRun{ev.RunID, s.clock()})
		s.pruneLocked()
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
	return DefaultKeyWindow
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
func (s *Memory) Events(_ context.Context, runID string, after int64) ([]Event, error) {
	evs, _ := s.since(runID, after)
	return evs, nil
}

func (s *Memory) since(runID string, after int64) ([]Event, <-chan struct{}) {
	evs, changed, _, _ := s.sinceOrGone(runID, after)
	return evs, changed
}

// sinceOrGone is since, and also reports a run the store does not know
// (never saved, or pruned), and a finished run with no event after after
// (finished: nothing is coming either).
func (s *Memory) sinceOrGone(runID string, after int64) (_ []Event, _ <-chan struct{}, gone, finished bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	evs, ok := s.events[runID]
	if after < 0 {
		after = 0
	}
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
func (s *Memory) Follow(ctx context.Context, runID string, after int64, fn func(Event) error) error {
	for {
		evs, changed, gone, finished := s.sinceOrGone(runID, after)
		if gone {
			return fmt.Errorf("%w: %q", ErrNotFound, runID)
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
	s.states[runID] = state
	return nil
}

// State returns a saved snapshot.
func (s *Memory) State(_ context.Context, runID string) (*stubbornv1.ControlState, error) {
	s.mu.Lock()
	data, ok := s.states[runID]
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, runID)
	}
	return readState(runID, data)
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
		st, err := decodeState(data)
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

// stateDecodes counts the states decoded whole (decodeState), for tests
// of what a listing costs.
var stateDecodes atomic.Int64

func decodeState(data []byte) (*stubbornv1.ControlState, error) {
	stateDecodes.Add(1)
	st := &stubbornv1.ControlState{}
	if err := proto.Unmarshal(data, st); err != nil {
		return nil, fmt.Errorf("undecodable run state: %w", err)
	}
	return st, nil
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
		return fmt.Errorf("%w: run %s already has a driver", ErrConflict, runID)
	}
	s.owners[runID] = owner
	if _, saved := s.states[runID]; !saved && state != nil {
		s.states[runID] = state
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
		return fmt.Errorf("%w: run %s is driven by %q, not %q", ErrConflict, runID, s.owners[runID], from)
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
func (s *Memory) Serve(ctx context.Context, owner string, handle func(context.Context, *Command) (*stubbornv1.ControlState, error)) (func(), error) {
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
func (s *Memory) Send(ctx context.Context, owner string, cmd *Command) (*stubbornv1.ControlState, error) {
	s.mu.Lock()
	handle := s.servers[owner]
	s.mu.Unlock()
	if handle == nil {
		return nil, errNotServing
	}
	return handle(ctx, cmd)
}

// Close does nothing.
func (s *Memory) Close() error { return nil }
