package controls_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// lostRace is the reason recorded for a candidate cancelled because another
// one won, and the cause its context carries.
const (
	lostRace   = "another candidate won the race"
	lostRaceTo = "cancelled: " + lostRace
	lostTie    = "lost a tie to an earlier candidate"
)

// byDelegate indexes a run's attempts by delegate.
func byDelegate(log []*stubbornv1.Attempt) map[string]*stubbornv1.Attempt {
	out := map[string]*stubbornv1.Attempt{}
	for _, a := range log {
		out[a.GetDelegate()] = a
	}
	return out
}

// recordsByDelegate indexes a run's failure records by delegate.
func recordsByDelegate(fs []*stubbornv1.FailureRecord) map[string]rec {
	out := map[string]rec{}
	for _, r := range recs(fs) {
		out[r.Delegate] = r
	}
	return out
}

// TestRaceEnsures has one row per rule of race's contract (DESIGN.md and
// issue 3: race has no reference file of its own).
func TestRaceEnsures(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		test func(t *testing.T)
	}{
		{"All candidates are called at once with the same brief", func(t *testing.T) {
			f := newFixture(map[string][]controlstest.Reply{
				"a": {unavailable("a broke")},
				"b": {ok("from b")},
				"c": {hang},
			})
			open := f.gate("a", "b", "c")
			done := f.start(testCtx(t), race("a", "b", "c"))
			f.waitStarted(t, "a", "b", "c") // all three in flight before any answers
			open()
			r := f.end(t, done)

			assert.Equal(t, succeeded, r.out.Status)
			assert.Equal(t, "b", r.out.Winner)
			// Attempts are numbered in list order, whoever starts first.
			for i, name := range []string{"a", "b", "c"} {
				require.Len(t, f.started[name], 1)
				assert.Equal(t, taskBrief, f.started[name][0].Brief)
				assert.EqualValues(t, i+1, f.started[name][0].Attempt)
				assert.EqualValues(t, i+1, byDelegate(r.state.GetAttemptLog())[name].GetNumber())
			}
			f.waitReturned(t, "a", "c")
		}},
		{"The first acceptable result wins", func(t *testing.T) {
			f := newFixture(map[string][]controlstest.Reply{
				"a": {ok("not acceptable")},
				"b": {hang},
				"c": {ok("acceptable")},
			})
			f.env.Criteria = rejectTexts{"not acceptable": "not what was asked"}
			open := f.gate("c")
			done := f.start(testCtx(t), race("a", "b", "c"))
			f.waitFailureOf(t, "a") // a answered first, and was rejected
			open()
			r := f.end(t, done)

			assert.Equal(t, succeeded, r.out.Status)
			assert.Equal(t, "c", r.out.Winner)
			assert.Equal(t, "acceptable", r.out.Result.GetText())
			assert.Equal(t, "c", r.state.GetWinner())
			assert.Equal(t, "acceptable", r.state.GetResult().GetText())
			log := byDelegate(r.state.GetAttemptLog())
			assert.Equal(t, attemptRejected, log["a"].GetOutcome())
			assert.Equal(t, attemptCancelled, log["b"].GetOutcome())
			assert.Equal(t, attemptSucceeded, log["c"].GetOutcome())
			f.waitReturned(t, "b")
		}},
		{"The calls still running are cancelled for real: their context is cancelled and the delegates see it", func(t *testing.T) {
			f := newFixture(map[string][]controlstest.Reply{
				"a": {hang},
				"b": {hang},
				"c": {ok("from c")},
			})
			open := f.gate("c")
			done := f.start(testCtx(t), race("a", "b", "c"))
			f.waitStarted(t, "a", "b") // the losers are really running
			open()
			r := f.end(t, done)
			require.Equal(t, "c", r.out.Winner)

			// A Hang reply returns only once its context is done: these
			// returns prove the losers' calls were cancelled.
			for name, back := range f.waitReturned(t, "a", "b") {
				assert.ErrorIs(t, back.err, context.Canceled, name)
				assert.ErrorIs(t, back.ctxErr, context.Canceled, name)
				require.Error(t, back.cause, name)
				assert.Equal(t, lostRace, back.cause.Error(), name)
			}
			log := byDelegate(r.state.GetAttemptLog())
			assert.Equal(t, attemptCancelled, log["a"].GetOutcome())
			assert.Equal(t, attemptCancelled, log["b"].GetOutcome())
		}},
		{"winner, attempts and failure_history (one record per candidate that failed or was cancelled) are filled", func(t *testing.T) {
			f := newFixture(map[string][]controlstest.Reply{
				"a": {unavailable("a broke")},
				"b": {hang},
				"c": {ok("from c")},
			})
			open := f.gate("c")
			done := f.start(testCtx(t), race("a", "b", "c"))
			f.waitFailureOf(t, "a")
			open()
			r := f.end(t, done)

			assert.Equal(t, "c", r.state.GetWinner())
			assert.Equal(t, "from c", r.state.GetResult().GetText())
			assert.EqualValues(t, 3, r.state.GetAttempts())
			assert.Equal(t, []rec{
				{1, "a", "Error: a broke", "a broke"},
				{2, "b", "Error: " + lostRaceTo, lostRaceTo},
			}, recs(r.state.GetFailureHistory()))
			f.waitReturned(t, "b")
		}},
		{"Ties go to the earlier candidate in the list only when they truly finish together", func(t *testing.T) {
			t.Run("a later candidate that finishes first beats an earlier one still running", func(t *testing.T) {
				f := newFixture(map[string][]controlstest.Reply{"a": {hang}, "b": {ok("from b")}})
				done := f.start(testCtx(t), race("a", "b"))
				r := f.end(t, done)
				assert.Equal(t, "b", r.out.Winner)
				assert.Equal(t, rec{1, "a", "Error: " + lostRaceTo, lostRaceTo}, recordsByDelegate(r.state.GetFailureHistory())["a"])
				f.waitReturned(t, "a")
			})
			t.Run("two that finish together: the earlier one wins", testTrueTie)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.test(t)
		})
	}
}

