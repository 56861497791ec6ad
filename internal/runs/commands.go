package runs

import (
	"context"
	"errors"
	"fmt"
	"time"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// Cancel cancels a run and waits (bounded by ctx) until it has ended. A
// finished run is returned as it is.
func (m *Manager) Cancel(ctx context.Context, id string) (*stubbornv1.ControlState, error) {
	return m.command(ctx, &store.Command{RunID: id, Cancel: true})
}

// Decide answers a run awaiting a decision; limit, when not nil, is the
// run's spend limit from then on (DecideRunRequest.spend_limit).
func (m *Manager) Decide(ctx context.Context, id string, d stubbornv1.Decision, limit *stubbornv1.SpendLimit) (*stubbornv1.ControlState, error) {
	return m.command(ctx, &store.Command{RunID: id, Decision: d, SpendLimit: store.CommandLimit(limit)})
}

// command carries out cmd here if this server drives the run, or sends it
// to the server that does.
//
// Only ctx's tenant may command its runs: that is checked here, on the
// server the command arrives at, before it is carried out or sent on.
func (m *Manager) command(ctx context.Context, cmd *store.Command) (*stubbornv1.ControlState, error) {
	if r := m.local(cmd.RunID); r != nil && !r.isLost() {
		if err := visible(ctx, cmd.RunID, r.tenant); err != nil {
			return nil, err
		}
		cur, err := m.current(ctx, r)
		if err != nil {
			return nil, err
		}
		if cur != nil {
			return m.handle(ctx, cmd)
		}
	}
	st, err := m.state(ctx, cmd.RunID)
	if err != nil {
		return nil, err
	}
	if store.IsTerminal(st.GetStatus()) {
		return m.handle(ctx, cmd)
	}
	owner, err := m.store.Driver(ctx, cmd.RunID)
	if err != nil {
		return nil, err
	}
	if owner == "" || owner == m.owner {
		return m.handle(ctx, cmd)
	}
	st, err = m.store.Send(ctx, owner, cmd)
	if errors.Is(err, store.ErrNotServing) && m.awaitTakeover(ctx, cmd.RunID, owner) {
		return m.command(ctx, cmd) // to the run's next driver
	}
	if err != nil && !errors.Is(err, ErrNotAwaitingDecision) && !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return st, err
}

// takeoverWait bounds how long a command waits for a run whose driver
// stopped to be taken over: the dead driver's lease runs out, then a scan
// takes the run over (a sixth of a lease later at most) and resumes it
// from its journal, which on a loaded store takes its own time — the
// fault suite allows a takeover a lease and 2 s. Two leases and 2 s.
func (m *Manager) takeoverWait() time.Duration { return 2*m.cfg.Lease + 2*time.Second }

// awaitTakeover waits, within ctx and takeoverWait, until the run
// whose driver dead stopped serving has another driver (or none: it
// ended), and reports whether it has. This server's scan is woken first:
// the run may be this server's to take over.
func (m *Manager) awaitTakeover(ctx context.Context, id, dead string) bool {
	m.poke()
	ctx, cancel := context.WithTimeout(ctx, m.takeoverWait())
	defer cancel()
	t := time.NewTicker(takeoverPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-m.ctx.Done():
			return false
		case <-t.C:
		}
		owner, err := m.store.Driver(ctx, id)
		if err == nil && owner != dead {
			return true
		}
	}
}

// awaitResumed waits, within ctx and takeoverWait, for a run that
// the store says this server drives, but that it does not drive yet (it
// is taking the run over, or driving again a run lost here), to be driven
// here; it reports whether it is. It returns false at once when the store
// names another driver.
func (m *Manager) awaitResumed(ctx context.Context, id string) bool {
	ctx, cancel := context.WithTimeout(ctx, m.takeoverWait())
	defer cancel()
	t := time.NewTicker(takeoverPoll)
	defer t.Stop()
	m.poke() // a run lost here is driven again by the scan
	for {
		if owner, err := m.store.Driver(ctx, id); err != nil || owner != m.owner {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-m.ctx.Done():
			return false
		case <-t.C:
		}
		if r := m.local(id); r != nil && !r.isLost() {
			return true
		}
	}
}

// takeoverPoll is how often awaitTakeover asks the store for the driver.
const takeoverPoll = 50 * time.Millisecond

// handle carries out a command on a run this server drives, or on a
// finished run.
func (m *Manager) handle(ctx context.Context, cmd *store.Command) (*stubbornv1.ControlState, error) {
	r := m.local(cmd.RunID)
	if r == nil || r.isLost() {
		st, err := m.store.State(ctx, cmd.RunID)
		if err != nil {
			return nil, err
		}
		if !store.IsTerminal(st.GetStatus()) {
			if m.awaitResumed(ctx, cmd.RunID) {
				return m.handle(ctx, cmd)
			}
			return nil, fmt.Errorf("%w: run %s is driven by another server", ErrUnavailable, cmd.RunID)
		}
		if cmd.Cancel {
			return st, nil
		}
		return nil, fmt.Errorf("%w (status %s)", ErrNotAwaitingDecision, st.GetStatus())
	}
	if cmd.Cancel {
		r.stop(errCancelled)
		select {
		case <-r.ended:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if err := notRecorded(r, "the cancellation"); err != nil {
			return nil, err
		}
		return r.snapshot()
	}
	// A run being resumed from its journal is decided once the replay has
	// reached where the run waits.
	if err := r.caughtUp(ctx); err != nil {
		return nil, err
	}
	r.waitMu.Lock()
	r.mu.Lock()
	tr, parked := r.tracker, r.parking != nil || r.parkingSet != nil
	r.mu.Unlock()
	if parked {
		// Parked, or being parked: its tracker records the decision, and
		// the run is woken to take it (decide).
		r.waitMu.Unlock()
		return m.decide(ctx, r, tr, cmd.Decision, cmd.SpendLimit.Proto())
	}
	if tr == nil {
		r.waitMu.Unlock()
		return nil, fmt.Errorf("%w (the run has ended)", ErrNotAwaitingDecision)
	}
	err := tr.Decide(cmd.Decision, cmd.SpendLimit.Proto()) // its wait, if any, is not parked now (evict)
	r.waitMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("%w (status %s)", err, tr.Status())
	}
	r.flush() // decision_received: the caller is answered once it is written
	if err := notRecorded(r, "the decision"); err != nil {
		return nil, err
	}
	return tr.Snapshot(), nil
}

// notRecorded is ErrUnavailable when run r was lost here (a write failed,
// or it was taken over) before what a command did to it was written: an
// OK to a command means the command is in the run's journal.
func notRecorded(r *run, what string) error {
	if !r.isLost() {
		return nil
	}
	why := "it was taken over by another server"
	if err := r.lostBecause(); err != nil {
		why = err.Error()
	}
	return fmt.Errorf("%w: %s on run %s may not be recorded (this server lost the run: %s); read the run and try again", ErrUnavailable, what, r.id, why)
}
