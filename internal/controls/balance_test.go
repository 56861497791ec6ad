package controls_test

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// target is a balance target; weight 0 leaves it unset.
func target(name string, weight int32) *stubbornv1.BalanceTarget {
	t := &stubbornv1.BalanceTarget{Name: name}
	if weight != 0 {
		t.Weight = &weight
	}
	return t
}

func balanceOf(strategy stubbornv1.BalanceStrategy, targets ...*stubbornv1.BalanceTarget) *stubbornv1.BalanceSpec {
	return &stubbornv1.BalanceSpec{Targets: targets, Strategy: strategy}
}

func balanceSpec(b *stubbornv1.BalanceSpec) *stubbornv1.ControlSpec {
	return &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Balance{Balance: b}}
}

const (
	weighted  = stubbornv1.BalanceStrategy_BALANCE_STRATEGY_WEIGHTED
	leastBusy = stubbornv1.BalanceStrategy_BALANCE_STRATEGY_LEAST_BUSY
	byLatency = stubbornv1.BalanceStrategy_BALANCE_STRATEGY_LATENCY
	byUsage   = stubbornv1.BalanceStrategy_BALANCE_STRATEGY_USAGE
	picked    = stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_BALANCE_PICK
)

// balanceFixture is a fixture whose guards tell how the delegates stand,
// and whose randomness is seeded.
func balanceFixture(script map[string][]controlstest.Reply, seed uint64) (*fixture, *controlstest.Standings) {
	f := newFixture(script)
	s := controlstest.NewStandings()
	f.env.Guards = s
	f.env.Rand = rand.New(rand.NewPCG(seed, 7))
	return f, s
}

// TestBalanceStrategiesPick checks that each strategy picks the target its
// figures say, and that the attempt says why.
func TestBalanceStrategiesPick(t *testing.T) {
	t.Parallel()
	abc := []*stubbornv1.BalanceTarget{target("a", 0), target("b", 0), target("c", 0)}
	cases := []struct {
		name     string
		strategy stubbornv1.BalanceStrategy
		stand    map[string]controls.Standing
		want     string
		detail   string
	}{
		{
			name: "least_busy: fewest in flight", strategy: leastBusy,
			stand: map[string]controls.Standing{"a": {InFlight: 3, Room: 1}, "b": {InFlight: 2, Room: 1}, "c": {InFlight: 5, Room: 1}},
			want:  "b", detail: "balance least_busy: 2 in flight (others a 3 in flight, c 5 in flight)",
		},
		{
			name: "latency: lowest recent latency", strategy: byLatency,
			stand: map[string]controls.Standing{
				"a": {Latency: 300 * time.Millisecond, Room: 1}, "b": {Latency: 900 * time.Millisecond, Room: 1}, "c": {Latency: 120 * time.Millisecond, Room: 1},
			},
			want: "c", detail: "balance latency: 120ms recent latency (others a 300ms recent latency, b 900ms recent latency)",
		},
		{
			name: "latency: a target not measured yet is tried first", strategy: byLatency,
			stand: map[string]controls.Standing{"a": {Latency: 300 * time.Millisecond, Room: 1}, "b": {Room: 1}, "c": {Latency: 120 * time.Millisecond, Room: 1}},
			want:  "b", detail: "balance latency: not measured yet (others a 300ms recent latency, c 120ms recent latency)",
		},
		{
			name: "usage: most room left", strategy: byUsage,
			stand: map[string]controls.Standing{"a": {Room: 0.1}, "b": {Room: 0.5}, "c": {Room: 0.8}},
			want:  "c", detail: "balance usage: 80% of its rate limits left (others a 10% of its rate limits left, b 50% of its rate limits left)",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, s := balanceFixture(map[string][]controlstest.Reply{"a": {ok("A")}, "b": {ok("B")}, "c": {ok("C")}}, 1)
			for n, st := range tc.stand {
				s.Set(n, st)
			}
			r := f.run(t, testCtx(t), balanceSpec(balanceOf(tc.strategy, abc...)))
			require.Equal(t, succeeded, r.out.Status)
			assert.Equal(t, tc.want, r.out.Winner)
			assert.Equal(t, []string{tc.want}, delegatesOf(r.calls))
			a := r.state.GetAttemptLog()[0]
			assert.Equal(t, picked, a.GetStartReason())
			assert.Equal(t, tc.detail, a.GetStartDetail())
		})
	}
}

