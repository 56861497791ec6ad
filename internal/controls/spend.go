package controls

import (
	"context"
	"errors"
	"fmt"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// A run's spend limit (RunOptions.spend_limit) is checked before each
// delegate call an attempt makes: what the run has spent (its RunCost, the
// fold of its attempt_finished and failure_analyzed events), plus the
// share reserved by calls in flight, plus the call's estimated input (its
// brief and the run's task, bytesPerToken a token, at the delegate's
// input price) must stay within max_cost and max_total_tokens. A call
// that would pass them is not made: the run asks a person
// (decision_requested, STATUS_REASON_SPEND_LIMIT_REACHED) whose RETRY
// carries a raised limit, or, with on_exhausted FAIL or a run that never
// asks, ends FAILED with that reason.
//
// The check is a recorded effect: replayed, a call the journal shows
// started was allowed, and a request the journal shows made before it is
// taken again (with its answer), so a resumed run never decides it anew;
// only at the journal's end does the run check live, where its state is
// what it has spent.

// errSpendLimit ends a run whose spend limit stopped it (Execute's stop):
// its message is the run's status_reason.
type errSpendLimit struct{ reason string }

func (e *errSpendLimit) Error() string { return e.reason }

// mayCall checks the spend limit before a call to delegate with brief,
// the next attempt at env.Path, and returns nil when the call may go (its
// estimated input is then reserved until the attempt ends). Otherwise it
// asks for a decision, and returns nil once a RETRY raised the limit
// enough; or it stops the run (ending ctx) and returns ctx's error, for
// the control to see stopped. calls is how many calls of that delegate
// and brief start together (a race's candidates).
func (e *Env) mayCall(ctx context.Context, delegate, brief string, calls int) error {
	t := e.Tracker
	if !t.limited() {
		return nil
	}
	if _, isPreset := e.preset(delegate); isPreset {
		return nil // its own attempts are checked
	}
	price := e.Delegates.Info(delegate).Price
	for {
		asked, allowed := t.recordedSpendCheck(e.Path)
		if allowed {
			return nil
		}
		need := e.judged(t.estimate(price, brief, calls), brief, calls)
		if !asked {
			why, over := t.over(need)
			if !over {
				t.reserve(need)
				return nil
			}
			if e.NeverAsk || t.limitFails() {
				return t.stopForSpend(ctx, why)
			}
			asked, need.reason = true, why
		}
		d, _, err := t.AwaitDecision(ctx, e.Path, need.reason, stubbornv1.StatusReason_STATUS_REASON_SPEND_LIMIT_REACHED, 0)
		if err != nil {
			return err
		}
		if d != stubbornv1.Decision_DECISION_RETRY {
			return t.stopForSpend(ctx, "spend limit reached; decision: FAIL")
		}
	}
}

// mayStartNow reports whether a call to delegate with brief may start now
// without asking anyone: the journal shows it started, or the run is
// within its limit with it (its share is then reserved). A hedged race's
// next candidate that may not start waits for the calls in flight.
func (e *Env) mayStartNow(delegate, brief string) bool {
	t := e.Tracker
	if !t.limited() {
		return true
	}
	if _, isPreset := e.preset(delegate); isPreset {
		return true
	}
	if asked, allowed := t.recordedSpendCheck(e.Path); allowed || asked {
		return allowed
	}
	need := e.judged(t.estimate(e.Delegates.Info(delegate).Price, brief, 1), brief, 1)
	if _, over := t.over(need); over {
		return false
	}
	t.reserve(need)
	return true
}

// judged is need with the input of the judge that will rule on each of
// the calls' answers added (its brief holds the task and the answer: the
// call's brief is the estimate): the check before an attempt covers its
// judge's call too, which is then not checked again.
func (e *Env) judged(need spendNeed, brief string, calls int) spendNeed {
	j, ok := e.Criteria.(interface{ judgeName() string })
	if !ok || j.judgeName() == "" {
		return need
	}
	more := e.Tracker.estimate(e.Delegates.Info(j.judgeName()).Price, brief, calls)
	need.cost, need.tokens = finite(need.cost+more.cost), need.tokens+more.tokens
	return need
}

// spendNeed is what a call is estimated to spend before it is made, and
// why the limit stops it, once it does.
type spendNeed struct {
	spend
	reason string
}

// limited reports whether the run has a spend limit.
func (t *Tracker) limited() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.state.GetOptions().GetSpendLimit()
	return l.GetMaxCost() > 0 || l.GetMaxTotalTokens() > 0
}

