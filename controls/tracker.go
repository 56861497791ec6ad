package controls

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Sink receives each event as it happens, in order. run_id and seq are left
// for the sink to fill. It must not block for long: controls call it inline.
type Sink func(ev *stubbornv1.RunEvent)

// Recorder is a Sink that also sees the run's state right after the change
// the event reports. Both are read during the call only: state is the
// tracker's own, and ev shares messages with it (run_started's and
// run_finished's state is state itself, an attempt event's attempt is the
// log's), so encode or clone what must outlive the call. The tracker copies
// nothing for an event: a run's events are encoded once, by the recorder.
type Recorder func(ev *stubbornv1.RunEvent, state *stubbornv1.ControlState)

// ErrNotAwaitingDecision is returned by Decide when the run is not waiting
// for a decision.
var ErrNotAwaitingDecision = errors.New("run is not awaiting a decision")

// ErrParked is returned by WaitBackoff when the tracker parked the run
// instead of waiting (see ParkWaits).
var ErrParked = errors.New("run parked while it waits")

// Tracker keeps a run's ControlState and turns every step of a control into
// an event. It is safe for concurrent use (race runs attempts in parallel).
//
// A tracker built with a journal (the events a run already recorded, when
// another server takes the run over) replays it: running the control again
// from the start, every step that the journal holds is taken from it instead
// of being done again — the attempt's answer without calling the delegate
// (see Env.answer and the other effects in effects.go), the backoff's wait
// without waiting it again, the decision without asking — and its event is
// not emitted twice. The first step the journal lacks is done for real, and
// from there the run goes on live. An attempt that started but never
// finished comes back as interrupted (ErrInterrupted). The controls never
// ask which: the effects their Env gives them are the journal's or live.
type Tracker struct {
	mu       sync.Mutex
	state    *stubbornv1.ControlState
	clock    Clock
	record   Recorder
	decision chan stubbornv1.Decision // non-nil while awaiting a decision
	until    time.Time                // end of the backoff announced last
	journal  *journal                 // noJournal when not replaying
	finished bool                     // run_finished was emitted: nothing follows it

	untilPath   string        // path of the backoff announced last
	parkFrom    time.Duration // 0: never park
	parked      bool          // the run is parked: nothing more is emitted
	parkedUntil time.Time     // when a parked run's wait ends; zero: when decided
	answer      *answer       // the decision for the wait a replay reaches (Answer)
	park        func(until time.Time, decision bool)
	onLive      []func() // called once before the first step the journal lacks
}

// answer is a decision given ahead of its wait (Tracker.Answer).
type answer struct {
	decision stubbornv1.Decision
	taken    func()
}

// NewTracker tracks state (owned by the tracker from now on) and sends
// events to sink, each a copy of its own.
func NewTracker(state *stubbornv1.ControlState, clock Clock, sink Sink) *Tracker {
	var rec Recorder
	if sink != nil {
		rec = func(ev *stubbornv1.RunEvent, _ *stubbornv1.ControlState) { sink(proto.CloneOf(ev)) }
	}
	return NewReplayTracker(state, clock, rec, nil)
}

// NewReplayTracker tracks state, replaying the events already recorded in
// journal (in seq order; empty for a new run), and sends every new event to
// rec. For a run being resumed, state must be the state of its run_started
// event.
func NewReplayTracker(state *stubbornv1.ControlState, clock Clock, rec Recorder, recorded []*stubbornv1.RunEvent) *Tracker {
	if clock == nil {
		clock = RealClock{}
	}
	t := &Tracker{state: state, clock: clock, record: rec, journal: noJournal}
	if len(recorded) > 0 {
		t.journal = newJournal(recorded)
	}
	return t
}

// Snapshot returns a copy of the current state.
// A state over MaxStateBytes comes with its attempt log's and failure
// history's texts cut (BoundState).
func (t *Tracker) Snapshot() *stubbornv1.ControlState {
	t.mu.Lock()
	defer t.mu.Unlock()
	if st := BoundState(t.state, MaxStateBytes); st != t.state {
		return st
	}
	return proto.CloneOf(t.state)
}

// Status returns the current status.
func (t *Tracker) Status() stubbornv1.RunStatus {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.state.GetStatus()
}