// TestBalanceWeightedSharesByWeight runs a 3:1 balance 400 times, each run
// with randomness of its own (seeded, as the engine seeds each run's): the
// first target gets 75 % ± 7 % of the calls.
func TestBalanceWeightedSharesByWeight(t *testing.T) {
	t.Parallel()
	spec := balanceSpec(balanceOf(weighted, target("first", 3), target("second", 1)))
	counts := map[string]int{}
	for i := range 400 {
		f := newFixture(map[string][]controlstest.Reply{"first": {ok("1")}, "second": {ok("2")}})
		f.env.Rand = rand.New(rand.NewPCG(42, uint64(i)))
		r := f.run(t, testCtx(t), spec)
		require.Equal(t, succeeded, r.out.Status)
		counts[r.out.Winner]++
		assert.Contains(t, r.state.GetAttemptLog()[0].GetStartDetail(), "balance weighted: weight ")
	}
	share := float64(counts["first"]) / 400
	assert.InDelta(t, 0.75, share, 0.07, "first got %d of 400", counts["first"])
	assert.Equal(t, 400, counts["first"]+counts["second"])
}

// TestBalanceMovesOnAndTriesEachOnce checks that a failure moves the
// balance on to the next pick, each target once, until one answers; and
// that every target failing exhausts the run.
func TestBalanceMovesOnAndTriesEachOnce(t *testing.T) {
	t.Parallel()
	f, s := balanceFixture(map[string][]controlstest.Reply{
		"a": {unavailable("a down")}, "b": {unavailable("b down")}, "c": {ok("C")},
	}, 1)
	s.Set("a", controls.Standing{InFlight: 0, Room: 1})
	s.Set("b", controls.Standing{InFlight: 1, Room: 1})
	s.Set("c", controls.Standing{InFlight: 2, Room: 1})
	r := f.run(t, testCtx(t), balanceSpec(balanceOf(leastBusy, target("a", 0), target("b", 0), target("c", 0))))
	require.Equal(t, succeeded, r.out.Status)
	assert.Equal(t, []string{"a", "b", "c"}, delegatesOf(r.calls))
	assert.Equal(t, "balance least_busy: 1 in flight (others c 2 in flight)", r.state.GetAttemptLog()[1].GetStartDetail())
	fs := failureEvents(f.events.All())
	require.Len(t, fs, 2)
	assert.True(t, fs[0].GetWillRetry())
	assert.Equal(t, taskBrief, fs[0].GetNextBrief(), "every target gets the original brief")

	f2, _ := balanceFixture(map[string][]controlstest.Reply{"a": {unavailable("a down")}, "b": {unavailable("b down")}}, 1)
	r = f2.run(t, testCtx(t), balanceSpec(balanceOf(weighted, target("a", 0), target("b", 0))))
	assert.Equal(t, exhausted, r.out.Status)
	assert.Equal(t, "all 2 targets of the balance failed", r.out.Reason)
	assert.ElementsMatch(t, []string{"a", "b"}, delegatesOf(r.calls))
	fs = failureEvents(f2.events.All())
	require.Len(t, fs, 2)
	assert.False(t, fs[1].GetWillRetry())
}

