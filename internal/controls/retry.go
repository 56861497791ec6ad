package controls

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	rpccode "google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/grpc/codes"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Defaults for the retry control's unset RetrySpec fields.
const (
	// defaultRetryAttempts is the number of retries after the first try.
	defaultRetryAttempts = 6
	// defaultRetryBaseWait is the base of the exponential backoff.
	defaultRetryBaseWait = time.Second
	// defaultRetryMaxWait is the longest wait before any retry.
	defaultRetryMaxWait = 60 * time.Second
)

// Reasons a failure is not retried that are not built from the failure.
const (
	reasonRejected = "not transient: the failure criteria rejected the result (only errors are retried)"
	reasonDeadline = "retry would end after the run's deadline"
	reasonBudget   = "retry budget exhausted"
	// reasonExhausted starts the reason of every retry that the round's
	// allowance stops.
	reasonExhausted = "retries exhausted"
)

// retryControl calls the same delegate again after a full-jitter exponential
// backoff, for transient failures only (spec/retry-backoff.md). Every
// attempt gets the original brief.
//
// A failed attempt is retried only when all of these hold, checked in this
// order; the first that fails is the record's not_retried_reason, and its
// not_retried_code the value of it (NOT_TRANSIENT, REFUSED or REJECTED,
// NOT_IDEMPOTENT, HINT_NO_RETRY, HINT_OVER_CAP, EXHAUSTED, DEADLINE, BUDGET):
//   - the failure is transient (see [Transient]). A result the criteria
//     reject is not: the retry contract retries raised errors only;
//   - the delegate is declared idempotent or read_only, or the call never
//     reached it (CallError.NotSent);
//   - a server hint, if any, is neither negative ("do not retry") nor
//     longer than max_wait;
//   - the round still has retries left (see below);
//   - the wait ends before the run's deadline (ctx's deadline, compared
//     with env's clock): a wait ending at or after it leaves no time for
//     the attempt;
//   - the retry budget, if env.Budgets is set, allows it.
//
// The wait before retry n of a round is drawn by backoff from
// [0, min(max_wait, base·2^(n-1))]; a server hint replaces it, and its
// backoff_scheduled event then has from_hint set and bound = max_wait (the
// only bound a hint obeys). The backoff event is emitted before every wait,
// and the wait slept is the wait announced.
//
// A failure that is not retried for any reason but the round running out
// ends the run FAILED with that reason (code NOT_RETRIED), without asking
// anyone. When the round runs out (attempts retries after the first try),
// on_exhausted FAIL ends the run FAILED "retries exhausted"
// (RETRIES_EXHAUSTED); ASK (the default) waits for a decision, with the same
// code. FAIL ends the run FAILED "decision: FAIL" (DECISION_FAIL); no
// decision within decision_timeout ends it FAILED "no decision within
// <timeout>" (DECISION_TIMEOUT). RETRY grants a new round of attempts
// retries (at least one, so that a person's RETRY always leads to a call)
// whose backoff starts again from the base: the first retry waits a backoff
// drawn from [0, min(max_wait, base)] like any first retry, so the delegate
// gets the same spacing whether or not a person was asked. That retry still
// respects the run's deadline but not the retry budget: a person asked for
// it explicitly. A retry that is to follow (recorded before a takeover, or
// granted by RETRY) but whose wait would end after the run's deadline ends
// the run FAILED (RETRY_PAST_DEADLINE).
//
// The run's context ending, during an attempt, a wait or the decision,
// ends the control at once with [stopped]'s outcome, never with a retry.
func retryControl(ctx context.Context, env *Env, taskBrief string, spec *stubbornv1.RetrySpec) Outcome {
	r := newRetry(env, taskBrief, spec)
	for round := 1; ; round++ {
		out, spent := r.run(ctx, env, round)
		if spent == "" {
			return out
		}
		if !r.ask {
			return failedWith(stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED, reasonExhausted)
		}
		d, timedOut, err := env.Tracker.AwaitDecision(ctx, env.Path, spent,
			stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED, r.decisionTimeout)
		switch {
		case err != nil:
			return stopped(ctx)
		case timedOut:
			return failedWith(stubbornv1.StatusReason_STATUS_REASON_DECISION_TIMEOUT,
				fmt.Sprintf("no decision within %v", r.decisionTimeout))
		case d != stubbornv1.Decision_DECISION_RETRY:
			return failedWith(stubbornv1.StatusReason_STATUS_REASON_DECISION_FAIL,
				"decision: "+strings.TrimPrefix(d.String(), "DECISION_"))
		}
	}
}

