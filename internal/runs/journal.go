package runs

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// record is the tracker's recorder: it numbers the event and encodes it,
// once, for the store, the journal in memory and every watcher, and keeps
// it pending (the outbox), with the state when the status changed, until
// flush writes what is pending in one store write. The tracker calls it
// with its lock held, so record writes nothing: the run's own goroutine
// writes the outbox once the tracker is unlocked, before each delegate
// call and health check (flushing), before a wait (runClock),
// after the run parks or ends (drive) and once a decision is taken
// (Manager.handle, decide). An event that makes the run wait for a person
// (decision_requested), and any event recorded while a delegate call is
// in flight (a race's candidates), is written by the run's writer
// (kick), which the tracker's lock does not hold either. So a call is
// made only once its attempt_started is durable, a watcher sees an event
// only once it is, and a one-attempt run writes its four events in two.
// ev and st are the tracker's: read during the call only, as the Observer
// does.
func (r *run) record(ev *stubbornv1.RunEvent, st *stubbornv1.ControlState) {
	seq, lastStatus, ok := r.number(ev.GetRunResumed() != nil)
	if !ok {
		return
	}
	ev.RunId = r.id
	ev.Seq = seq
	enc, ev, err := r.encodeBounded(ev)
	var state []byte
	status := st.GetStatus()
	if err == nil && (enc.Finished || status != lastStatus) {
		state = r.stateBytes(enc, st)
	}
	if err != nil {
		// Not expected: the API's strings are checked or made UTF-8 before
		// they reach an event. The run cannot go on without its journal.
		r.log.Error("run stopped: its event cannot be encoded", "run_id", r.id, "err", err)
		r.lose(err, err)
		return
	}
	if !r.keep(ev, enc, state, status) {
		return
	}
	switch ev.GetKind().(type) {
	case *stubbornv1.RunEvent_DecisionRequested:
		// The run waits for a person now: a watcher must see it.
		r.kick()
	case *stubbornv1.RunEvent_RunFinished, *stubbornv1.RunEvent_DecisionReceived:
		// Written by whoever waits for them (drive, Manager.handle).
	default:
		if r.calls.Load() > 0 {
			// Another call is in flight (a race's candidates): the run
			// waits for it, and this event is news now.
			r.kick()
		}
	}
}

// number returns the seq of the run's next event and the status recorded
// last; ok false once the run is lost or has ended here. An event other
// than run_resumed (resumed) recorded while the run replays its journal is
// the first step its journal lacks: the replay has caught up. The tracker calls
// record under its own lock, one event at a time, so r.mu is taken only to
// number and to keep the event: the watchers' since never waits for the
// store's I/O (flush does it unlocked).
func (r *run) number(resumed bool) (seq int64, lastStatus stubbornv1.RunStatus, ok bool) {
	r.mu.Lock()
	if r.lost || r.done {
		r.mu.Unlock()
		return 0, 0, false
	}
	var release func()
	if r.replay != nil && !resumed {
		release = r.liveLocked()
	}
	seq = int64(len(r.events)+r.writing+len(r.pending)) + 1
	lastStatus = r.lastStatus
	r.mu.Unlock()
	if release != nil {
		release()
	}
	return seq, lastStatus, true
}

// encodeBounded encodes ev (encode); one larger than the store's messages
// (or a watcher's) has its texts cut, and the run goes on. It returns the
// event as encoded.
func (r *run) encodeBounded(ev *stubbornv1.RunEvent) (store.Event, *stubbornv1.RunEvent, error) {
	enc, err := r.encode(ev)
	if err == nil && len(enc.Data) > r.maxEvent-eventFraming {
		r.log.Warn("event too large: its texts are cut", "run_id", r.id, "seq", ev.GetSeq(), "bytes", len(enc.Data), "limit", r.maxEvent)
		ev = controls.BoundEvent(ev, r.maxEvent-eventFraming)
		enc, err = store.EncodeEvent(ev)
	}
	return enc, ev, err
}