// TestBalanceLeavesOutOpenAndSpent checks that a target whose breaker is
// open, or whose rate limits are spent, is not picked, and the pick says
// so; with every target left out nothing is called and the run says why.
func TestBalanceLeavesOutOpenAndSpent(t *testing.T) {
	t.Parallel()
	script := map[string][]controlstest.Reply{"a": {ok("A")}, "b": {ok("B")}, "c": {ok("C")}}
	f, s := balanceFixture(script, 1)
	s.Set("a", controls.Standing{Open: true, Room: 1})
	s.Set("b", controls.Standing{Room: 0})
	r := f.run(t, testCtx(t), balanceSpec(balanceOf(weighted, target("a", 1000), target("b", 1000), target("c", 1))))
	require.Equal(t, succeeded, r.out.Status)
	assert.Equal(t, []string{"c"}, delegatesOf(r.calls))
	assert.Equal(t, "balance weighted: weight 1 of 1; left out: a (circuit breaker open), b (rate limits spent)",
		r.state.GetAttemptLog()[0].GetStartDetail())

	f, s = balanceFixture(script, 1)
	s.Set("a", controls.Standing{Open: true, Room: 1})
	s.Set("b", controls.Standing{Room: 0})
	r = f.run(t, testCtx(t), balanceSpec(balanceOf(leastBusy, target("a", 0), target("b", 0))))
	assert.Equal(t, exhausted, r.out.Status)
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_ALL_FAILED, r.out.Code)
	assert.Equal(t, "no target of the balance was called: none could take the call: a (circuit breaker open), b (rate limits spent)", r.out.Reason)
	assert.Empty(t, r.calls)
	assert.Empty(t, r.state.GetAttemptLog())

	// Left out after a failure: the failure says no attempt follows.
	f, s = balanceFixture(map[string][]controlstest.Reply{"a": {unavailable("a down")}, "b": {ok("B")}}, 1)
	s.Set("b", controls.Standing{Open: true})
	r = f.run(t, testCtx(t), balanceSpec(balanceOf(weighted, target("a", 0), target("b", 0))))
	assert.Equal(t, exhausted, r.out.Status)
	assert.Equal(t, "1 target of the balance failed and none could take the call: b (circuit breaker open)", r.out.Reason)
	fs := failureEvents(f.events.All())
	require.Len(t, fs, 1)
	assert.False(t, fs[0].GetWillRetry())
}

// TestBalanceMaxAttempts checks the bound on attempts.
func TestBalanceMaxAttempts(t *testing.T) {
	t.Parallel()
	f, _ := balanceFixture(map[string][]controlstest.Reply{
		"a": {unavailable("down")}, "b": {unavailable("down")}, "c": {unavailable("down")}, "d": {ok("D")},
	}, 3)
	spec := balanceOf(weighted, target("a", 0), target("b", 0), target("c", 0), target("d", 0))
	spec.MaxAttempts = ptr(int32(2))
	// d answers, but is picked only if it is among the first two: pin the
	// order with least_busy.
	spec.Strategy = leastBusy
	s := controlstest.NewStandings()
	for i, n := range []string{"a", "b", "c", "d"} {
		s.Set(n, controls.Standing{InFlight: i, Room: 1})
	}
	f.env.Guards = s
	r := f.run(t, testCtx(t), balanceSpec(spec))
	assert.Equal(t, exhausted, r.out.Status)
	assert.Equal(t, "2 of the balance's 4 targets tried (max_attempts), all failed", r.out.Reason)
	assert.Equal(t, []string{"a", "b"}, delegatesOf(r.calls))
}

// TestBalanceFailureCriteriaMoveOn checks that an answer the failure
// criteria reject moves the balance on, as the chain.
func TestBalanceFailureCriteriaMoveOn(t *testing.T) {
	t.Parallel()
	f, s := balanceFixture(map[string][]controlstest.Reply{"a": {ok("no results found")}, "b": {ok("three sources")}}, 1)
	s.Set("b", controls.Standing{InFlight: 1, Room: 1})
	f.env.Criteria = noSources
	r := f.run(t, testCtx(t), balanceSpec(balanceOf(leastBusy, target("a", 0), target("b", 0))))
	require.Equal(t, succeeded, r.out.Status)
	assert.Equal(t, "b", r.out.Winner)
	assert.Equal(t, []stubbornv1.AttemptOutcome{attemptRejected, attemptSucceeded}, outcomes(r.state.GetAttemptLog()))
}

// TestBalanceSkipsNotServing checks that a target whose health check says
// NOT_SERVING is recorded skipped, as in the chain, and the next is picked.
func TestBalanceSkipsNotServing(t *testing.T) {
	t.Parallel()
	f, s := balanceFixture(map[string][]controlstest.Reply{"a": {ok("A")}, "b": {ok("B")}}, 1)
	s.Set("b", controls.Standing{InFlight: 1, Room: 1})
	f.fakes.SetNotServing("a")
	r := f.run(t, testCtx(t), balanceSpec(balanceOf(leastBusy, target("a", 0), target("b", 0))))
	require.Equal(t, succeeded, r.out.Status)
	assert.Equal(t, []stubbornv1.AttemptOutcome{attemptSkipped, attemptSucceeded}, outcomes(r.state.GetAttemptLog()))
	assert.Equal(t, []string{"b"}, delegatesOf(r.calls))
}

