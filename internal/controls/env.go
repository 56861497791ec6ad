package controls

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Call is one delegate call a control asks for.
type Call struct {
	// Delegate is the registry name of the delegate.
	Delegate string
	// Brief is the brief exactly as it must be sent.
	Brief string
	// Attempt is the run-wide attempt number, starting at 1.
	Attempt int32

	// The fields below are the run's, the same for each of its calls: the
	// run engine (runs) sets them on every call its controls make; a
	// control leaves them zero.

	// RunID is sent as ExecuteRequest.run_id and the stubborn-run-id header.
	RunID string
	// IdempotencyKey is sent as ExecuteRequest.idempotency_key and the
	// stubborn-idempotency-key header.
	IdempotencyKey string
	// Metadata is sent as ExecuteRequest.metadata (not as gRPC headers).
	// Read only.
	Metadata map[string]string
	// AttemptTimeout, when positive, replaces the delegate's configured
	// timeout of each attempt. The run's own deadline still applies.
	AttemptTimeout time.Duration
	// FirstOutputTimeout and IdleTimeout, when positive, replace the
	// delegate's configured stall timeouts of a streamed attempt: how long
	// it may go without its first output, and between two outputs.
	FirstOutputTimeout, IdleTimeout time.Duration

	// TaskBrief, Messages and ModelParams are the run's task: its brief
	// as the run was asked it (Brief may be enriched), and, for a
	// conversation, its messages and model parameters (read only), as
	// runs journaled before the typed conversation have them.
	TaskBrief   string
	Messages    []*structpb.Struct
	ModelParams *structpb.Struct
	// Conversation is the run's typed conversation (read only), when the
	// run was asked one: a run has it or Messages and ModelParams, never
	// both.
	Conversation *stubbornv1.Conversation

	// Added is what the control added to the run's brief to make Brief
	// (retry-with-learning's failure history), set by the control that
	// makes the call: Brief is TaskBrief followed by Added. A model
	// delegate adds it to the conversation (to its last user message, or
	// as a user message of its own after tool results).
	Added string

	// Task says the call is an attempt at the run's task (set by the
	// control that makes it), not a judge's or an analyst's call about
	// one: only such a call gets the run's Messages and ModelParams.
	Task bool

	// Output, when set, is given the attempt's text as a delegate that
	// streams makes it, piece by piece, in order, never two at once, and
	// only while Call runs (so a piece never follows the call's answer).
	// A control sets it (call); Delegates call it. Nil means nobody
	// watches the output. For a model's answer, the text is its first
	// choice's text only (Result.text); Deltas carries the rest.
	Output func(text string)
	// Deltas, when set, is given what a model streams besides its first
	// choice's text: the text of its other choices and every tool call's
	// fragments (id and name with the first, then pieces of arguments),
	// with Output's rules: in order, never at once with each other or
	// with Output, only while Call runs. Set and nil with Output. A delta
	// of choice 0's text is taken as text given to Output: a layer that
	// gathers pieces (the run engine's coalescing) hands text and deltas
	// over in one call, and they become one attempt_output event.
	Deltas func(ds []*stubbornv1.OutputDelta)
}

// RunCall returns a Call with the run's fields of st set: RunID,
// IdempotencyKey, Metadata and AttemptTimeout.
func RunCall(st *stubbornv1.ControlState) Call {
	o := st.GetOptions()
	return Call{
		RunID: st.GetRunId(), IdempotencyKey: o.GetIdempotencyKey(),
		Metadata: o.GetMetadata(), AttemptTimeout: o.GetAttemptTimeout().AsDuration(),
		FirstOutputTimeout: o.GetFirstOutputTimeout().AsDuration(), IdleTimeout: o.GetIdleTimeout().AsDuration(),
		TaskBrief: st.GetTaskBrief(), Messages: st.GetTaskMessages(), ModelParams: st.GetModelParams(),
		Conversation: st.GetConversation(),
	}
}

// WithRun sets the run's fields of run (RunCall) on c.
func (c Call) WithRun(run Call) Call {
	c.RunID, c.IdempotencyKey, c.Metadata, c.AttemptTimeout = run.RunID, run.IdempotencyKey, run.Metadata, run.AttemptTimeout
	c.FirstOutputTimeout, c.IdleTimeout = run.FirstOutputTimeout, run.IdleTimeout
	c.TaskBrief, c.Messages, c.ModelParams, c.Conversation = run.TaskBrief, run.Messages, run.ModelParams, run.Conversation
	return c
}

// ForRun returns d with the run's fields of st (RunCall) set on every
// call: for what calls delegates outside a control's Env, as a run's
// judge does.
func ForRun(d Delegates, st *stubbornv1.ControlState) Delegates {
	return runCalls{d, RunCall(st)}
}

