package controls_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// deadlineOnly reports a deadline but never ends: like the manager's
// heldContext while a journal is replayed.
type deadlineOnly struct {
	context.Context
	dl time.Time
}

func (c deadlineOnly) Deadline() (time.Time, bool) { return c.dl, true }

// scriptedBy answers per delegate by attempt number (byAttempt), with a
// default per delegate, and optional analyst.
type scriptedBy struct {
	mu      sync.Mutex
	answers map[int32]controlstest.Reply
	byName  map[string]controlstest.Reply
	info    map[string]controls.DelegateInfo
	calls   []controls.Call
}

func (b *scriptedBy) Call(_ context.Context, c controls.Call) (*stubbornv1.Result, error) {
	b.mu.Lock()
	b.calls = append(b.calls, c)
	r, ok := b.byName[c.Delegate]
	if !ok {
		r = b.answers[c.Attempt]
	}
	b.mu.Unlock()
	if r.Err != nil {
		return nil, r.Err
	}
	return &stubbornv1.Result{Text: r.Text}, nil
}

// made returns the calls made so far: a race's losers may still be
// calling when the run has ended.
func (b *scriptedBy) made() []controls.Call {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]controls.Call(nil), b.calls...)
}

func (b *scriptedBy) Info(n string) controls.DelegateInfo  { return b.info[n] }
func (b *scriptedBy) Serving(context.Context, string) bool { return true }

type world struct {
	spec     *stubbornv1.ControlSpec
	presets  presetMap
	budgets  func() controls.Budgets
	deadline time.Duration // from the clock's start; 0: none
	skew     time.Duration // how much later a resumed run's clock starts
	d        func() *scriptedBy
	// block makes the clock's sleeps wait for ctx (controlstest.Clock's
	// Block): a hedged race's delay never passes by itself.
	block bool
}

func (w world) run(journal []*stubbornv1.RunEvent, resumed bool) (controls.Outcome, []*stubbornv1.RunEvent, *scriptedBy) {
	st, rec, recorded := resumeFrom(w.spec, journal)
	clock := controlstest.NewClock()
	start := clock.Now()
	if resumed && w.skew > 0 {
		_ = clock.Sleep(context.Background(), w.skew)
	}
	clock.Block = w.block
	ctx := context.Background()
	if w.deadline > 0 {
		ctx = deadlineOnly{ctx, start.Add(w.deadline)}
	}
	tr := controls.NewReplayTracker(st, clock, rec, journal)
	tr.Start()
	d := w.d()
	env := &controls.Env{Delegates: d, Tracker: tr, Clock: clock, Presets: w.presets}
	if w.budgets != nil {
		env.Budgets = w.budgets()
	}
	out := controls.Execute(ctx, env, "task", w.spec)
	tr.Finish(out.Status, out.Result, out.Winner, out.Reason, out.Code)
	return out, recorded(), d
}

// key names what an event records, for duplicates.
func key(ev *stubbornv1.RunEvent) string {
	switch {
	case ev.GetAttemptStarted() != nil:
		return fmt.Sprint("started ", ev.GetAttemptStarted().GetAttempt().GetNumber())
	case ev.GetAttemptFinished() != nil:
		return fmt.Sprint("finished ", ev.GetAttemptFinished().GetAttempt().GetNumber())
	case ev.GetFailureAnalyzed() != nil:
		return fmt.Sprint("failure ", ev.GetFailureAnalyzed().GetFailure().GetAttempt())
	case ev.GetBackoffScheduled() != nil:
		// next_attempt is the number the next attempt was to get: in
		// concurrent branches two backoffs may name the same one.
		return fmt.Sprint("backoff ", ev.GetPath(), " ", ev.GetBackoffScheduled().GetNextAttempt())
	}
	return ""
}

