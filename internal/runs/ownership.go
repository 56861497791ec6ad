package runs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// beat tells the store this server is alive, three times a lease, until
// ctx ends.
func (m *Manager) beat(ctx context.Context) {
	defer m.beating.Done()
	t := time.NewTicker(m.cfg.Lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if m.paused.Load() {
			continue
		}
		sent := time.Now()
		if err := m.store.Beat(ctx, m.owner); err != nil {
			if ctx.Err() == nil {
				m.log.Warn("heartbeat failed", "err", err)
			}
			continue
		}
		m.landed(sent)
	}
}

// scan takes over runs whose owner is dead: at once, then when a server
// it saw alive has stopped beating or another one left, or when the last
// scan left orphans behind, and every fullScanEvery ticks whatever
// happened. It looks at the heartbeats (a few entries) scanTicks times a
// lease, so that a dead server's runs are taken over soon after its
// heartbeat expires (a lease after its last beat landed), not up to half
// a lease later; listing every run's driver costs in proportion to the
// runs (10,000 waiting runs on JetStream: ~2 % of a core each time), and
// is done only then. Woken (poke), it also drives again the runs lost
// here that the store says this server drives, and checks this server's
// runs once its lease had lapsed (reclaim.go). first says whether the
// first scan is still to be made (New made it for a sole owner).
func (m *Manager) scan(first bool) {
	defer m.loops.Done()
	t := time.NewTicker(m.cfg.Lease / scanTicks)
	defer t.Stop()
	dirty := first
	var seen map[string]bool
	sinceFull := 0
	for {
		if !m.paused.Load() {
			m.verifyIfLapsed()
			m.reclaim() // what it leaves, the next tick tries again
			live, left, err := m.liveOwners()
			if err != nil {
				live = nil
			}
			sinceFull++
			if err != nil || first || dirty || left || gone(seen, live) || sinceFull >= fullScanEvery {
				dirty = !m.takeOverOrphans(first && m.cfg.SoleOwner, live)
				first, sinceFull = false, 0
			}
			if err == nil {
				seen = live
			}
		} else {
			dirty = true // servers may have come and gone meanwhile, unseen
		}
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		case <-m.rescan:
		}
	}
}

// scanTicks is how many times a lease the scan looks at the heartbeats.
const scanTicks = 6

// fullScanEvery bounds the scans between two listings of every run's
// driver: a server that came and went unseen (it stopped within a tick
// of starting without leaving, or this server's scan took longer than a
// lease) is never seen to stop, and its runs wait for this (five leases).
// A server that closes leaves (Store.Leave), which the next scan sees.
const fullScanEvery = 5 * scanTicks

// liveOwners returns the other servers that beat within the lease, and
// whether another one left within it.
func (m *Manager) liveOwners() (live map[string]bool, left bool, err error) {
	live = map[string]bool{}
	err = m.store.Live(m.ctx, func(owner string, gone bool) {
		switch {
		case owner == m.owner:
		case gone:
			left = true
		default:
			live[owner] = true
		}
	})
	return live, left, err
}

// gone reports whether a server in seen is not in live.
func gone(seen, live map[string]bool) bool {
	for owner := range seen {
		if !live[owner] {
			return true
		}
	}
	return false
}

// takeOverOrphans resumes every run whose owner is dead (all other owners'
// runs when sole). It reports whether it left none behind: none it could
// not list, take over or resume, and no owner whose liveness it could not
// tell or that it found alive although live (the heartbeats just listed,
// nil when that failed) has it no more: the two reads may disagree for a
// moment (a replica that has not expired the heartbeat yet), and the scan
// after next would not look again.
func (m *Manager) takeOverOrphans(sole bool, live map[string]bool) (clean bool) {
	orphans, marks, clean := m.findOrphans(sole, live)
	if !m.takeOverAll(orphans) {
		return false
	}
	dropped := m.dropMarks(marks)
	return clean && dropped
}