type runCalls struct {
	Delegates
	run Call
}

func (r runCalls) Call(ctx context.Context, c Call) (*stubbornv1.Result, error) {
	return r.Delegates.Call(ctx, c.WithRun(r.run))
}

// Delegates is how a control reaches delegates.
type Delegates interface {
	// Call sends one attempt. A failure is returned as a *CallError, or as the
	// context's error when ctx ended.
	Call(ctx context.Context, c Call) (*stubbornv1.Result, error)
	// Info describes a delegate from the registry.
	Info(name string) DelegateInfo
	// Serving reports whether the delegate's health check says it serves.
	// Implementations answer true when they cannot tell.
	Serving(ctx context.Context, name string) bool
}

// DelegateInfo is what the registry declares about a delegate.
type DelegateInfo struct {
	// Idempotent says a repeated call has no further side effect.
	Idempotent bool
	// ReadOnly says a call has no side effect at all.
	ReadOnly bool
	// RetryOn, when set, is what counts as transient for retries of the
	// delegate (the registry's retry_on), in place of Transient's rules;
	// a run's RetrySpec.retry_on overrides it.
	RetryOn *stubbornv1.RetryOn
	// Price, when set, prices the delegate's calls (cost.go); nil means
	// they cost nothing.
	Price *stubbornv1.Price
}

// CallError is a failed delegate call, already classified by the delegates
// layer.
type CallError struct {
	// Code is the gRPC status code of the failure.
	Code codes.Code
	// Message is the status message.
	Message string
	// HTTPStatus is the upstream HTTP status the delegate attached, or 0.
	HTTPStatus int
	// RetryHint is the wait the delegate asked for; valid when HasHint.
	RetryHint time.Duration
	// HasHint says the delegate sent a RetryInfo or a pushback.
	HasHint bool
	// NotSent says the call provably never reached the delegate (for
	// example, connection refused), so retrying it is safe whatever the
	// delegate's idempotency.
	NotSent bool
	// Refused says Stubborn's own middleware refused the call; it is never
	// retried.
	Refused bool
	// RefusedBy names the delegate's guard that refused it (a circuit
	// breaker, a bulkhead, a rate limit): the call was not sent, and the
	// attempt is recorded as SKIPPED. Refused is set too.
	RefusedBy stubbornv1.RefusedBy
	// Interrupted says the call was in flight when the server driving the
	// run stopped: the delegate may or may not have done it, so it is
	// called again only if it is idempotent or read_only.
	Interrupted bool
}

// refusedBy returns which guard of the delegate refused the call err is
// about, or UNSPECIFIED when err is no guard's refusal.
func refusedBy(err error) stubbornv1.RefusedBy {
	if ce, ok := errors.AsType[*CallError](err); ok {
		return ce.RefusedBy
	}
	return stubbornv1.RefusedBy_REFUSED_BY_UNSPECIFIED
}

func (e *CallError) Error() string {
	if e.Message == "" {
		return e.Code.String()
	}
	return e.Message
}

// Message returns the text the reference contracts call e.message: the
// status message of a *CallError, or err.Error() otherwise.
func Message(err error) string {
	var ce *CallError
	if errors.As(err, &ce) {
		return ce.Message
	}
	return err.Error()
}

// Guards admit calls to delegates: the delegates' circuit breakers,
// bulkheads and rate limits, shared by every run of a server.
type Guards interface {
	// Admit asks to send one call to delegate, waiting within the
	// delegate's bound if it must (a bulkhead's slot, a rate limit). It
	// returns a *CallError with RefusedBy set when the call may not go, or
	// ctx's error when ctx ended first. When the call may go, done must be
	// called once with its answer; it returns words for the attempt's note
	// when the answer changed the guard's state (it opened a circuit
	// breaker, say), else "".
	Admit(ctx context.Context, delegate string) (done func(res *stubbornv1.Result, err error) string, err error)
}

// Standing is how a delegate stands as of now, as a balance control
// weighs it (Standings).
type Standing struct {
	// Open says its circuit breaker refuses calls now (open, not yet
	// half-open).
	Open bool
	// InFlight is how many calls to it this server has in flight.
	InFlight int
	// Latency is its recent latency on this server (time to first output
	// for a stream); 0 when not measured yet.
	Latency time.Duration
	// Room is the share of its tightest rate limit left within the
	// minute: 1 with no rate limit, 0 when spent.
	Room float64
}

// Standings tell how delegates stand: what a balance control picks by.
// Env's Guards (else its Delegates) offer it when they have it; without
// it every delegate stands alike (Standing{Room: 1}).
type Standings interface {
	// Standing returns the named delegate's standing now. It must not
	// block, and is read-only.
	Standing(delegate string) Standing
}