// TestBalanceNestsBothWays checks a preset as a balance's target (it has
// no standing, so it stands as the others' average and is never left out)
// and a balance as a preset in a chain.
func TestBalanceNestsBothWays(t *testing.T) {
	t.Parallel()
	f, s := balanceFixture(map[string][]controlstest.Reply{"a": {unavailable("a down")}, "x": {unavailable("x down")}, "y": {ok("Y")}}, 1)
	s.Set("a", controls.Standing{InFlight: 4, Room: 1})
	s.Set("b", controls.Standing{InFlight: 8, Open: true})
	f.env.Presets = controls.PresetMap{"pair": chain("x", "y")}
	r := f.run(t, testCtx(t), balanceSpec(balanceOf(leastBusy, target("b", 0), target("pair", 0), target("a", 0))))
	require.Equal(t, succeeded, r.out.Status)
	assert.Equal(t, "pair", r.out.Winner)
	// pair stands as the average of a and b: 6 in flight, more than a's 4.
	assert.Equal(t, []string{"a", "x", "y"}, delegatesOf(r.calls))
	log := r.state.GetAttemptLog()
	require.Len(t, log, 4)
	assert.Equal(t, "balance least_busy: 6 in flight; left out: b (circuit breaker open)", log[1].GetStartDetail())
	assert.Equal(t, "targets[1]", log[2].GetPath())

	f, s = balanceFixture(map[string][]controlstest.Reply{"p": {unavailable("p down")}, "a": {unavailable("a down")}, "b": {ok("B")}}, 1)
	s.Set("b", controls.Standing{InFlight: 1, Room: 1})
	f.env.Presets = controls.PresetMap{"spread": balanceSpec(balanceOf(leastBusy, target("a", 0), target("b", 0)))}
	r = f.run(t, testCtx(t), chain("p", "spread"))
	require.Equal(t, succeeded, r.out.Status)
	assert.Equal(t, "spread", r.out.Winner)
	assert.Equal(t, []string{"p", "a", "b"}, delegatesOf(r.calls))
	log = r.state.GetAttemptLog()
	require.Len(t, log, 4)
	assert.Equal(t, "chain[1]", log[2].GetPath())
	assert.Equal(t, picked, log[3].GetStartReason())
}

// TestBalanceReplayTakesPicksFromTheJournal records a run, then resumes it
// from every cut of its journal with the standings turned around and other
// randomness: the resumed run calls only what the journal did not answer,
// picks what the journal picked, and ends the same way.
func TestBalanceReplayTakesPicksFromTheJournal(t *testing.T) {
	t.Parallel()
	for _, strategy := range []stubbornv1.BalanceStrategy{weighted, leastBusy, byLatency, byUsage} {
		t.Run(strategy.String(), func(t *testing.T) {
			t.Parallel()
			spec := balanceSpec(balanceOf(strategy, target("a", 5), target("b", 3), target("c", 1)))
			unavailable := controlstest.Fail(codes.Unavailable, "busy")
			d := &byAttempt{answers: map[int32]controlstest.Reply{1: unavailable, 2: unavailable, 3: ok("won")}}
			before := controlstest.NewStandings()
			before.Set("a", controls.Standing{InFlight: 1, Latency: time.Second, Room: 0.9})
			before.Set("b", controls.Standing{InFlight: 2, Latency: 2 * time.Second, Room: 0.5})
			before.Set("c", controls.Standing{InFlight: 3, Latency: 3 * time.Second, Room: 0.2})
			_, journal := runBalance(t, spec, d, before, 1, nil)
			want := attemptDelegates(journal)
			require.Len(t, want, 3)

			after := controlstest.NewStandings() // the other way round
			after.Set("a", controls.Standing{InFlight: 3, Latency: 3 * time.Second, Room: 0.2})
			after.Set("b", controls.Standing{InFlight: 2, Latency: 2 * time.Second, Room: 0.5})
			after.Set("c", controls.Standing{InFlight: 1, Latency: time.Second, Room: 0.9})
			for cut := 1; cut < len(journal); cut++ {
				d := &byAttempt{answers: d.answers}
				out, more := runBalance(t, spec, d, after, 99, journal[:cut])
				assert.NotEqual(t, stubbornv1.StatusReason_STATUS_REASON_NONDETERMINISTIC_REPLAY, out.Code, "cut %d: %s", cut, out.Reason)
				held := attemptDelegates(journal[:cut])
				for _, ev := range more {
					if a := ev.GetAttemptStarted().GetAttempt(); a != nil {
						assert.Greater(t, int(a.GetNumber()), len(held), "cut %d: a pick the journal held was made again", cut)
					}
				}
				for _, n := range d.called() {
					assert.Greater(t, n, answeredIn(journal[:cut]), "cut %d: attempt %d was answered already", cut, n)
				}
				if len(held) == len(want) {
					// Every pick in the journal: the standings now would
					// pick the other way round, and are not asked.
					got := attemptDelegates(append(append([]*stubbornv1.RunEvent(nil), journal[:cut]...), more...))
					assert.Equal(t, want, got, "cut %d: the same picks", cut)
				}
			}
			// The journal with its last pick but not its answer: the pick
			// is the journal's, the answer is live (interrupted, so the
			// run ends exhausted, having tried each target once).
			out, more := runBalance(t, spec, &byAttempt{answers: d.answers}, after, 99, journal[:len(journal)-2])
			assert.Equal(t, exhausted, out.Status)
			assert.Empty(t, attemptDelegates(more))
			// With no journal at all, the same standings pick otherwise.
			_, fresh := runBalance(t, spec, &byAttempt{answers: d.answers}, after, 99, nil)
			if strategy != weighted {
				assert.NotEqual(t, want, attemptDelegates(fresh), "the standings turned around pick otherwise live")
			}
		})
	}
}

