package controls

import (
	"context"
	"fmt"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// fallbackChain tries delegates in order, each with the original brief and
// no failure context (spec/fallback-chain.md). The first accepted result
// wins and no later delegate is called. A delegate whose health check
// reports NOT_SERVING is skipped without a call, and the skip is recorded
// as its failure. When every delegate fails the outcome is EXHAUSTED with no
// result and no winner, and attempts equals the chain's length.
func fallbackChain(ctx context.Context, env *Env, taskBrief string, spec *stubbornv1.FallbackChainSpec) Outcome {
	chain := spec.GetChain()
	for i, name := range chain {
		if ctx.Err() != nil {
			return stopped(ctx)
		}
		var (
			n int32
			a attemptResult
		)
		if env.serving(ctx, name) {
			n, a = attempt(ctx, env, fmt.Sprintf("chain[%d]", i), name, taskBrief, 0)
			if ctx.Err() != nil {
				return stopped(ctx)
			}
		} else {
			n = env.Tracker.BeginAttempt(env.Path, name, taskBrief, 0)
			const why = "skipped: health check reports NOT_SERVING"
			env.Tracker.EndAttempt(n, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SKIPPED, nil, nil, why)
			a = attemptResult{outcome: stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SKIPPED, failed: true, reason: why, summary: "Skipped: NOT_SERVING"}
		}
		if !a.failed {
			return Outcome{Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, Result: a.result, Winner: name}
		}
		rec := &stubbornv1.FailureRecord{
			Attempt: n, Delegate: name, Summary: a.summary, Reason: a.reason, Path: env.Path,
			Source: failureSource(env, n, a),
		}
		next := ""
		if i+1 < len(chain) {
			next = taskBrief
		}
		env.Tracker.Failure(rec, i+1 < len(chain), next)
	}
	return exhausted("all %d delegates in the chain failed", len(chain))
}
