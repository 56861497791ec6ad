package controls

import (
	"context"
	"errors"
	"fmt"
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
// finished comes back as interrupted (errInterrupted). The controls never
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

	untilPath string             // path of the backoff announced last
	ownSteps  int32              // attempts begun so far by the run's own control (path "")
	steps     map[string]int32   // by nested paths; nil until one begins one
	woken     context.CancelFunc // ends the wait for a decision (Decide); with decision

	stop func(error) // ends the run's control (Execute's), set once

	// output is what each attempt streamed so far (attempt_output), by
	// attempt number; nil until one streams.
	output map[int32]*streamedOutput
	// analysisCost is what asking the analyst about a failed attempt
	// cost, by attempt number, until Failure records it.
	analysisCost map[int32]*stubbornv1.CallCost
	// reserved is the spend limit's share held by calls in flight (their
	// estimated input), by attempt number (spend.go).
	reserved map[int32]spend
	// stamps are timestamps not yet given out (stamp): a run's events take
	// several each, made a chunk at a time.
	stamps []timestamppb.Timestamp
}

// stampChunk is how many timestamps the tracker makes at once: a run of
// one attempt takes nine.
const stampChunk = 12

// nondeterminismError is why a resumed run ended at a step its journal
// recorded otherwise: its control now starts attempt Attempt to another
// delegate, or at another path, than the journal had (as after a config
// reload changed a preset between a crash and the takeover). The run ends
// FAILED, STATUS_REASON_NONDETERMINISTIC_REPLAY, and no answer recorded
// for another call is taken.
type nondeterminismError struct {
	// Attempt is the run-wide number of the attempt.
	Attempt int32
	// Recorded and Asked are the delegate and path the journal had and
	// the control now asks for.
	RecordedDelegate, RecordedPath, AskedDelegate, AskedPath string
}

func (e *nondeterminismError) Error() string {
	at := func(path string) string {
		if path == "" {
			return ""
		}
		return " at " + path
	}
	return fmt.Sprintf("nondeterministic replay: the journal's attempt %d went to %q%s, the control now asks for %q%s",
		e.Attempt, e.RecordedDelegate, at(e.RecordedPath), e.AskedDelegate, at(e.AskedPath))
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
		// The state is what the whole journal folds to from the start
		// (the run's history, and its status, as every reader of the
		// journal sees them): the control's replay then takes each
		// recorded step without changing the state, and only what happens
		// live folds into it.
		for _, ev := range recorded {
			apply(state, proto.CloneOf(ev))
			if o := ev.GetAttemptOutput(); o != nil {
				t.streamed(o, false)
			}
		}
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

// now returns the clock's time, as an event's time. Callers hold t.mu.
func (t *Tracker) now() *timestamppb.Timestamp {
	now := t.clock.Now()
	return t.stamp(now.Unix(), int32(now.Nanosecond()))
}

// copyTime returns a copy of ts (nil for nil). Callers hold t.mu.
func (t *Tracker) copyTime(ts *timestamppb.Timestamp) *timestamppb.Timestamp {
	if ts == nil {
		return nil
	}
	return t.stamp(ts.GetSeconds(), ts.GetNanos())
}

// stamp returns a new timestamp, from the tracker's chunk. Callers hold
// t.mu.
func (t *Tracker) stamp(seconds int64, nanos int32) *timestamppb.Timestamp {
	if len(t.stamps) == 0 {
		t.stamps = make([]timestamppb.Timestamp, stampChunk)
	}
	ts := &t.stamps[0]
	t.stamps = t.stamps[1:]
	ts.Seconds, ts.Nanos = seconds, nanos
	return ts
}

// fold stamps ev, a change that happens now at path, with its path, its
// time (at, from now) and the status it leads to (NextStatus), folds it
// into the state (apply) and emits it. Callers hold t.mu, so events leave
// in the order the state changed.
//
// Once run_finished is emitted, nothing changes any more: a control may
// leave work behind when it returns (a race's losing preset may still
// report its attempt), but the run has ended, and its state is the fold of
// the events it emitted.
func (t *Tracker) fold(at *timestamppb.Timestamp, path string, ev *stubbornv1.RunEvent) {
	if t.finished {
		return // the run ended: its state is the fold of its events
	}
	ev.Path, ev.Time = path, at
	ev.Status = NextStatus(t.state.GetStatus(), ev)
	apply(t.state, ev)
	t.emit(ev)
}

// emit hands ev to the recorder, unless the run has finished. Callers
// hold t.mu.
func (t *Tracker) emit(ev *stubbornv1.RunEvent) {
	if t.finished {
		return
	}
	t.finished = ev.GetRunFinished() != nil
	if t.record != nil {
		t.record(ev, t.state)
	}
}

// Start marks the run RUNNING and emits run_started.
func (t *Tracker) Start() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.journal.take(t.journal.runStarted) != nil {
		return // folded in already (NewReplayTracker)
	}
	t.fold(t.now(), "", newRunStarted(t.state))
}

