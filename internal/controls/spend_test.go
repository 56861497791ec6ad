package controls_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// price is the test's model price: 2 per million input tokens, 1 per
// million read from the cache, 10 per million output, 0.001 a call.
var price = &stubbornv1.Price{InputPerMtok: 2, CachedInputPerMtok: 1, OutputPerMtok: 10, PerCall: 0.001}

// usageAnswer is a model's answer text reporting usage in/out (cached of in).
func usageAnswer(text string, in, out, cached int64) controlstest.Reply {
	return controlstest.Reply{Result: &stubbornv1.Result{Text: text, Usage: &stubbornv1.Usage{
		InputTokens: in, OutputTokens: out, TotalTokens: in + out, CacheReadTokens: cached,
	}}}
}

// estimated is what a call is estimated to cost at price, sent and got
// bytes (4 a token, at least one each).
func estimated(sent, got int) float64 {
	tok := func(n int) float64 { return float64(max(1, (n+3)/4)) }
	return tok(sent)*2/1e6 + tok(got)*10/1e6 + 0.001
}

func pricedFixture(script map[string][]controlstest.Reply, priced ...string) *fixture {
	return pricedAt(price, script, priced...)
}

// dear costs 0.01 a call, whatever its tokens.
var dear = &stubbornv1.Price{PerCall: 0.01}

func pricedAt(p *stubbornv1.Price, script map[string][]controlstest.Reply, priced ...string) *fixture {
	f := newFixture(script)
	for _, name := range priced {
		f.fakes.SetInfo(name, controls.DelegateInfo{Idempotent: true, Price: p})
	}
	return f
}

func TestAnAttemptCostsItsUsageTimesItsDelegatesPrice(t *testing.T) {
	t.Parallel()
	f := pricedFixture(map[string][]controlstest.Reply{"m": {unavailable("busy"), usageAnswer("done", 1000, 500, 200)}}, "m")
	r := f.run(t, testCtx(t), retryOf("m", 3))
	require.Equal(t, succeeded, r.out.Status, r.out.Reason)
	log := r.state.GetAttemptLog()
	require.Len(t, log, 2)

	// Failed after it was sent, with no usage: estimated from its brief.
	assert.InDelta(t, estimated(len(taskBrief), 0), log[0].GetCost(), 1e-12)
	assert.True(t, log[0].GetCostEstimated())
	// (800 input × 2 + 200 cached × 1 + 500 output × 10) / 1e6 + 0.001.
	assert.InDelta(t, 0.0078, log[1].GetCost(), 1e-12)
	assert.False(t, log[1].GetCostEstimated())
	assert.EqualValues(t, 1500, log[1].GetTotalTokens())

	c := r.state.GetCost()
	assert.InDelta(t, log[0].GetCost()+log[1].GetCost(), c.GetTotal(), 1e-12)
	assert.InDelta(t, c.GetTotal(), c.GetByDelegate()["m"], 1e-12)
	assert.True(t, c.GetEstimated())
	// The state's cost is the fold of the events: what a reader of the
	// journal, or a resumed run, gets.
	assert.True(t, proto.Equal(c, controls.Fold(f.events.All()).GetCost()), "the events fold to the same cost")
}

func TestAStreamCutBeforeItsUsageIsEstimatedFromWhatItStreamed(t *testing.T) {
	t.Parallel()
	cut := controlstest.Reply{Chunks: []string{"twelve bytes", "and eleven."}, Err: &controls.CallError{Code: codes.Unavailable, Message: "stream reset"}}
	f := pricedFixture(map[string][]controlstest.Reply{"m": {cut}}, "m")
	r := f.run(t, testCtx(t), retryOf("m", 1))
	require.Equal(t, failed, r.out.Status)
	a := r.state.GetAttemptLog()[0]
	assert.True(t, a.GetCostEstimated())
	assert.InDelta(t, estimated(len(taskBrief), len("twelve bytesand eleven.")), a.GetCost(), 1e-12)
	assert.Positive(t, a.GetCost())
}