// limitFails reports whether the run's limit ends it rather than asks.
func (t *Tracker) limitFails() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.state.GetOptions().GetSpendLimit().GetOnExhausted() == stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL
}

// recordedSpendCheck reads what the journal says of the spend check
// before the next attempt at path: allowed when the attempt started
// without a spend request before it; asked when a spend request comes
// first (AwaitDecision takes it, and its answer).
func (t *Tracker) recordedSpendCheck(path string) (asked, allowed bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	started := t.journal.startedAt[t.nextStep(path)]
	if t.journal.used[started] {
		started = nil
	}
	if req := t.journal.next(t.journal.requests[path]); req != nil &&
		req.GetDecisionRequested().GetReasonCode() == stubbornv1.StatusReason_STATUS_REASON_SPEND_LIMIT_REACHED &&
		(started == nil || req.GetSeq() < started.GetSeq()) {
		return true, false
	}
	return false, started != nil
}

// estimate is what calls calls of a delegate priced p, each sent brief and
// the run's task, are estimated to spend on their input.
func (t *Tracker) estimate(p *stubbornv1.Price, brief string, calls int) spendNeed {
	t.mu.Lock()
	sent := int64(len(brief)) + t.taskBytesLocked()
	t.mu.Unlock()
	tokens := tokensOf(sent) * int64(max(calls, 1))
	cost := (float64(tokens)*p.GetInputPerMtok()/1e6 + p.GetPerCall()) * float64(max(calls, 1))
	return spendNeed{spend: spend{cost: finite(cost), tokens: tokens, estimated: true}}
}

// over reports whether spending need on top of what the run spent and
// reserved passes its limit, and says so in words.
func (t *Tracker) over(need spendNeed) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.state.GetOptions().GetSpendLimit()
	c := t.state.GetCost()
	cost, tokens := c.GetTotal(), c.GetTotalTokens()
	for _, r := range t.reserved {
		cost, tokens = cost+r.cost, tokens+r.tokens
	}
	switch {
	case l.GetMaxCost() > 0 && cost+need.cost > l.GetMaxCost():
		return fmt.Sprintf("spend limit reached: the run has spent %.6g of max_cost %.6g and the next call is estimated at %.6g", cost, l.GetMaxCost(), need.cost), true
	case l.GetMaxTotalTokens() > 0 && tokens+need.tokens > l.GetMaxTotalTokens():
		return fmt.Sprintf("spend limit reached: the run has used %d of max_total_tokens %d and the next call is estimated at %d input tokens", tokens, l.GetMaxTotalTokens(), need.tokens), true
	}
	return "", false
}

// reserve holds need for the next attempt, until it ends (endAttempt).
func (t *Tracker) reserve(need spendNeed) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.reserved == nil {
		t.reserved = map[int32]spend{}
	}
	n := t.nextNumber()
	r := t.reserved[n]
	r.cost, r.tokens = r.cost+need.cost, r.tokens+need.tokens
	t.reserved[n] = r
}

// stopForSpend ends the run's control because its spend limit stopped it
// (Execute turns the stop into a FAILED outcome with why), and returns
// ctx's error once it has ended.
func (t *Tracker) stopForSpend(ctx context.Context, why string) error {
	t.mu.Lock()
	stop := t.stop
	t.mu.Unlock()
	if stop == nil {
		return &errSpendLimit{reason: why} // not under Execute: nothing to stop
	}
	stop(&errSpendLimit{reason: why})
	<-ctx.Done()
	return ctx.Err()
}

// spendStopped is the outcome of a run its spend limit stopped, if it was.
func spendStopped(ctx context.Context) (Outcome, bool) {
	if e, ok := errors.AsType[*errSpendLimit](context.Cause(ctx)); ok {
		return failedWith(stubbornv1.StatusReason_STATUS_REASON_SPEND_LIMIT_REACHED, e.reason), true
	}
	return Outcome{}, false
}