// TestBalanceAsksAnInterruptedIdempotentTargetAgain: a run taken over
// while its balance's call was in flight (the journal holds the pick, not
// the answer) picks that target again when its delegate is idempotent —
// the deployment did not fail — instead of counting it tried and ending
// EXHAUSTED once the others failed; a delegate that is not idempotent is
// not asked twice.
func TestBalanceAsksAnInterruptedIdempotentTargetAgain(t *testing.T) {
	t.Parallel()
	spec := balanceSpec(balanceOf(weighted, target("a", 1), target("b", 1)))
	unavailable := controlstest.Fail(codes.Unavailable, "busy")
	s := controlstest.NewStandings()
	// The first pick fails, the second is interrupted: its journal ends
	// with its attempt_started.
	_, journal := runBalance(t, spec, &byAttempt{answers: map[int32]controlstest.Reply{1: unavailable, 2: ok("won")}}, s, 1, nil)
	picks := attemptDelegates(journal)
	require.Len(t, picks, 2)
	cut := len(journal)
	for i, ev := range journal {
		if ev.GetAttemptStarted().GetAttempt().GetNumber() == 2 {
			cut = i + 1
		}
	}
	held := journal[:cut]

	d := &byAttempt{answers: map[int32]controlstest.Reply{3: ok("won again")}, info: controls.DelegateInfo{Idempotent: true}}
	out, more := runBalance(t, spec, d, s, 99, held)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, out.Status, out.Reason)
	again := attemptDelegates(more)
	require.Len(t, again, 1, "one more attempt")
	assert.Equal(t, strings.SplitN(picks[1], ":", 2)[0], strings.SplitN(again[0], ":", 2)[0], "the interrupted target, asked again")
	assert.Equal(t, []int32{3}, d.called())

	d = &byAttempt{answers: map[int32]controlstest.Reply{3: ok("never")}}
	out, more = runBalance(t, spec, d, s, 99, held)
	assert.Equal(t, exhausted, out.Status, "not idempotent: each target once")
	assert.Empty(t, attemptDelegates(more))
	assert.Empty(t, d.called())
}

// runBalance is runOnce with standings and seeded randomness.
func runBalance(t *testing.T, spec *stubbornv1.ControlSpec, d *byAttempt, s *controlstest.Standings, seed uint64, journal []*stubbornv1.RunEvent) (controls.Outcome, []*stubbornv1.RunEvent) {
	t.Helper()
	st, rec, recorded := resumeFrom(spec, journal)
	clock := controlstest.NewClock()
	tr := controls.NewReplayTracker(st, clock, rec, journal)
	tr.Start()
	env := &controls.Env{Delegates: d, Tracker: tr, Clock: clock, Guards: s, Rand: rand.New(rand.NewPCG(seed, seed))}
	out := controls.Execute(t.Context(), env, "task", spec)
	tr.Finish(out.Status, out.Result, out.Winner, out.Reason, out.Code)
	return out, recorded()
}