// touch sets the state's update time, before a change: to now, or to the
// replayed event's time. Callers hold t.mu.
func (t *Tracker) touch(replayed *stubbornv1.RunEvent) {
	if replayed != nil {
		t.state.UpdateTime = copyTime(replayed.GetTime())
		return
	}
	t.state.UpdateTime = timestamppb.New(t.clock.Now())
}

// emit stamps the event with the path and the time of the change it
// reports, and hands it to the recorder. Callers hold t.mu, so events leave
// in the order the state changed.
//
// Nothing is emitted after run_finished: a control may leave work behind
// when it returns (a race's losing preset may still report its attempt),
// but the run has ended and its stream with it.
func (t *Tracker) emit(path string, ev *stubbornv1.RunEvent) {
	if t.finished || t.parked {
		return
	}
	if ev.GetRunResumed() == nil {
		t.goLive()
	}
	t.finished = ev.GetRunFinished() != nil
	ev.Path = path
	ev.Time = t.state.UpdateTime // replaced, never changed, by touch
	if t.record != nil {
		t.record(ev, t.state)
	}
}

// OnLive adds f to the functions called once, in the order added, before
// the tracker does the first step of the run that its journal does not
// hold: emits an event (run_resumed aside) or waits. A server resuming a
// run from its journal holds the run's cancellation back until then, so
// that the control replays the whole journal before it may stop: a run
// cancelled while it is replayed ends with its whole history. f is called
// with the tracker's lock held. Call before the run is driven.
func (t *Tracker) OnLive(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.onLive = append(t.onLive, f)
}

// goLive calls the OnLive functions, once. Callers hold t.mu.
func (t *Tracker) goLive() {
	fs := t.onLive
	t.onLive = nil
	for _, f := range fs {
		f()
	}
}

// ParkWaits makes WaitBackoff park the run, instead of waiting, for a
// backoff of the run's own control (path "") with at least min left, and
// AwaitDecision for a decision the run's own control asks for, unless its
// timeout is nearer than min: they call park with the wait's end (zero for
// a decision without timeout) and whether it is a decision, with the
// tracker's lock held, and return
// ErrParked; the tracker then emits nothing more and Finish does nothing.
// The control returns (as when its context ends), and whoever drives the
// run resumes it when the wait is over with a new tracker replaying the
// journal, so that a waiting run holds no goroutine. Only the run's own
// control is parked: it alone knows that no other step of the run goes on
// meanwhile (a race's branches do). min 0 never parks. Call before the run
// is driven.
func (t *Tracker) ParkWaits(min time.Duration, park func(until time.Time, decision bool)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.parkFrom, t.park = min, park
}

// parkLocked parks the run until until (zero: until decided). Callers
// hold t.mu.
func (t *Tracker) parkLocked(until time.Time, decision bool) {
	t.parked, t.parkedUntil = true, until
	if t.park != nil {
		t.park(until, decision)
	}
}

// Parked reports whether the run is parked, and until when it waits: the
// end of its backoff, or the timeout of the decision it awaits (zero when
// it has none). A run parked for a decision has the status
// AWAITING_DECISION; it is decided by waking it: a new tracker replays
// the journal up to the same wait, and takes the decision from there.
func (t *Tracker) Parked() (until time.Time, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.parkedUntil, t.parked
}

// Start marks the run RUNNING and emits run_started.
func (t *Tracker) Start() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if ev := t.journal.take(t.journal.runStarted); ev != nil {
		t.touch(ev)
		t.state.Status = stubbornv1.RunStatus_RUN_STATUS_RUNNING
		return
	}
	t.touch(nil)
	t.state.Status = stubbornv1.RunStatus_RUN_STATUS_RUNNING
	t.emit("", &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_RunStarted{
		RunStarted: &stubbornv1.RunStarted{State: t.state},
	}})
}

// Resumed emits run_resumed: owner took the run over.
func (t *Tracker) Resumed(owner, reason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.touch(nil)
	t.emit("", &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_RunResumed{
		RunResumed: &stubbornv1.RunResumed{Owner: owner, Reason: reason},
	}})
}