// what summarises an event without its times.
func what(ev *stubbornv1.RunEvent) string {
	s := controlstest.Kind(ev) + " " + ev.GetPath()
	switch {
	case ev.GetAttemptStarted() != nil:
		a := ev.GetAttemptStarted().GetAttempt()
		s += fmt.Sprint(" #", a.GetNumber(), " ", a.GetDelegate(), " ", a.GetPath())
		if r := a.GetStartReason(); r != stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_UNSPECIFIED {
			s += " " + r.String()
		}
	case ev.GetAttemptFinished() != nil:
		a := ev.GetAttemptFinished().GetAttempt()
		s += fmt.Sprint(" #", a.GetNumber(), " ", a.GetDelegate(), " ", a.GetOutcome())
	case ev.GetFailureAnalyzed() != nil:
		f := ev.GetFailureAnalyzed()
		s += fmt.Sprintf(" #%d %s retry=%v why=%q (%v) analysis=%q", f.GetFailure().GetAttempt(), f.GetFailure().GetDelegate(), f.GetWillRetry(), f.GetFailure().GetNotRetriedReason(), f.GetFailure().GetNotRetriedCode(), f.GetFailure().GetAnalysis())
	case ev.GetDecisionRequested() != nil:
		s += fmt.Sprintf(" why=%q (%v)", ev.GetDecisionRequested().GetReason(), ev.GetDecisionRequested().GetReasonCode())
	case ev.GetBackoffScheduled() != nil:
		b := ev.GetBackoffScheduled()
		s += fmt.Sprint(" next=", b.GetNextAttempt(), " bound=", b.GetBound().AsDuration(), " hint=", b.GetFromHint(), " zero=", b.GetWait().AsDuration() == 0)
	case ev.GetRunFinished() != nil:
		st := ev.GetRunFinished().GetState()
		s += " " + st.GetStatus().String() + " " + st.GetStatusReason() + " (" + st.GetStatusReasonCode().String() + ")"
	}
	return s
}

// checkEveryCut records a run of w, then resumes it from every cut of its
// journal: no recorded attempt is called again and no recorded step is
// recorded twice; with strict, a run resumed at a clean cut (no attempt in
// flight) also ends as the original did, with the same events after the
// cut (times aside).
func checkEveryCut(t *testing.T, w world, strict bool) {
	want, all, _ := w.run(nil, false)
	t.Logf("live: %s %s, %d events", want.Status, want.Reason, len(all))
	checkFold(t, all, "live")
	for cut := 1; cut < len(all); cut++ {
		journal := all[:cut]
		out, fresh, d := w.run(journal, true)
		checkFold(t, append(journal[:cut:cut], fresh...), fmt.Sprint("cut ", cut))
		seen := map[string]bool{}
		finished := map[int32]bool{}
		inFlight := false
		for _, ev := range journal {
			seen[key(ev)] = true
			if a := ev.GetAttemptFinished(); a != nil {
				finished[a.GetAttempt().GetNumber()] = true
			}
			if ev.GetAttemptStarted() != nil {
				inFlight = true
			}
			if ev.GetAttemptFinished() != nil {
				inFlight = false
			}
		}
		for _, ev := range fresh {
			if k := key(ev); k != "" {
				assert.False(t, seen[k], "cut %d: %s recorded twice (journal and resumed run): %s", cut, k, what(ev))
				seen[k] = true
			}
		}
		for _, c := range d.made() {
			if c.Delegate != "analyst" {
				assert.False(t, finished[c.Attempt], "cut %d: attempt %d called again", cut, c.Attempt)
			}
		}
		if inFlight || !strict {
			continue
		}
		var wantWhat, gotWhat []string
		for _, ev := range all[cut:] {
			wantWhat = append(wantWhat, what(ev))
		}
		for _, ev := range fresh {
			gotWhat = append(gotWhat, what(ev))
		}
		assert.Equal(t, want.Status, out.Status, "cut %d", cut)
		assert.Equal(t, want.Reason, out.Reason, "cut %d", cut)
		assert.Equal(t, want.Code, out.Code, "cut %d", cut)
		assert.Equal(t, wantWhat, gotWhat, "cut %d (after %s)", cut, what(journal[cut-1]))
	}
}

var unavail = controlstest.Fail(codes.Unavailable, "busy")

func rvRetry(target string, attempts int32, onEx stubbornv1.OnExhausted) *stubbornv1.ControlSpec {
	return &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
		Target: target, Attempts: &attempts, BaseWait: durationpb.New(time.Second), OnExhausted: onEx,
	}}}
}