// attemptDelegates returns the delegates of the attempts started in evs,
// with the start detail, in order.
func attemptDelegates(evs []*stubbornv1.RunEvent) []string {
	var out []string
	for _, ev := range evs {
		if a := ev.GetAttemptStarted().GetAttempt(); a != nil {
			out = append(out, a.GetDelegate()+": "+a.GetStartDetail())
		}
	}
	return out
}

// answeredIn returns the highest attempt number whose end evs hold.
func answeredIn(evs []*stubbornv1.RunEvent) int32 {
	var n int32
	for _, ev := range evs {
		if a := ev.GetAttemptFinished().GetAttempt(); a != nil {
			n = max(n, a.GetNumber())
		}
	}
	return n
}

// TestBalanceNamesItsTargets checks the names a balance reaches.
func TestBalanceNamesItsTargets(t *testing.T) {
	t.Parallel()
	spec := balanceSpec(balanceOf(weighted, target("a", 0), target("p", 2)))
	assert.Equal(t, "balance", controls.ControlName(spec))
	assert.Equal(t, []string{"a", "p"}, controls.Named(spec))
	got := controls.ExpandPresets(spec, controls.PresetMap{"p": chain("x")})
	assert.Len(t, got, 1)
	assert.True(t, strings.HasPrefix(controls.ControlName(got["p"]), "fallback"))
}

// TestBalanceTiesDrawnByWeight checks that equal figures are drawn by
// weight with the run's randomness: the same seed, the same picks; over
// many seeds the heavier target takes its share.
func TestBalanceTiesDrawnByWeight(t *testing.T) {
	t.Parallel()
	spec := balanceSpec(balanceOf(leastBusy, target("light", 1), target("heavy", 9)))
	wins := map[string]int{}
	for i := range 200 {
		f := newFixture(map[string][]controlstest.Reply{"light": {ok("l")}, "heavy": {ok("h")}})
		f.env.Guards = controlstest.NewStandings() // every target idle: a tie
		f.env.Rand = rand.New(rand.NewPCG(9, uint64(i)))
		r := f.run(t, testCtx(t), spec)
		require.Equal(t, succeeded, r.out.Status)
		wins[r.out.Winner]++
		assert.True(t, strings.HasSuffix(r.state.GetAttemptLog()[0].GetStartDetail(), "; a tie of 2 drawn by weight"))
	}
	assert.InDelta(t, 0.9, float64(wins["heavy"])/200, 0.07, "heavy won %d of 200", wins["heavy"])

	again := func() string {
		f := newFixture(map[string][]controlstest.Reply{"light": {ok("l")}, "heavy": {ok("h")}})
		f.env.Guards = controlstest.NewStandings()
		f.env.Rand = rand.New(rand.NewPCG(9, 3))
		return f.run(t, testCtx(t), spec).out.Winner
	}
	assert.Equal(t, again(), again(), "the same seed, the same pick")
}

// TestBalanceStopsWithTheRun checks that a cancelled run stops the
// balance: the call in flight is cancelled and no other target is picked.
func TestBalanceStopsWithTheRun(t *testing.T) {
	t.Parallel()
	f, s := balanceFixture(map[string][]controlstest.Reply{"a": {hang}, "b": {ok("B")}}, 1)
	s.Set("b", controls.Standing{InFlight: 1, Room: 1})
	ctx, cancel := context.WithCancel(testCtx(t))
	done := f.start(ctx, balanceSpec(balanceOf(leastBusy, target("a", 0), target("b", 0))))
	f.waitStarted(t, "a")
	cancel()
	r := f.end(t, done)
	assert.Equal(t, cancelled, r.out.Status)
	assert.Equal(t, []string{"a"}, delegatesOf(r.calls))
	assert.Equal(t, []stubbornv1.AttemptOutcome{attemptCancelled}, outcomes(r.state.GetAttemptLog()))
}