// BeginAttempt records an attempt that starts now and emits
// attempt_started. It returns the attempt's run-wide number.
func (t *Tracker) BeginAttempt(path, delegate, brief string, waitBefore time.Duration) int32 {
	return t.beginAttempt(path, delegate, brief, waitBefore, stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_UNSPECIFIED)
}

// beginAttempt is BeginAttempt with the reason the attempt starts now
// (Attempt.start_reason), which a race's candidates have. A replayed
// attempt keeps the journal's.
func (t *Tracker) beginAttempt(path, delegate, brief string, waitBefore time.Duration, reason stubbornv1.AttemptStartReason) int32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := int32(len(t.state.AttemptLog)) + 1
	if path == "" {
		// ControlState.attempts counts the run's own control's attempts; a
		// nested preset's attempts are in the log under their path.
		t.state.Attempts++
	}
	t.state.Status = stubbornv1.RunStatus_RUN_STATUS_RUNNING
	if ev := t.journal.take(t.journal.started[n]); ev != nil {
		t.touch(ev)
		t.state.AttemptLog = append(t.state.AttemptLog, proto.CloneOf(ev.GetAttemptStarted().GetAttempt()))
		return n
	}
	t.touch(nil)
	a := &stubbornv1.Attempt{
		Number:      n,
		Delegate:    delegate,
		Brief:       brief,
		StartTime:   copyTime(t.state.UpdateTime),
		Path:        path,
		StartReason: reason,
	}
	if waitBefore > 0 {
		a.WaitBefore = durationpb.New(waitBefore)
	}
	t.state.AttemptLog = append(t.state.AttemptLog, a)
	t.emit(path, &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_AttemptStarted{
		AttemptStarted: &stubbornv1.AttemptStarted{Attempt: a},
	}})
	return n
}

// startTime returns when attempt n started: now, or the journal's time for
// a replayed attempt.
func (t *Tracker) startTime(n int32) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.state.GetAttemptLog()[n-1].GetStartTime().AsTime()
}

// EndAttempt records how attempt n ended and emits attempt_finished. err,
// when not nil, becomes the attempt's error.
func (t *Tracker) EndAttempt(n int32, outcome stubbornv1.AttemptOutcome, result *stubbornv1.Result, err error, note string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if ev := t.journal.take(t.journal.finished[n]); ev != nil {
		t.touch(ev)
		t.state.AttemptLog[n-1] = proto.CloneOf(ev.GetAttemptFinished().GetAttempt())
		return
	}
	t.touch(nil)
	a := t.state.AttemptLog[n-1]
	a.EndTime = copyTime(t.state.UpdateTime)
	a.Outcome = outcome
	a.Result = result
	if err != nil {
		a.Error = attemptError(err)
	}
	t.emit(a.GetPath(), &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_AttemptFinished{
		AttemptFinished: &stubbornv1.AttemptFinished{Attempt: a, Note: note},
	}})
}

// Failure appends rec to the failure history and emits failure_analyzed.
func (t *Tracker) Failure(rec *stubbornv1.FailureRecord, willRetry bool, nextBrief string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if ev := t.journal.take(t.journal.failures[rec.GetAttempt()]); ev != nil {
		t.touch(ev)
		t.state.FailureHistory = append(t.state.FailureHistory, proto.CloneOf(ev.GetFailureAnalyzed().GetFailure()))
		return
	}
	t.touch(nil)
	t.state.FailureHistory = append(t.state.FailureHistory, rec)
	t.emit(rec.GetPath(), &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_FailureAnalyzed{
		FailureAnalyzed: &stubbornv1.FailureAnalyzed{
			Failure:   rec,
			WillRetry: willRetry,
			NextBrief: nextBrief,
		},
	}})
}

