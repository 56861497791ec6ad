package controls

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Sink receives each event as it happens, in order. run_id, seq and time are
// left for the sink to fill. It must not block for long: controls call it
// inline.
type Sink func(ev *stubbornv1.RunEvent)

// ErrNotAwaitingDecision is returned by Decide when the run is not waiting
// for a decision.
var ErrNotAwaitingDecision = errors.New("run is not awaiting a decision")

// Tracker keeps a run's ControlState and turns every step of a control into
// an event. It is safe for concurrent use (race runs attempts in parallel).
type Tracker struct {
	mu       sync.Mutex
	state    *stubbornv1.ControlState
	clock    Clock
	sink     Sink
	decision chan stubbornv1.Decision // non-nil while awaiting a decision
}

// NewTracker tracks state (owned by the tracker from now on) and sends
// events to sink.
func NewTracker(state *stubbornv1.ControlState, clock Clock, sink Sink) *Tracker {
	if clock == nil {
		clock = RealClock{}
	}
	return &Tracker{state: state, clock: clock, sink: sink}
}

// Snapshot returns a copy of the current state.
func (t *Tracker) Snapshot() *stubbornv1.ControlState {
	t.mu.Lock()
	defer t.mu.Unlock()
	return proto.CloneOf(t.state)
}

// Status returns the current status.
func (t *Tracker) Status() stubbornv1.RunStatus {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.state.GetStatus()
}

// touch sets the state's update time to now, before a change. Callers hold
// t.mu.
func (t *Tracker) touch() {
	t.state.UpdateTime = timestamppb.New(t.clock.Now())
}

// emit stamps the event with the path and the time of the change it
// reports, and hands it to the sink. Callers hold t.mu, so events leave in
// the order the state changed.
func (t *Tracker) emit(path string, ev *stubbornv1.RunEvent) {
	ev.Path = path
	ev.Time = proto.CloneOf(t.state.UpdateTime)
	if t.sink != nil {
		t.sink(ev)
	}
}

// Start marks the run RUNNING and emits run_started.
func (t *Tracker) Start() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.touch()
	t.state.Status = stubbornv1.RunStatus_RUN_STATUS_RUNNING
	t.emit("", &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_RunStarted{
		RunStarted: &stubbornv1.RunStarted{State: proto.CloneOf(t.state)},
	}})
}

// BeginAttempt records an attempt that starts now and emits
// attempt_started. It returns the attempt's run-wide number.
func (t *Tracker) BeginAttempt(path, delegate, brief string, waitBefore time.Duration) int32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.touch()
	n := int32(len(t.state.AttemptLog)) + 1
	a := &stubbornv1.Attempt{
		Number:    n,
		Delegate:  delegate,
		Brief:     brief,
		StartTime: timestamppb.New(t.clock.Now()),
		Path:      path,
	}
	if waitBefore > 0 {
		a.WaitBefore = durationpb.New(waitBefore)
	}
	t.state.AttemptLog = append(t.state.AttemptLog, a)
	if path == "" {
		// ControlState.attempts counts the run's own control's attempts; a
		// nested preset's attempts are in the log under their path.
		t.state.Attempts++
	}
	t.state.Status = stubbornv1.RunStatus_RUN_STATUS_RUNNING
	t.emit(path, &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_AttemptStarted{
		AttemptStarted: &stubbornv1.AttemptStarted{Attempt: proto.CloneOf(a)},
	}})
	return n
}

// NextAttempt returns the number the next attempt will get.
func (t *Tracker) NextAttempt() int32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return int32(len(t.state.AttemptLog)) + 1
}

// EndAttempt records how attempt n ended and emits attempt_finished. err,
// when not nil, becomes the attempt's error.
func (t *Tracker) EndAttempt(n int32, outcome stubbornv1.AttemptOutcome, result *stubbornv1.Result, err error, note string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.touch()
	a := t.state.AttemptLog[n-1]
	a.EndTime = timestamppb.New(t.clock.Now())
	a.Outcome = outcome
	a.Result = result
	if err != nil {
		a.Error = attemptError(err)
	}
	t.emit(a.GetPath(), &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_AttemptFinished{
		AttemptFinished: &stubbornv1.AttemptFinished{Attempt: proto.CloneOf(a), Note: note},
	}})
}

