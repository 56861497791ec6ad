package controls

import (
	"context"
	"fmt"
	"strings"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// DefaultMaxRetries is retry-with-learning's total number of attempts when
// max_retries is unset.
const DefaultMaxRetries = 3

// RetryWithLearning retries the same delegate, each retry's brief carrying
// the whole failure history (spec/retry-with-learning.md).
//
// max_retries is the total number of attempts. Attempt 1 gets the original
// brief; every later attempt gets EnrichBrief(brief, failures so far). Any
// error from the delegate, and any result the criteria reject, is a failure
// and is retried. The first accepted result wins. When attempts run out the
// outcome is EXHAUSTED with no result; the last result stays in the attempt
// log.
func RetryWithLearning(ctx context.Context, env *Env, taskBrief string, spec *stubbornv1.RetryWithLearningSpec) Outcome {
	maxRetries := DefaultMaxRetries
	if spec.MaxRetries != nil {
		maxRetries = int(spec.GetMaxRetries())
	}
	target := spec.GetTarget()
	var failures []*stubbornv1.FailureRecord

	brief := taskBrief
	for i := 0; i < maxRetries; i++ {
		if ctx.Err() != nil {
			return stopped(ctx)
		}
		n, a := attempt(ctx, env, "target", target, brief, 0)
		if ctx.Err() != nil {
			return stopped(ctx)
		}
		if !a.failed {
			return Outcome{Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, Result: a.result, Winner: target}
		}
		rec := &stubbornv1.FailureRecord{Attempt: n, Delegate: target, Summary: a.summary, Reason: a.reason, Path: env.Path}
		failures = append(failures, rec)
		willRetry := i+1 < maxRetries
		brief = ""
		if willRetry {
			brief = EnrichBrief(taskBrief, failures)
		}
		env.Tracker.Failure(rec, willRetry, brief)
	}
	return exhausted("all %d attempts failed", maxRetries)
}

// EnrichBrief appends the failure history to the original brief, in the
// reference format, byte for byte. An analyst's advice, when a record has
// one, follows that record's reason.
func EnrichBrief(taskBrief string, failures []*stubbornv1.FailureRecord) string {
	if len(failures) == 0 {
		return taskBrief
	}
	var b strings.Builder
	b.WriteString(taskBrief)
	b.WriteString("\n\nPrior attempts failed. You MUST try a different approach.\n")
	for i, f := range failures {
		fmt.Fprintf(&b, "\nAttempt %d: %s\nFailure reason: %s\n", i+1, f.GetSummary(), f.GetReason())
		if f.GetAnalysis() != "" {
			fmt.Fprintf(&b, "What to try differently: %s\n", f.GetAnalysis())
		}
	}
	return b.String()
}
