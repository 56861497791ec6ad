package controls

import (
	"context"
	"time"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// A control's inputs that it cannot compute itself reach it through these
// methods of its Env, as recorded effects: a delegate's answer (judged), a
// health answer, the retry budget's say, the clock against the run's
// deadline, the analysis of a failure (the analyst's advice, the retry
// control's decision), a backoff's wait and a person's decision (the last
// two through the Tracker). A run being resumed from its journal (a
// Tracker built by NewReplayTracker with the events already recorded) gets
// each effect the journal holds as it was recorded, and the others live, so
// a control simply runs again from the start, never asks whether it is
// being replayed, and reaches the point where the journal stops, where it
// goes on live. Temporal's SDK hides replay from workflow code the same way.

// answer returns attempt n's answer, judged: the journal's, or the call's.
// An attempt in flight when the run changed hands comes back as
// errInterrupted.
//
// A preset's attempt whose end the journal holds is run again (unless it
// was cancelled), so that its own steps, which are in the run's attempt log
// and keyed by the preset's path, are replayed too; its end is then the
// recorded one, and an interrupted one goes on where its journal stops
// instead of failing as an interrupted call. A preset cancelled then is not
// run again: it would go on live past where it was stopped.
func (e *Env) answer(ctx context.Context, n int32, slot, delegate, brief string) attemptResult {
	was, recorded := e.Tracker.recordedAnswer(n)
	if !recorded {
		return call(ctx, e, n, slot, delegate, brief)
	}
	spec, isPreset := e.preset(delegate)
	if !isPreset || was.outcome == stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_CANCELLED {
		return was
	}
	res, err := nested(ctx, e, slot, delegate, brief, spec)
	if was.outcome != stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_INTERRUPTED {
		return was // its end as judged then
	}
	return judge(ctx, e, n, delegate, res, err)
}

// inHand reports whether answer gives attempt n, to delegate, without
// going live: the journal holds its end (a preset's steps then replay from
// the journal), or shows it interrupted and it is no preset (which would
// go on live). A race takes such answers before it looks at its clock or
// calls anyone, so that a resumed race decides from the journal's answers,
// not from how fast goroutines ran.
func (e *Env) inHand(n int32, delegate string) bool {
	was, ok := e.Tracker.recordedAnswer(n)
	if !ok {
		return false
	}
	_, isPreset := e.preset(delegate)
	return !isPreset || was.outcome != stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_INTERRUPTED
}

// startedHere reports whether the journal shows that the race candidate
// that comes next, delegate, started at this point of the race: before the
// run changed hands, a hedged race started it (its delay passed, or the
// candidates before it failed), and before any acceptable answer, since
// none ended the race. It then starts again now, before the race looks at
// any answer, and without waiting again for a delay.
func (e *Env) startedHere(delegate string) bool {
	return e.Tracker.nextStartedAs(e.Path, delegate)
}

// serving reports whether the delegate that the next attempt goes to
// serves: false when the journal shows that attempt skipped, true when it
// shows it made, else what the delegate's health check says now.
func (e *Env) serving(ctx context.Context, delegate string) bool {
	if was, ok := e.Tracker.nextAnswer(e.Path); ok {
		return was.outcome != stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SKIPPED
	}
	return e.Delegates.Serving(ctx, delegate)
}

// count tells the retry budget, if any, how attempt n to the delegate
// went: success for an answer, !success for a transient failure. An
// attempt whose end the journal holds was counted when it was made.
func (e *Env) count(n int32, delegate string, success bool) {
	if e.Budgets != nil && !e.Tracker.answered(n) {
		e.Budgets.Record(delegate, success)
	}
}

// allowRetry asks the retry budget, if any, whether the delegate may be
// retried now. It is asked only while a failure is analysed live (see
// analysed).
func (e *Env) allowRetry(delegate string) bool {
	return e.Budgets == nil || e.Budgets.Allow(delegate)
}

// endsPastDeadline reports whether a wait before the next attempt, starting
// now, ends at or after the run's deadline (ctx's, against env's clock),
// leaving no time for the attempt. A backoff the journal holds was
// scheduled, so its wait did not.
func (e *Env) endsPastDeadline(ctx context.Context, wait time.Duration) bool {
	dl, ok := ctx.Deadline()
	if !ok || e.Tracker.nextScheduled(e.Path) {
		return false
	}
	return wait >= dl.Sub(e.clock().Now())
}

// analysed returns the analysis of a failure whose record is rec: the
// journal's record and whether a retry followed it, when the journal holds
// them; otherwise live completes rec (a retry's decision, an analyst's
// advice) and says whether a retry follows. Either way the caller records
// the result with Tracker.Failure.
func (e *Env) analysed(rec *stubbornv1.FailureRecord, live func(rec *stubbornv1.FailureRecord) bool) (*stubbornv1.FailureRecord, bool) {
	if was, willRetry, ok := e.Tracker.recordedFailure(rec.GetAttempt()); ok {
		return was, willRetry
	}
	return rec, live(rec)
}

// backoff announces the wait before the next attempt (backoff_scheduled)
// and waits it: the journal's wait, with the time left, when it holds this
// backoff. It returns the wait announced, or an error when the run stopped
// meanwhile.
func (e *Env) backoff(ctx context.Context, wait, bound time.Duration, fromHint bool) (time.Duration, error) {
	wait = e.Tracker.Backoff(e.Path, e.Tracker.nextAttempt(), wait, bound, fromHint)
	if err := e.Tracker.WaitBackoff(ctx, e.clock()); err != nil {
		return wait, err
	}
	return wait, ctx.Err()
}