// testTrueTie makes a and b finish together: the race is held still (its
// loop blocked in the event sink while it records x's failure) while a and b
// answer. When it moves on, both answers are waiting, and a, earlier in the
// list, must win.
//
// That both answers were handed to the race before it moves on cannot be
// observed from outside; the test leaves them a settling time, and tries
// again with a longer one when the run shows that no tie happened (b won
// and a was simply cancelled). A tie the race saw always reports b's loss
// as lostTie, so a wrong winner is never mistaken for a missed tie.
func testTrueTie(t *testing.T) {
	for settle := time.Millisecond; ; settle *= 2 {
		f := newFixture(map[string][]controlstest.Reply{
			"a": {ok("from a")},
			"b": {ok("from b")},
			"x": {unavailable("x broke")},
		})
		open := f.gate("a", "b")
		stalled, resume := make(chan struct{}), make(chan struct{})
		var once sync.Once
		f.onEvent = func(ev *stubbornv1.RunEvent) {
			if ev.GetAttemptFinished().GetAttempt().GetDelegate() == "x" {
				once.Do(func() { close(stalled) })
				<-resume
			}
		}
		done := f.start(testCtx(t), race("a", "b", "x"))
		recv(t, stalled, "the race to record x's failure")
		open()
		f.waitReturned(t, "a", "b")
		time.Sleep(settle)
		close(resume)
		r := f.end(t, done)

		recsOf := recordsByDelegate(r.state.GetFailureHistory())
		tie := recsOf["a"].Reason == lostTie || recsOf["b"].Reason == lostTie
		if !tie && settle < 500*time.Millisecond {
			t.Logf("no tie after a settling time of %v; again", settle)
			continue
		}
		require.True(t, tie, "a and b never finished together")
		assert.Equal(t, succeeded, r.out.Status)
		assert.Equal(t, "a", r.out.Winner)
		assert.Equal(t, "from a", r.out.Result.GetText())
		assert.Equal(t, lostTie, recsOf["b"].Reason)
		assert.Equal(t, "x broke", recsOf["x"].Reason)
		assert.Equal(t, attemptCancelled, byDelegate(r.state.GetAttemptLog())["b"].GetOutcome())
		return
	}
}

