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

// race calls the candidates with the same brief: all at once, or with
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
func race(ctx context.Context, env *Env, taskBrief string, spec *stubbornv1.RaceSpec) Outcome {
	if ctx.Err() != nil {
		return stopped(ctx)
	}
	r := newRacer(ctx, env, taskBrief, spec)
	defer r.cancel(nil)
	r.start()
	for r.running() {
		if ctx.Err() != nil {
			r.cancelPending(context.Cause(ctx))
			return stopped(ctx)
		}
		if r.startNow() {
			continue
		}
		first, ok := r.await(ctx)
		switch {
		case !ok: // the next candidate started, or the run ended
		case first.a.failed:
			r.fail(first.index, first.a)
		default:
			return r.win(first)
		}
	}
	// The last calls may have come back cancelled before the loop saw the
	// run's end: they failed because the run ended, not on their own.
	if ctx.Err() != nil {
		return stopped(ctx)
	}
	return exhausted("all %d candidates failed", len(r.candidates))
}

// finish is a race candidate's answer: the candidate's index, and how its
// attempt went.
type finish struct {
	index int
	a     attemptResult
}

// racer is one race's state.
type racer struct {
	env        *Env
	brief      string
	candidates []string
	hedge      time.Duration
	ctx        context.Context // the candidates' calls': ended when the race is
	cancel     context.CancelCauseFunc
	hedged     func(i int, at time.Time) <-chan struct{}
	done       chan finish  // buffered, so that a loser returning after the race ended never blocks
	numbers    []int32      // of the candidates started, in list order
	pending    map[int]bool // the candidates started and not finished
	toCall     []int        // started, to call once the answers in hand are taken (goLive)
	// held says the next candidate waits for the calls in flight: the
	// run's spend limit does not let it start beside them (spend.go).
	held bool
}

func newRacer(ctx context.Context, env *Env, brief string, spec *stubbornv1.RaceSpec) *racer {
	candidates := spec.GetCandidates()
	r := &racer{
		env: env, brief: brief, candidates: candidates,
		hedge:   spec.GetHedgeDelay().AsDuration(), // never negative: the server and the config refuse it
		done:    make(chan finish, len(candidates)),
		numbers: make([]int32, 0, len(candidates)),
		pending: make(map[int]bool, len(candidates)),
	}
	r.ctx, r.cancel = context.WithCancelCause(ctx)
	r.hedged = hedgeTimer(r.ctx, env.clock(), r.hedge)
	return r
}

// start starts every candidate, or a hedged race's first. Every attempt
// is recorded before any call starts, so that they are numbered in list
// order.
func (r *racer) start() {
	if r.hedge > 0 {
		r.begin(stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_AT_ONCE)
		return
	}
	for range r.candidates {
		r.begin(stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_AT_ONCE)
		if r.held || r.ctx.Err() != nil {
			return
		}
	}
}

// running reports whether the race goes on: a candidate is pending, or
// one is left to start.
func (r *racer) running() bool {
	return len(r.pending) > 0 || len(r.numbers) < len(r.candidates)
}

// begin records the start of the next candidate's attempt, and launches
// it.
func (r *racer) begin(reason stubbornv1.AttemptStartReason) {
	i := len(r.numbers)
	if len(r.pending) > 0 {
		if r.held = !r.env.mayStartNow(r.candidates[i], r.brief); r.held {
			return
		}
	} else if r.env.mayCall(r.ctx, r.candidates[i], r.brief, 1) != nil {
		return // the run stopped: the race sees it ended
	}
	r.held = false
	r.numbers = append(r.numbers, r.env.Tracker.beginAttempt(r.env.Path, r.candidates[i], r.brief, 0, reason, ""))
	r.pending[i] = true
	if r.env.inHand(r.numbers[i], r.candidates[i]) {
		r.done <- finish{index: i, a: r.answer(i)}
		return
	}
	r.toCall = append(r.toCall, i)
}

// answer is candidate i's answer: the journal's, or its call's.
func (r *racer) answer(i int) attemptResult {
	return answerAs(r.ctx, r.env, r.numbers[i], i, r.candidates[i], r.brief)
}

