package runs

import (
	"context"
	"fmt"
	"time"

	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// A run must always have a driver that drives it. Two ways it could be
// left with none (issue 29, finding 3), and one way a server could serve
// a copy that is no longer the run (finding 5):
//
//   - a write of this server's failed (a conflict after its beats stopped
//     landing, a write that timed out through an outage): its copy is lost
//     (run.lose), but the owners bucket may still name this server, which
//     is alive and beating, so no other server takes the run over. lostHere
//     notes the run, and the scan (reclaim) drives it again from its
//     journal once the store still names this server, or forgets it when
//     it names another.
//   - this server's lease lapsed (it was stopped, or cut off from the
//     store, for longer than its lease) and another took its runs over: its
//     copies that never wrote meanwhile do not know. Once its beats land
//     again the scan checks every copy it drives against the owners bucket
//     (verifyClaims), and until then GetRun and commands check the run they
//     read (current).

// lostHere notes run id, whose copy here was lost by a failed write, to
// be looked at again a lease later (the outage that failed the write may
// be over by then; another server would take it over no sooner), and
// twice as long after each time it is lost again, up to maxReclaimWait: a
// store that keeps refusing a run's writes is not hammered.
func (m *Manager) lostHere(id string) {
	m.mu.Lock()
	if m.relost == nil {
		m.relost = map[string]*relost{}
	}
	l := m.relost[id]
	if l == nil {
		l = &relost{wait: m.cfg.Lease}
		m.relost[id] = l
	} else {
		l.wait = min(2*l.wait, maxReclaimWait)
	}
	l.at, l.resumed, l.notMine = time.Now().Add(l.wait), false, 0
	m.mu.Unlock()
}

// relost is a run lost here, to look at again at at.
type relost struct {
	// notMine counts the reads in a row that said another server drives
	// it (reclaimOne). Guarded by the Manager's mu.
	notMine int
	at      time.Time
	wait    time.Duration
	// resumed says it was driven again here: once that copy ends or is
	// lost in turn, it is dropped or looked at again.
	resumed bool
}

// maxReclaimWait bounds the wait before a run lost here is looked at
// again.
const maxReclaimWait = 5 * time.Minute

// poke wakes the scan.
func (m *Manager) poke() {
	select {
	case m.rescan <- struct{}{}:
	default:
	}
}

// reclaim drives again each run lost here whose driver the store still
// says is this server. It reports whether it left none behind.
func (m *Manager) reclaim() (clean bool) {
	now := time.Now()
	m.mu.Lock()
	var due []*relost
	var ids []string
	for id, l := range m.relost {
		switch r := m.runs[id]; {
		case l.resumed && (r == nil || r.isLost()):
			delete(m.relost, id) // its copy here was lost otherwise (taken over): not this server's
		case !l.resumed && !l.at.After(now):
			ids, due = append(ids, id), append(due, l)
		}
	}
	m.mu.Unlock()
	clean = true
	for i, id := range ids {
		if m.ctx.Err() != nil {
			return false
		}
		done, resumed, err := m.reclaimOne(id, due[i])
		if err != nil {
			clean = false
			m.log.Warn("driving a run lost here again", "run_id", id, "err", err)
		}
		m.mu.Lock()
		if l := m.relost[id]; l != nil {
			switch {
			case resumed:
				l.resumed = true // kept, so that its next loss waits longer
			case done:
				delete(m.relost, id)
			default:
				l.at = now.Add(m.cfg.Lease / scanTicks)
			}
		}
		m.mu.Unlock()
	}
	return clean
}

// reclaimOne drives run id again if the store says this server drives
// it (resumed); done says there is nothing more to do for it here. A read
// of the owners bucket may be answered by a NATS server that lags (a
// direct get, from a node that just came back): "not this server's" is
// believed only once notMineTimes reads in a row say so, and a run with
// no driver only once its journal says it finished, or after as many.
func (m *Manager) reclaimOne(id string, l *relost) (done, resumed bool, err error) {
	if r := m.local(id); r != nil && !r.isLost() {
		return true, false, nil // driven here again already
	}
	if !m.leaseHeld() {
		return false, false, nil // once this server's beats land again
	}
	owner, err := m.store.Driver(m.ctx, id)
	if err != nil {
		return false, false, err
	}
	if owner != m.owner {
		if owner == "" {
			if fin, err := m.finishedInJournal(id); err == nil && fin {
				return true, false, nil // it ended, and was let go
			}
		}
		// Another server drives it, or it was let go: unless the read
		// was stale.
		m.mu.Lock()
		l.notMine++
		n := l.notMine
		m.mu.Unlock()
		return n >= notMineTimes, false, nil
	}
	// A compare-and-set from this server to itself: of this server and
	// another taking the run over at the same moment, one wins. A
	// conflict may also be a stale read: looked at again.
	if err := m.store.TakeOver(m.ctx, id, m.owner, m.owner); err != nil {
		return false, false, err
	}
	m.log.Info("driving a run lost here again from its journal: the store still names this server its driver", "run_id", id)
	if err := m.resumeBecause(id, m.owner, "a write of its driver failed, and it is resumed from its journal"); err != nil {
		return false, false, err
	}
	return true, true, nil
}

// notMineTimes is how many reads in a row must say another server drives
// a run lost here before this server leaves it to that one.
const notMineTimes = 3

// finishedInJournal reports whether run id's journal ends with
// run_finished.
func (m *Manager) finishedInJournal(id string) (bool, error) {
	evs, err := m.store.Events(m.ctx, id, 0)
	if err != nil || len(evs) == 0 {
		return false, err
	}
	last := evs[len(evs)-1]
	if last.Finished {
		// Its last write landed although it failed here: the listing
		// index, which this server notes after a write it saw land, has
		// yet to learn of its end.
		m.store.IndexEnd(id, last)
	}
	return last.Finished, nil
}

// reclaimedLocked forgets run id, which ended here: a loss before does not
// make the next run's wait longer.
func (m *Manager) reclaimedLocked(id string) {
	if m.relost != nil {
		delete(m.relost, id)
	}
}

// landed records a heartbeat that landed, sent at sent; when the one
// before was a lease ago or more, other servers may have taken this
// one's runs over meanwhile: the scan checks them (verifyClaims).
func (m *Manager) landed(sent time.Time) {
	prev := m.beatLanded.Swap(sent.UnixNano())
	if prev != 0 && sent.Sub(time.Unix(0, prev)) >= m.cfg.Lease-m.leaseMargin() {
		m.lapses.Add(1)
		m.poke()
	}
}

// unverified reports whether this server's lease has lapsed since its
// runs' claims were last checked (verifyClaims), or lapses now.
func (m *Manager) unverified() bool {
	return m.lapses.Load() != m.verified.Load() || !m.leaseHeld()
}

// verifyIfLapsed checks this server's runs' claims once its lease has
// lapsed (scan).
func (m *Manager) verifyIfLapsed() {
	gen := m.lapses.Load()
	if gen == m.verified.Load() {
		return
	}
	if m.verifyClaims() {
		m.verified.Store(gen) // only the scan sets it
	}
}

// leaseMargin is how long before its lease ends a server counts as
// possibly dead to the others (JetStream's fence margin).
func (m *Manager) leaseMargin() time.Duration { return min(store.FenceMargin, m.cfg.Lease/4) }

// leaseHeld reports whether this server's last heartbeat landed less than
// a lease ago (less the margin): no other server may have taken its runs.
func (m *Manager) leaseHeld() bool {
	at := m.beatLanded.Load()
	return at != 0 && time.Since(time.Unix(0, at)) < m.cfg.Lease-m.leaseMargin()
}

// verifyClaims stops every copy this server drives of a run the store
// says another server drives (or none): it was taken over while this
// server's lease had lapsed.
func (m *Manager) verifyClaims() (clean bool) {
	m.mu.Lock()
	local := make([]*run, 0, len(m.runs))
	for _, r := range m.runs {
		local = append(local, r)
	}
	m.mu.Unlock()
	clean = true
	for _, r := range local {
		if m.ctx.Err() != nil {
			return false
		}
		select {
		case <-r.ready:
		default:
			continue // being claimed: its claim is fenced by the lease
		}
		if r.isLost() || r.isDone() {
			continue
		}
		if _, err := m.stillDriven(m.ctx, r); err != nil {
			clean = false
		}
	}
	return clean
}

// stillDriven reports whether the store still names this server the
// driver of r, a copy it drives; when not, r is lost (it writes nothing
// more, its watchers follow the store).
func (m *Manager) stillDriven(ctx context.Context, r *run) (bool, error) {
	r.mu.Lock()
	claiming := r.jw.Claimer != "" && !r.firstLanded
	r.mu.Unlock()
	if claiming {
		// A new run whose claim, its journal's first write, has yet to
		// land: the journal names nobody yet, and that write is fenced
		// by the journal's expected sequence and this server's lease.
		return true, nil
	}
	owner, err := m.store.Driver(ctx, r.id)
	if err != nil {
		return false, err
	}
	if owner == m.owner {
		return true, nil
	}
	if r.isDone() {
		return true, nil // it finished here meanwhile, and was let go
	}
	m.log.Warn("run taken over by another server: its copy here is stopped", "run_id", r.id, "driver", owner)
	r.lose(fmt.Errorf("%w: run %s is driven by %q", ErrConflict, r.id, owner), errLost)
	// Looked at again, in case the read was stale (reclaimOne).
	m.lostHere(r.id)
	return false, nil
}

// current returns r, a copy this server drives, if it may be served as
// the run's current state: while this server's lease is held and r is
// not parked, or else once the store says this server still drives it.
// A parked copy writes nothing that a takeover would fence, so it is
// checked each time: another server that saw this one's heartbeats late
// may have taken the run over, and ended it, while this one's lease held
// (make chaos, nats-sigstop). Nil when it does not (r is lost then: read
// the store); an error when that cannot be told.
func (m *Manager) current(ctx context.Context, r *run) (*run, error) {
	if r.isDone() || (!m.unverified() && !r.isParked()) {
		return r, nil
	}
	ok, err := m.stillDriven(ctx, r)
	if err != nil {
		return nil, fmt.Errorf("%w: the store cannot say whether this server still drives run %s: %v", ErrUnavailable, r.id, err)
	}
	if !ok {
		return nil, nil
	}
	return r, nil
}

// mayWrite reports whether r, a copy this server drives, may write its
// next events: yes while this server's lease is held and its claims were
// checked since it last lapsed; else only once the store says this
// server still drives it (stillDriven loses the copy when not). A copy
// that wakes from a wait after this server was stopped past its lease
// (a parked run's timer, a call that answers) must not write, and so
// call, before the server that took it over has: the lease's fence
// alone lets it, once a heartbeat lands again. When the store cannot
// say, the write is tried, and fenced as always.
func (m *Manager) mayWrite(r *run) bool {
	if !m.unverified() {
		return true
	}
	ok, err := m.stillDriven(m.letGo, r)
	return err != nil || ok
}

// isParked reports whether r waits parked (drive, park).
func (r *run) isParked() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.parking != nil
}
