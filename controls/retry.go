package controls

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	rpccode "google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/grpc/codes"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Defaults for the retry control's unset RetrySpec fields.
const (
	// DefaultRetryAttempts is the number of retries after the first try.
	DefaultRetryAttempts = 6
	// DefaultRetryBaseWait is the base of the exponential backoff.
	DefaultRetryBaseWait = time.Second
	// DefaultRetryMaxWait is the longest wait before any retry.
	DefaultRetryMaxWait = 60 * time.Second
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

// Retry calls the same delegate again after a full-jitter exponential
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
// The wait before retry n of a round is drawn by [Backoff] from
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
func Retry(ctx context.Context, env *Env, taskBrief string, spec *stubbornv1.RetrySpec) Outcome {
	target := spec.GetTarget()
	retries := DefaultRetryAttempts
	if spec != nil && spec.Attempts != nil {
		retries = max(0, int(spec.GetAttempts()))
	}
	base := durationOr(spec.GetBaseWait().AsDuration(), spec.GetBaseWait() != nil, DefaultRetryBaseWait)
	maxWait := durationOr(spec.GetMaxWait().AsDuration(), spec.GetMaxWait() != nil, DefaultRetryMaxWait)
	decisionTimeout := spec.GetDecisionTimeout().AsDuration() // unset: 0, wait for ever
	ask := spec.GetOnExhausted() != stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL
	info := env.Delegates.Info(target)
	record := func(success bool) {
		if env.Budgets != nil {
			env.Budgets.Record(target, success)
		}
	}

	round, allowed, used := 1, retries, 0 // retries granted and spent in this round
	var waitBefore time.Duration
	for {
		if ctx.Err() != nil {
			return stopped(ctx)
		}
		n, a := attempt(ctx, env, "target", target, taskBrief, waitBefore)
		if ctx.Err() != nil {
			return stopped(ctx)
		}
		// A run resumed from its journal (taken over, or woken from a
		// parked wait) replays what was decided after a recorded attempt,
		// not what would be decided now: the time left and the retry budget
		// have changed since. A replayed attempt was counted in the budget
		// when it was made.
		replayed := env.Tracker.AttemptReplayed(n)
		was, willRetry, decided := env.Tracker.ReplayedFailure(n)
		if !replayed && (a.outcome == stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED ||
			a.outcome == stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_REJECTED) {
			record(true) // the delegate answered: it is not overloaded
		}
		if !a.failed {
			return Outcome{Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, Result: a.result, Winner: target}
		}

		// Why this failure is not retried; empty while a retry may follow.
		rec := &stubbornv1.FailureRecord{
			Attempt: n, Delegate: target, Summary: a.summary, Reason: a.reason, Path: env.Path,
			Source: failureSource(env, n, a),
		}
		var ce *CallError
		errors.As(a.err, &ce)
		var notRetried string // why, in words; empty while a retry may follow
		var code stubbornv1.NotRetried
		if a.outcome == stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_REJECTED {
			notRetried, code = reasonRejected, stubbornv1.NotRetried_NOT_RETRIED_REJECTED
		} else if rec.Transient, notRetried = Transient(ce); notRetried != "" {
			code = notTransientCode(ce)
		}
		if rec.Transient && !replayed {
			record(false)
		}
		switch {
		case notRetried != "": // not transient; ce may be nil
		case !info.Idempotent && !info.ReadOnly && !ce.NotSent:
			notRetried = fmt.Sprintf("delegate %q is neither idempotent nor read_only", target)
			code = stubbornv1.NotRetried_NOT_RETRIED_NOT_IDEMPOTENT
		case ce.HasHint && ce.RetryHint < 0:
			notRetried = fmt.Sprintf("retry hint %v asks not to retry", ce.RetryHint)
			code = stubbornv1.NotRetried_NOT_RETRIED_HINT_NO_RETRY
		case ce.HasHint && ce.RetryHint > maxWait:
			notRetried = fmt.Sprintf("retry hint %v exceeds max_wait %v", ce.RetryHint, maxWait)
			code = stubbornv1.NotRetried_NOT_RETRIED_HINT_OVER_CAP
		}
		roundOver := notRetried == "" && used >= allowed
		if roundOver {
			code = stubbornv1.NotRetried_NOT_RETRIED_EXHAUSTED
			notRetried = fmt.Sprintf("%s (%d of %d)", reasonExhausted, used, allowed)
			if round > 1 {
				notRetried = fmt.Sprintf("%s (%d of %d in round %d)", reasonExhausted, used, allowed, round)
			}
		}

		if decided {
			// What was decided then holds (whether the call was sent, say,
			// is not in the journal).
			notRetried, code = was.GetNotRetriedReason(), was.GetNotRetriedCode()
			roundOver = !willRetry && roundRanOut(was)
		}

		// The wait before the retry: the delegate's hint, else the backoff.
		var wait, bound time.Duration
		var fromHint bool
		if notRetried == "" {
			if fromHint = ce != nil && ce.HasHint; fromHint {
				wait, bound = ce.RetryHint, maxWait
			} else {
				wait, bound = Backoff(env.Rand, used+1, base, maxWait)
			}
			switch {
			case decided: // the journal says what followed
			case endsPastDeadline(ctx, env, wait):
				notRetried, code = reasonDeadline, stubbornv1.NotRetried_NOT_RETRIED_DEADLINE
			case env.Budgets != nil && !env.Budgets.Allow(target):
				notRetried, code = reasonBudget, stubbornv1.NotRetried_NOT_RETRIED_BUDGET
			}
		}

		rec.NotRetriedReason, rec.NotRetriedCode = notRetried, code
		if notRetried == "" {
			env.Tracker.Failure(rec, true, taskBrief)
			if decided && !env.Tracker.BackoffReplayed(env.Tracker.NextAttempt()) && endsPastDeadline(ctx, env, wait) {
				// The journal says a retry follows but not its wait (the
				// run stopped in between): the wait drawn now must end
				// before the deadline, as a live run's would.
				return failedWith(stubbornv1.StatusReason_STATUS_REASON_RETRY_PAST_DEADLINE, reasonDeadline)
			}
		} else {
			env.Tracker.Failure(rec, false, "")
			switch {
			case !roundOver:
				return failedWith(stubbornv1.StatusReason_STATUS_REASON_NOT_RETRIED, notRetried)
			case !ask:
				return failedWith(stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED, reasonExhausted)
			}
			d, timedOut, err := env.Tracker.AwaitDecision(ctx, env.Path, notRetried,
				stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED, decisionTimeout)
			switch {
			case err != nil:
				return stopped(ctx)
			case timedOut:
				return failedWith(stubbornv1.StatusReason_STATUS_REASON_DECISION_TIMEOUT,
					fmt.Sprintf("no decision within %v", decisionTimeout))
			case d != stubbornv1.Decision_DECISION_RETRY:
				return failedWith(stubbornv1.StatusReason_STATUS_REASON_DECISION_FAIL,
					"decision: "+strings.TrimPrefix(d.String(), "DECISION_"))
			}
			// A new round, its backoff starting again from the base.
			round, allowed, used = round+1, max(retries, 1), 0
			wait, bound = Backoff(env.Rand, 1, base, maxWait)
			fromHint = false
			if !env.Tracker.BackoffReplayed(env.Tracker.NextAttempt()) && endsPastDeadline(ctx, env, wait) {
				return failedWith(stubbornv1.StatusReason_STATUS_REASON_RETRY_PAST_DEADLINE, reasonDeadline)
			}
		}

		used++
		wait = env.Tracker.Backoff(env.Path, env.Tracker.NextAttempt(), wait, bound, fromHint)
		if env.Tracker.WaitBackoff(ctx, env.clock()) != nil || ctx.Err() != nil {
			return stopped(ctx)
		}
		waitBefore = wait
	}
}

// Transient reports whether a retry may fix a failed call, and when not,
// why, as a FailureRecord.not_retried_reason. In order:
//   - nil (the error was not a *CallError) is not transient;
//   - a call Stubborn's own middleware refused never is;
//   - an upstream HTTP status of 408, 425, 429 or 5xx is, whatever the code;
//   - any other 4xx is not, whatever the code;
//   - otherwise the gRPC code decides: UNAVAILABLE, DEADLINE_EXCEEDED (of
//     the attempt: the run's own end never reaches here), RESOURCE_EXHAUSTED
//     and ABORTED are transient, every other code is not.
func Transient(ce *CallError) (bool, string) {
	switch {
	case ce == nil:
		return false, "not transient: not a classified delegate error"
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

// endsPastDeadline reports whether a wait starting now ends at or after the
// run's deadline, leaving no time for the attempt that follows it.
func endsPastDeadline(ctx context.Context, env *Env, wait time.Duration) bool {
	dl, ok := ctx.Deadline()
	return ok && wait >= dl.Sub(env.clock().Now())
}

// failedWith is the outcome of a run that ends without a result for reason,
// whose value is code.
func failedWith(code stubbornv1.StatusReason, reason string) Outcome {
	return Outcome{Status: stubbornv1.RunStatus_RUN_STATUS_FAILED, Reason: reason, Code: code}
}