// answerAs is candidate i's answer to attempt n: what a call on a
// goroutine of its own reads, none of the race's own state.
func answerAs(ctx context.Context, env *Env, n int32, i int, candidate, brief string) attemptResult {
	return env.answer(ctx, n, fmt.Sprintf("candidates[%d]", i), candidate, brief)
}

// goLive calls the candidates started and not called yet, each on a
// goroutine of its own.
func (r *racer) goLive() {
	for _, i := range r.toCall {
		ctx, env, n, candidate, brief, done := r.ctx, r.env, r.numbers[i], r.candidates[i], r.brief, r.done
		go func() { done <- finish{index: i, a: answerAs(ctx, env, n, i, candidate, brief)} }()
	}
	r.toCall = r.toCall[:0]
}

// startNow starts the next candidate of a hedged race without waiting
// for its delay, and reports whether it did: every candidate started so
// far failed, or the journal shows it started at this point.
func (r *racer) startNow() bool {
	next := len(r.numbers)
	switch {
	case next >= len(r.candidates):
		return false
	case len(r.pending) == 0:
		r.begin(stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_EARLIER_FAILED)
	case r.env.startedHere(r.candidates[next]):
		r.begin(stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_HEDGE_DELAY) // the journal's reason, in fact
	default:
		return false
	}
	return true
}

// await returns the next answer: one in hand at once, before the clock;
// else, with the calls started, the first to come, unless the hedge
// delay passes first (the next candidate starts) or the run ends (false
// both).
func (r *racer) await(ctx context.Context) (finish, bool) {
	select {
	case f := <-r.done:
		return f, true
	default:
	}
	r.goLive()
	var timer <-chan struct{}
	if next := len(r.numbers); next < len(r.candidates) && !r.held {
		timer = r.hedged(next, r.env.Tracker.startTime(r.numbers[next-1]).Add(r.hedge))
	}
	select {
	case f := <-r.done:
		return f, true
	case <-timer:
		r.begin(stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_HEDGE_DELAY)
	case <-ctx.Done():
	}
	return finish{}, false
}

// fail records candidate i's failure.
func (r *racer) fail(i int, a attemptResult) {
	delete(r.pending, i)
	endAttempt(r.env, r.numbers[i], a)
	r.env.Tracker.Failure(&stubbornv1.FailureRecord{
		Attempt: r.numbers[i], Delegate: r.candidates[i], Summary: a.summary, Reason: a.reason, Path: r.env.Path,
		Source: failureSource(r.env, r.numbers[i], a),
	}, false, "")
}

// cancelPending records every pending candidate cancelled, in list order
// for a stable event order.
func (r *racer) cancelPending(cause error) {
	reason := "cancelled: " + cause.Error()
	for i := range r.numbers {
		if r.pending[i] {
			r.fail(i, attemptResult{
				outcome: stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_CANCELLED,
				err:     context.Canceled, failed: true, reason: reason, summary: "Error: " + reason,
			})
		}
	}
}

// win ends the race with an acceptable answer. Whatever else has
// finished by now finished together with it: the earliest acceptable one
// in the list wins, the others lose, and the calls still running are
// cancelled.
func (r *racer) win(first finish) Outcome {
	together := []finish{first}
	for len(r.done) > 0 {
		together = append(together, <-r.done)
	}
	winner := first
	for _, f := range together {
		if !f.a.failed && f.index < winner.index {
			winner = f
		}
	}
	r.cancel(errLostRace)
	delete(r.pending, winner.index)
	endAttempt(r.env, r.numbers[winner.index], winner.a)
	for _, f := range together {
		switch {
		case f.index == winner.index:
		case f.a.failed:
			r.fail(f.index, f.a)
		default:
			f.a.failed, f.a.reason = true, "lost a tie to an earlier candidate"
			f.a.summary = FirstChars(ResultString(f.a.result), 200)
			f.a.outcome = stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_CANCELLED
			r.fail(f.index, f.a)
		}
	}
	r.cancelPending(errLostRace)
	return Outcome{Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, Result: winner.a.result, Winner: r.candidates[winner.index]}
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