// Backoff marks the run BACKING_OFF and emits backoff_scheduled for a wait
// that starts now. It returns the wait to honour: the journal's, when the
// backoff was already announced before the run changed hands. Wait with
// WaitBackoff.
func (t *Tracker) Backoff(path string, nextAttempt int32, wait, bound time.Duration, fromHint bool) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.state.Status = stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF
	if ev := t.journal.take(t.journal.backoffs[nextAttempt]); ev != nil {
		t.touch(ev)
		b := ev.GetBackoffScheduled()
		t.until = b.GetUntil().AsTime()
		t.untilPath = path
		if t.journal.started[nextAttempt] != nil {
			t.until = time.Time{} // the wait is over: the next attempt started
		}
		return b.GetWait().AsDuration()
	}
	t.touch(nil)
	now := t.state.GetUpdateTime().AsTime()
	t.until = now.Add(wait)
	t.untilPath = path
	t.emit(path, &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_BackoffScheduled{
		BackoffScheduled: &stubbornv1.BackoffScheduled{
			NextAttempt: nextAttempt,
			Wait:        durationpb.New(wait),
			Until:       timestamppb.New(t.until),
			Bound:       durationpb.New(bound),
			FromHint:    fromHint,
		},
	}})
	return wait
}

// WaitBackoff sleeps on clock until the end of the backoff announced last,
// or returns ctx's error when ctx ends first. A backoff replayed from the
// journal resumes with the time that was left.
//
// With ParkWaits, a long enough backoff of the run's own control parks the
// run: WaitBackoff returns ErrParked at once.
func (t *Tracker) WaitBackoff(ctx context.Context, clock Clock) error {
	t.mu.Lock()
	until := t.until
	if until.IsZero() {
		t.mu.Unlock()
		return ctx.Err()
	}
	t.goLive()
	left := until.Sub(clock.Now())
	if t.parkFrom > 0 && t.untilPath == "" && left >= t.parkFrom && !t.finished && ctx.Err() == nil {
		t.parkLocked(until, false)
		t.mu.Unlock()
		return ErrParked
	}
	t.mu.Unlock()
	return clock.Sleep(ctx, left)
}

// AwaitDecision marks the run AWAITING_DECISION, with reason as its
// status_reason and code as its status_reason_code, emits
// decision_requested (with both) and blocks until Decide is called, timeout
// passes (0 means never), or ctx ends. A timeout returns DECISION_FAIL with
// timedOut set.
//
// With ParkWaits, the run's own control (path "") parks instead, unless
// less than the minimum is left before the timeout: AwaitDecision returns
// ErrParked at once, and Decide returns ErrNotAwaitingDecision; whoever
// drives the run wakes it to be decided (see Parked).
func (t *Tracker) AwaitDecision(ctx context.Context, path, reason string, code stubbornv1.StatusReason, timeout time.Duration) (d stubbornv1.Decision, timedOut bool, err error) {
	ch := make(chan stubbornv1.Decision, 1)
	t.mu.Lock()
	t.state.Status = stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION
	t.state.StatusReason, t.state.StatusReasonCode = reason, code
	var deadline time.Time
	if ev := t.journal.take(t.journal.next(&t.journal.requests)); ev != nil {
		t.touch(ev)
		if dl := ev.GetDecisionRequested().GetDeadline(); dl != nil {
			deadline = dl.AsTime()
		}
		if got := t.journal.take(t.journal.next(&t.journal.answers)); got != nil {
			t.touch(got)
			t.state.Status = stubbornv1.RunStatus_RUN_STATUS_RUNNING
			t.state.StatusReason, t.state.StatusReasonCode = "", stubbornv1.StatusReason_STATUS_REASON_UNSPECIFIED
			t.mu.Unlock()
			return got.GetDecisionReceived().GetDecision(), false, nil
		}
	} else {
		t.touch(nil)
		req := &stubbornv1.DecisionRequested{Reason: reason, ReasonCode: code, FailureHistory: t.state.FailureHistory}
		if timeout > 0 {
			deadline = t.state.GetUpdateTime().AsTime().Add(timeout)
			req.Deadline = timestamppb.New(deadline)
		}
		t.emit(path, &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_DecisionRequested{DecisionRequested: req}})
	}
	t.decision = ch
	t.goLive()
	if a := t.answer; a != nil {
		t.answer = nil
		t.decideLocked(a.decision)
		a.taken()
	}
	if t.decision != nil && t.parkFrom > 0 && path == "" && !t.finished && ctx.Err() == nil &&
		(deadline.IsZero() || deadline.Sub(t.clock.Now()) >= t.parkFrom) {
		t.decision = nil
		t.parkLocked(deadline, true)
		t.mu.Unlock()
		return stubbornv1.Decision_DECISION_UNSPECIFIED, false, ErrParked
	}
	t.mu.Unlock()

	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if !deadline.IsZero() {
		go func() {
			// The clock decides when the timeout is over, so tests can fake it.
			if t.clock.Sleep(waitCtx, deadline.Sub(t.clock.Now())) == nil {
				cancel()
			}
		}()
	}
	select {
	case d = <-ch:
		return d, false, nil
	case <-waitCtx.Done():
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.decision = nil
	select {
	case d = <-ch: // Decide won the race against the timeout.
		return d, false, nil
	default:
	}
	if ctx.Err() != nil {
		return stubbornv1.Decision_DECISION_UNSPECIFIED, false, ctx.Err()
	}
	return stubbornv1.Decision_DECISION_FAIL, true, nil
}