// findOrphans returns the runs of dead servers (all others' when sole):
// those of owners entries, and those claimed in their journals, without
// owners entries (claims.go), found from their servers' marks, which it
// returns too. clean is false when a server's liveness or a listing could
// not be read, or live (when not nil) missed a server alive.
func (m *Manager) findOrphans(sole bool, live map[string]bool) (orphans []orphan, marks map[string]markRev, clean bool) {
	clean = true
	alive := map[string]bool{m.owner: true}
	dead := func(owner string) bool {
		isLive, seen := alive[owner]
		if !seen && !sole {
			ok, err := m.store.Alive(m.ctx, owner)
			isLive = err != nil || ok // when in doubt, leave it
			if err != nil || (ok && live != nil && !live[owner]) {
				clean = false
			}
			alive[owner] = isLive
		}
		return owner != m.owner && (sole || !isLive)
	}
	err := m.store.Owners(m.ctx, func(runID, owner string) bool {
		if dead(owner) {
			orphans = append(orphans, orphan{runID, owner})
		}
		return m.ctx.Err() == nil
	})
	if err != nil {
		clean = false
		if m.ctx.Err() == nil {
			m.log.Warn("listing run owners", "err", err)
		}
	}
	if m.ctx.Err() != nil {
		return orphans, nil, clean
	}
	marks, found, err := m.journalOrphans(dead)
	if err != nil {
		clean, marks = false, nil
		if m.ctx.Err() == nil {
			m.log.Warn("looking for the runs of dead servers in their journals", "err", err)
		}
	}
	listed := make(map[string]bool, len(orphans))
	for _, o := range orphans {
		listed[o.run] = true
	}
	for _, o := range found {
		if !listed[o.run] {
			orphans = append(orphans, o)
		}
	}
	return orphans, marks, clean
}

// takeOverAll takes orphans over, takeoverWorkers at a time: each is a few
// store round trips, and a dead server's thousand runs are not to wait for
// each other. Every one is done before the scan goes on (reclaim, the next
// scan), so a run is resumed by one of them at a time. It reports whether
// every one was, and the manager was not closed meanwhile.
func (m *Manager) takeOverAll(orphans []orphan) bool {
	var (
		wg     sync.WaitGroup
		failed atomic.Bool
		sem    = make(chan struct{}, takeoverWorkers)
	)
	for _, o := range orphans {
		if m.ctx.Err() != nil {
			failed.Store(true)
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if !m.takeOver(o.run, o.owner) {
				failed.Store(true)
			}
		})
	}
	wg.Wait()
	return !failed.Load()
}

// dropMarks drops the marks of the servers whose runs were all taken over
// (marks), and reports whether it dropped every one it was to. A mark
// written within a lease and a half may be a server's that is not dead
// after all (its heartbeat landed since its liveness was read): its fence
// may not have passed. Its runs are taken over; the mark goes at a later
// scan.
func (m *Manager) dropMarks(marks map[string]markRev) bool {
	clean := true
	for owner, mr := range marks {
		if time.Since(mr.written) < m.cfg.Lease+m.cfg.Lease/2 {
			continue
		}
		if err := m.store.DropMark(m.ctx, owner, mr.rev); err != nil {
			clean = false
			m.log.Warn("dropping the mark of a server whose runs were taken over", "dead_owner", owner, "err", err)
		}
	}
	return clean
}

// markRev is a server's mark, the revision it was read at and when it
// was written.
type markRev struct {
	mark, rev uint64
	written   time.Time
}

// journalOrphans returns the marks of the servers dead says are dead, and
// the runs they claimed in their journals after them that have neither
// ended nor an owners entry.
func (m *Manager) journalOrphans(dead func(owner string) bool) (map[string]markRev, []orphan, error) {
	marks := map[string]markRev{}
	err := m.store.ClaimMarks(m.ctx, func(owner string, mark, rev uint64, written time.Time) {
		if dead(owner) {
			marks[owner] = markRev{mark, rev, written}
		}
	})
	if err != nil || len(marks) == 0 {
		return nil, nil, err
	}
	from := make(map[string]uint64, len(marks))
	for owner, mr := range marks {
		from[owner] = mr.mark
	}
	var found []orphan
	err = m.store.JournalOrphans(m.ctx, from, func(runID, owner string) {
		found = append(found, orphan{runID, owner})
	})
	if err != nil {
		return nil, nil, err
	}
	return marks, found, nil
}