// Failure appends rec to the failure history and emits failure_analyzed.
func (t *Tracker) Failure(rec *stubbornv1.FailureRecord, willRetry bool, nextBrief string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.touch()
	t.state.FailureHistory = append(t.state.FailureHistory, rec)
	t.emit(rec.GetPath(), &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_FailureAnalyzed{
		FailureAnalyzed: &stubbornv1.FailureAnalyzed{
			Failure:   proto.CloneOf(rec),
			WillRetry: willRetry,
			NextBrief: nextBrief,
		},
	}})
}

// Backoff marks the run BACKING_OFF and emits backoff_scheduled for a wait
// that starts now.
func (t *Tracker) Backoff(path string, nextAttempt int32, wait, bound time.Duration, fromHint bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.touch()
	t.state.Status = stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF
	t.emit(path, &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_BackoffScheduled{
		BackoffScheduled: &stubbornv1.BackoffScheduled{
			NextAttempt: nextAttempt,
			Wait:        durationpb.New(wait),
			Until:       timestamppb.New(t.clock.Now().Add(wait)),
			Bound:       durationpb.New(bound),
			FromHint:    fromHint,
		},
	}})
}

// AwaitDecision marks the run AWAITING_DECISION, emits decision_requested
// and blocks until Decide is called, timeout passes (0 means never), or ctx
// ends. A timeout returns DECISION_FAIL with timedOut set.
func (t *Tracker) AwaitDecision(ctx context.Context, path, reason string, timeout time.Duration) (d stubbornv1.Decision, timedOut bool, err error) {
	ch := make(chan stubbornv1.Decision, 1)
	t.mu.Lock()
	t.touch()
	t.decision = ch
	t.state.Status = stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION
	t.state.StatusReason = reason
	req := &stubbornv1.DecisionRequested{Reason: reason}
	for _, f := range t.state.FailureHistory {
		req.FailureHistory = append(req.FailureHistory, proto.CloneOf(f))
	}
	if timeout > 0 {
		req.Deadline = timestamppb.New(t.clock.Now().Add(timeout))
	}
	t.emit(path, &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_DecisionRequested{DecisionRequested: req}})
	t.mu.Unlock()

	waitCtx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		waitCtx, cancel = context.WithCancel(ctx)
		go func() {
			// The clock decides when the timeout is over, so tests can fake it.
			if t.clock.Sleep(waitCtx, timeout) == nil {
				cancel()
			}
		}()
	}
	defer cancel()
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
// decision_received. It returns ErrNotAwaitingDecision otherwise.
func (t *Tracker) Decide(d stubbornv1.Decision) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.decision == nil {
		return ErrNotAwaitingDecision
	}
	t.touch()
	t.decision <- d
	t.decision = nil
	t.state.Status = stubbornv1.RunStatus_RUN_STATUS_RUNNING
	t.state.StatusReason = ""
	t.emit("", &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_DecisionReceived{
		DecisionReceived: &stubbornv1.DecisionReceived{Decision: d},
	}})
	return nil
}

// Finish sets the final status, result and winner, and emits run_finished.
// Only the first call has an effect.
func (t *Tracker) Finish(status stubbornv1.RunStatus, result *stubbornv1.Result, winner, reason string) *stubbornv1.ControlState {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.state.GetEndTime() != nil {
		return proto.CloneOf(t.state)
	}
	t.touch()
	t.decision = nil
	t.state.Status = status
	t.state.Result = result
	t.state.Winner = winner
	t.state.StatusReason = reason
	t.state.EndTime = proto.CloneOf(t.state.UpdateTime)
	final := proto.CloneOf(t.state)
	t.emit("", &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_RunFinished{
		RunFinished: &stubbornv1.RunFinished{State: final},
	}})
	return proto.CloneOf(final)
}

// attemptError converts a call failure to its wire form.
func attemptError(err error) *stubbornv1.AttemptError {
	var ce *CallError
	if errors.As(err, &ce) {
		ae := &stubbornv1.AttemptError{Code: int32(ce.Code), Message: ce.Message, HttpStatus: int32(ce.HTTPStatus)}
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
	return &stubbornv1.AttemptError{Code: int32(code), Message: err.Error()}
}