// A non-idempotent delegate whose call provably was not sent: the original
// retries it.
func TestReplayKeepsARetryOfACallNotSent(t *testing.T) {
	notSent := controlstest.Reply{Err: &controls.CallError{Code: codes.Unavailable, Message: "refused", NotSent: true}}
	checkEveryCut(t, world{
		spec: rvRetry("d", 3, stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL),
		d: func() *scriptedBy {
			return &scriptedBy{answers: map[int32]controlstest.Reply{1: notSent, 2: notSent, 3: controlstest.OK("ok")}}
		},
	}, true)
}

// A retry preset nested in a fallback chain.
func TestReplayRunsANestedRetryInAFallbackChainAgain(t *testing.T) {
	idem := map[string]controls.DelegateInfo{"a": {Idempotent: true}, "b": {Idempotent: true}}
	checkEveryCut(t, world{
		spec:    &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"ra", "b"}}}},
		presets: presetMap{"ra": rvRetry("a", 2, stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL)},
		d: func() *scriptedBy {
			return &scriptedBy{info: idem, byName: map[string]controlstest.Reply{"a": unavail, "b": controlstest.OK("b")}}
		},
	}, true)
}

// A run resumed after its deadline passed: replayed decisions hold.
func TestReplayPastTheDeadlineRepeatsNothing(t *testing.T) {
	checkEveryCut(t, world{
		spec:     rvRetry("d", 3, stubbornv1.OnExhausted_ON_EXHAUSTED_ASK),
		deadline: time.Hour, skew: 2 * time.Hour,
		d: func() *scriptedBy {
			return &scriptedBy{info: map[string]controls.DelegateInfo{"d": {Idempotent: true}},
				answers: map[int32]controlstest.Reply{1: unavail, 2: unavail, 3: controlstest.OK("ok")}}
		},
	}, false)
}

// Budgets: a resumed run meets a drained budget.
func TestReplayWithADrainedBudgetRepeatsNothing(t *testing.T) {
	checkEveryCut(t, world{
		spec: rvRetry("d", 3, stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL),
		budgets: func() controls.Budgets {
			s, _ := controls.NewBudgetSet(2, 0.1)
			return s
		},
		d: func() *scriptedBy {
			return &scriptedBy{info: map[string]controls.DelegateInfo{"d": {Idempotent: true}},
				answers: map[int32]controlstest.Reply{1: unavail, 2: unavail, 3: controlstest.OK("ok")}}
		},
	}, false)
}

// Retry-with-learning with an analyst.
func TestReplayOfLearningAsksTheAnalystOnlyWhenItsAnswerIsMissing(t *testing.T) {
	checkEveryCut(t, world{
		spec: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_RetryWithLearning{RetryWithLearning: &stubbornv1.RetryWithLearningSpec{
			Target: "d", MaxRetries: ptr(int32(3)), Analyst: "analyst"}}},
		d: func() *scriptedBy {
			return &scriptedBy{info: map[string]controls.DelegateInfo{"d": {Idempotent: true}},
				byName:  map[string]controlstest.Reply{"analyst": controlstest.OK("try harder")},
				answers: map[int32]controlstest.Reply{1: unavail, 2: unavail, 3: controlstest.OK("ok")}}
		},
	}, true)
}

// A run stopped after deciding to retry but before drawing its wait, and
// resumed when no wait fits before its deadline any more, ends as a live
// run would have: "retry would end after the run's deadline", with no
// backoff and no further attempt.
func TestAResumedRetryFitsItsNewWaitBeforeTheDeadline(t *testing.T) {
	w := world{
		spec:     rvRetry("d", 3, stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL),
		deadline: time.Hour, skew: time.Hour,
		d: func() *scriptedBy {
			return &scriptedBy{info: map[string]controls.DelegateInfo{"d": {Idempotent: true}},
				answers: map[int32]controlstest.Reply{1: unavail, 2: controlstest.OK("ok")}}
		},
	}
	live, all, _ := w.run(nil, false)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, live.Status, live.Reason)
	cut := 0
	for i, ev := range all {
		if ev.GetFailureAnalyzed().GetWillRetry() {
			cut = i + 1
		}
	}
	if !assert.NotZero(t, cut, "the live run retried") {
		return
	}
	assert.NotNil(t, all[cut].GetBackoffScheduled(), "the cut falls between the decision and its wait")

	out, fresh, d := w.run(all[:cut], true)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, out.Status)
	assert.Equal(t, "retry would end after the run's deadline", out.Reason)
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_RETRY_PAST_DEADLINE, out.Code)
	assert.Empty(t, d.made(), "no attempt after the deadline")
	assert.Equal(t, []string{"run_finished"}, kinds(fresh))
}

