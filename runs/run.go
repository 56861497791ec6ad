package runs

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stubbornhq/stubborn/controls"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/runs/store"
)

// run is a run this server drives: its tracker and, in memory, the journal
// of its events for fast watching.
type run struct {
	id     string
	tenant string // ControlState.tenant: who may see the run
	order  uint64
	store  store.Store
	log    *slog.Logger
	ready  chan struct{} // closed once tracker is set
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
	deps    Deps
	unbind  func()
	writers *sync.WaitGroup // the manager's, of the runs' writers (kick)

	// waitMu orders the run's parking (evict) and a decision taken
	// while its tracker waits (handle): a wait whose decision came first
	// is not parked, and a decision that comes once the run parks goes to
	// its parking (decide).
	waitMu sync.Mutex

	mu     sync.Mutex
	writer bool // the run's writer runs (kick)
	// parkingSet, while not nil, is closed once the run's control,
	// parked, has its parking set (drive); evicted is its wait, from
	// when the control's goroutine ends in it (evict) until drive takes
	// it to park the run.
	parkingSet chan struct{}
	evicted    *controls.Wait
	// onLive, set while the run is replayed, is called once the replay
	// has caught up (wentLive): drive's release of the run's cancellation.
	onLive func()
	// end is the run's end for the Observer (endSummary), from when
	// run_finished is recorded until it is written.
	end     *stubbornv1.RunEvent
	parking *parking      // set while the run is parked
	replay  chan struct{} // set while its tracker replays its journal
	// tracker drives the run until it ends here; then it is dropped, and
	// with it the state's many small messages, which the garbage collector
	// would scan for as long as the finished run is kept: the
	// run_finished event has the final state.
	tracker *controls.Tracker
	events  []store.Event // encoded once, sent as they are to every watcher
	// changed is closed, and cleared, by the next event or loss; since
	// makes one only for a watcher that has to wait, so that an event
	// nobody waits for costs no channel.
	changed    chan struct{}
	done       bool
	lost       bool  // another server drives the run: write nothing more
	lostErr    error // why, when a write failed
	lastStatus stubbornv1.RunStatus
	ended      chan struct{} // closed once the run has ended here
	// pending are the events recorded and not yet written (record), with
	// the state to save after them when their status changed; writing
	// counts those a flush is writing.
	pending      []store.Event
	pendingState []byte
	// pendingStatus is pendingState's status; savedStatus the status of
	// the state saved last (or claimed), -1 when unknown. A state is saved
	// only when its status differs: a retry whose wait is zero goes from
	// RUNNING to BACKING_OFF and back between two writes, and saving
	// RUNNING again would change only the snapshot's details. savedStatus
	// is read and set by flush.
	pendingStatus stubbornv1.RunStatus
	savedStatus   stubbornv1.RunStatus
	writing       int
	flushMu       sync.Mutex   // one flush at a time
	calls         atomic.Int32 // delegate calls in flight (flushing)
	endUnsaved    bool         // the final state could not be saved
	// jw is this copy's part in its journal's writes: its view of
	// where the journal ends (the store fences its appends with it) and,
	// for a new run claimed by its journal's first write (claims.go), this
	// server's name (Claimer). Moved by flush, under flushMu, and set by
	// start or resume before the first.
	jw store.Writer
	// onLost, when set, is told of a write that failed and lost the run
	// here (Manager.lostHere): the store may still name this server its
	// driver, and then nobody else would drive it.
	onLost func(id string)
	// mayWrite, when set, reports whether this copy may still write:
	// false once this server's lease lapsed and the store names another
	// driver (Manager.mayWrite; it loses the copy then).
	mayWrite func(r *run) bool
	// base is the part of the run's state that never changes
	// (constantPart), for the run_finished of a run whose events the
	// store refused (endRefused); nil once the run has ended here. Guarded
	// by mu. maxEvent bounds an event's encoding
	// (eventLimit).
	base     *stubbornv1.ControlState
	maxEvent int
	clock    controls.Clock
	// outputWindow and outputBytes coalesce streamed text (coalescer).
	outputWindow time.Duration
	outputBytes  int
	// slab is the free end of the array the run's events are encoded in
	// (encode); used by record only, under the tracker's lock.
	slab []byte
	// firstDone, for a new run claimed by its journal's first write
	// (writer.Claimer), is closed once that write was made (firstLanded
	// says it landed) or the run was lost first. Set before the run's
	// first flush; firstDone and firstLanded are guarded by mu after.
	firstDone   chan struct{}
	firstLanded bool
	// saveEnd says the run's final state must be saved: the store does
	// not read it from the journal (finalInJournal), or the run saved
	// a state before (the saved one would hide the journal's), or this
	// server cannot tell (a run taken over). Read and set by flush.
	saveEnd bool
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
func (r *run) wakeLocked() {
	if r.changed != nil {
		close(r.changed)
		r.changed = nil
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
