package runs

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/stubbornhq/stubborn/controls"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
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
// DecideRun wakes it with the decision (decide). Woken, it is driven again
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
			m.wake(p.ctx, r, nil)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !until.IsZero() {
		p.timer = time.AfterFunc(time.Until(until), wake)
	}
	p.stop = context.AfterFunc(p.ctx, wake)
}

// wake ends run r's parking: it is driven again from its journal, with
// answer, when set, for the decision it awaits.
func (m *Manager) wake(ctx context.Context, r *run, answer *decision) {
	m.parked.Add(-1)
	r.mu.Lock()
	r.parking = nil
	r.mu.Unlock()
	if r.isLost() {
		answer.give(ErrClosed)
		m.endDrive(r)
		return
	}
	if r.isDone() {
		// Ended as it parked: the store refused its events (endRefused).
		answer.give(ErrNotAwaitingDecision)
		m.retire(r)
		m.endDrive(r)
		return
	}
	m.workers.run(func() { m.unpark(ctx, r, answer) })
}

// decision is a DecideRun for a parked run: the decision, and where to
// say whether the run took it.
type decision struct {
	d     stubbornv1.Decision
	taken chan error // buffered: one answer
}

// give reports the decision taken (nil) or not; only the first report
// counts.
func (a *decision) give(err error) {
	if a == nil {
		return
	}
	select {
	case a.taken <- err:
	default:
	}
}

// decide wakes run r, parked by tr for a decision (tr said so:
// controls.ErrParked), with d, and waits until the replayed run has taken
// it. It reports false when that parking is over (another call woke it
// first). Once the run is woken with d, d is taken whatever the caller's
// context: the replay, which calls no delegate, is waited for.
func (m *Manager) decide(ctx context.Context, r *run, tr *controls.Tracker, d stubbornv1.Decision) (ok bool, err error) {
	r.mu.Lock()
	p, set := r.parking, r.parkingSet
	r.mu.Unlock()
	if p == nil && set != nil {
		// Parked a moment ago: its events are being written (drive).
		select {
		case <-set:
		case <-ctx.Done():
			return true, ctx.Err()
		}
		r.mu.Lock()
		p = r.parking
		r.mu.Unlock()
	}
	if p == nil || p.tracker != tr || !p.decision || !p.claim() {
		return false, nil
	}
	answer := &decision{d: d, taken: make(chan error, 1)}
	m.wake(p.ctx, r, answer)
	err = <-answer.taken
	if err == nil {
		r.flush() // decision_received, recorded before it was taken
	}
	return true, err
}

// unpark drives a parked run again: a new tracker replays its journal.
func (m *Manager) unpark(ctx context.Context, r *run, answer *decision) {
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
		answer.give(err)
		r.lose(err, err)
		m.endDrive(r)
		return
	}
	state := proto.CloneOf(journal[0].GetRunStarted().GetState())
	tr := m.tracker(r, state, journal)
	// GetRun reads the parked tracker, whose state is whole, until the new
	// one has replayed the journal.
	tr.OnLive(func() { r.setTracker(tr) })
	r.replaying()
	if answer != nil {
		tr.Answer(answer.d, func() { answer.give(nil) })
	}
	m.drive(ctx, r, tr, state, true, "")
	// The run ended or parked again without reaching its decision (it
	// cannot: its journal ends awaiting it).
	answer.give(ErrNotAwaitingDecision)
}