// Resumed emits run_resumed: owner took the run over. It follows the
// whole journal, so its status is the one the journal's events folded to
// (AWAITING_DECISION for a run that awaits one), while the tracker's own
// state, which replays the journal from its start, keeps its status.
func (t *Tracker) Resumed(owner, reason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	at := t.now()
	status := t.journal.status
	if status == stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED {
		status = t.state.GetStatus()
	}
	t.state.UpdateTime = at
	t.emit(&stubbornv1.RunEvent{Time: at, Status: status, Kind: &stubbornv1.RunEvent_RunResumed{
		RunResumed: &stubbornv1.RunResumed{Owner: owner, Reason: reason},
	}})
}

// BeginAttempt records an attempt that starts now at path and emits
// attempt_started. It returns the attempt's run-wide number: the
// journal's, for an attempt it holds at this path and step.
func (t *Tracker) BeginAttempt(path, delegate, brief string, waitBefore time.Duration) int32 {
	return t.beginAttempt(path, delegate, brief, waitBefore, stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_UNSPECIFIED, "")
}

// beginAttempt is BeginAttempt with the reason the attempt starts now
// (Attempt.start_reason), which a race's candidates and a balance's picks
// have, and its words (Attempt.start_detail: a balance's figures). A
// replayed attempt keeps the journal's.
func (t *Tracker) beginAttempt(path, delegate, brief string, waitBefore time.Duration, reason stubbornv1.AttemptStartReason, detail string) int32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	at := t.nextStep(path)
	switch {
	case path == "":
		t.ownSteps = at.step
	case t.steps == nil:
		t.steps = map[string]int32{path: at.step}
	default:
		t.steps[path] = at.step
	}
	if ev := t.journal.take(t.journal.startedAt[at]); ev != nil {
		a := ev.GetAttemptStarted().GetAttempt()
		if a.GetDelegate() == delegate {
			return a.GetNumber() // folded in already
		}
		// The control went another way than the journal: the run ends
		// here. The attempt goes on unrecorded (the run has finished) and
		// its call is never made: the control's context is ended.
		t.divergeLocked(&nondeterminismError{Attempt: a.GetNumber(), RecordedDelegate: a.GetDelegate(), RecordedPath: a.GetPath(), AskedDelegate: delegate, AskedPath: path})
	}
	n := t.nextNumber()
	now := t.now()
	ev, a := newAttemptStarted()
	a.Number, a.Delegate, a.Brief, a.StartTime, a.Path = n, delegate, brief, t.copyTime(now), path
	a.StartReason, a.StartDetail = reason, detail
	if waitBefore > 0 {
		a.WaitBefore = durationpb.New(waitBefore)
	}
	t.fold(now, path, ev)
	return n
}

// startTime returns when attempt n started: now, or the journal's time for
// a replayed attempt.
func (t *Tracker) startTime(n int32) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n < 1 || int(n) > len(t.state.AttemptLog) {
		return t.clock.Now() // begun after the run ended: never recorded
	}
	return t.state.GetAttemptLog()[n-1].GetStartTime().AsTime()
}

// EndAttempt records how attempt n ended and emits attempt_finished. err,
// when not nil, becomes the attempt's error.
func (t *Tracker) EndAttempt(n int32, outcome stubbornv1.AttemptOutcome, result *stubbornv1.Result, err error, note string) {
	t.endAttempt(n, outcome, result, err, note, attemptPrice{})
}

// attemptPrice is how an attempt's end is priced: its delegate's price
// (nil: none), and the judges' calls it made.
type attemptPrice struct {
	price *stubbornv1.Price
	calls []*stubbornv1.CallCost
}