// retry is one run of the retry control: its spec, read once. (Its Env
// is passed beside it, so that escape analysis keeps both on the stack.)
type retry struct {
	target, brief                  string
	info                           DelegateInfo
	retries                        int // per round: attempts, at least 1 after a RETRY
	base, maxWait, decisionTimeout time.Duration
	ask                            bool // on_exhausted ASK
	// retryOn is what counts as transient (the run's retry_on, else the
	// delegate's); nil means Transient's rules.
	retryOn *stubbornv1.RetryOn
}

func newRetry(env *Env, taskBrief string, spec *stubbornv1.RetrySpec) retry {
	r := retry{
		target: spec.GetTarget(), brief: taskBrief, info: env.Delegates.Info(spec.GetTarget()),
		retries:         defaultRetryAttempts,
		base:            durationOr(spec.GetBaseWait().AsDuration(), spec.GetBaseWait() != nil, defaultRetryBaseWait),
		maxWait:         durationOr(spec.GetMaxWait().AsDuration(), spec.GetMaxWait() != nil, defaultRetryMaxWait),
		decisionTimeout: spec.GetDecisionTimeout().AsDuration(), // unset: 0, wait for ever
		ask:             spec.GetOnExhausted() != stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL && !env.NeverAsk,
	}
	r.retryOn = spec.GetRetryOn()
	if r.retryOn == nil {
		r.retryOn = r.info.RetryOn
	}
	if spec != nil && spec.Attempts != nil {
		r.retries = max(0, int(spec.GetAttempts()))
	}
	return r
}

// run is one round, the retry contract's run(retries, fun, transient,
// announce): it calls the target, and while a failure is to be retried
// (see retryControl) it announces the wait, waits, and calls again. It returns
// how the run ends, or, when the round's retries ran out, spent: why, in
// words. A round after the first starts with a retry, its backoff drawn
// from the base again.
func (r *retry) run(ctx context.Context, env *Env, round int) (out Outcome, spent string) {
	allowed, used := r.retries, 0 // retries granted and spent in this round
	var w retryWait
	if round > 1 {
		allowed = max(r.retries, 1)
		w.wait, w.bound = backoff(env.Rand, 1, r.base, r.maxWait)
		w.pastDeadline = env.endsPastDeadline(ctx, w.wait)
	}
	for again := round > 1; ; again = true {
		var waitBefore time.Duration
		if again {
			if w.pastDeadline {
				// A retry that is to follow (recorded before the run
				// changed hands, or granted by RETRY) must still end its
				// wait before the deadline.
				return failedWith(stubbornv1.StatusReason_STATUS_REASON_RETRY_PAST_DEADLINE, reasonDeadline), ""
			}
			used++
			var err error
			if waitBefore, err = env.backoff(ctx, w.wait, w.bound, w.fromHint); err != nil {
				return stopped(ctx), ""
			}
		}
		if ctx.Err() != nil {
			return stopped(ctx), ""
		}
		n, a := attempt(ctx, env, "target", r.target, r.brief, waitBefore)
		if ctx.Err() != nil {
			return stopped(ctx), ""
		}
		if a.outcome == stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED || a.outcome == stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_REJECTED {
			env.count(n, r.target, true) // the delegate answered: it is not overloaded
		}
		if !a.failed {
			return Outcome{Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, Result: a.result, Winner: r.target}, ""
		}
		v := r.verdict(ctx, env, n, a, used, allowed, round)
		if why := v.rec.GetNotRetriedReason(); why != "" {
			env.Tracker.Failure(v.rec, false, "")
			if !v.willRetry && roundRanOut(v.rec) {
				return Outcome{}, why
			}
			return failedWith(stubbornv1.StatusReason_STATUS_REASON_NOT_RETRIED, why), ""
		}
		env.Tracker.Failure(v.rec, true, r.brief)
		w = v.wait
	}
}

// verdict is what the retry contract decides about a failed attempt:
// "retry after wait", or "not retried: why" (the record's
// not_retried_reason and code).
type verdict struct {
	rec       *stubbornv1.FailureRecord
	wait      retryWait // the wait before the retry, when there is one
	willRetry bool      // as recorded, for a verdict the journal holds
}

