package runs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
)

// parking is a parked run's wait: a timer (none when the run awaits a
// decision without timeout) and a hook on the run's context, either of
// which wakes it, once.
type parking struct {
	ctx      context.Context   // the run's own
	tracker  *controls.Tracker // the parked one
	decision bool              // it awaits a decision
	mu       sync.Mutex
	woken    bool
	timer    *time.Timer
	stop     func() bool
}

// claim marks the wait over, and reports whether this caller is the one to
// wake the run.
func (p *parking) claim() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.woken {
		return false
	}
	p.woken = true
	if p.timer != nil {
		p.timer.Stop()
	}
	if p.stop != nil {
		p.stop()
	}
	return true
}

// park keeps a parked run waiting without a goroutine: a timer wakes it
// when its backoff, or its decision's timeout, is over; the end of its
// context (CancelRun, its deadline, shutdown) wakes it at once; and
// DecideRun wakes it once its decision is recorded (decide). Woken, it is driven again
// from its journal, which replays up to the wait and goes on from there
// (or stops, when its context ended); abandoned meanwhile (Close, kill),
// it is only let go. Until woken, GetRun reads the parked tracker, whose
// state is the run's.
func (m *Manager) park(r *run, p *parking, until time.Time) {
	m.parked.Add(1)
	r.mu.Lock()
	r.parking = p
	if r.parkingSet != nil {
		close(r.parkingSet)
		r.parkingSet = nil
	}
	r.mu.Unlock()
	wake := func() {
		if p.claim() {
			m.wake(p.ctx, r)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !until.IsZero() {
		p.timer = time.AfterFunc(time.Until(until), wake)
	}
	p.stop = context.AfterFunc(p.ctx, wake)
}

// wake ends run r's parking: it is driven again from its journal.
func (m *Manager) wake(ctx context.Context, r *run) {
	m.parked.Add(-1)
	r.mu.Lock()
	r.parking = nil
	r.mu.Unlock()
	if r.isLost() {
		m.endDrive(r)
		return
	}
	if r.isDone() {
		// Ended as it parked: the store refused its events (endRefused).
		m.retire(r)
		m.endDrive(r)
		return
	}
	m.workers.run(func() { m.unpark(ctx, r) })
}

// decide decides run r, parked by tr for a decision, with d: the parked
// tracker still awaits the decision, and records it; once it is written,
// the run is woken, and its replay takes the decision from its journal.
// It returns the run's state with the decision, or ErrNotAwaitingDecision
// when that parking is over (another call woke it first) or is not for a
// decision.
func (m *Manager) decide(ctx context.Context, r *run, tr *controls.Tracker, d stubbornv1.Decision, limit *stubbornv1.SpendLimit) (*stubbornv1.ControlState, error) {
	r.mu.Lock()
	p, set := r.parking, r.parkingSet
	r.mu.Unlock()
	if p == nil && set != nil {
		// Parked a moment ago: its events are being written (drive).
		select {
		case <-set:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		r.mu.Lock()
		p = r.parking
		r.mu.Unlock()
	}
	if p == nil || p.tracker != tr || !p.decision || !p.claim() {
		return nil, fmt.Errorf("%w (another decision, its timeout or a cancellation came first)", ErrNotAwaitingDecision)
	}
	err := tr.Decide(d, limit)
	if err == nil {
		r.flush() // decision_received, before the replay reads the journal
	}
	m.wake(p.ctx, r)
	if err != nil {
		return nil, fmt.Errorf("%w (status %s)", err, tr.Status())
	}
	if err := notRecorded(r, "the decision"); err != nil {
		return nil, err
	}
	return tr.Snapshot(), nil
}

// unpark drives a parked run again: a new tracker replays its journal.
func (m *Manager) unpark(ctx context.Context, r *run) {
	r.flush() // the events the run recorded before it parked, if not yet written
	r.mu.Lock()
	recorded := r.events[:len(r.events):len(r.events)]
	r.mu.Unlock()
	journal, err := decodeAll(recorded)
	if err == nil && (len(journal) == 0 || journal[0].GetRunStarted().GetState() == nil) {
		err = errors.New("its journal does not start with run_started")
	}
	if err != nil {
		// Not expected: the run recorded these events itself.
		m.log.Error("run stopped: it cannot be resumed after its wait", "run_id", r.id, "err", err)
		r.lose(err, err)
		m.endDrive(r)
		return
	}
	state := proto.CloneOf(journal[0].GetRunStarted().GetState())
	tr := m.tracker(r, state, journal)
	// The new tracker's state is the fold of the whole journal: GetRun
	// reads it at once.
	r.setTracker(tr)
	r.replaying()
	m.drive(ctx, r, tr, state, true, "")
}
