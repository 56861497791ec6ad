package controls

import (
	"context"
	"fmt"
	"strings"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// defaultMaxRetries is retry-with-learning's total number of attempts when
// max_retries is unset.
const defaultMaxRetries = 3

// retryWithLearning retries the same delegate, each retry's brief carrying
// the whole failure history (spec/retry-with-learning.md).
//
// max_retries is the total number of attempts. Attempt 1 gets the original
// brief; every later attempt gets EnrichBrief(brief, failures so far). Any
// error from the delegate, and any result the criteria reject, is a failure
// and is retried. The first accepted result wins. When attempts run out the
// outcome is EXHAUSTED with no result; the last result stays in the attempt
// log.
//
// With an analyst, each failure that another attempt follows is sent to the
// analyst (analystBrief) and its advice joins the failure's record, and so
// every later brief. Without one, briefs are exactly the reference format.
func retryWithLearning(ctx context.Context, env *Env, taskBrief string, spec *stubbornv1.RetryWithLearningSpec) Outcome {
	maxRetries := defaultMaxRetries
	if spec.MaxRetries != nil {
		maxRetries = int(spec.GetMaxRetries())
	}
	target := spec.GetTarget()
	var failures []*stubbornv1.FailureRecord

	brief, added := taskBrief, "" // brief is taskBrief followed by added
	for i := 0; i < maxRetries; i++ {
		if ctx.Err() != nil {
			return stopped(ctx)
		}
		n, a := attempt(ctx, env.adding(added), "target", target, brief, 0)
		if ctx.Err() != nil {
			return stopped(ctx)
		}
		if !a.failed {
			return Outcome{Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, Result: a.result, Winner: target}
		}
		rec := &stubbornv1.FailureRecord{
			Attempt: n, Delegate: target, Summary: a.summary, Reason: a.reason, Path: env.Path,
			Source: failureSource(env, n, a),
		}
		willRetry := i+1 < maxRetries
		if refusedBy(a.err) != stubbornv1.RefusedBy_REFUSED_BY_UNSPECIFIED {
			// A guard of the delegate refused the call (its circuit
			// breaker is open, say): no failure of the delegate to learn
			// from, and asking again at once would be refused again.
			rec.NotRetriedReason = "not retried: " + a.reason
			rec.NotRetriedCode = stubbornv1.NotRetried_NOT_RETRIED_REFUSED
			env.Tracker.Failure(rec, false, "")
			return failedWith(stubbornv1.StatusReason_STATUS_REASON_NOT_RETRIED, rec.NotRetriedReason)
		}
		if a.outcome == stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_INTERRUPTED && willRetry {
			// The delegate may have done the interrupted attempt: only an
			// idempotent or read-only one may be asked again. The outcome
			// says so both when this server finds the attempt in flight
			// and when the journal has its end (a run taken over again):
			// the CallError of a recorded end is not marked Interrupted.
			if info := env.Delegates.Info(target); !info.Idempotent && !info.ReadOnly {
				rec.NotRetriedReason = fmt.Sprintf("attempt %d was interrupted and delegate %q is neither idempotent nor read_only", n, target)
				rec.NotRetriedCode = stubbornv1.NotRetried_NOT_RETRIED_INTERRUPTED_NOT_IDEMPOTENT
				env.Tracker.Failure(rec, false, "")
				return failedWith(stubbornv1.StatusReason_STATUS_REASON_NOT_RETRIED, rec.NotRetriedReason)
			}
		}
		if willRetry && spec.GetAnalyst() != "" {
			rec, _ = env.analysed(rec, func(rec *stubbornv1.FailureRecord) bool {
				analyse(ctx, env, spec.GetAnalyst(), taskBrief, rec)
				return willRetry
			})
			if ctx.Err() != nil {
				env.Tracker.Failure(rec, false, "")
				return stopped(ctx)
			}
		}
		failures = append(failures, rec)
		brief, added = "", ""
		if willRetry {
			added = enrichment(failures)
			brief = taskBrief + added
		}
		env.Tracker.Failure(rec, willRetry, brief)
	}
	return exhausted("all %d attempts failed", maxRetries)
}

// analystAdviceChars bounds the analyst's advice kept in a failure record,
// in characters (and MaxReasonBytes in bytes): it joins every later brief.
const analystAdviceChars = 2000

// analystBrief is the brief the analyst gets about a failed attempt: the
// task, the attempt's summary and its failure reason, and the question.
func analystBrief(taskBrief string, rec *stubbornv1.FailureRecord) string {
	return fmt.Sprintf("A task was attempted and the attempt failed.\n\nTask:\n%s\n\nAttempt %d: %s\nFailure reason: %s\n\n"+
		"What should the next attempt do differently? Answer with the advice only.",
		taskBrief, rec.GetAttempt(), rec.GetSummary(), rec.GetReason())
}

// analyse asks the analyst what the next attempt should do differently and
// puts its answer in rec.Analysis. The analyst never fails the run: an
// error or an empty answer leaves no analysis, and rec.AnalysisError says
// why. The call is not an attempt and is not in the attempt log.
func analyse(ctx context.Context, env *Env, analyst, taskBrief string, rec *stubbornv1.FailureRecord) {
	brief := analystBrief(taskBrief, rec)
	res, err := env.Delegates.Call(ctx, Call{Delegate: analyst, Brief: brief, Attempt: rec.GetAttempt()})
	env.Tracker.noteAnalysisCost(rec.GetAttempt(), callCost(env.Delegates, analyst, res, err, int64(len(brief))))
	switch {
	case ctx.Err() != nil:
		rec.AnalysisError = fmt.Sprintf("analyst %q failed: cancelled", analyst)
	case err != nil:
		rec.AnalysisError = fmt.Sprintf("analyst %q failed: %s", analyst, Cut(Message(err), MaxReasonBytes))
	default:
		advice := strings.TrimSpace(ResultString(res))
		if advice == "" {
			rec.AnalysisError = fmt.Sprintf("analyst %q gave no advice (empty answer)", analyst)
			return
		}
		rec.Analysis = Cut(FirstChars(advice, analystAdviceChars), MaxReasonBytes)
	}
}

// EnrichBrief appends the failure history to the original brief, in the
// reference format, byte for byte. An analyst's advice, when a record has
// one, follows that record's reason.
func EnrichBrief(taskBrief string, failures []*stubbornv1.FailureRecord) string {
	return taskBrief + enrichment(failures)
}

// enrichment is what EnrichBrief appends to the brief: empty for no
// failures.
func enrichment(failures []*stubbornv1.FailureRecord) string {
	if len(failures) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n\nPrior attempts failed. You MUST try a different approach.\n")
	for i, f := range failures {
		fmt.Fprintf(&b, "\nAttempt %d: %s\nFailure reason: %s\n", i+1, f.GetSummary(), f.GetReason())
		if f.GetAnalysis() != "" {
			fmt.Fprintf(&b, "What to try differently: %s\n", f.GetAnalysis())
		}
	}
	return b.String()
}