// endAttempt is EndAttempt, the attempt priced with pr (cost.go).
func (t *Tracker) endAttempt(n int32, outcome stubbornv1.AttemptOutcome, result *stubbornv1.Result, err error, note string, pr attemptPrice) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.reserved, n)
	if t.journal.take(t.journal.finished[n]) != nil {
		return // folded in already
	}
	if n < 1 || int(n) > len(t.state.AttemptLog) {
		return // begun after the run ended (its replay went another way): never recorded
	}
	at := t.now()
	a := t.state.AttemptLog[n-1] // changed in place: the event's is the log's
	a.EndTime = t.copyTime(at)
	a.Outcome = outcome
	a.Result = result
	if err != nil {
		a.Error = attemptError(err)
	}
	var out int64
	streamed := false
	if s := t.output[n]; s != nil {
		out, streamed = s.text, s.text > 0 || s.deltas
	}
	t.priceLocked(a, result, err, out, pr.price)
	ev, af := newAttemptFinished()
	af.Attempt, af.Note, af.Calls = a, note, pr.calls
	af.OutputBytes, af.OutputDiscarded = out, streamed && outcome != stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED
	t.fold(at, a.GetPath(), ev)
}

// outputOf returns what a delegate that streams gives attempt n's output
// to (Call.Output and Call.Deltas): Piece, for attempt n. provisional
// says failure criteria will rule on the answer once it is whole.
func (t *Tracker) outputOf(n int32, provisional bool) (func(text string), func(ds []*stubbornv1.OutputDelta)) {
	return func(text string) { t.Piece(n, text, nil, provisional) },
		func(ds []*stubbornv1.OutputDelta) { t.Piece(n, "", ds, provisional) }
}

// Output emits attempt_output: attempt n, in flight, streamed text, which
// follows what it streamed before (Piece).
func (t *Tracker) Output(n int32, text string, provisional bool) {
	t.Piece(n, text, nil, provisional)
}

// Piece emits attempt_output: attempt n, in flight, streamed text (its
// first choice's) and deltas (the rest of its answer), which follow what
// it streamed before; one event carries both. A delta of choice 0's text
// joins text, after it (Call.Deltas). Each delta gets its offset: the
// bytes its own stream (a choice's text, a tool call's arguments)
// streamed before it. A piece of an attempt that has ended (a race's
// loser, cancelled while a piece was on its way) or of one the tracker
// never began is dropped: its end said what became of its output.
func (t *Tracker) Piece(n int32, text string, ds []*stubbornv1.OutputDelta, provisional bool) {
	var kept []*stubbornv1.OutputDelta
	for _, d := range ds {
		switch k := d.GetKind().(type) {
		case *stubbornv1.OutputDelta_Text:
			if d.GetChoice() == 0 {
				text += k.Text
			} else if k.Text != "" {
				kept = append(kept, &stubbornv1.OutputDelta{Choice: d.GetChoice(), Kind: &stubbornv1.OutputDelta_Text{Text: k.Text}})
			}
		case *stubbornv1.OutputDelta_ToolCall:
			tc := k.ToolCall
			if tc.GetId() != "" || tc.GetName() != "" || tc.GetArguments() != "" {
				kept = append(kept, &stubbornv1.OutputDelta{Choice: d.GetChoice(), Kind: &stubbornv1.OutputDelta_ToolCall{ToolCall: &stubbornv1.ToolCallDelta{
					Index: tc.GetIndex(), Id: tc.GetId(), Name: tc.GetName(), Arguments: tc.GetArguments(),
				}}})
			}
		}
	}
	if text == "" && len(kept) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if n < 1 || int(n) > len(t.state.AttemptLog) {
		return
	}
	a := t.state.AttemptLog[n-1]
	if a.GetOutcome() != stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_UNSPECIFIED {
		return
	}
	o := &stubbornv1.AttemptOutput{Attempt: n, Text: text, Provisional: provisional, Deltas: kept}
	if text != "" {
		o.Offset = t.streamedText(n)
	}
	t.streamed(o, true)
	t.fold(t.now(), a.GetPath(), &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_AttemptOutput{AttemptOutput: o}})
}

// streamKey names one stream of an attempt's output besides its first
// choice's text: a choice's text (call -1) or one of its tool calls'
// arguments.
type streamKey struct {
	attempt, choice, call int32
}

// streamedOutput is what an attempt streamed so far.
type streamedOutput struct {
	text    int64 // bytes of its first choice's text
	deltas  bool  // some deltas too
	streams map[streamKey]int64
}

// streamedText returns the bytes of text attempt n streamed so far.
// Callers hold t.mu, or own t.
func (t *Tracker) streamedText(n int32) int64 {
	if s := t.output[n]; s != nil {
		return s.text
	}
	return 0
}