func TestRaceEdges(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		test func(t *testing.T)
	}{
		{"every candidate fails: EXHAUSTED, one failure record per candidate", func(t *testing.T) {
			f := newFixture(map[string][]controlstest.Reply{
				"a": {unavailable("a broke")},
				"b": {ok("no results found")},
				"c": {fail(codes.Internal, "")},
			})
			f.env.Criteria = noSources
			r := f.run(t, testCtx(t), race("a", "b", "c"))

			assert.Equal(t, exhausted, r.out.Status)
			assert.Nil(t, r.out.Result)
			assert.Empty(t, r.out.Winner)
			assert.Nil(t, r.state.GetResult())
			assert.Empty(t, r.state.GetWinner())
			assert.EqualValues(t, 3, r.state.GetAttempts())
			assert.ElementsMatch(t, []rec{
				{1, "a", "Error: a broke", "a broke"},
				{2, "b", "no results found", "the result has no sources"},
				{3, "c", "Error: ", ""},
			}, recs(r.state.GetFailureHistory()))
			assert.Equal(t, "no results found", byDelegate(r.state.GetAttemptLog())["b"].GetResult().GetText())
		}},
		{"the winner finishes while the others hang forever: the race ends at once, losers CANCELLED", func(t *testing.T) {
			f := newFixture(map[string][]controlstest.Reply{
				"a": {hangForever},
				"b": {hangForever},
				"c": {ok("from c")},
			})
			t.Cleanup(f.fakes.Release)
			open := f.gate("c")
			done := f.start(testCtx(t), race("a", "b", "c"))
			f.waitStarted(t, "a", "b")
			open()
			r := f.end(t, done) // would time out if the race waited for a or b

			assert.Equal(t, succeeded, r.out.Status)
			assert.Equal(t, "c", r.out.Winner)
			log := byDelegate(r.state.GetAttemptLog())
			assert.Equal(t, attemptCancelled, log["a"].GetOutcome())
			assert.Equal(t, attemptCancelled, log["b"].GetOutcome())
			assert.NotNil(t, log["a"].GetEndTime(), "recorded as ended without waiting for it")
			assert.Equal(t, map[string]rec{
				"a": {1, "a", "Error: " + lostRaceTo, lostRaceTo},
				"b": {2, "b", "Error: " + lostRaceTo, lostRaceTo},
			}, recordsByDelegate(r.state.GetFailureHistory()))

			f.fakes.Release() // let the ill-behaved calls end
			f.waitReturned(t, "a", "b")
		}},
		{"a race of one that succeeds", func(t *testing.T) {
			f := newFixture(map[string][]controlstest.Reply{"only": {ok("from only")}})
			r := f.run(t, testCtx(t), race("only"))
			assert.Equal(t, succeeded, r.out.Status)
			assert.Equal(t, "only", r.state.GetWinner())
			assert.EqualValues(t, 1, r.state.GetAttempts())
			assert.Empty(t, r.state.GetFailureHistory())
		}},
		{"a race of one that fails", func(t *testing.T) {
			f := newFixture(map[string][]controlstest.Reply{"only": {unavailable("down")}})
			r := f.run(t, testCtx(t), race("only"))
			assert.Equal(t, exhausted, r.out.Status)
			assert.Equal(t, []rec{{1, "only", "Error: down", "down"}}, recs(r.state.GetFailureHistory()))
		}},
		{"an empty result wins", func(t *testing.T) {
			f := newFixture(map[string][]controlstest.Reply{"a": {ok("")}, "b": {hang}})
			r := f.run(t, testCtx(t), race("a", "b"))
			assert.Equal(t, succeeded, r.out.Status)
			assert.Equal(t, "a", r.out.Winner)
			require.NotNil(t, r.out.Result)
			assert.Empty(t, r.out.Result.GetText())
			f.waitReturned(t, "b")
		}},
		{"the run is cancelled mid-race: CANCELLED", func(t *testing.T) {
			f := newFixture(map[string][]controlstest.Reply{"a": {hang}, "b": {hang}})
			ctx, cancel := context.WithCancelCause(testCtx(t))
			defer cancel(nil)
			done := f.start(ctx, race("a", "b"))
			f.waitStarted(t, "a", "b")
			cancel(errors.New("CancelRun"))
			r := f.end(t, done)

			assert.Equal(t, cancelled, r.out.Status)
			assert.Equal(t, "cancelled: CancelRun", r.out.Reason)
			assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_CANCELLED, r.out.Code)
			assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_CANCELLED, r.state.GetStatusReasonCode())
			assert.Empty(t, r.out.Winner)
			assert.Equal(t, []stubbornv1.AttemptOutcome{attemptCancelled, attemptCancelled}, outcomes(r.state.GetAttemptLog()))
			assert.Len(t, r.state.GetFailureHistory(), 2)
			for name, back := range f.waitReturned(t, "a", "b") {
				assert.ErrorIs(t, back.ctxErr, context.Canceled, name)
			}
		}},
		{"the run is cancelled while the race records a failure: still CANCELLED", func(t *testing.T) {
			// The race is held still while it records x's failure; meanwhile
			// the run is cancelled and a's cancelled call comes back, so that
			// when the race moves on both a's return and the run's end are
			// waiting. Whichever it looks at first, the run was cancelled.
			// Several rounds, since which one it sees first is up to select.
			for round := range 8 {
				f := newFixture(map[string][]controlstest.Reply{"a": {hang}, "x": {unavailable("x broke")}})
				stalled, resume := make(chan struct{}), make(chan struct{})
				var once sync.Once
				f.onEvent = func(ev *stubbornv1.RunEvent) {
					if ev.GetAttemptFinished().GetAttempt().GetDelegate() == "x" {
						once.Do(func() { close(stalled) })
						<-resume
					}
				}
				ctx, cancel := context.WithCancel(testCtx(t))
				done := f.start(ctx, race("a", "x"))
				recv(t, stalled, "the race to record x's failure")
				cancel()
				f.waitReturned(t, "a")
				time.Sleep(time.Millisecond) // let a's return reach the race
				close(resume)
				r := f.end(t, done)
				require.Equal(t, cancelled, r.out.Status, "round %d: %s", round, r.out.Reason)
			}
		}},
		{"an expired deadline: FAILED, run timeout exceeded, no call", func(t *testing.T) {
			f := newFixture(map[string][]controlstest.Reply{"a": {ok("never asked")}, "b": {ok("never asked")}})
			ctx, cancel := context.WithDeadline(testCtx(t), time.Now().Add(-time.Second))
			defer cancel()
			r := f.run(t, ctx, race("a", "b"))
			assert.Equal(t, failed, r.out.Status)
			assert.Equal(t, "run timeout exceeded", r.out.Reason)
			assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_RUN_TIMEOUT, r.out.Code)
			assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_RUN_TIMEOUT, r.state.GetStatusReasonCode())
			assert.Empty(t, r.calls)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.test(t)
		})
	}
}