// Decide answers a run that waits in AwaitDecision and emits
// decision_received. It returns ErrParked when the run awaits a decision
// parked, and ErrNotAwaitingDecision when it awaits none.
func (t *Tracker) Decide(d stubbornv1.Decision) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.decision == nil {
		if t.parked && t.state.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION {
			return ErrParked // whoever parked the run decides it (Answer)
		}
		return ErrNotAwaitingDecision
	}
	t.decideLocked(d)
	return nil
}

// Answer gives a tracker replaying the journal of a run parked for a
// decision (see Parked) that decision: AwaitDecision takes it, as Decide
// would, when the replay reaches that wait, and calls taken then (with the
// tracker's lock held). Call before the run is driven.
func (t *Tracker) Answer(d stubbornv1.Decision, taken func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.answer = &answer{d, taken}
}

// decideLocked answers AwaitDecision. Callers hold t.mu, and t.decision is
// set.
func (t *Tracker) decideLocked(d stubbornv1.Decision) {
	t.touch(nil)
	t.decision <- d
	t.decision = nil
	t.state.Status = stubbornv1.RunStatus_RUN_STATUS_RUNNING
	t.state.StatusReason, t.state.StatusReasonCode = "", stubbornv1.StatusReason_STATUS_REASON_UNSPECIFIED
	t.emit("", &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_DecisionReceived{
		DecisionReceived: &stubbornv1.DecisionReceived{Decision: d},
	}})
}

// Finish sets the final status, result and winner, and why (reason, and
// code as a value: UNSPECIFIED for SUCCEEDED), and emits run_finished.
// Only the first call has an effect; none once the run is parked.
func (t *Tracker) Finish(status stubbornv1.RunStatus, result *stubbornv1.Result, winner, reason string, code stubbornv1.StatusReason) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.state.GetEndTime() != nil || t.parked {
		return
	}
	t.touch(nil)
	t.decision = nil
	t.state.Status = status
	t.state.Result = result
	t.state.Winner = winner
	t.state.StatusReason, t.state.StatusReasonCode = reason, code
	t.state.EndTime = copyTime(t.state.UpdateTime)
	t.emit("", &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_RunFinished{
		RunFinished: &stubbornv1.RunFinished{State: BoundState(t.state, MaxStateBytes)},
	}})
}

// copyTime returns a copy of ts, as proto.CloneOf would, without its
// reflection: events copy a time several times each.
func copyTime(ts *timestamppb.Timestamp) *timestamppb.Timestamp {
	if ts == nil {
		return nil
	}
	return &timestamppb.Timestamp{Seconds: ts.GetSeconds(), Nanos: ts.GetNanos()}
}

// attemptError converts a call failure to its wire form.
func attemptError(err error) *stubbornv1.AttemptError {
	var ce *CallError
	if errors.As(err, &ce) {
		ae := &stubbornv1.AttemptError{
			Code: int32(ce.Code), Message: Cut(ce.Message, MaxReasonBytes), HttpStatus: int32(ce.HTTPStatus),
			NotSent: ce.NotSent, Refused: ce.Refused, RefusedBy: ce.RefusedBy,
		}
		if ce.HasHint {
			ae.RetryHint = durationpb.New(ce.RetryHint)
		}
		return ae
	}
	code := codes.Unknown
	switch {
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	}
	return &stubbornv1.AttemptError{Code: int32(code), Message: strings.ToValidUTF8(err.Error(), "\uFFFD")}
}