// streamed notes o, the attempt's next output, setting its deltas'
// offsets when it is live, or taking them as they are (an event of the
// journal, with o.Offset too). Callers hold t.mu, or own t.
func (t *Tracker) streamed(o *stubbornv1.AttemptOutput, live bool) {
	if t.output == nil {
		t.output = map[int32]*streamedOutput{}
	}
	n := o.GetAttempt()
	s := t.output[n]
	if s == nil {
		s = &streamedOutput{}
		t.output[n] = s
	}
	if o.GetText() != "" {
		s.text = o.GetOffset() + int64(len(o.GetText()))
	}
	for _, d := range o.GetDeltas() {
		k, size := streamKey{n, d.GetChoice(), -1}, int64(len(d.GetText()))
		if tc := d.GetToolCall(); tc != nil {
			k.call, size = tc.GetIndex(), int64(len(tc.GetArguments()))
		}
		if s.streams == nil {
			s.streams = map[streamKey]int64{}
		}
		if live {
			d.Offset = s.streams[k]
		}
		s.streams[k] = d.GetOffset() + size
		s.deltas = true
	}
}

// Failure appends rec to the failure history and emits failure_analyzed.
func (t *Tracker) Failure(rec *stubbornv1.FailureRecord, willRetry bool, nextBrief string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.journal.take(t.journal.failures[rec.GetAttempt()]) != nil {
		return // folded in already
	}
	cc := t.analysisCost[rec.GetAttempt()]
	delete(t.analysisCost, rec.GetAttempt())
	t.fold(t.now(), rec.GetPath(), &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_FailureAnalyzed{
		FailureAnalyzed: &stubbornv1.FailureAnalyzed{
			Failure:      rec,
			WillRetry:    willRetry,
			NextBrief:    nextBrief,
			AnalysisCost: cc,
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
	if ev := t.journal.take(t.journal.backoffAt[t.nextStep(path)]); ev != nil {
		b := ev.GetBackoffScheduled() // folded in already
		t.until = b.GetUntil().AsTime()
		t.untilPath = path
		if t.journal.startedAt[t.nextStep(path)] != nil {
			t.until = time.Time{} // the wait is over: the next attempt started
		}
		return b.GetWait().AsDuration()
	}
	at := t.now()
	t.until = at.AsTime().Add(wait)
	t.untilPath = path
	t.fold(at, path, &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_BackoffScheduled{
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
// journal resumes with the time that was left. The sleep's context says
// what it waits for (WaitOf).
func (t *Tracker) WaitBackoff(ctx context.Context, clock Clock) error {
	t.mu.Lock()
	until, path := t.until, t.untilPath
	t.mu.Unlock()
	if until.IsZero() {
		return ctx.Err()
	}
	return clock.Sleep(withWait(ctx, Wait{Path: path, Until: until}), until.Sub(clock.Now()))
}

// AwaitDecision marks the run AWAITING_DECISION, with reason as its
// status_reason and code as its status_reason_code, emits
// decision_requested (with both) and waits, sleeping on the tracker's
// clock, until Decide is called, timeout passes (0 means never: a sleep of
// Forever), or ctx ends. A timeout returns DECISION_FAIL with timedOut
// set. The sleep's context says what it waits for (WaitOf).
func (t *Tracker) AwaitDecision(ctx context.Context, path, reason string, code stubbornv1.StatusReason, timeout time.Duration) (d stubbornv1.Decision, timedOut bool, err error) {
	t.mu.Lock()
	deadline, got, answered := t.requestLocked(path, reason, code, timeout)
	if answered {
		t.mu.Unlock()
		return got, false, nil
	}
	ch := make(chan stubbornv1.Decision, 1)
	waitCtx, woken := context.WithCancel(ctx)
	defer woken()
	t.decision, t.woken = ch, woken
	t.mu.Unlock()

	left := Forever
	if !deadline.IsZero() {
		left = deadline.Sub(t.clock.Now())
	}
	slept := t.clock.Sleep(withWait(waitCtx, Wait{Path: path, Until: deadline, Decision: true}), left)

	t.mu.Lock()
	defer t.mu.Unlock()
	t.decision, t.woken = nil, nil
	select {
	case d = <-ch: // decided, whether or not the timeout came too
		return d, false, nil
	default:
	}
	if ctx.Err() != nil {
		return stubbornv1.Decision_DECISION_UNSPECIFIED, false, ctxErr(ctx)
	}
	if slept != nil {
		return stubbornv1.Decision_DECISION_UNSPECIFIED, false, slept
	}
	return stubbornv1.Decision_DECISION_FAIL, true, nil
}

// requestLocked asks for a decision at path: it takes the journal's
// request, and its answer when the journal has one (answered), or emits
// decision_requested. It returns when the wait for it times out (zero:
// never). Callers hold t.mu.
func (t *Tracker) requestLocked(path, reason string, code stubbornv1.StatusReason, timeout time.Duration) (deadline time.Time, d stubbornv1.Decision, answered bool) {
	ev := t.journal.take(t.journal.next(t.journal.requests[path]))
	if ev == nil {
		at := t.now()
		req := &stubbornv1.DecisionRequested{Reason: reason, ReasonCode: code, FailureHistory: t.state.FailureHistory}
		if timeout > 0 {
			deadline = at.AsTime().Add(timeout)
			req.Deadline = timestamppb.New(deadline)
		}
		t.fold(at, path, &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_DecisionRequested{DecisionRequested: req}})
		return deadline, d, false
	}
	// Folded in already. Recorded by a release before status_reason_code,
	// the request the run still awaits gets the code the control gives the
	// same reason now.
	if t.state.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION &&
		t.state.GetStatusReasonCode() == stubbornv1.StatusReason_STATUS_REASON_UNSPECIFIED && t.state.GetStatusReason() == reason {
		t.state.StatusReasonCode = code
	}
	if dl := ev.GetDecisionRequested().GetDeadline(); dl != nil {
		deadline = dl.AsTime()
	}
	if got := t.journal.take(t.journal.next(t.journal.answers[path])); got != nil {
		return deadline, got.GetDecisionReceived().GetDecision(), true // folded in already
	}
	return deadline, d, false
}

// Decide answers a run that waits in AwaitDecision and emits
// decision_received, or returns ErrNotAwaitingDecision when it awaits
// none. A run whose wait was abandoned (its goroutine ended in the
// clock's Sleep, see WaitOf) still awaits it here: Decide records the
// decision, and the run's replay from its journal takes it.
//
// limit, when not nil, is the run's spend limit from then on: the event
// carries it, and folding it sets the run's options.spend_limit.
func (t *Tracker) Decide(d stubbornv1.Decision, limit *stubbornv1.SpendLimit) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.decision == nil {
		return ErrNotAwaitingDecision
	}
	t.decision <- d
	t.woken()
	t.decision, t.woken = nil, nil
	t.fold(t.now(), "", &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_DecisionReceived{
		DecisionReceived: &stubbornv1.DecisionReceived{Decision: d, SpendLimit: limit},
	}})
	return nil
}

// Finish sets the final status, result and winner, and why (reason, and
// code as a value: UNSPECIFIED for SUCCEEDED), and emits run_finished.
// Only the first call has an effect.
func (t *Tracker) Finish(status stubbornv1.RunStatus, result *stubbornv1.Result, winner, reason string, code stubbornv1.StatusReason) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.finishLocked(status, result, winner, reason, code)
}

// divergeLocked ends a replayed run whose control asked for another step
// than its journal recorded: FAILED with err's words, and the control
// stopped (Execute's context ends with err as its cause). Callers hold
// t.mu.
func (t *Tracker) divergeLocked(err *nondeterminismError) {
	t.finishLocked(stubbornv1.RunStatus_RUN_STATUS_FAILED, nil, "", err.Error(), stubbornv1.StatusReason_STATUS_REASON_NONDETERMINISTIC_REPLAY)
	if t.stop != nil {
		t.stop(err)
	}
}

// stopWith makes stop end the run's control, unless a stop is set
// already (a nested control's Execute). It reports whether it was set.
func (t *Tracker) stopWith(stop func(error)) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stop != nil {
		return false
	}
	t.stop = stop
	return true
}

// finishLocked is Finish. Callers hold t.mu.
func (t *Tracker) finishLocked(status stubbornv1.RunStatus, result *stubbornv1.Result, winner, reason string, code stubbornv1.StatusReason) {
	if t.state.GetEndTime() != nil {
		return
	}
	t.decision, t.woken = nil, nil
	// The final state is the event's: set here, so that run_finished
	// carries it whole (cut to MaxStateBytes), and folded in again as a
	// no-op.
	at := t.now()
	t.state.Status, t.state.UpdateTime, t.state.EndTime = status, at, t.copyTime(at)
	t.state.Result = result
	t.state.Winner = winner
	t.state.StatusReason, t.state.StatusReasonCode = reason, code
	t.fold(at, "", newRunFinished(BoundState(t.state, MaxStateBytes)))
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
