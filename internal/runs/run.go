package runs

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// run is a run this server drives: its tracker and, in memory, the journal
// of its events for fast watching. It is made of parts, each with the lock
// that guards it (runs/doc.go has the lock tree): what is fixed when the
// run is admitted (runSetup), its life under mu (the tracker, how it ended
// here), its outbox (the events recorded and not yet written, and this
// copy's part in the journal's writes: flushMu), its feed (the journal in
// memory and the watchers' wake-ups, under mu) and its parking (waitMu).
type run struct {
	runSetup

	mu sync.Mutex
	runLife
	outbox
	feed
	runParking
}

// runSetup is what a run is given when it is admitted (Manager.admit),
// never changed after: read without a lock.
type runSetup struct {
	id     string
	tenant string // ControlState.tenant: who may see the run
	order  uint64
	store  store.Store
	log    *slog.Logger
	ready  chan struct{} // closed once tracker is set
	// writers is the manager's wait group of the runs' writers (kick).
	writers *sync.WaitGroup
	// mgr, when set, is told of a write that failed and lost the run here
	// (Manager.lostHere: the store may still name this server its driver,
	// and then nobody else would drive it), and asked before each write
	// whether this copy may still write (Manager.mayWrite: false once this
	// server's lease lapsed and the store names another driver). A pointer,
	// not two method values: those would be two allocations a run.
	mgr *Manager
	// maxEvent bounds an event's encoding (store.EventLimit).
	maxEvent int
	clock    controls.Clock
	// runClock is the clock of the run's controls and trackers
	// (Manager.clock), made once with the run: handed out as a pointer, it
	// costs no allocation a drive or a tracker.
	runClock runClock
	// outputWindow and outputBytes coalesce streamed text (coalescer).
	outputWindow time.Duration
	outputBytes  int
	// ended is closed once the run has ended here.
	ended chan struct{}
}

// runLife is the run's life on this server, guarded by run.mu unless a
// field says otherwise.
type runLife struct {
	// cancel ends the run's context (stop), stopTimer its timeout; both
	// are dropped once the run has ended here (endDrive), so that the
	// finished runs this server keeps do not keep their contexts. Guarded
	// by mu after the run has started.
	cancel    context.CancelCauseFunc
	stopTimer context.CancelFunc
	observe   func(*stubbornv1.RunEvent) // the Observer's, or nil
	// deps are what the run's control reaches while this server drives
	// it (bind); unbind, once, lets go of them (endDrive). Set before the
	// run's first drive, guarded by mu after.
	deps   Deps
	unbind func()
	// onLive, set while the run is replayed, is called once the replay
	// has caught up (wentLive): drive's release of the run's cancellation.
	onLive func()
	// end is the run's end for the Observer (endSummary), from when
	// run_finished is recorded until it is written.
	end    *stubbornv1.RunEvent
	replay chan struct{} // set while its tracker replays its journal
	// tracker drives the run until it ends here; then it is dropped, and
	// with it the state's many small messages, which the garbage collector
	// would scan for as long as the finished run is kept: the
	// run_finished event has the final state.
	tracker    *controls.Tracker
	done       bool
	lost       bool  // another server drives the run: write nothing more
	lostErr    error // why, when a write failed
	lastStatus stubbornv1.RunStatus
	// base is the part of the run's state that never changes
	// (constantPart), for the run_finished of a run whose events the
	// store refused (endRefused); nil once the run has ended here.
	base *stubbornv1.ControlState
	// slab is the free end of the array the run's events are encoded in
	// (encode); used by record only, under the tracker's lock.
	slab []byte
}

// outbox holds a run's events recorded and not yet written (record), until
// flush writes them in one store write, and this copy's part in the
// journal's writes. Its first fields are guarded by run.mu; flushMu, one
// flush at a time, guards the rest.
type outbox struct {
	writer bool // the run's writer runs (kick)
	// pending are the events recorded and not yet written, with the state
	// to save after them when their status changed (pendingStatus is its
	// status); writing counts those a flush is writing.
	pending       []store.Event
	pendingState  []byte
	pendingStatus stubbornv1.RunStatus
	writing       int
	endUnsaved    bool // the final state could not be saved
	// firstDone, for a new run claimed by its journal's first write
	// (jw.Claimer), is closed once that write was made (firstLanded says
	// it landed) or the run was lost first. Set before the run's first
	// flush.
	firstDone   chan struct{}
	firstLanded bool

	flushMu sync.Mutex
	// jw is this copy's part in its journal's writes: its view of where
	// the journal ends (the store fences its appends with it) and, for a
	// new run claimed by its journal's first write (claims.go), this
	// server's name (Claimer). Set by start or resume before the first
	// flush.
	jw store.Writer
	// savedStatus is the status of the state saved last (or claimed), -1
	// when unknown. A state is saved only when its status differs: a
	// retry whose wait is zero goes from RUNNING to BACKING_OFF and back
	// between two writes, and saving RUNNING again would change only the
	// snapshot's details.
	savedStatus stubbornv1.RunStatus
	// saveEnd says the run's final state must be saved: the store does
	// not read it from the journal (FinalInJournal), or the run saved a
	// state before (the saved one would hide the journal's), or this
	// server cannot tell (a run taken over).
	saveEnd bool
	calls   atomic.Int32 // delegate calls in flight (flushing)
}

// feed is the run's journal in memory, as written, and its watchers'
// wake-up, guarded by run.mu.
type feed struct {
	events []store.Event // encoded once, sent as they are to every watcher
	// changed is closed, and cleared, by the next event or loss; since
	// makes one only for a watcher that has to wait, so that an event
	// nobody waits for costs no channel.
	changed chan struct{}
}