// Presets resolves names that stand for a whole control rather than a
// delegate, so that controls nest.
type Presets interface {
	// Preset returns the control a name stands for, if it is a preset.
	Preset(name string) (*stubbornv1.ControlSpec, bool)
}

// Verdict is what failure criteria decided about a result.
type Verdict struct {
	// Failed says the result counts as a failure.
	Failed bool
	// Reason says why, when Failed.
	Reason string
	// Note carries extra words for the event, such as a judge's unreadable
	// answer that was accepted (fail open).
	Note string
	// Calls are what the delegate calls made to judge cost (a judge's).
	Calls []*stubbornv1.CallCost
}

// Criteria judges a delegate's result. A nil Criteria accepts every result.
type Criteria interface {
	// Check judges r. An error means the judging itself failed; the attempt
	// then fails with that error as its reason.
	Check(ctx context.Context, attempt int32, delegate string, r *stubbornv1.Result) (Verdict, error)
}

// Clock tells time and waits. Tests use a fake one.
//
// A run's tracker makes its waits, a backoff's and a decision's, as
// sleeps whose context says what is awaited (WaitOf). Those of the run's
// own control (Wait.Path "") are made on the goroutine that called
// Execute, while nothing else of the run is in flight: the engine driving
// the run may end that goroutine there (runtime.Goexit) instead of
// sleeping, to hold nothing while the run waits, and drive the run again
// from its journal when the wait is over (a new tracker replays the
// journal up to the same wait, and goes on from there). Execute then never
// returns; the controls' deferred functions run and record nothing, and
// the tracker keeps awaiting a decision it was asked for: Decide records
// it for the replay to take.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// Sleep waits for d, or returns ctx.Err() as soon as ctx is done. A
	// sleep of Forever or more ends only with ctx.
	Sleep(ctx context.Context, d time.Duration) error
}

// Forever is how long a run's control sleeps for a decision that has no
// timeout: a Clock's sleep of Forever or more ends only with its context.
const Forever = time.Duration(1<<63 - 1)

// Wait is what a run waits for in a Clock's Sleep: the end of the backoff
// its control at Path announced (Until), or a decision it asked for there
// (Decision; Until is when the wait times out, zero for never).
type Wait struct {
	Path     string
	Until    time.Time
	Decision bool
}

type waitKey struct{}

// withWait is ctx for a Sleep that waits for w.
func withWait(ctx context.Context, w Wait) context.Context {
	return context.WithValue(ctx, waitKey{}, w)
}

// WaitOf returns what a Sleep whose context is ctx waits for, when a run's
// tracker makes it: a backoff's or a decision's wait, at any path. A
// hedged race's delay has none.
func WaitOf(ctx context.Context) (Wait, bool) {
	w, ok := ctx.Value(waitKey{}).(Wait)
	return w, ok
}

// RealClock is the wall clock.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// Sleep waits for d or until ctx is done, with one timer and no goroutine.
func (RealClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Env is everything a control needs from outside.
type Env struct {
	// Delegates reaches delegates by name. Required.
	Delegates Delegates
	// Tracker keeps the run's state and emits its events. Required.
	Tracker *Tracker
	// Clock defaults to RealClock.
	Clock Clock
	// Rand draws backoff jitter. Nil means a randomly seeded source.
	Rand *rand.Rand
	// Criteria judges results. Nil means only errors are failures.
	Criteria Criteria
	// Path says where this control sits when controls are nested through
	// presets (for example "chain[0]"). Empty for the run's own control.
	Path string
	// Presets resolves preset names. Nil means there are none.
	Presets Presets
	// Budgets throttles the retry control's retries per delegate. Nil (the
	// default) means no retry budget.
	Budgets Budgets
	// Guards admit each live call to a delegate (circuit breakers,
	// bulkheads, rate limits). Nil means every call goes.
	Guards Guards
	// added is what enclosing controls added to the run's brief to make
	// the brief this control's attempts start from (a retry-with-
	// learning's history, for the preset it retries): a task call's Added
	// starts with it. Empty for the run's own control.
	added string
	// NeverAsk makes every retry control of the run, nested ones too,
	// fail when its retries run out instead of asking a person
	// (RunOptions.never_ask).
	NeverAsk bool
}

// adding returns e, or a copy of it whose calls add more to the run's
// brief (Env.added).
func (e *Env) adding(more string) *Env {
	if more == "" {
		return e
	}
	c := *e
	c.added += more
	return &c
}

func (e *Env) clock() Clock {
	if e.Clock == nil {
		return RealClock{}
	}
	return e.Clock
}

// check applies the criteria to a result.
func (e *Env) check(ctx context.Context, attempt int32, delegate string, r *stubbornv1.Result) (Verdict, error) {
	if e.Criteria == nil {
		return Verdict{}, nil
	}
	return e.Criteria.Check(ctx, attempt, delegate, r)
}