func TestACallNeverSentCostsNothing(t *testing.T) {
	t.Parallel()
	refused := controlstest.Reply{Err: &controls.CallError{Code: codes.Unavailable, Message: "connection refused", NotSent: true}}
	f := pricedFixture(map[string][]controlstest.Reply{"m": {refused}}, "m")
	r := f.run(t, testCtx(t), retryOf("m", 1))
	assert.Zero(t, r.state.GetAttemptLog()[0].GetCost())
	assert.Nil(t, r.state.GetCost())
}

func TestJudgesAndAnalystsCostUnderTheirOwnNames(t *testing.T) {
	t.Parallel()
	f := pricedFixture(map[string][]controlstest.Reply{
		"target":  {usageAnswer("no results found", 100, 10, 0), usageAnswer("three sources", 100, 10, 0)},
		"judge":   {usageAnswer(`{"is_failure": true, "reason": "no sources"}`, 50, 5, 0), usageAnswer(`{"is_failure": false}`, 50, 5, 0)},
		"analyst": {usageAnswer("look harder", 40, 4, 0)},
	}, "target", "judge", "analyst")
	spec := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_RetryWithLearning{RetryWithLearning: &stubbornv1.RetryWithLearningSpec{
		Target: "target", Analyst: "analyst", FailureCriteria: "must cite sources", MaxRetries: ptr(int32(3)),
	}}}
	f.env.Criteria = controls.NewCriteria(spec, "judge", f.env.Delegates)
	r := f.run(t, testCtx(t), spec)
	require.Equal(t, succeeded, r.out.Status, r.out.Reason)

	perCall := func(in, out float64) float64 { return (in*2+out*10)/1e6 + 0.001 }
	by := r.state.GetCost().GetByDelegate()
	assert.InDelta(t, 2*perCall(100, 10), by["target"], 1e-12)
	assert.InDelta(t, 2*perCall(50, 5), by["judge"], 1e-12)
	assert.InDelta(t, perCall(40, 4), by["analyst"], 1e-12)
	assert.InDelta(t, by["target"]+by["judge"]+by["analyst"], r.state.GetCost().GetTotal(), 1e-12)
	assert.False(t, r.state.GetCost().GetEstimated())
	var judged, analysed int
	for _, ev := range f.events.All() {
		judged += len(ev.GetAttemptFinished().GetCalls())
		if ev.GetFailureAnalyzed().GetAnalysisCost() != nil {
			analysed++
		}
	}
	assert.Equal(t, 2, judged, "each attempt_finished carries its judge's call")
	assert.Equal(t, 1, analysed, "the failure_analyzed carries the analyst's call")
}

// limited sets a spend limit on the fixture's run.
func limited(f *fixture, l *stubbornv1.SpendLimit) {
	st := f.env.Tracker.Snapshot()
	st.Options = &stubbornv1.RunOptions{SpendLimit: l}
	f.env.Tracker = controls.NewTracker(st, f.env.Clock, func(ev *stubbornv1.RunEvent) {
		f.events.Sink(ev)
		f.evs <- ev
	})
}