// A health answer is a recorded effect: a fallback chain resumed after it
// skipped a delegate that was NOT_SERVING skips it again, and does not
// call it, although it serves now (as the tree before the effects did).
func TestReplayTakesHealthFromTheJournal(t *testing.T) {
	spec := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"a", "b"}}}}
	script := func() map[string][]controlstest.Reply {
		return map[string][]controlstest.Reply{"a": {controlstest.OK("a")}, "b": {controlstest.OK("b")}}
	}
	d := controlstest.NewDelegates(script())
	d.SetNotServing("a")
	st, rec, recorded := resumeFrom(spec, nil)
	tr := controls.NewReplayTracker(st, controlstest.NewClock(), rec, nil)
	tr.Start()
	out := controls.Execute(context.Background(), &controls.Env{Delegates: d, Tracker: tr, Clock: controlstest.NewClock()}, "task", spec)
	tr.Finish(out.Status, out.Result, out.Winner, out.Reason, out.Code)
	all := recorded()
	assert.Equal(t, "b", out.Winner)
	assert.Equal(t, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SKIPPED, all[2].GetAttemptFinished().GetAttempt().GetOutcome())

	for _, cut := range []int{3, 4} { // after the skip; after its failure record
		resumed := controlstest.NewDelegates(script()) // a serves now
		out, fresh := func() (controls.Outcome, []*stubbornv1.RunEvent) {
			st, rec, recorded := resumeFrom(spec, all[:cut])
			tr := controls.NewReplayTracker(st, controlstest.NewClock(), rec, all[:cut])
			tr.Start()
			out := controls.Execute(context.Background(), &controls.Env{Delegates: resumed, Tracker: tr, Clock: controlstest.NewClock()}, "task", spec)
			tr.Finish(out.Status, out.Result, out.Winner, out.Reason, out.Code)
			return out, recorded()
		}()
		assert.Equal(t, "b", out.Winner, "cut %d", cut)
		assert.Empty(t, resumed.CallsTo("a"), "cut %d: a is not called", cut)
		assert.Equal(t, kinds(all[cut:]), kinds(fresh), "cut %d", cut)
	}
}

// A hedged race whose candidates fail fast, each next one starting at
// once: resumed at every cut, it starts the same candidates for the same
// reasons and calls none again (its delay never passes by itself).
func TestReplayOfAHedgedRaceWhoseCandidatesFail(t *testing.T) {
	checkEveryCut(t, world{
		spec:  hedged(100*time.Millisecond, "a", "b", "c"),
		block: true,
		d: func() *scriptedBy {
			return &scriptedBy{byName: map[string]controlstest.Reply{"a": unavail, "b": unavail, "c": controlstest.OK("c")}}
		},
	}, true)
}