// verdict is the contract's transient?(answer) and run's choice for
// attempt n's failure, in one place: the journal's verdict when it holds
// one (Env.analysed); else, in order, whether the failure is one a retry
// may fix and the delegate may be called again, what the delegate asked
// (a hint), what is left of the round (transient), then whether the wait
// ends before the run's deadline and the retry budget allows it.
func (r *retry) verdict(ctx context.Context, env *Env, n int32, a attemptResult, used, allowed, round int) verdict {
	rec, w := r.transient(ctx, env, n, a, used, allowed, round)
	rec, willRetry := env.analysed(rec, func(rec *stubbornv1.FailureRecord) bool {
		switch {
		case rec.NotRetriedReason != "":
		case w.pastDeadline:
			rec.NotRetriedReason, rec.NotRetriedCode = reasonDeadline, stubbornv1.NotRetried_NOT_RETRIED_DEADLINE
		case !env.allowRetry(r.target):
			rec.NotRetriedReason, rec.NotRetriedCode = reasonBudget, stubbornv1.NotRetried_NOT_RETRIED_BUDGET
		}
		return rec.NotRetriedReason == ""
	})
	return verdict{rec: rec, wait: w, willRetry: willRetry}
}

// retryWait is the wait before a retry: the delegate's hint, else the
// backoff, and whether it ends past the run's deadline.
type retryWait struct {
	wait, bound            time.Duration
	fromHint, pastDeadline bool
}

// transient is the contract's transient(answer): the failure record of
// attempt n, whose not_retried_reason says why the failure is not retried
// (see retryControl, up to the round's retries running out), and, when it may
// be, the wait before the retry. The deadline and the retry budget have
// the last word (see Env.analysed).
func (r *retry) transient(ctx context.Context, env *Env, n int32, a attemptResult, used, allowed, round int) (*stubbornv1.FailureRecord, retryWait) {
	rec := &stubbornv1.FailureRecord{
		Attempt: n, Delegate: r.target, Summary: a.summary, Reason: a.reason, Path: env.Path,
		Source: failureSource(env, n, a),
	}
	var ce *CallError
	errors.As(a.err, &ce)
	if a.outcome == stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_REJECTED {
		rec.NotRetriedReason, rec.NotRetriedCode = reasonRejected, stubbornv1.NotRetried_NOT_RETRIED_REJECTED
	} else if rec.Transient, rec.NotRetriedReason = TransientOn(ce, r.retryOn); rec.NotRetriedReason != "" {
		rec.NotRetriedCode = notTransientCode(ce)
	}
	if rec.Transient {
		env.count(n, r.target, false)
	}
	switch {
	case rec.NotRetriedReason != "": // not transient; ce may be nil
	case !r.info.Idempotent && !r.info.ReadOnly && !ce.NotSent:
		rec.NotRetriedReason = fmt.Sprintf("delegate %q is neither idempotent nor read_only", r.target)
		rec.NotRetriedCode = stubbornv1.NotRetried_NOT_RETRIED_NOT_IDEMPOTENT
	case ce.HasHint && ce.RetryHint < 0:
		rec.NotRetriedReason = fmt.Sprintf("retry hint %v asks not to retry", ce.RetryHint)
		rec.NotRetriedCode = stubbornv1.NotRetried_NOT_RETRIED_HINT_NO_RETRY
	case ce.HasHint && ce.RetryHint > r.maxWait:
		rec.NotRetriedReason = fmt.Sprintf("retry hint %v exceeds max_wait %v", ce.RetryHint, r.maxWait)
		rec.NotRetriedCode = stubbornv1.NotRetried_NOT_RETRIED_HINT_OVER_CAP
	case used >= allowed:
		rec.NotRetriedReason = fmt.Sprintf("%s (%d of %d)", reasonExhausted, used, allowed)
		if round > 1 {
			rec.NotRetriedReason = fmt.Sprintf("%s (%d of %d in round %d)", reasonExhausted, used, allowed, round)
		}
		rec.NotRetriedCode = stubbornv1.NotRetried_NOT_RETRIED_EXHAUSTED
	default:
		var w retryWait
		if w.fromHint = ce.HasHint; w.fromHint {
			w.wait, w.bound = ce.RetryHint, r.maxWait
		} else {
			w.wait, w.bound = backoff(env.Rand, used+1, r.base, r.maxWait)
		}
		w.pastDeadline = env.endsPastDeadline(ctx, w.wait)
		return rec, w
	}
	return rec, retryWait{}
}