// stateBytes is the encoding of st to save after enc: the part of enc's
// own encoding that run_started and run_finished carry, or st sized by its
// encoding (BoundState, which sizes it again, only for a state that may be
// over the bound). nil when it cannot be encoded (logged).
func (r *run) stateBytes(enc store.Event, st *stubbornv1.ControlState) []byte {
	if state := enc.StateBytes(); state != nil {
		return state
	}
	state, err := proto.Marshal(st)
	if err == nil && len(state) > controls.MaxStateBytes {
		state, err = proto.Marshal(controls.BoundState(st, controls.MaxStateBytes))
	}
	if err != nil {
		r.log.Warn("saving run state", "run_id", r.id, "err", err)
		return nil
	}
	return state
}

// keep puts enc in the outbox, with state when it is to be saved, and
// tells the Observer; false when the run was lost meanwhile.
func (r *run) keep(ev *stubbornv1.RunEvent, enc store.Event, state []byte, status stubbornv1.RunStatus) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lost {
		return false
	}
	if r.pending == nil {
		// Room for a one-attempt run's writes (two events each).
		r.pending = make([]store.Event, 0, pendingCap)
	}
	r.pending = append(r.pending, enc)
	if state != nil {
		r.pendingState, r.pendingStatus = state, status
	}
	r.lastStatus = status
	if r.observe != nil {
		if enc.Finished {
			// Observed once written (flush): the tracker's state may
			// change after it is unlocked (a race's losing branches), so
			// the observer gets a summary of it, made now.
			r.end = endSummary(ev)
		} else {
			r.observe(ev)
		}
	}
	return true
}

// encode encodes ev as EncodeEvent does, into the free end of the run's
// slab: the events of a run are laid out one after the other in an array
// or two rather than one each. An event's Data is never written again:
// encodings go after it. Called by record, one event at a time.
func (r *run) encode(ev *stubbornv1.RunEvent) (store.Event, error) {
	if cap(r.slab) < slabMin {
		r.slab = make([]byte, 0, slabSize)
	}
	data, err := proto.MarshalOptions{}.MarshalAppend(r.slab, ev)
	if err != nil {
		return store.Event{}, fmt.Errorf("encoding event %d of run %s: %w", ev.GetSeq(), ev.GetRunId(), err)
	}
	r.slab = data[len(data):]
	return store.Event{RunID: ev.GetRunId(), Seq: ev.GetSeq(), Finished: ev.GetRunFinished() != nil, Data: data[:len(data):len(data)]}, nil
}

// A run's slab is slabSize bytes; a new one is made when less than
// slabMin is left (a larger event grows it as append does).
const (
	slabSize = 1024
	slabMin  = 128
)

// endSummary returns a run_finished like ev with a state of its own that
// has the run's constant fields and its end, but not its result, attempt
// log or failure history (what an Observer reads of a run's end).
func endSummary(ev *stubbornv1.RunEvent) *stubbornv1.RunEvent {
	st := ev.GetRunFinished().GetState()
	sum := constantPart(st)
	sum.Status, sum.StatusReason, sum.StatusReasonCode = st.GetStatus(), st.GetStatusReason(), st.GetStatusReasonCode()
	sum.Attempts, sum.Winner = st.GetAttempts(), st.GetWinner()
	sum.UpdateTime, sum.EndTime = st.GetUpdateTime(), st.GetEndTime()
	return &stubbornv1.RunEvent{
		RunId: ev.GetRunId(), Seq: ev.GetSeq(), Time: ev.GetTime(), Path: ev.GetPath(),
		Kind: &stubbornv1.RunEvent_RunFinished{RunFinished: &stubbornv1.RunFinished{State: sum}},
	}
}

// kick has the run's writer write its outbox: a goroutine of the run's
// own, started unless one runs, that flushes until nothing is pending.
func (r *run) kick() {
	r.mu.Lock()
	if r.writer || r.lost || r.done {
		r.mu.Unlock()
		return
	}
	r.writer = true
	r.mu.Unlock()
	r.writers.Add(1)
	go func() {
		defer r.writers.Done()
		for {
			r.flush()
			r.mu.Lock()
			if len(r.pending) == 0 || r.lost || r.done {
				r.writer = false
				r.mu.Unlock()
				return
			}
			r.mu.Unlock()
		}
	}()
}

// runClock is the Clock of a run's controls and tracker. A wait (a
// backoff, a decision) starts once the events before it are written; a
// zero wait is no wait: its events go with the next attempt's, written
// before its call. A wait that the tracker makes (controls.WaitOf) is one
// its journal does not end: a replay has caught up (wentLive). And a wait
// of the run's own control of at least parkAfter parks the run: its
// goroutine ends there (evict), and drive parks it (park), to be driven
// again from its journal when the wait is over.
type runClock struct {
	controls.Clock
	r         *run
	parkAfter time.Duration // 0 or less: never park
}