// orphan is a run whose driver is dead.
type orphan struct{ run, owner string }

// takeoverWorkers bounds the runs a scan takes over at once.
const takeoverWorkers = 16

// takeOver takes run id over from its dead owner and resumes it. It
// reports false when the run is left behind: the store could not be
// asked, or the run could not be resumed.
func (m *Manager) takeOver(id, from string) bool {
	if err := m.store.TakeOver(m.ctx, id, from, m.owner); err != nil {
		return errors.Is(err, ErrConflict) // another server was faster
	}
	if err := m.resume(id, from); err != nil {
		m.log.Error("resuming a run", "run_id", id, "err", err)
		// The store names this server its driver now: nobody else
		// would take it over. Tried again like a run lost here.
		m.lostHere(id)
		return false
	}
	return true
}

// checkJournal decodes run id's journal as recorded, and says why it
// cannot be resumed from it, if it cannot: an event that does not decode,
// events missing, no run_started first, or a journal the store lost.
func (m *Manager) checkJournal(id string, recorded []store.Event) (journal []*stubbornv1.RunEvent, why string, err error) {
	journal, err = decodeAll(recorded)
	if err != nil {
		return nil, fmt.Sprintf("an event of its journal cannot be read (%v)", err), nil
	}
	for i, ev := range journal {
		if ev.GetSeq() != int64(i)+1 {
			return nil, fmt.Sprintf("its journal has event %d where event %d belongs: events are missing", ev.GetSeq(), i+1), nil
		}
	}
	if len(journal) > 0 && journal[0].GetRunStarted().GetState() == nil {
		return nil, "its journal does not start with run_started", nil
	}
	if len(journal) == 0 {
		lost, why, err := m.store.JournalLost(m.ctx, id)
		if err != nil || lost {
			return nil, cmp.Or(why, "its journal was lost"), err
		}
	}
	return journal, "", nil
}

// unrecoverable ends a run that cannot be resumed (w: the writer of the
// journal read, where the end is written) without risk of calling
// its delegates again for work they may have done: its journal is damaged
// or gone (a store that lost data). It is not driven: the run ends FAILED
// with why, in a run_finished after the events its journal still has, its
// final state is saved and its claim released, and an ERROR names it. It
// returns an error only when the store could not be written: the run stays
// claimed, for the next scan.
func (m *Manager) unrecoverable(w *store.Writer, id string, recorded []store.Event, why string) error {
	var state *stubbornv1.ControlState
	if len(recorded) > 0 {
		if ev, err := recorded[0].Decode(); err == nil {
			state = ev.GetRunStarted().GetState()
		}
	}
	if state == nil {
		if st, err := m.store.State(m.ctx, id); err == nil {
			state = st
		}
	}
	end := &stubbornv1.ControlState{RunId: id}
	if state != nil {
		end = constantPart(state)
	}
	now := timestamppb.New(m.cfg.Clock.Now())
	end.Status = stubbornv1.RunStatus_RUN_STATUS_FAILED
	end.StatusReason = "the run could not be recovered: " + why + "; it was not resumed, so that no delegate is called again for work it may have done"
	end.StatusReasonCode = stubbornv1.StatusReason_STATUS_REASON_UNRECOVERABLE
	end.UpdateTime, end.EndTime = now, now
	seq := int64(1)
	if n := len(recorded); n > 0 {
		seq = recorded[n-1].Seq + 1
	}
	m.log.Error("run cannot be recovered: its journal is damaged or lost; it ends FAILED", "run_id", id, "why", why, "events", len(recorded))
	enc, err := store.EncodeEvent(controls.BoundEvent(&stubbornv1.RunEvent{
		RunId: id, Seq: seq, Time: now,
		Kind: &stubbornv1.RunEvent_RunFinished{RunFinished: &stubbornv1.RunFinished{State: end}},
	}, refusedEventBytes))
	if err != nil {
		return err
	}
	if err := m.store.Append(m.ctx, w, enc); err != nil {
		return fmt.Errorf("ending unrecoverable run %s: %w", id, err)
	}
	if err := m.store.PutState(m.ctx, id, enc.StateBytes()); err != nil {
		return fmt.Errorf("ending unrecoverable run %s: %w", id, err)
	}
	return m.store.Release(m.ctx, id)
}