// hedged is a race of names with hedge_delay d.
func hedged(d time.Duration, names ...string) *stubbornv1.ControlSpec {
	spec := race(names...)
	spec.GetRace().HedgeDelay = durationpb.New(d)
	return spec
}

// Start reasons, shorter.
const (
	atOnce        = stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_AT_ONCE
	afterDelay    = stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_HEDGE_DELAY
	earlierFailed = stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_EARLIER_FAILED
)

// started is when and why each attempt of a run started, by delegate, as
// offsets from the clock's start.
type started struct {
	At     time.Duration
	Reason stubbornv1.AttemptStartReason
}

func startsOf(log []*stubbornv1.Attempt) map[string]started {
	t0 := controlstest.NewClock().Now()
	out := map[string]started{}
	for _, a := range log {
		out[a.GetDelegate()] = started{a.GetStartTime().AsTime().Sub(t0), a.GetStartReason()}
	}
	return out
}

// sleeping waits until the race waits for its hedge delay (n sleeps in
// progress) and returns when each sleep ends, as offsets from the clock's
// start.
func sleeping(t *testing.T, clock *controlstest.ManualClock, n int) []time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), patience)
	defer cancel()
	ends, err := clock.WaitSleeping(ctx, n)
	require.NoError(t, err, "waiting for %d sleeps; in progress: %v", n, clock.Sleeping())
	t0 := controlstest.NewClock().Now()
	var out []time.Duration
	for _, e := range ends {
		out = append(out, e.Sub(t0))
	}
	return out
}

