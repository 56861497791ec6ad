package controls

import (
	"context"
	"errors"
	"fmt"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// errLostRace is the cancellation cause seen by the calls that lost a race.
var errLostRace = errors.New("another candidate won the race")

// Race calls every candidate at once with the same brief. The first
// acceptable result wins; the calls still running are cancelled for real
// (their context is cancelled) and recorded as cancelled at once, without
// waiting for them to return. Candidates that finished together with the
// winner (already done when the race looks) lose to the earliest acceptable
// one in the list. When every candidate fails the outcome is EXHAUSTED.
func Race(ctx context.Context, env *Env, taskBrief string, spec *stubbornv1.RaceSpec) Outcome {
	candidates := spec.GetCandidates()
	if ctx.Err() != nil {
		return stopped(ctx)
	}
	raceCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	type finish struct {
		index int
		a     attemptResult
	}
	// Buffered so that a loser returning after the race ended never blocks.
	done := make(chan finish, len(candidates))
	numbers := make([]int32, len(candidates))
	for i, name := range candidates {
		numbers[i] = env.Tracker.BeginAttempt(env.Path, name, taskBrief, 0)
	}
	candidate := *env
	candidate.racing = true
	for i, name := range candidates {
		go func() {
			done <- finish{index: i, a: candidate.answer(raceCtx, numbers[i], fmt.Sprintf("candidates[%d]", i), name, taskBrief)}
		}()
	}

	pending := make(map[int]bool, len(candidates))
	for i := range candidates {
		pending[i] = true
	}
	fail := func(i int, a attemptResult) {
		delete(pending, i)
		endAttempt(env, numbers[i], a)
		env.Tracker.Failure(&stubbornv1.FailureRecord{
			Attempt: numbers[i], Delegate: candidates[i], Summary: a.summary, Reason: a.reason, Path: env.Path,
			Source: failureSource(env, numbers[i], a),
		}, false, "")
	}
	cancelPending := func(cause error) {
		reason := "cancelled: " + cause.Error()
		for i := range candidates { // in list order, for a stable event order
			if pending[i] {
				fail(i, attemptResult{
					outcome: stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_CANCELLED,
					err:     context.Canceled, failed: true, reason: reason, summary: "Error: " + reason,
				})
			}
		}
	}

	for len(pending) > 0 {
		var first finish
		select {
		case first = <-done:
		case <-ctx.Done():
			cancelPending(context.Cause(ctx))
			return stopped(ctx)
		}
		if first.a.failed {
			fail(first.index, first.a)
			continue
		}
		// An acceptable result. Whatever else has finished by now finished
		// together with it: the earliest acceptable one in the list wins.
		together := []finish{first}
	drain:
		for {
			select {
			case f := <-done:
				together = append(together, f)
			default:
				break drain
			}
		}
		winner := first
		for _, f := range together {
			if !f.a.failed && f.index < winner.index {
				winner = f
			}
		}
		cancel(errLostRace)
		delete(pending, winner.index)
		endAttempt(env, numbers[winner.index], winner.a)
		for _, f := range together {
			switch {
			case f.index == winner.index:
			case f.a.failed:
				fail(f.index, f.a)
			default:
				f.a.failed, f.a.reason = true, "lost a tie to an earlier candidate"
				f.a.summary = firstChars(ResultString(f.a.result), 200)
				f.a.outcome = stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_CANCELLED
				fail(f.index, f.a)
			}
		}
		cancelPending(errLostRace)
		return Outcome{Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, Result: winner.a.result, Winner: candidates[winner.index]}
	}
	// The last calls may have come back cancelled before the loop saw the
	// run's end: they failed because the run ended, not on their own.
	if ctx.Err() != nil {
		return stopped(ctx)
	}
	return exhausted("all %d candidates failed", len(candidates))
}
