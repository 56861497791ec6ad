package controls

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Outcome is how a control ended.
type Outcome struct {
	// Status is terminal: SUCCEEDED, EXHAUSTED, FAILED or CANCELLED.
	Status stubbornv1.RunStatus
	// Result is the accepted result; set only for SUCCEEDED.
	Result *stubbornv1.Result
	// Winner is the delegate whose result was accepted.
	Winner string
	// Reason says, in words, why the control ended this way.
	Reason string
	// Code says it as a value (ControlState.status_reason_code):
	// UNSPECIFIED for SUCCEEDED, set for every other status.
	Code stubbornv1.StatusReason
}

// Execute runs the control that spec selects over brief, start to end. It
// does not call Tracker.Start or Tracker.Finish: the caller owns the run's
// life.
func Execute(ctx context.Context, env *Env, brief string, spec *stubbornv1.ControlSpec) Outcome {
	if env.Path == "" && (env.Tracker.journal != noJournal || env.Tracker.limited()) {
		// The run's own control, replayed or with a spend limit: a
		// replay that finds the journal took another way
		// (Tracker.divergeLocked), or a spend limit that ends the run
		// (spend.go), stops it through ctx, and the outcome says why. (A
		// run that is neither cannot be stopped so, and pays nothing for
		// it.)
		var stop context.CancelCauseFunc
		ctx, stop = context.WithCancelCause(ctx)
		defer stop(nil)
		if env.Tracker.stopWith(stop) {
			out := execute(ctx, env, brief, spec)
			if nd, ok := errors.AsType[*nondeterminismError](context.Cause(ctx)); ok {
				return failedWith(stubbornv1.StatusReason_STATUS_REASON_NONDETERMINISTIC_REPLAY, nd.Error())
			}
			if sp, ok := spendStopped(ctx); ok {
				return sp
			}
			return out
		}
	}
	return execute(ctx, env, brief, spec)
}

// execute is Execute without the run's stop.
func execute(ctx context.Context, env *Env, brief string, spec *stubbornv1.ControlSpec) Outcome {
	switch k := spec.GetKind().(type) {
	case *stubbornv1.ControlSpec_RetryWithLearning:
		return retryWithLearning(ctx, env, brief, k.RetryWithLearning)
	case *stubbornv1.ControlSpec_FallbackChain:
		return fallbackChain(ctx, env, brief, k.FallbackChain)
	case *stubbornv1.ControlSpec_Race:
		return race(ctx, env, brief, k.Race)
	case *stubbornv1.ControlSpec_Retry:
		return retryControl(ctx, env, brief, k.Retry)
	case *stubbornv1.ControlSpec_Balance:
		return balance(ctx, env, brief, k.Balance)
	}
	return failedWith(stubbornv1.StatusReason_STATUS_REASON_NO_CONTROL, "no control in spec")
}

// stopped is the outcome of a control whose run context ended: the run's
// own deadline fails it, anything else (CancelRun, shutdown) cancels it.
func stopped(ctx context.Context) Outcome {
	if errors.Is(ctxErr(ctx), context.DeadlineExceeded) {
		return failedWith(stubbornv1.StatusReason_STATUS_REASON_RUN_TIMEOUT, "run timeout exceeded")
	}
	reason := "cancelled"
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		reason = "cancelled: " + cause.Error()
	} else if cause != nil && cause != context.Canceled {
		reason = cause.Error()
	}
	return Outcome{Status: stubbornv1.RunStatus_RUN_STATUS_CANCELLED, Reason: reason, Code: stubbornv1.StatusReason_STATUS_REASON_CANCELLED}
}

// ctxErr is ctx's error, made DeadlineExceeded when that is its cause: a
// context derived from one whose deadline passed only says Canceled when
// the deadline reached it through a cancellation (a resumed run's context
// holds its cancellation back while its journal is replayed).
func ctxErr(ctx context.Context) error {
	err := ctx.Err()
	if err != nil && errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
		return context.DeadlineExceeded
	}
	return err
}

// exhausted is the outcome once every allowed attempt failed.
func exhausted(format string, args ...any) Outcome {
	return Outcome{
		Status: stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED, Reason: fmt.Sprintf(format, args...),
		Code: stubbornv1.StatusReason_STATUS_REASON_ALL_FAILED,
	}
}