// clock returns run r's clock (made by admit).
func (m *Manager) clock(r *run) controls.Clock {
	return &r.runClock
}

func (c runClock) Sleep(ctx context.Context, d time.Duration) error {
	if w, ok := controls.WaitOf(ctx); ok {
		c.r.wentLive()
		if w.Path == "" && c.parkAfter > 0 && d >= c.parkAfter && c.r.evict(ctx, w) {
			// The run's own control waits, and nothing else of the run
			// goes on: its goroutine ends here, its deferred functions
			// run (drive's parks it), and the tracker records nothing
			// more unless asked for its decision (decide).
			runtime.Goexit()
		}
	}
	if d > 0 {
		c.r.flush()
	}
	return c.Clock.Sleep(ctx, d)
}

// flush writes the run's pending events to the store in one write (fenced:
// a write after another server took the run over fails), saves the state
// when their status changed, journals them and wakes the watchers. One
// flush at a time, in order; one that finds nothing pending returns once
// the flush before it has written.
//
// Each store bounds its own calls (JetStream's have the client's default
// timeout, and are made again through an outage for up to its
// WriteRetry), so flush gives them no deadline (writeContext).
func (r *run) flush() { r.flushThrough(math.MaxInt64) }

// flushThrough is flush of the pending events up to seq last only (and
// no state: the rest's is saved after the rest). Start writes run_started
// alone with it when the run's control has not written it (a call waiting
// for a guard: its attempt_started is written with the call, so that a
// server that stops meanwhile leaves no trace of a call never sent).
func (r *run) flushThrough(last int64) {
	r.flushMu.Lock()
	defer r.flushMu.Unlock()
	r.mu.Lock()
	evs, state, status := r.take(last)
	if r.lost || len(evs) == 0 {
		r.writing = 0
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()

	if r.jw.Claimer != "" {
		defer func() {
			r.mu.Lock()
			r.firstWrittenLocked()
			r.mu.Unlock()
		}()
	}
	if !r.write(evs) {
		return
	}
	finished := evs[len(evs)-1].Finished
	if state != nil && r.mustSave(finished, status) {
		r.saveState(state, status, finished)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.writing = 0
	if r.lost {
		return // abandoned meanwhile: the events are in the store, which its watchers follow now
	}
	r.written(evs)
	if r.pending == nil && !r.done {
		// The outbox's next events go where these were: nobody holds evs
		// any more (the feed and the stores copy the events they keep),
		// and nothing else is pending in that array (a flush through a
		// seq leaves the rest in it as pending: then this is not nil).
		r.pending = evs[:0]
	}
}

// pendingCap is the outbox's first capacity (keep); flushThrough hands the
// array back to the outbox once its events are written.
const pendingCap = 4

// take takes the pending events up to seq last (and their state, when
// they are all that is pending), and counts them as being written. The
// caller holds run.mu.
func (o *outbox) take(last int64) (evs []store.Event, state []byte, status stubbornv1.RunStatus) {
	evs, state, status = o.pending, o.pendingState, o.pendingStatus
	o.pending, o.pendingState = nil, nil
	if n := len(evs); n > 0 && evs[n-1].Seq > last {
		k := 0
		for k < n && evs[k].Seq <= last {
			k++
		}
		o.pending, o.pendingState = evs[k:], state
		evs, state = evs[:k], nil
	}
	o.writing = len(evs)
	return evs, state, status
}

// mustSave reports whether a state of status is to be saved after a write
// (finished: the run's last): the final one when the store does not read
// it from the journal (saveEnd), another when its status differs from the
// one saved. The caller holds flushMu.
func (o *outbox) mustSave(finished bool, status stubbornv1.RunStatus) bool {
	if finished {
		return o.saveEnd
	}
	return status != o.savedStatus
}

// write appends evs to the run's journal, fenced by this copy's view of it
// (jw), and reports whether they were written. A write the store refuses
// for good ends the run (endRefused); any other failure loses it here. The
// caller holds flushMu.
func (r *run) write(evs []store.Event) bool {
	if r.mgr != nil && !r.mgr.mayWrite(r) {
		return false // taken over while this server's lease had lapsed: lost
	}
	err := r.store.Append(writeContext{r}, &r.jw, evs...)
	refused := refusedBy(err)
	if r.jw.Claimer != "" && evs[0].Seq == 1 && (err == nil || refused != nil && refused.Written > 0) {
		r.mu.Lock()
		r.firstLanded = true
		r.mu.Unlock()
	}
	if err == nil {
		return true
	}
	if refused != nil && r.endRefused(evs, refused) {
		return false
	}
	r.log.Warn("run lost: its journal moved on without this server", "run_id", r.id, "err", err)
	r.lose(err, errLost)
	if r.mgr != nil {
		r.mgr.lostHere(r.id)
	}
	return false
}

// refusedBy returns the store's refusal in err, or nil. Its own function:
// errors.As takes the variable's address, which would put it on the heap
// for every write, failed or not.
func refusedBy(err error) *store.RefusedError {
	if err == nil {
		return nil
	}
	var refused *store.RefusedError
	if errors.As(err, &refused) {
		return refused
	}
	return nil
}

// saveState saves the run's state after a write (finished: its last). A
// save that fails may have landed all the same (a timeout): the store may
// hold this state, so the next differs from what is known saved, and the
// end must be saved over it. The caller holds flushMu.
func (r *run) saveState(state []byte, status stubbornv1.RunStatus, finished bool) {
	if err := r.store.PutState(writeContext{r}, r.id, state); err != nil {
		r.log.Warn("saving run state", "run_id", r.id, "err", err)
		r.mu.Lock()
		r.endUnsaved = finished
		r.mu.Unlock()
		r.saveEnd, r.savedStatus = true, -1
		return
	}
	r.saveEnd, r.savedStatus = true, status
}

// written adds evs, just written, to the run's journal in memory, ends the
// run here after its run_finished, and wakes the watchers. The caller holds
// run.mu.
func (r *run) written(evs []store.Event) {
	r.feed.append(evs)
	if last := evs[len(evs)-1]; last.Finished {
		r.done = true
		r.tracker = nil
		close(r.ended)
		if r.observe != nil && r.end != nil {
			// The run's end is observed once written: a run whose last
			// write failed is observed to stop (loseLocked), not to end.
			r.observe(r.end)
			r.observe, r.end = nil, nil
		}
	}
	r.feed.wake()
}

// append adds evs to the journal in memory. The caller holds run.mu.
func (f *feed) append(evs []store.Event) {
	if f.events == nil {
		f.events = make([]store.Event, 0, journalCap)
	}
	f.events = append(f.events, evs...)
}

// writeContext is the context of a run's store writes. It is never
// cancelled: a write under way is made whole (as a run that is let go
// leaves it), and a cancelled run's run_finished is still written. It
// carries the run's ended channel (store.StopWritesKey): a store that makes a
// failed write again through an outage (JetStream) stops trying once this
// server lets the run go (lose, abandon). A type of its own, not
// context.WithValue: nothing to allocate per write, and no goroutine for
// the deadlines derived from it (it has no Done channel).
type writeContext struct{ r *run }

func (writeContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (writeContext) Done() <-chan struct{}       { return nil }
func (writeContext) Err() error                  { return nil }

func (c writeContext) Value(key any) any {
	switch key {
	case store.StopWritesKey{}:
		return (<-chan struct{})(c.r.ended)
	}
	return nil
}

// eventFraming is what an event's encoding adds to its message's size.
const eventFraming = 64

// endRefused ends a run whose events the store refused for good (too
// large, a full stream): FAILED, with the reason, in a run_finished small
// enough for the store to take, after the events it did write. The run's
// context is cancelled: its control stops, and nothing it records after
// is written. It reports false when that run_finished could not be
// written either (or the run's first event was refused: Start fails it),
// and the run is to be lost as for any failed write.
func (r *run) endRefused(evs []store.Event, refused *store.RefusedError) bool {
	r.mu.Lock()
	base := r.base
	r.mu.Unlock()
	written := evs[:refused.Written]
	if base == nil || evs[0].Seq == 1 && len(written) == 0 {
		return false
	}
	now := timestamppb.New(r.clock.Now())
	st := constantPart(base)
	st.Status = stubbornv1.RunStatus_RUN_STATUS_FAILED
	st.StatusReason = controls.Cut(errRefused.Error()+": "+refused.Err.Error(), controls.MaxReasonBytes)
	st.StatusReasonCode = stubbornv1.StatusReason_STATUS_REASON_STORE_REFUSED
	st.UpdateTime, st.EndTime = now, now
	ev := &stubbornv1.RunEvent{
		RunId: r.id, Seq: evs[refused.Written].Seq, Time: now,
		Kind: &stubbornv1.RunEvent_RunFinished{RunFinished: &stubbornv1.RunFinished{State: st}},
	}
	enc, err := store.EncodeEvent(controls.BoundEvent(ev, refusedEventBytes))
	if err == nil {
		err = r.store.Append(writeContext{r}, &r.jw, enc)
	}
	if err != nil {
		r.log.Error("run stopped: the store refused its events, and its end", "run_id", r.id, "refused", refused.Err, "err", err)
		return false
	}
	r.log.Error("run failed: the store refused its events", "run_id", r.id, "seq", evs[refused.Written].Seq, "err", refused.Err)
	if r.saveEnd {
		if data, err := proto.Marshal(st); err == nil {
			if err := r.store.PutState(writeContext{r}, r.id, data); err != nil {
				r.log.Warn("saving run state", "run_id", r.id, "err", err)
			}
		}
	}
	r.mu.Lock()
	r.writing = 0
	r.pending, r.pendingState = nil, nil
	r.events = append(r.events, written...)
	r.events = append(r.events, enc)
	r.done = true
	r.tracker = nil
	close(r.ended)
	r.wakeLocked()
	observe := r.observe
	r.observe = nil
	r.mu.Unlock()
	if observe != nil {
		observe(ev)
	}
	r.stop(errRefused)
	return true
}

// refusedEventBytes bounds the run_finished of a run whose events the
// store refused: far below any store's message size.
const refusedEventBytes = 64 << 10

// flushing is the Delegates of a run's controls: each call, and each
// health check (it may take a while), is made once the events before it
// are written (run.flush).
type flushing struct {
	controls.Delegates
	r *run
	// of are the run's fields of every call (controls.Call's RunID,
	// IdempotencyKey, Metadata, AttemptTimeout).
	of controls.Call
}

func (f flushing) Serving(ctx context.Context, name string) bool {
	f.r.flush()
	return f.Delegates.Serving(ctx, name)
}

// joined returns what hands a coalesced piece to output and deltas: all
// of it to deltas (which takes choice 0's text as text, Call.Deltas), or
// only choice 0's text to output when nobody watches deltas.
func joined(output func(string), deltas func([]*stubbornv1.OutputDelta)) func([]*stubbornv1.OutputDelta) {
	if deltas != nil {
		return deltas
	}
	return func(ds []*stubbornv1.OutputDelta) {
		text := ""
		for _, d := range ds {
			if d.GetChoice() == 0 {
				text += d.GetText()
			}
		}
		if text != "" {
			output(text)
		}
	}
}

func (f flushing) Call(ctx context.Context, c controls.Call) (*stubbornv1.Result, error) {
	f.r.flush()
	f.r.calls.Add(1)
	defer f.r.calls.Add(-1)
	if f.r.isLost() || f.r.isDone() {
		// The write failed: the run's context ends (lose, endRefused),
		// and nothing is sent on its behalf.
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// Refused: this server's own doing, not the delegate's (a guard's
		// breaker does not count it).
		return nil, &controls.CallError{Code: codes.Aborted, Message: "not sent: " + errLost.Error(), NotSent: true, Refused: true}
	}
	if c.Output != nil {
		co := newCoalescer(joined(c.Output, c.Deltas), f.r.outputWindow, f.r.outputBytes)
		defer co.close() // every piece is out before the answer is judged
		c.Output, c.Deltas = co.piece, co.deltas
	}
	return f.Delegates.Call(ctx, c.WithRun(f.of))
}

// decodeAll decodes a journal for replay.
func decodeAll(evs []store.Event) ([]*stubbornv1.RunEvent, error) {
	out := make([]*stubbornv1.RunEvent, len(evs))
	for i, e := range evs {
		ev, err := e.Decode()
		if err != nil {
			return nil, err
		}
		out[i] = ev
	}
	return out, nil
}