// A hedged race cut mid-race resumes without waiting again: a hangs, b
// starts when the delay has passed and wins. The resumed runs' clock never
// moves, so any wait for a delay would hang them.
func TestAHedgedRaceResumedMidRaceDoesNotWaitAgain(t *testing.T) {
	const delay = 100 * time.Millisecond
	spec := hedged(delay, "a", "b")
	script := func() *controlstest.Delegates {
		return controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {hang}, "b": {controlstest.OK("from b")}})
	}
	// run runs spec, replaying journal; advance moves the clock once the
	// race waits for its delay.
	run := func(journal []*stubbornv1.RunEvent, advance bool) (controls.Outcome, []*stubbornv1.RunEvent, *controlstest.Delegates) {
		st, rec, recorded := resumeFrom(spec, journal)
		clock := controlstest.NewManualClock()
		tr := controls.NewReplayTracker(st, clock, rec, journal)
		tr.Start()
		d := script()
		done := make(chan controls.Outcome, 1)
		go func() {
			out := controls.Execute(testCtx(t), &controls.Env{Delegates: d, Tracker: tr, Clock: clock}, "task", spec)
			tr.Finish(out.Status, out.Result, out.Winner, out.Reason, out.Code)
			done <- out
		}()
		if advance {
			sleeping(t, clock, 1)
			clock.Advance(delay)
		}
		return recv(t, done, "the race to end"), recorded(), d
	}
	live, all, _ := run(nil, true)
	require.Equal(t, "b", live.Winner)
	cutAfter := func(k string) int {
		for i, ev := range all {
			if key(ev) == k {
				return i + 1
			}
		}
		t.Fatalf("no %s in %v", k, kinds(all))
		return 0
	}
	startOf := func(evs []*stubbornv1.RunEvent, delegate string) *stubbornv1.Attempt {
		for _, ev := range evs {
			if a := ev.GetAttemptStarted().GetAttempt(); a.GetDelegate() == delegate {
				return a
			}
		}
		return nil
	}
	require.Equal(t, stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_HEDGE_DELAY, startOf(all, "b").GetStartReason())

	t.Run("cut after a started, before b: a was in flight and failed, so b starts at once", func(t *testing.T) {
		out, fresh, d := run(all[:cutAfter("started 1")], false)
		assert.Equal(t, "b", out.Winner)
		assert.Empty(t, d.CallsTo("a"), "a is not called again")
		assert.Len(t, d.CallsTo("b"), 1)
		assert.Equal(t, []string{"attempt_finished", "failure_analyzed", "attempt_started", "attempt_finished", "run_finished"}, kinds(fresh))
		assert.Equal(t, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_INTERRUPTED, fresh[0].GetAttemptFinished().GetAttempt().GetOutcome())
		assert.Equal(t, stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_EARLIER_FAILED, startOf(fresh, "b").GetStartReason())
	})
	t.Run("cut after b started: b starts again from the journal, without waiting, and nothing is called", func(t *testing.T) {
		journal := all[:cutAfter("started 2")]
		out, fresh, d := run(journal, false)
		assert.Empty(t, d.Calls())
		for _, ev := range fresh {
			assert.Nil(t, ev.GetAttemptStarted(), "no start is recorded twice: %s", what(ev))
		}
		// Both calls were in flight when the run stopped: a race does not
		// call its candidates again.
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED, out.Status)
		st := fresh[len(fresh)-1].GetRunFinished().GetState()
		require.Len(t, st.GetAttemptLog(), 2)
		assert.Equal(t, startOf(journal, "b").GetStartTime().AsTime(), st.GetAttemptLog()[1].GetStartTime().AsTime())
		assert.Equal(t, stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_HEDGE_DELAY, st.GetAttemptLog()[1].GetStartReason())
	})
	for _, k := range []string{"finished 2", "finished 1", "failure 1"} {
		t.Run("cut after "+k+": b wins again, and nothing is called", func(t *testing.T) {
			journal := all[:cutAfter(k)]
			out, fresh, d := run(journal, false)
			assert.Equal(t, "b", out.Winner)
			assert.Equal(t, "from b", out.Result.GetText())
			assert.Empty(t, d.Calls())
			seen := map[string]bool{}
			for _, ev := range journal {
				seen[key(ev)] = true
			}
			for _, ev := range fresh {
				if k := key(ev); k != "" {
					assert.False(t, seen[k], "%s recorded twice", k)
				}
			}
		})
	}
}

// checkFold checks that a run's journal folds (controls.Fold) to the state
// its run_finished carries, the tracker's, and that each event carries the
// status its fold reached.
func checkFold(t *testing.T, journal []*stubbornv1.RunEvent, what string) {
	t.Helper()
	end := journal[len(journal)-1].GetRunFinished().GetState()
	require.NotNil(t, end, "%s: the journal ends with run_finished", what)
	assert.True(t, proto.Equal(end, controls.Fold(journal)), "%s: the journal folds to the final state\nfold:  %v\nfinal: %v", what, controls.Fold(journal), end)
	status := stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED
	for _, ev := range journal {
		status = controls.NextStatus(status, ev)
		assert.Equal(t, status, ev.GetStatus(), "%s: the status of seq %d (%s)", what, ev.GetSeq(), controlstest.Kind(ev))
	}
}
