package controls

import (
	"errors"
	"math"

	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// A delegate call's cost is its delegate's price (DelegateInfo.Price)
// times the usage the call reported (Result.usage). A priced call that
// reported none — a stream cut or cancelled before its usage, a delegate
// that reports no usage, a call that failed after it was sent — is
// estimated from the bytes sent and received, bytesPerToken a token, and
// marked so: never zero. A call that was never sent (a guard refused it,
// the connection was refused) costs nothing.

// bytesPerToken is the estimate's bytes a token: the usual rule of thumb
// for English text with the providers' tokenizers.
const bytesPerToken = 4

// spend is what one call cost and used.
type spend struct {
	cost      float64
	tokens    int64
	estimated bool
}

// priced returns what a call to a delegate with price p cost: from res's
// usage when it reported one, else estimated from sent (bytes of the
// request) and got (bytes of the answer, streamed or whole). A nil price
// costs nothing, but tokens are still counted (max_total_tokens).
func priced(p *stubbornv1.Price, res *stubbornv1.Result, err error, sent, got int64) spend {
	if notSent(err) {
		return spend{}
	}
	if u := res.GetUsage(); u != nil && (u.GetInputTokens() > 0 || u.GetOutputTokens() > 0 || u.GetTotalTokens() > 0) {
		in, out := max(u.GetInputTokens(), 0), max(u.GetOutputTokens(), 0)
		total := u.GetTotalTokens()
		if total < in+out {
			total = in + out
		}
		cached := min(max(u.GetCacheReadTokens(), 0), in)
		cachedPrice := p.GetCachedInputPerMtok()
		if cachedPrice == 0 {
			cachedPrice = p.GetInputPerMtok()
		}
		cost := (float64(in-cached)*p.GetInputPerMtok() + float64(cached)*cachedPrice + float64(out)*p.GetOutputPerMtok()) / 1e6
		return spend{cost: finite(cost + p.GetPerCall()), tokens: total}
	}
	in, out := tokensOf(sent), tokensOf(got)
	cost := (float64(in)*p.GetInputPerMtok()+float64(out)*p.GetOutputPerMtok())/1e6 + p.GetPerCall()
	return spend{cost: finite(cost), tokens: in + out, estimated: true}
}

// tokensOf estimates the tokens of n bytes: at least one.
func tokensOf(n int64) int64 { return max(1, (n+bytesPerToken-1)/bytesPerToken) }

// finite keeps a cost a number JSON and every client can carry.
func finite(c float64) float64 {
	if math.IsNaN(c) || c < 0 {
		return 0
	}
	return min(c, math.MaxFloat32)
}

// notSent reports whether err says the call never reached the delegate: a
// guard refused it, or it provably was not sent.
func notSent(err error) bool {
	ce, ok := errors.AsType[*CallError](err)
	return ok && (ce.NotSent || ce.Refused)
}

// callCost is what a call that is not an attempt (a judge's, an
// analyst's) cost, for the event; nil for an unpriced delegate that used
// no tokens we know of.
func callCost(d Delegates, delegate string, res *stubbornv1.Result, err error, sent int64) *stubbornv1.CallCost {
	var got int64
	if res != nil {
		got = int64(len(ResultString(res)))
	}
	s := priced(d.Info(delegate).Price, res, err, sent, got)
	if s.cost == 0 && s.tokens == 0 {
		return nil
	}
	return &stubbornv1.CallCost{Delegate: delegate, Cost: s.cost, TotalTokens: s.tokens, Estimated: s.estimated}
}

// addAttemptCost adds what an attempt that ended, and its judges' calls,
// cost to the run's cost.
func addAttemptCost(st *stubbornv1.ControlState, f *stubbornv1.AttemptFinished) {
	a := f.GetAttempt()
	addCost(st, a.GetDelegate(), a.GetCost(), a.GetTotalTokens(), a.GetCostEstimated())
	for _, c := range f.GetCalls() {
		addCallCost(st, c)
	}
}

// addCallCost adds what call c (nil: none) cost to the run's cost.
func addCallCost(st *stubbornv1.ControlState, c *stubbornv1.CallCost) {
	if c != nil {
		addCost(st, c.GetDelegate(), c.GetCost(), c.GetTotalTokens(), c.GetEstimated())
	}
}

// addCost adds what a call of delegate cost to the run's cost.
func addCost(st *stubbornv1.ControlState, delegate string, cost float64, tokens int64, estimated bool) {
	if cost == 0 && tokens == 0 {
		return
	}
	c := st.GetCost()
	if c == nil {
		c = &stubbornv1.RunCost{}
		st.Cost = c
	}
	c.Total = finite(c.Total + cost)
	c.TotalTokens += tokens
	c.Estimated = c.Estimated || estimated
	if cost != 0 {
		if c.ByDelegate == nil {
			c.ByDelegate = map[string]float64{}
		}
		c.ByDelegate[delegate] = finite(c.ByDelegate[delegate] + cost)
	}
}

// delegateOf returns the delegate attempt n went to; "" for an attempt
// the log does not hold.
func (t *Tracker) delegateOf(n int32) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n < 1 || int(n) > len(t.state.GetAttemptLog()) {
		return ""
	}
	return t.state.GetAttemptLog()[n-1].GetDelegate()
}

// noteAnalysisCost keeps what asking the analyst about attempt n cost,
// for its failure_analyzed (Failure).
func (t *Tracker) noteAnalysisCost(n int32, cc *stubbornv1.CallCost) {
	if cc == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.analysisCost == nil {
		t.analysisCost = map[int32]*stubbornv1.CallCost{}
	}
	t.analysisCost[n] = cc
}

// priceLocked sets attempt a's cost and tokens: from its answer's usage,
// or for a priced delegate without one, estimated from its brief and the
// run's task (sent) and its answer or what it streamed (streamed bytes).
// An unpriced delegate's attempt counts the tokens it reported only.
// Callers hold t.mu.
func (t *Tracker) priceLocked(a *stubbornv1.Attempt, res *stubbornv1.Result, err error, streamed int64, p *stubbornv1.Price) {
	if p == nil {
		if u := res.GetUsage(); u != nil {
			a.TotalTokens = max(u.GetTotalTokens(), u.GetInputTokens()+u.GetOutputTokens(), 0)
		}
		return
	}
	got := streamed
	if res != nil && res.GetUsage() == nil {
		got = max(got, int64(len(ResultString(res))))
	}
	s := priced(p, res, err, int64(len(a.GetBrief()))+t.taskBytesLocked(), got)
	a.Cost, a.TotalTokens, a.CostEstimated = s.cost, s.tokens, s.estimated
}

// taskBytesLocked is the size of the run's task beyond its brief: the
// conversation or messages a model delegate is sent. Callers hold t.mu.
func (t *Tracker) taskBytesLocked() int64 {
	n := 0
	if c := t.state.GetConversation(); c != nil {
		n += proto.Size(c)
	}
	for _, m := range t.state.GetTaskMessages() {
		n += proto.Size(m)
	}
	return int64(n)
}