// TestHedgedRace has one row per rule of race.hedge_delay (issue 23, item
// 2), on a clock that moves only when the test moves it: candidates start
// one after another, each when the delay has passed since the one before
// it started, or at once when every candidate started so far has failed;
// the first acceptable answer wins; the candidates not started yet are
// never called.
func TestHedgedRace(t *testing.T) {
	t.Parallel()
	const delay = 100 * time.Millisecond
	type script = map[string][]controlstest.Reply
	tests := []struct {
		name   string
		script script
		test   func(t *testing.T, f *fixture, clock *controlstest.ManualClock)
	}{
		{"a first candidate that answers acceptably within the delay is the only call", script{"a": {ok("from a")}, "b": {ok("from b")}}, func(t *testing.T, f *fixture, clock *controlstest.ManualClock) {
			open := f.gate("a")
			done := f.start(testCtx(t), hedged(delay, "a", "b"))
			f.waitStarted(t, "a")
			assert.Equal(t, []time.Duration{delay}, sleeping(t, clock, 1), "b waits for the delay")
			clock.Advance(delay - time.Millisecond)
			open()
			r := f.end(t, done)

			assert.Equal(t, succeeded, r.out.Status)
			assert.Equal(t, "a", r.out.Winner)
			assert.Empty(t, f.fakes.CallsTo("b"), "b is never called")
			assert.Equal(t, []string{"a"}, delegatesOf(r.calls))
			assert.EqualValues(t, 1, r.state.GetAttempts())
			assert.Equal(t, map[string]started{"a": {0, atOnce}}, startsOf(r.state.GetAttemptLog()))
			assert.Empty(t, r.state.GetFailureHistory())
			assert.Empty(t, sleeping(t, clock, 0), "the delay's timer is stopped")
		}},
		{"a slow first candidate: the second starts exactly when the delay has passed", script{"a": {hang}, "b": {ok("from b")}}, func(t *testing.T, f *fixture, clock *controlstest.ManualClock) {
			done := f.start(testCtx(t), hedged(delay, "a", "b"))
			f.waitStarted(t, "a")
			assert.Equal(t, []time.Duration{delay}, sleeping(t, clock, 1))
			clock.Advance(delay - time.Millisecond)
			assert.Equal(t, []time.Duration{delay}, sleeping(t, clock, 1), "still waiting, 1ms before the delay")
			assert.Empty(t, f.fakes.CallsTo("b"))
			clock.Advance(time.Millisecond)
			r := f.end(t, done)

			assert.Equal(t, succeeded, r.out.Status)
			assert.Equal(t, "b", r.out.Winner)
			assert.Equal(t, map[string]started{"a": {0, atOnce}, "b": {delay, afterDelay}}, startsOf(r.state.GetAttemptLog()))
			var reasons []stubbornv1.AttemptStartReason // as the events say, for the console and the CLI
			for _, ev := range f.events.All() {
				if a := ev.GetAttemptStarted().GetAttempt(); a != nil {
					reasons = append(reasons, a.GetStartReason())
				}
			}
			assert.Equal(t, []stubbornv1.AttemptStartReason{atOnce, afterDelay}, reasons)
			assert.Equal(t, []rec{{1, "a", "Error: " + lostRaceTo, lostRaceTo}}, recs(r.state.GetFailureHistory()))
			assert.Equal(t, attemptCancelled, byDelegate(r.state.GetAttemptLog())["a"].GetOutcome())
			f.waitReturned(t, "a")
		}},
		{"a first candidate that fails fast: the second starts at once, before the delay", script{"a": {unavailable("a broke")}, "b": {ok("from b")}}, func(t *testing.T, f *fixture, _ *controlstest.ManualClock) {
			r := f.run(t, testCtx(t), hedged(delay, "a", "b")) // the clock never moves

			assert.Equal(t, succeeded, r.out.Status)
			assert.Equal(t, "b", r.out.Winner)
			assert.Equal(t, map[string]started{"a": {0, atOnce}, "b": {0, earlierFailed}}, startsOf(r.state.GetAttemptLog()))
			assert.Equal(t, []rec{{1, "a", "Error: a broke", "a broke"}}, recs(r.state.GetFailureHistory()))
		}},
		{"an answer the acceptance criteria reject counts as failed: the next starts at once", script{"a": {ok("not acceptable")}, "b": {ok("from b")}}, func(t *testing.T, f *fixture, _ *controlstest.ManualClock) {
			f.env.Criteria = rejectTexts{"not acceptable": "not what was asked"}
			r := f.run(t, testCtx(t), hedged(delay, "a", "b"))

			assert.Equal(t, "b", r.out.Winner)
			assert.Equal(t, map[string]started{"a": {0, atOnce}, "b": {0, earlierFailed}}, startsOf(r.state.GetAttemptLog()))
			assert.Equal(t, attemptRejected, byDelegate(r.state.GetAttemptLog())["a"].GetOutcome())
		}},
		{"the delay counts from the latest start: a at 0, b at the delay, c at twice the delay", script{"a": {hang}, "b": {hang}, "c": {ok("from c")}}, func(t *testing.T, f *fixture, clock *controlstest.ManualClock) {
			done := f.start(testCtx(t), hedged(delay, "a", "b", "c"))
			f.waitStarted(t, "a")
			assert.Equal(t, []time.Duration{delay}, sleeping(t, clock, 1))
			clock.Advance(delay)
			f.waitStarted(t, "b")
			assert.Equal(t, []time.Duration{2 * delay}, sleeping(t, clock, 1))
			clock.Advance(delay)
			r := f.end(t, done)

			assert.Equal(t, "c", r.out.Winner)
			assert.Equal(t, map[string]started{"a": {0, atOnce}, "b": {delay, afterDelay}, "c": {2 * delay, afterDelay}}, startsOf(r.state.GetAttemptLog()))
			var order []string
			for i, a := range r.state.GetAttemptLog() {
				assert.EqualValues(t, i+1, a.GetNumber())
				order = append(order, a.GetDelegate())
			}
			assert.Equal(t, []string{"a", "b", "c"}, order, "numbered in list order")
			f.waitReturned(t, "a", "b")
		}},
		{"a failure while an earlier candidate still runs does not hurry the next one", script{"a": {hang}, "b": {unavailable("b broke")}, "c": {ok("from c")}}, func(t *testing.T, f *fixture, clock *controlstest.ManualClock) {
			done := f.start(testCtx(t), hedged(delay, "a", "b", "c"))
			f.waitStarted(t, "a")
			sleeping(t, clock, 1)
			clock.Advance(delay)
			f.waitFailureOf(t, "b")
			assert.Equal(t, []time.Duration{2 * delay}, sleeping(t, clock, 1), "a still runs: c waits for its delay")
			assert.Empty(t, f.fakes.CallsTo("c"))
			clock.Advance(delay)
			r := f.end(t, done)

			assert.Equal(t, "c", r.out.Winner)
			assert.Equal(t, map[string]started{"a": {0, atOnce}, "b": {delay, afterDelay}, "c": {2 * delay, afterDelay}}, startsOf(r.state.GetAttemptLog()))
			f.waitReturned(t, "a")
		}},
		{"every candidate fails: EXHAUSTED as without hedging, each started as soon as the ones before failed", script{
			"a": {unavailable("a broke")}, "b": {fail(codes.Internal, "b broke")}, "c": {unavailable("c broke")},
		}, func(t *testing.T, f *fixture, clock *controlstest.ManualClock) {
			r := f.run(t, testCtx(t), hedged(delay, "a", "b", "c"))

			assert.Equal(t, exhausted, r.out.Status)
			assert.Equal(t, "all 3 candidates failed", r.out.Reason)
			assert.Nil(t, r.out.Result)
			assert.Empty(t, r.out.Winner)
			assert.EqualValues(t, 3, r.state.GetAttempts())
			assert.Equal(t, []rec{{1, "a", "Error: a broke", "a broke"}, {2, "b", "Error: b broke", "b broke"}, {3, "c", "Error: c broke", "c broke"}},
				recs(r.state.GetFailureHistory()))
			assert.Equal(t, map[string]started{"a": {0, atOnce}, "b": {0, earlierFailed}, "c": {0, earlierFailed}}, startsOf(r.state.GetAttemptLog()))
			assert.Empty(t, sleeping(t, clock, 0))
		}},
		{"hedge_delay unset: every candidate starts at once, as before hedging", script{"a": {ok("from a")}, "b": {hang}}, func(t *testing.T, f *fixture, clock *controlstest.ManualClock) {
			testAllAtOnce(t, f, clock, race("a", "b"))
		}},
		{"hedge_delay 0: the same", script{"a": {ok("from a")}, "b": {hang}}, func(t *testing.T, f *fixture, clock *controlstest.ManualClock) {
			testAllAtOnce(t, f, clock, hedged(0, "a", "b"))
		}},
		{"the run is cancelled during the delay: CANCELLED, and the next candidate is never called", script{"a": {hang}, "b": {ok("from b")}}, func(t *testing.T, f *fixture, clock *controlstest.ManualClock) {
			ctx, cancel := context.WithCancelCause(testCtx(t))
			defer cancel(nil)
			done := f.start(ctx, hedged(delay, "a", "b"))
			f.waitStarted(t, "a")
			sleeping(t, clock, 1)
			cancel(errors.New("CancelRun"))
			r := f.end(t, done)

			assert.Equal(t, cancelled, r.out.Status)
			assert.Equal(t, "cancelled: CancelRun", r.out.Reason)
			assert.Empty(t, f.fakes.CallsTo("b"))
			assert.EqualValues(t, 1, r.state.GetAttempts())
			assert.Empty(t, sleeping(t, clock, 0))
			f.waitReturned(t, "a")
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := controlstest.NewManualClock()
			tc.test(t, newFixtureWith(tc.script, clock), clock)
		})
	}
}

// testAllAtOnce runs a race of a (answers when let) and b (hangs) that
// does not hedge: both are called before either answers, without the clock
// moving, and both attempts say they started at once.
func testAllAtOnce(t *testing.T, f *fixture, clock *controlstest.ManualClock, spec *stubbornv1.ControlSpec) {
	open := f.gate("a")
	done := f.start(testCtx(t), spec)
	f.waitStarted(t, "a", "b")
	assert.Empty(t, clock.Sleeping(), "nothing waits")
	open()
	r := f.end(t, done)

	assert.Equal(t, "a", r.out.Winner)
	assert.Equal(t, map[string]started{"a": {0, atOnce}, "b": {0, atOnce}}, startsOf(r.state.GetAttemptLog()))
	f.waitReturned(t, "b")
}