// resume drives a run taken over from a dead owner, replaying its journal.
func (m *Manager) resume(id, from string) error {
	return m.resumeBecause(id, from, fmt.Sprintf("its owner %s stopped", from))
}

// resumeBecause drives a run this server has just become the driver of,
// replaying its journal; because says why (run_resumed). A copy of the
// run that this server still drives is stale — the run was taken from it —
// and is stopped first: a process drives a run at most once.
func (m *Manager) resumeBecause(id, from, because string) error {
	if old := m.local(id); old != nil && !old.isLost() && !old.isDone() {
		m.log.Warn("run taken back: its copy here was stale and is stopped", "run_id", id, "from", from)
		old.lose(fmt.Errorf("%w: the run was taken over meanwhile", ErrConflict), errLost)
	}
	if gone, err := m.deleted(id); gone || err != nil {
		return err
	}
	var w store.Writer
	recorded, err := m.store.JournalFrom(m.ctx, id, &w)
	if err != nil {
		return err
	}
	// Its end, when it cannot be resumed, is written after the journal
	// just read (w).
	journal, why, err := m.checkJournal(id, recorded)
	if err != nil {
		return err
	}
	if why != "" {
		return m.unrecoverable(&w, id, recorded, why)
	}
	if n := len(journal); n > 0 && journal[n-1].GetRunFinished() != nil {
		// It finished but its owner died before letting go of it.
		if err := m.store.PutState(m.ctx, id, recorded[n-1].StateBytes()); err != nil {
			return err
		}
		return m.store.Release(m.ctx, id)
	}
	var state *stubbornv1.ControlState
	if len(journal) > 0 {
		state = proto.CloneOf(journal[0].GetRunStarted().GetState())
	} else if state, err = m.store.State(m.ctx, id); errors.Is(err, ErrNotFound) {
		// A claim with neither journal nor state (Start saves the state
		// before it claims: they expired, or were written by an older
		// version): nothing to resume from.
		return m.store.Release(m.ctx, id)
	} else if err != nil {
		return err
	}
	if state == nil {
		return fmt.Errorf("run %s: journal does not start with run_started", id)
	}
	r, err := m.admit(id, state.GetTenant())
	if err != nil {
		return err
	}
	r.events = recorded
	r.jw = w
	r.saveEnd = true // its driver before may have saved a state
	// run_resumed is recorded while the tracker, about to replay, says
	// RUNNING: the state saved last (by the driver before) stays until
	// the replay has caught up (wentLive), not RUNNING with no attempts.
	r.lastStatus = stubbornv1.RunStatus_RUN_STATUS_RUNNING
	runCtx := m.runContext(r, state.GetCreateTime().AsTime(), state.GetOptions())
	if m.cfg.Observer != nil {
		runCtx, r.observe = m.cfg.Observer.ObserveRun(runCtx, context.Background(), state, true)
	}
	m.log.Info("resuming run", "run_id", id, "from", from, "events", len(journal))
	r.replaying()
	tr := m.track(r, state, journal)
	m.bind(context.Background(), r)
	m.workers.run(func() { m.drive(runCtx, r, tr, state, true, because) })
	return nil
}