func TestASpendLimitStopsTheRunBeforeTheCallThatWouldPassIt(t *testing.T) {
	t.Parallel()
	learn := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_RetryWithLearning{RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "m", MaxRetries: ptr(int32(10))}}}
	failing := controlstest.Fail(codes.Unavailable, "busy")

	t.Run("FAIL ends it", func(t *testing.T) {
		t.Parallel()
		f := pricedAt(dear, map[string][]controlstest.Reply{"m": {failing}}, "m")
		limited(f, &stubbornv1.SpendLimit{MaxCost: 0.035, OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL})
		r := f.run(t, testCtx(t), learn)
		assert.Equal(t, failed, r.out.Status)
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_SPEND_LIMIT_REACHED, r.out.Code)
		assert.Contains(t, r.out.Reason, "max_cost 0.035")
		// 0.01 a call: three fit, the fourth would pass 0.035.
		assert.Len(t, r.state.GetAttemptLog(), 3)
		assert.InDelta(t, 0.03, r.state.GetCost().GetTotal(), 1e-9)
		assert.Len(t, f.fakes.CallsTo("m"), len(r.state.GetAttemptLog()), "no call without its attempt")
		assert.NotContains(t, f.events.Kinds(), "decision_requested")
	})

	t.Run("a run that never asks fails", func(t *testing.T) {
		t.Parallel()
		f := pricedAt(dear, map[string][]controlstest.Reply{"m": {failing}}, "m")
		limited(f, &stubbornv1.SpendLimit{MaxTotalTokens: 1})
		f.env.NeverAsk = true
		r := f.run(t, testCtx(t), learn)
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_SPEND_LIMIT_REACHED, r.out.Code)
		assert.Empty(t, r.state.GetAttemptLog(), "the first call's input is over the limit already")
		assert.Empty(t, f.fakes.Calls())
	})

	t.Run("ASK waits; RETRY with a raised limit goes on; FAIL ends it", func(t *testing.T) {
		t.Parallel()
		f := pricedAt(dear, map[string][]controlstest.Reply{"m": {failing, failing, usageAnswer("done", 10, 10, 0)}}, "m")
		limited(f, &stubbornv1.SpendLimit{MaxCost: 0.01})
		done := f.start(testCtx(t), learn)
		waitKind(t, f, "decision_requested")
		st := f.env.Tracker.Snapshot()
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, st.GetStatus())
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_SPEND_LIMIT_REACHED, st.GetStatusReasonCode())
		calls := len(f.fakes.Calls())
		// A RETRY that raises the limit by too little asks again.
		require.NoError(t, f.env.Tracker.Decide(stubbornv1.Decision_DECISION_RETRY, &stubbornv1.SpendLimit{MaxCost: st.GetCost().GetTotal() + 1e-9}))
		waitKind(t, f, "decision_requested")
		assert.Len(t, f.fakes.Calls(), calls, "no call while the limit stops it")
		require.NoError(t, f.env.Tracker.Decide(stubbornv1.Decision_DECISION_RETRY, &stubbornv1.SpendLimit{MaxCost: 1}))
		r := f.end(t, done)
		assert.Equal(t, succeeded, r.out.Status, r.out.Reason)
		assert.InDelta(t, 1, r.state.GetOptions().GetSpendLimit().GetMaxCost(), 0, "the decision's limit is the run's")

		g := pricedAt(dear, map[string][]controlstest.Reply{"m": {failing}}, "m")
		limited(g, &stubbornv1.SpendLimit{MaxCost: 0.01})
		done = g.start(testCtx(t), learn)
		waitKind(t, g, "decision_requested")
		require.NoError(t, g.env.Tracker.Decide(stubbornv1.Decision_DECISION_FAIL, nil))
		r = g.end(t, done)
		assert.Equal(t, failed, r.out.Status)
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_SPEND_LIMIT_REACHED, r.out.Code)
	})
}

// waitKind waits for the next event of kind.
func waitKind(t *testing.T, f *fixture, kind string) {
	t.Helper()
	for {
		ev := recv(t, f.evs, "a "+kind+" event")
		if controlstest.Kind(ev) == kind {
			return
		}
	}
}

func TestEveryControlStopsAtItsSpendLimit(t *testing.T) {
	t.Parallel()
	specs := map[string]*stubbornv1.ControlSpec{
		"retry":          retryOf("m", 5),
		"fallback_chain": {Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"m", "m", "m"}}}},
		"race":           {Kind: &stubbornv1.ControlSpec_Race{Race: &stubbornv1.RaceSpec{Candidates: []string{"m", "m", "m"}}}},
		"balance": {Kind: &stubbornv1.ControlSpec_Balance{Balance: &stubbornv1.BalanceSpec{Targets: []*stubbornv1.BalanceTarget{
			{Name: "m"}, {Name: "m"}, {Name: "m"},
		}}}},
	}
	failing := controlstest.Fail(codes.Unavailable, "busy")
	for name, spec := range specs {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := pricedAt(dear, map[string][]controlstest.Reply{"m": {failing}}, "m")
			limited(f, &stubbornv1.SpendLimit{MaxCost: 0.025, OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL})
			r := f.run(t, testCtx(t), spec)
			assert.Equal(t, failed, r.out.Status, r.out.Reason)
			assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_SPEND_LIMIT_REACHED, r.out.Code, r.out.Reason)
			assert.Len(t, f.fakes.Calls(), 2, "0.01 a call: two fit in 0.025, the third is not made")
			assert.InDelta(t, 0.02, r.state.GetCost().GetTotal(), 1e-9)
		})
	}
}