// ResultString is the reference contracts' String(result): the text, or the
// structured data as JSON when there is no text. A model's answer with
// tool calls (its first choice's, as its text is) reads as the text
// followed, on a line of its own, by the calls as compact JSON,
// [{"name":"get_weather","arguments":{"city":"Paris"}}], the arguments as
// they are when they are JSON, else as a string: what a judge, an analyst
// and a failure's summary read of an answer that is only tool calls.
func ResultString(r *stubbornv1.Result) string {
	if calls := toolCallsJSON(r); calls != "" {
		if r.GetText() == "" {
			return calls
		}
		return r.GetText() + "\n" + calls
	}
	if r.GetText() != "" || r.GetData() == nil {
		return r.GetText()
	}
	b, err := protojson.Marshal(r.GetData())
	if err != nil {
		return ""
	}
	return string(b)
}

// toolCallsJSON is the tool calls of r's first choice as compact JSON
// (ResultString), empty when it has none.
func toolCallsJSON(r *stubbornv1.Result) string {
	var calls []*stubbornv1.ToolCall
	for _, c := range r.GetChoices() {
		if c.GetIndex() == 0 {
			calls = c.GetMessage().GetToolCalls()
			break
		}
	}
	if len(calls) == 0 {
		return ""
	}
	type call struct {
		Name      string `json:"name"`
		Arguments any    `json:"arguments"`
	}
	out := make([]call, len(calls))
	for i, c := range calls {
		out[i] = call{Name: c.GetName(), Arguments: c.GetArguments()}
		var b bytes.Buffer
		if json.Valid([]byte(c.GetArguments())) && json.Compact(&b, []byte(c.GetArguments())) == nil {
			out[i].Arguments = json.RawMessage(b.Bytes())
		}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // read by people and models, not pasted into HTML
	if err := enc.Encode(out); err != nil {
		return ""
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// FirstChars returns the first n characters (not bytes) of s, like the
// reference's String.slice(0, n).
func FirstChars(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := 0
	for pos := range s {
		if i == n {
			return s[:pos]
		}
		i++
	}
	return s
}

// attemptResult is what one delegate call, judged, came to.
type attemptResult struct {
	outcome stubbornv1.AttemptOutcome
	result  *stubbornv1.Result
	err     error  // the call's error, when it failed
	failed  bool   // the call failed or the criteria rejected the result
	reason  string // why, when failed
	summary string // the failure record's summary, when failed
	note    string // extra words for the attempt_finished event
	// calls are what the judges asked about the answer cost.
	calls []*stubbornv1.CallCost
}

// attempt calls a delegate (or runs a preset) once, judges the answer, and
// records the attempt's start and end. slot names the spec field the name
// came from (such as "chain[1]"); a preset's own attempts are recorded under
// it. The answer comes through env (see Env.answer). The caller checks
// ctx.Err() afterwards.
func attempt(ctx context.Context, env *Env, slot, delegate, brief string, waitBefore time.Duration) (int32, attemptResult) {
	if err := env.mayCall(ctx, delegate, brief, 1); err != nil {
		return 0, attemptResult{outcome: stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_CANCELLED, err: err, failed: true, reason: "cancelled", summary: "Error: cancelled"}
	}
	n := env.Tracker.BeginAttempt(env.Path, delegate, brief, waitBefore)
	a := env.answer(ctx, n, slot, delegate, brief)
	endAttempt(env, n, a)
	return n, a
}

// call sends attempt n to a delegate, or runs the preset of that name, and
// judges the answer, without recording the attempt itself.
func call(ctx context.Context, env *Env, n int32, slot, delegate, brief string) attemptResult {
	var (
		res *stubbornv1.Result
		err error
	)
	if _, ok := errors.AsType[*nondeterminismError](context.Cause(ctx)); ok {
		// The run ended at a replay that went another way (Execute): no
		// call is made for it, not even one that would fail at once.
		return judge(ctx, env, n, delegate, nil, ctx.Err())
	}
	if spec, isPreset := env.preset(delegate); isPreset {
		res, err = nested(ctx, env, slot, delegate, brief, spec)
		return judge(ctx, env, n, delegate, res, err)
	}
	// Provisional until judged: by the run's failure criteria, or, for a
	// nested control's attempt, by the attempt that ran its preset.
	c := Call{Delegate: delegate, Brief: brief, Attempt: n, Task: true, Added: env.added}
	c.Output, c.Deltas = env.Tracker.outputOf(n, env.Criteria != nil || env.Path != "")
	if env.Guards == nil {
		res, err = env.Delegates.Call(ctx, c)
		return judge(ctx, env, n, delegate, res, err)
	}
	// Admitted before the call, after the attempt began: a call waiting
	// for a bulkhead's slot or a rate limit has its attempt_started
	// recorded but not yet written (the call writes it), so a server that
	// stops meanwhile leaves no trace of a call that was never sent.
	done, err := env.Guards.Admit(ctx, delegate)
	if err != nil {
		return judge(ctx, env, n, delegate, nil, err)
	}
	answered := false
	defer func() {
		if !answered { // the call panicked: its slot and probe go back, uncounted
			done(nil, errCallPanicked)
		}
	}()
	res, err = env.Delegates.Call(ctx, c)
	answered = true
	note := done(res, err)
	a := judge(ctx, env, n, delegate, res, err)
	if note != "" {
		a.note = strings.TrimPrefix(a.note+"; "+note, "; ")
	}
	return a
}

// judge turns attempt n's answer, a result or an error, into how the
// attempt ended, applying the failure criteria to a result.
func judge(ctx context.Context, env *Env, n int32, delegate string, res *stubbornv1.Result, err error) attemptResult {
	if ctx.Err() != nil {
		return attemptResult{
			outcome: stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_CANCELLED,
			err:     ctxErr(ctx), failed: true, reason: "cancelled", summary: "Error: cancelled",
		}
	}
	if err != nil {
		msg := Cut(Message(err), MaxReasonBytes)
		if refusedBy(err) != stubbornv1.RefusedBy_REFUSED_BY_UNSPECIFIED {
			// Not sent: a guard of the delegate refused it.
			return attemptResult{
				outcome: stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SKIPPED,
				err:     err, failed: true, reason: msg, summary: "Skipped: " + msg,
			}
		}
		return attemptResult{
			outcome: stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_ERROR,
			err:     err, failed: true, reason: msg, summary: "Error: " + msg,
		}
	}
	if res == nil {
		res = &stubbornv1.Result{}
	}
	// Whatever Delegates answered with (the delegates package bounds its
	// own answers already): a run records no data deeper than
	// MaxDataDepth.
	res = BoundResult(res)
	v, jerr := env.check(ctx, n, delegate, res)
	calls := v.Calls
	if ce, ok := errors.AsType[*criteriaError](jerr); ok {
		calls = ce.Calls
	}
	rejected := attemptResult{
		outcome: stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_REJECTED,
		result:  res, failed: true, summary: FirstChars(ResultString(res), 200), calls: calls,
	}
	switch {
	case jerr != nil:
		rejected.reason = Cut(Message(jerr), MaxReasonBytes)
		rejected.note = "failure criteria could not be checked: " + rejected.reason
		return rejected
	case v.Failed:
		rejected.reason, rejected.note = Cut(v.Reason, MaxReasonBytes), Cut(v.Note, MaxReasonBytes)
		return rejected
	}
	return attemptResult{outcome: stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED, result: res, note: Cut(v.Note, MaxReasonBytes), calls: calls}
}

// errCallPanicked is what a guard is told of a call that panicked.
var errCallPanicked = errors.New("the delegate call panicked")

// errInterrupted is the error of an attempt that was in flight when the
// server driving its run stopped.
var errInterrupted = &CallError{
	Code:        codes.Unavailable,
	Message:     "interrupted: the server driving the run stopped during the call",
	Interrupted: true,
}

// nested runs a preset's control as one step of its parent: its attempts
// are recorded with the path parent/slot, and its outcome becomes the step's
// result or error. A preset that does not succeed fails the step with a
// non-transient error, so an enclosing retry does not repeat a whole
// control that already gave up.
func nested(ctx context.Context, env *Env, slot, name, brief string, spec *stubbornv1.ControlSpec) (*stubbornv1.Result, error) {
	child := *env
	child.Path = slot
	if env.Path != "" {
		child.Path = env.Path + "/" + slot
	}
	child.Criteria = nil // a preset's own criteria are not supported yet
	out := Execute(ctx, &child, brief, spec)
	switch out.Status {
	case stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED:
		return out.Result, nil
	case stubbornv1.RunStatus_RUN_STATUS_CANCELLED:
		return nil, ctx.Err()
	}
	msg := fmt.Sprintf("preset %q ended %s: %s", name, strings.TrimPrefix(out.Status.String(), "RUN_STATUS_"), out.Reason)
	return nil, &CallError{Code: codes.Unknown, Message: msg}
}

// preset resolves a preset name.
func (e *Env) preset(name string) (*stubbornv1.ControlSpec, bool) {
	if e.Presets == nil {
		return nil, false
	}
	return e.Presets.Preset(name)
}

// endAttempt records how attempt n ended.
func endAttempt(env *Env, n int32, a attemptResult) {
	pr := attemptPrice{calls: a.calls}
	if d := env.Tracker.delegateOf(n); d != "" {
		if _, isPreset := env.preset(d); !isPreset {
			pr.price = env.Delegates.Info(d).Price
		}
	}
	env.Tracker.endAttempt(n, a.outcome, a.result, a.err, a.note, pr)
}