// runParking is how the run waits without a goroutine (park.go).
type runParking struct {
	// waitMu orders the run's parking (evict) and a decision taken
	// while its tracker waits (handle): a wait whose decision came first
	// is not parked, and a decision that comes once the run parks goes to
	// its parking (decide).
	waitMu sync.Mutex
	// parkingSet, while not nil, is closed once the run's control,
	// parked, has its parking set (drive); evicted is its wait, from
	// when the control's goroutine ends in it (evict) until drive takes
	// it to park the run. Both, and parking, are guarded by run.mu.
	parkingSet chan struct{}
	evicted    *controls.Wait
	parking    *parking // set while the run is parked
}

// isDone reports whether the run has ended here.
func (r *run) isDone() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done
}

// replaying says the run's tracker is about to replay its journal: until
// it goes live (wentLive), caughtUp waits.
func (r *run) replaying() {
	r.mu.Lock()
	r.replay = make(chan struct{})
	r.mu.Unlock()
}

// wentLive says the run's tracker has replayed its journal, if it was
// replaying it: its control waits for what the journal does not hold
// (runClock), or it records an event (record, which calls liveLocked).
func (r *run) wentLive() {
	r.mu.Lock()
	release := r.liveLocked()
	r.mu.Unlock()
	if release != nil {
		release()
	}
}

// liveLocked is wentLive with r.mu held: it returns the function to call
// once r.mu is unlocked, if any.
func (r *run) liveLocked() (release func()) {
	if r.replay == nil {
		return nil
	}
	close(r.replay)
	r.replay = nil
	// What the replay reached is not known here: the next event saves its
	// state whatever its status (record).
	r.lastStatus = -1
	release, r.onLive = r.onLive, nil
	return release
}

// evict says the run's own control waits for w, with nothing else of the
// run in flight, and its goroutine ends there (runClock): unless the wait
// is over already (ctx, the sleep's, ended: a decision came first, or the
// run is cancelled), the run is being parked from now on. It reports
// whether to end the goroutine.
func (r *run) evict(ctx context.Context, w controls.Wait) bool {
	r.waitMu.Lock()
	defer r.waitMu.Unlock()
	if ctx.Err() != nil {
		return false
	}
	r.mu.Lock()
	r.evicted = &w
	r.parkingSet = make(chan struct{})
	r.mu.Unlock()
	return true
}

// takeEvicted returns the wait the run's goroutine ended in (evict), once.
func (r *run) takeEvicted() *controls.Wait {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.evicted
	r.evicted = nil
	return w
}

// caughtUp waits, bounded by ctx, until the run's tracker is not replaying
// its journal: GetRun and DecideRun see the run as it is, not the part of
// its history replayed so far.
func (r *run) caughtUp(ctx context.Context) error {
	r.mu.Lock()
	c := r.replay
	r.mu.Unlock()
	if c == nil {
		return nil
	}
	select {
	case <-c:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// setTracker makes tr the run's tracker.
func (r *run) setTracker(tr *controls.Tracker) {
	r.mu.Lock()
	r.tracker = tr
	r.mu.Unlock()
}

// lose stops the run after a failed write: err is why, cause what its
// context is cancelled with.
func (r *run) lose(err, cause error) {
	r.mu.Lock()
	r.lostErr = err
	r.loseLocked()
	r.mu.Unlock()
	r.stop(cause)
}

// stop cancels the run's context with cause; once the run has ended here,
// it does nothing.
func (r *run) stop(cause error) {
	r.mu.Lock()
	c := r.cancel
	r.mu.Unlock()
	if c != nil {
		c(cause)
	}
}

// live returns the run's tracker while it goes on here, nil once it ended.
func (r *run) live() *controls.Tracker {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tracker
}

// snapshot returns the run's current state: the tracker's while it goes on
// here, its run_finished event's once it has ended.
func (r *run) snapshot() (*stubbornv1.ControlState, error) {
	r.mu.Lock()
	tr := r.tracker
	var final store.Event
	if tr == nil && r.done {
		final = r.events[len(r.events)-1]
	}
	r.mu.Unlock()
	if tr != nil {
		return tr.Snapshot(), nil
	}
	if final.Data == nil {
		return nil, fmt.Errorf("%w: run %s is not driven here", ErrUnavailable, r.id)
	}
	ev, err := final.Decode()
	if err != nil {
		return nil, store.UnreadableRun(r.id, err)
	}
	if ev.GetRunFinished().GetState() == nil {
		return nil, fmt.Errorf("run %s: its last event is not run_finished", r.id)
	}
	return ev.GetRunFinished().GetState(), nil
}

// abandon stops the run from writing anything more.
func (r *run) abandon() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.loseLocked()
}

func (r *run) loseLocked() {
	if r.lost {
		return
	}
	r.lost = true
	r.firstWrittenLocked()
	if r.observe != nil && !r.done {
		r.observe(nil) // this server stops driving the run without run_finished
	}
	if !r.done {
		close(r.ended)
	}
	r.wakeLocked()
}

// firstWrittenLocked says the run's first write was made, or will not
// be (claimer). Callers hold r.mu.
func (r *run) firstWrittenLocked() {
	if r.firstDone != nil {
		close(r.firstDone)
		r.firstDone = nil
	}
}

// journalCap is the in-memory journal's first capacity: a run with one or
// two attempts never grows it.
const journalCap = 8

// wakeLocked wakes the watchers waiting for a change. Callers hold r.mu.
func (r *run) wakeLocked() { r.feed.wake() }

// wake wakes the watchers waiting for a change. The caller holds run.mu.
func (f *feed) wake() {
	if f.changed != nil {
		close(f.changed)
		f.changed = nil
	}
}

// lostBecause returns why the run's last write failed, or nil.
func (r *run) lostBecause() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lostErr
}

func (r *run) isLost() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lost
}
