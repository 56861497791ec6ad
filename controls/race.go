package controls

import (
	"context"
	"errors"
	"fmt"
	"time"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// errLostRace is the cancellation cause seen by the calls that lost a race.
var errLostRace = errors.New("another candidate won the race")

// Race calls the candidates with the same brief: all at once, or with
// hedge_delay one after another in list order (a hedged race). The first
// acceptable result wins; the calls still running are cancelled for real
// (their context is cancelled) and recorded as cancelled at once, without
// waiting for them to return, and the candidates not started yet are never
// called. Candidates that finished together with the winner (already done
// when the race looks) lose to the earliest acceptable one in the list.
// When every candidate fails the outcome is EXHAUSTED.
//
// A hedged race starts its first candidate alone, and each next one when
// hedge_delay has passed (on env's clock) since the one before it started,
// or at once when every candidate started so far has failed; each
// attempt's start_reason says which. Replayed, it starts the candidates
// the journal shows started before it looks at any answer, and takes the
// journal's answers before it looks at the clock, so that it starts the
// same candidates, for the same reasons, without waiting again.
func Race(ctx context.Context, env *Env, taskBrief string, spec *stubbornv1.RaceSpec) Outcome {
	candidates := spec.GetCandidates()
	hedge := spec.GetHedgeDelay().AsDuration() // never negative: the server and the config refuse it
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
	numbers := make([]int32, 0, len(candidates)) // of the candidates started, in list order
	pending := make(map[int]bool, len(candidates))
	begin := func(reason stubbornv1.AttemptStartReason) {
		i := len(numbers)
		numbers = append(numbers, env.Tracker.beginAttempt(env.Path, candidates[i], taskBrief, 0, reason))
		pending[i] = true
	}
	answer := func(i int) attemptResult {
		return env.answer(raceCtx, numbers[i], fmt.Sprintf("candidates[%d]", i), candidates[i], taskBrief)
	}
	// The candidates to call: their calls start once the race has taken
	// the answers in hand and none of them won (goLive).
	var toCall []int
	launch := func(i int) {
		if env.inHand(numbers[i], candidates[i]) {
			done <- finish{index: i, a: answer(i)}
			return
		}
		toCall = append(toCall, i)
	}
	goLive := func() {
		for _, i := range toCall {
			go func() { done <- finish{index: i, a: answer(i)} }()
		}
		toCall = toCall[:0]
	}
	if hedge <= 0 {
		// Every attempt is recorded before any call starts, so that they
		// are numbered in list order.
		for range candidates {
			begin(stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_AT_ONCE)
		}
		for i := range candidates {
			launch(i)
		}
	} else {
		begin(stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_AT_ONCE)
		launch(0)
	}
	hedged := hedgeTimer(raceCtx, env.clock(), hedge)

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
		for i := range numbers { // in list order, for a stable event order
			if pending[i] {
				fail(i, attemptResult{
					outcome: stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_CANCELLED,
					err:     context.Canceled, failed: true, reason: reason, summary: "Error: " + reason,
				})
			}
		}
	}

	for {
		if ctx.Err() != nil {
			cancelPending(context.Cause(ctx))
			return stopped(ctx)
		}
		if next := len(numbers); next < len(candidates) {
			switch {
			case len(pending) == 0:
				// Every candidate started so far failed: no reason to wait.
				begin(stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_EARLIER_FAILED)
				launch(next)
				continue
			case env.startedHere(candidates[next]):
				begin(stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_HEDGE_DELAY) // the journal's reason, in fact
				launch(next)
				continue
			}
		}
		if len(pending) == 0 {
			break
		}
		var first finish
		select {
		case first = <-done: // an answer in hand goes before the clock
		default:
			goLive()
			var timer <-chan struct{}
			if next := len(numbers); next < len(candidates) {
				timer = hedged(next, env.Tracker.startTime(numbers[next-1]).Add(hedge))
			}
			select {
			case first = <-done:
			case <-timer:
				begin(stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_HEDGE_DELAY)
				launch(len(numbers) - 1)
				continue
			case <-ctx.Done():
				cancelPending(context.Cause(ctx))
				return stopped(ctx)
			}
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

// hedgeTimer returns the timer of a hedged race: hedged(i, at) is a channel
// closed when clock reaches at, the time candidate i may start. The timer
// runs once per candidate, from the first call for it (an answer that comes
// meanwhile leaves it running: the delay counts from the previous start);
// asking for the next candidate stops the previous one, and so does the
// end of ctx. Without hedging there is no timer.
func hedgeTimer(ctx context.Context, clock Clock, hedge time.Duration) func(i int, at time.Time) <-chan struct{} {
	armed, stop := -1, context.CancelFunc(func() {})
	var fired chan struct{}
	return func(i int, at time.Time) <-chan struct{} {
		if hedge <= 0 {
			return nil
		}
		if i != armed {
			stop()
			var wait context.Context
			wait, stop = context.WithCancel(ctx)
			armed, fired = i, make(chan struct{})
			go func(fired chan struct{}) {
				if d := at.Sub(clock.Now()); d <= 0 || clock.Sleep(wait, d) == nil {
					close(fired)
				}
			}(fired)
		}
		return fired
	}
}