// TestASpendLimitedRunResumesFromEveryEvent cuts a run that its spend
// limit stopped after each of its events and resumes it: the check is
// never made again for a call the journal shows, and the run ends the
// same way, with the same cost.
func TestASpendLimitedRunResumesFromEveryEvent(t *testing.T) {
	spec := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_RetryWithLearning{RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "d", MaxRetries: ptr(int32(10))}}}
	busy := controlstest.Fail(codes.Unavailable, "busy")
	answers := map[int32]controlstest.Reply{1: busy, 2: busy, 3: busy, 4: busy, 5: busy}
	info := controls.DelegateInfo{Idempotent: true, Price: &stubbornv1.Price{PerCall: 1}}
	limit := &stubbornv1.SpendLimit{MaxCost: 3.5, OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL}
	run := func(journal []*stubbornv1.RunEvent) (controls.Outcome, []*stubbornv1.RunEvent, *byAttempt) {
		d := &byAttempt{answers: answers, info: info}
		st, rec, recorded := resumeFrom(spec, journal)
		st.Options = &stubbornv1.RunOptions{SpendLimit: limit}
		clock := controlstest.NewClock()
		tr := controls.NewReplayTracker(st, clock, rec, journal)
		tr.Start()
		out := controls.Execute(context.Background(), &controls.Env{Delegates: d, Tracker: tr, Clock: clock}, "task", spec)
		tr.Finish(out.Status, out.Result, out.Winner, out.Reason, out.Code)
		return out, recorded(), d
	}
	want, all, d := run(nil)
	require.Equal(t, stubbornv1.StatusReason_STATUS_REASON_SPEND_LIMIT_REACHED, want.Code, want.Reason)
	require.Len(t, d.called(), 3, "three calls at 1 each fit in 3.5")
	wantCost := all[len(all)-1].GetRunFinished().GetState().GetCost()
	assert.InDelta(t, 3, wantCost.GetTotal(), 1e-9)
	for cut := 1; cut < len(all); cut++ {
		journal := all[:cut]
		if ev := journal[len(journal)-1]; ev.GetAttemptStarted() != nil {
			continue // a cut inside an attempt: interrupted, retried (TestReplayResumesFromEveryEvent)
		}
		out, fresh, _ := run(journal)
		assert.Equal(t, want, out, "cut %d", cut)
		assert.Equal(t, kinds(all[cut:]), kinds(fresh), "cut %d", cut)
		got := fresh[len(fresh)-1].GetRunFinished().GetState().GetCost()
		assert.True(t, proto.Equal(wantCost, got), "cut %d: cost %v, want %v", cut, got, wantCost)
	}
}

// The check before an attempt covers the judge that will rule on its
// answer: an attempt whose call fits but whose judging would not is not
// made.
func TestTheCheckBeforeAnAttemptCoversItsJudge(t *testing.T) {
	t.Parallel()
	f := pricedAt(dear, map[string][]controlstest.Reply{"m": {controlstest.OK("fine")}, "judge": {controlstest.OK(`{"is_failure": false}`)}}, "m", "judge")
	spec := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"m"}, FailureCriteria: "must be fine"}}}
	f.env.Criteria = controls.NewCriteria(spec, "judge", f.env.Delegates)
	limited(f, &stubbornv1.SpendLimit{MaxCost: 0.015, OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL})
	r := f.run(t, testCtx(t), spec)
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_SPEND_LIMIT_REACHED, r.out.Code, r.out.Reason)
	assert.Empty(t, f.fakes.Calls(), "0.01 for the call and 0.01 for its judge pass 0.015")

	g := pricedAt(dear, map[string][]controlstest.Reply{"m": {controlstest.OK("fine")}, "judge": {controlstest.OK(`{"is_failure": false}`)}}, "m", "judge")
	g.env.Criteria = controls.NewCriteria(spec, "judge", g.env.Delegates)
	limited(g, &stubbornv1.SpendLimit{MaxCost: 0.025, OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL})
	r = g.run(t, testCtx(t), spec)
	assert.Equal(t, succeeded, r.out.Status, r.out.Reason)
	assert.InDelta(t, 0.02, r.state.GetCost().GetTotal(), 1e-9, "the call and its judge")
}