// Transient reports whether a retry may fix a failed call, and when not,
// why, as a FailureRecord.not_retried_reason. In order:
//   - nil (the error was not a *CallError) is not transient;
//   - a call Stubborn's own middleware refused never is (one a delegate's
//     guard refused says which guard, and why);
//   - an upstream HTTP status of 408, 425, 429 or 5xx is, whatever the code;
//   - any other 4xx is not, whatever the code;
//   - otherwise the gRPC code decides: UNAVAILABLE, DEADLINE_EXCEEDED (of
//     the attempt: the run's own end never reaches here), RESOURCE_EXHAUSTED
//     and ABORTED are transient, every other code is not.
func Transient(ce *CallError) (bool, string) {
	switch {
	case ce == nil:
		return false, "not transient: not a classified delegate error"
	case ce.Refused && ce.RefusedBy != stubbornv1.RefusedBy_REFUSED_BY_UNSPECIFIED:
		return false, "not sent: " + ce.Message
	case ce.Refused:
		return false, "not transient: refused by Stubborn's own middleware"
	case ce.HTTPStatus == 408 || ce.HTTPStatus == 425 || ce.HTTPStatus == 429 ||
		ce.HTTPStatus >= 500 && ce.HTTPStatus <= 599:
		return true, ""
	case ce.HTTPStatus >= 400 && ce.HTTPStatus <= 499:
		return false, fmt.Sprintf("not transient: HTTP %d", ce.HTTPStatus)
	}
	switch ce.Code {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted:
		return true, ""
	}
	return false, "not transient: " + codeName(ce.Code)
}

// TransientOn is Transient with the failures on lists as transient in
// place of its rules, when on is set (RetrySpec.retry_on, a delegate's
// retry_on): a failure with an upstream HTTP status is judged by
// on.http_statuses alone, any other by on.grpc_codes. A call Stubborn
// refused never is.
func TransientOn(ce *CallError, on *stubbornv1.RetryOn) (bool, string) {
	if on == nil || ce == nil || ce.Refused {
		return Transient(ce)
	}
	if ce.HTTPStatus != 0 {
		if slices.Contains(on.GetHttpStatuses(), int32(ce.HTTPStatus)) {
			return true, ""
		}
		return false, fmt.Sprintf("not transient: HTTP %d is not in retry_on.http_statuses", ce.HTTPStatus)
	}
	name := codeName(ce.Code)
	for _, c := range on.GetGrpcCodes() {
		if strings.EqualFold(c, name) {
			return true, ""
		}
	}
	return false, "not transient: " + name + " is not in retry_on.grpc_codes"
}

// notTransientCode is the NotRetried value of a failure that [Transient]
// says a retry may not fix: the reason it gives, as a value.
func notTransientCode(ce *CallError) stubbornv1.NotRetried {
	if ce != nil && ce.Refused {
		return stubbornv1.NotRetried_NOT_RETRIED_REFUSED
	}
	return stubbornv1.NotRetried_NOT_RETRIED_NOT_TRANSIENT
}

// roundRanOut reports whether a recorded failure was not retried because
// its round's retries ran out. A record made by a release before
// not_retried_code has only the words, which then decide.
func roundRanOut(rec *stubbornv1.FailureRecord) bool {
	if c := rec.GetNotRetriedCode(); c != stubbornv1.NotRetried_NOT_RETRIED_UNSPECIFIED {
		return c == stubbornv1.NotRetried_NOT_RETRIED_EXHAUSTED
	}
	return strings.HasPrefix(rec.GetNotRetriedReason(), reasonExhausted)
}

// codeName is a gRPC code's canonical name (google.rpc.Code), such as
// UNAVAILABLE; codes.Code.String() spells it in Go's camel case instead.
func codeName(c codes.Code) string {
	if n, ok := rpccode.Code_name[int32(c)]; ok {
		return n
	}
	return fmt.Sprintf("CODE_%d", uint32(c))
}

// durationOr returns d when set (negative counts as zero), else def.
func durationOr(d time.Duration, set bool, def time.Duration) time.Duration {
	if !set {
		return def
	}
	return max(d, 0)
}

// failedWith is the outcome of a run that ends without a result for reason,
// whose value is code.
func failedWith(code stubbornv1.StatusReason, reason string) Outcome {
	return Outcome{Status: stubbornv1.RunStatus_RUN_STATUS_FAILED, Reason: reason, Code: code}
}
