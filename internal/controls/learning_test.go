package controls_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// learningCase is one run of retry-with-learning over the delegate "target".
type learningCase struct {
	name       string
	script     []controlstest.Reply // target's answers, in order; the last repeats
	maxRetries *int32               // nil: unset
	criteria   controls.Criteria    // nil: only errors fail
	check      func(t *testing.T, r ran, f *fixture)
}

func runLearningCases(t *testing.T, cases []learningCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(map[string][]controlstest.Reply{"target": tc.script})
			f.env.Criteria = tc.criteria
			r := f.run(t, testCtx(t), learning(tc.maxRetries))
			tc.check(t, r, f)
		})
	}
}

// noSources rejects the answer "no results found".
var noSources = rejectTexts{"no results found": "the result has no sources"}

// TestRetryWithLearningEnsures has one row per line of the Ensures section
// of spec/retry-with-learning.md.
func TestRetryWithLearningEnsures(t *testing.T) {
	t.Parallel()
	runLearningCases(t, []learningCase{
		{
			name:   "First attempt: target receives the original brief",
			script: []controlstest.Reply{unavailable("backend down"), ok("three sources")},
			check: func(t *testing.T, r ran, _ *fixture) {
				require.NotEmpty(t, r.calls)
				assert.Equal(t, controls.Call{Delegate: "target", Brief: taskBrief, Attempt: 1, Task: true}, r.calls[0])
				assert.Equal(t, taskBrief, r.state.GetAttemptLog()[0].GetBrief())
			},
		},
		{
			name: "On failure: analyze what went wrong, construct enriched brief with: " +
				"original task, what was tried, why it failed, what to try differently",
			script:   []controlstest.Reply{ok("no results found"), ok("three sources")},
			criteria: noSources,
			check: func(t *testing.T, r ran, _ *fixture) {
				require.Len(t, r.calls, 2)
				got := r.calls[1].Brief
				assert.Equal(t, enriched(taskBrief, [2]string{"no results found", "the result has no sources"}), got)
				assert.True(t, strings.HasPrefix(got, taskBrief+"\n\n"), "starts with the original task")
				assert.Contains(t, got, "Attempt 1: no results found\n", "what was tried")
				assert.Contains(t, got, "Failure reason: the result has no sources\n", "why it failed")
				assert.Contains(t, got, "You MUST try a different approach.", "what to try differently")
			},
		},
		{
			name: "Each retry receives the FULL failure history, not just the last attempt",
			script: []controlstest.Reply{
				unavailable("backend down"),
				ok("no results found"),
				fail(codes.DeadlineExceeded, "took too long"),
				ok("three sources"),
			},
			maxRetries: proto.Int32(4),
			criteria:   noSources,
			check: func(t *testing.T, r ran, _ *fixture) {
				h1 := [2]string{"Error: backend down", "backend down"}
				h2 := [2]string{"no results found", "the result has no sources"}
				h3 := [2]string{"Error: took too long", "took too long"}
				assert.Equal(t, []string{
					taskBrief,
					enriched(taskBrief, h1),
					enriched(taskBrief, h1, h2),
					enriched(taskBrief, h1, h2, h3),
				}, briefs(r.calls))
			},
		},
		{
			name:       "Returns on first success",
			script:     []controlstest.Reply{unavailable("backend down"), ok("first"), ok("second")},
			maxRetries: proto.Int32(5),
			check: func(t *testing.T, r ran, _ *fixture) {
				assert.Equal(t, succeeded, r.out.Status)
				assert.Equal(t, "first", r.out.Result.GetText())
				assert.Equal(t, "target", r.out.Winner)
				assert.Len(t, r.calls, 2, "no attempt after the first success")
			},
		},
		{
			name:     "After max_retries: returns the last result with &controlState.failure_history",
			script:   []controlstest.Reply{ok("bad 1"), ok("bad 2"), ok("bad 3")},
			criteria: rejectTexts{"bad 1": "one", "bad 2": "two", "bad 3": "three"},
			check: func(t *testing.T, r ran, _ *fixture) {
				// Stubborn's reading (DESIGN.md): EXHAUSTED, result unset, the
				// last result kept in the attempt log.
				assert.Equal(t, exhausted, r.out.Status)
				assert.Nil(t, r.out.Result)
				assert.Nil(t, r.state.GetResult())
				log := r.state.GetAttemptLog()
				require.Len(t, log, 3)
				assert.Equal(t, "bad 3", log[2].GetResult().GetText(), "last result visible in the attempt log")
				assert.Equal(t, attemptRejected, log[2].GetOutcome())
				assert.Equal(t, []rec{
					{1, "target", "bad 1", "one"},
					{2, "target", "bad 2", "two"},
					{3, "target", "bad 3", "three"},
				}, recs(r.state.GetFailureHistory()))
			},
		},
		{
			name:   "&controlState.result contains the final output",
			script: []controlstest.Reply{unavailable("backend down"), ok("three sources")},
			check: func(t *testing.T, r ran, _ *fixture) {
				assert.Equal(t, succeeded, r.state.GetStatus())
				assert.Equal(t, "three sources", r.state.GetResult().GetText())
				assert.Equal(t, "target", r.state.GetWinner())
			},
		},
		{
			name:   "&controlState.attempts contains the attempt count",
			script: []controlstest.Reply{unavailable("one"), unavailable("two"), ok("three sources")},
			check: func(t *testing.T, r ran, _ *fixture) {
				assert.EqualValues(t, 3, r.state.GetAttempts())
				require.Len(t, r.state.GetAttemptLog(), 3)
				for i, a := range r.state.GetAttemptLog() {
					assert.EqualValues(t, i+1, a.GetNumber())
				}
				// The delegate does not know it is retried: the same delegate,
				// the attempt number only as metadata.
				assert.Equal(t, []controls.Call{
					{Delegate: "target", Brief: taskBrief, Attempt: 1, Task: true},
					{Delegate: "target", Brief: enriched(taskBrief, [2]string{"Error: one", "one"}), Attempt: 2, Task: true,
						Added: strings.TrimPrefix(enriched(taskBrief, [2]string{"Error: one", "one"}), taskBrief)},
					{Delegate: "target", Brief: enriched(taskBrief, [2]string{"Error: one", "one"}, [2]string{"Error: two", "two"}), Attempt: 3, Task: true,
						Added: strings.TrimPrefix(enriched(taskBrief, [2]string{"Error: one", "one"}, [2]string{"Error: two", "two"}), taskBrief)},
				}, r.calls)
			},
		},
		{
			name:     "&controlState.failure_history contains analysis of each failed attempt",
			script:   []controlstest.Reply{unavailable("backend down"), ok("no results found"), ok("three sources")},
			criteria: noSources,
			check: func(t *testing.T, r ran, _ *fixture) {
				assert.Equal(t, []rec{
					{1, "target", "Error: backend down", "backend down"},
					{2, "target", "no results found", "the result has no sources"},
				}, recs(r.state.GetFailureHistory()))
			},
		},
	})
}

func TestRetryWithLearningEdges(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("0123456789", 1024) // 10 kB
	multi := strings.Repeat("aé日🙂", 75)        // 300 characters, 1 to 4 bytes each
	runLearningCases(t, []learningCase{
		{
			name:       "max_retries 1 failing: one attempt, then EXHAUSTED",
			script:     []controlstest.Reply{unavailable("backend down"), ok("never asked")},
			maxRetries: proto.Int32(1),
			check: func(t *testing.T, r ran, f *fixture) {
				assert.Equal(t, exhausted, r.out.Status)
				assert.Len(t, r.calls, 1)
				assert.EqualValues(t, 1, r.state.GetAttempts())
				assert.Len(t, r.state.GetFailureHistory(), 1)
				fa := failureEvents(f.events.All())
				require.Len(t, fa, 1)
				assert.False(t, fa[0].GetWillRetry())
				assert.Empty(t, fa[0].GetNextBrief())
			},
		},
		{
			name:       "max_retries 1 succeeding",
			script:     []controlstest.Reply{ok("three sources")},
			maxRetries: proto.Int32(1),
			check: func(t *testing.T, r ran, _ *fixture) {
				assert.Equal(t, succeeded, r.out.Status)
				assert.EqualValues(t, 1, r.state.GetAttempts())
			},
		},
		{
			name:   "max_retries unset: 3 attempts",
			script: []controlstest.Reply{unavailable("backend down")},
			check: func(t *testing.T, r ran, _ *fixture) {
				assert.Equal(t, exhausted, r.out.Status)
				assert.Len(t, r.calls, controls.DefaultMaxRetries)
				assert.EqualValues(t, 3, r.state.GetAttempts())
				assert.Len(t, r.state.GetFailureHistory(), 3)
			},
		},
		{
			name:   "an empty result is a success",
			script: []controlstest.Reply{ok(""), ok("never asked")},
			check: func(t *testing.T, r ran, _ *fixture) {
				assert.Equal(t, succeeded, r.out.Status)
				require.NotNil(t, r.out.Result)
				assert.Empty(t, r.out.Result.GetText())
				assert.Len(t, r.calls, 1)
				assert.Empty(t, r.state.GetFailureHistory())
			},
		},
		{
			name:   "an error with an empty message",
			script: []controlstest.Reply{unavailable(""), ok("three sources")},
			check: func(t *testing.T, r ran, _ *fixture) {
				assert.Equal(t, []rec{{1, "target", "Error: ", ""}}, recs(r.state.GetFailureHistory()))
				require.Len(t, r.calls, 2)
				assert.Equal(t, enriched(taskBrief, [2]string{"Error: ", ""}), r.calls[1].Brief)
				e := r.state.GetAttemptLog()[0].GetError()
				assert.EqualValues(t, codes.Unavailable, e.GetCode())
				assert.Empty(t, e.GetMessage())
			},
		},
		{
			name:   "an error with a 10 kB message: summary and brief carry its first MaxReasonBytes, marked cut",
			script: []controlstest.Reply{unavailable(long), ok("three sources")},
			check: func(t *testing.T, r ran, _ *fixture) {
				cut := long[:controls.MaxReasonBytes] + " …[6144 bytes cut]"
				assert.Equal(t, []rec{{1, "target", "Error: " + cut, cut}}, recs(r.state.GetFailureHistory()))
				require.Len(t, r.calls, 2)
				assert.Equal(t, enriched(taskBrief, [2]string{"Error: " + cut, cut}), r.calls[1].Brief)
			},
		},
		{
			name:     "a result over 200 characters: summary is exactly its first 200 characters",
			script:   []controlstest.Reply{ok(multi), ok("three sources")},
			criteria: rejectTexts{multi: "too long"},
			check: func(t *testing.T, r ran, _ *fixture) {
				want := strings.Repeat("aé日🙂", 50)
				require.Len(t, r.state.GetFailureHistory(), 1)
				got := r.state.GetFailureHistory()[0].GetSummary()
				assert.Equal(t, want, got)
				assert.Equal(t, 200, utf8.RuneCountInString(got))
				assert.True(t, utf8.ValidString(got))
				assert.Equal(t, multi, r.state.GetAttemptLog()[0].GetResult().GetText(), "the log keeps the whole result")
				require.Len(t, r.calls, 2)
				assert.Equal(t, enriched(taskBrief, [2]string{want, "too long"}), r.calls[1].Brief)
			},
		},
		{
			name:     "a result of exactly 200 multi-byte characters is kept whole",
			script:   []controlstest.Reply{ok(strings.Repeat("日", 200)), ok("three sources")},
			criteria: rejectTexts{strings.Repeat("日", 200): "wrong language"},
			check: func(t *testing.T, r ran, _ *fixture) {
				require.Len(t, r.state.GetFailureHistory(), 1)
				assert.Equal(t, strings.Repeat("日", 200), r.state.GetFailureHistory()[0].GetSummary())
			},
		},
		{
			name: "all attempts fail: EXHAUSTED, no result, no winner, full history, last result in the log",
			script: []controlstest.Reply{
				unavailable("backend down"), ok("no results found"), ok("still nothing"),
			},
			criteria: rejectTexts{"no results found": "no sources", "still nothing": "no sources again"},
			check: func(t *testing.T, r ran, _ *fixture) {
				assert.Equal(t, exhausted, r.out.Status)
				assert.Nil(t, r.out.Result)
				assert.Empty(t, r.out.Winner)
				assert.Equal(t, exhausted, r.state.GetStatus())
				assert.Nil(t, r.state.GetResult())
				assert.Empty(t, r.state.GetWinner())
				assert.EqualValues(t, 3, r.state.GetAttempts())
				assert.Equal(t, []rec{
					{1, "target", "Error: backend down", "backend down"},
					{2, "target", "no results found", "no sources"},
					{3, "target", "still nothing", "no sources again"},
				}, recs(r.state.GetFailureHistory()))
				log := r.state.GetAttemptLog()
				assert.Equal(t, []stubbornv1.AttemptOutcome{attemptError, attemptRejected, attemptRejected}, outcomes(log))
				assert.Equal(t, "still nothing", log[2].GetResult().GetText())
			},
		},
		{
			name:     "the criteria's own error fails the attempt with that reason",
			script:   []controlstest.Reply{ok("three sources")},
			criteria: brokenJudge{err: &controls.CallError{Code: codes.Unavailable, Message: "judge is down"}},
			check: func(t *testing.T, r ran, f *fixture) {
				assert.Equal(t, exhausted, r.out.Status)
				require.NotEmpty(t, r.state.GetFailureHistory())
				assert.Equal(t, rec{1, "target", "three sources", "judge is down"}, recs(r.state.GetFailureHistory())[0])
				assert.Equal(t, attemptRejected, r.state.GetAttemptLog()[0].GetOutcome())
				var notes []string
				for _, ev := range f.events.All() {
					if af := ev.GetAttemptFinished(); af != nil {
						notes = append(notes, af.GetNote())
					}
				}
				require.NotEmpty(t, notes)
				assert.Contains(t, notes[0], "judge is down")
			},
		},
	})
}

// TestEnrichBriefGolden compares the enriched brief for three failed
// attempts, byte for byte, with a golden file written by hand from the
// reference format.
func TestEnrichBriefGolden(t *testing.T) {
	t.Parallel()
	golden, err := os.ReadFile("testdata/enriched_brief_3_failures.golden")
	require.NoError(t, err)
	want := string(golden)

	t.Run("EnrichBrief", func(t *testing.T) {
		t.Parallel()
		got := controls.EnrichBrief(taskBrief, []*stubbornv1.FailureRecord{
			{Attempt: 1, Delegate: "target", Summary: "Error: search backend unavailable", Reason: "search backend unavailable"},
			{Attempt: 2, Delegate: "target", Summary: "aucun résultat trouvé", Reason: "the result contains no sources"},
			{Attempt: 3, Delegate: "target", Summary: "Error: quota exceeded: 0 of 100 queries left", Reason: "quota exceeded: 0 of 100 queries left"},
		})
		assert.Equal(t, want, got)
	})

	t.Run("the brief sent to attempt 4", func(t *testing.T) {
		t.Parallel()
		f := newFixture(map[string][]controlstest.Reply{"target": {
			unavailable("search backend unavailable"),
			ok("aucun résultat trouvé"),
			fail(codes.ResourceExhausted, "quota exceeded: 0 of 100 queries left"),
			ok("three sources"),
		}})
		f.env.Criteria = rejectTexts{"aucun résultat trouvé": "the result contains no sources"}
		r := f.run(t, testCtx(t), learning(proto.Int32(4)))
		require.Len(t, r.calls, 4)
		assert.Equal(t, want, r.calls[3].Brief)
		assert.Equal(t, want, r.state.GetAttemptLog()[3].GetBrief())
		assert.Equal(t, succeeded, r.out.Status)
	})

	t.Run("no failures: the original brief", func(t *testing.T) {
		t.Parallel()
		assert.Equal(t, taskBrief, controls.EnrichBrief(taskBrief, nil))
	})
}

// TestRetryWithLearningEvents checks the events of a 3-attempt run, and that
// each failure_analyzed event carries the brief the next attempt receives.
func TestRetryWithLearningEvents(t *testing.T) {
	t.Parallel()
	f := newFixture(map[string][]controlstest.Reply{"target": {
		unavailable("backend down"), ok("no results found"), ok("three sources"),
	}})
	f.env.Criteria = noSources
	r := f.run(t, testCtx(t), learning(nil))
	require.Equal(t, succeeded, r.out.Status)

	assert.Equal(t, []string{
		"run_started",
		"attempt_started", "attempt_finished", "failure_analyzed",
		"attempt_started", "attempt_finished", "failure_analyzed",
		"attempt_started", "attempt_finished",
		"run_finished",
	}, f.events.Kinds())

	evs := f.events.All()
	var (
		started  []*stubbornv1.Attempt
		finished []*stubbornv1.Attempt
		analyzed []*stubbornv1.FailureAnalyzed
	)
	for _, ev := range evs {
		assert.Empty(t, ev.GetPath(), "a top-level control's events have no path")
		switch {
		case ev.GetAttemptStarted() != nil:
			started = append(started, ev.GetAttemptStarted().GetAttempt())
		case ev.GetAttemptFinished() != nil:
			finished = append(finished, ev.GetAttemptFinished().GetAttempt())
		case ev.GetFailureAnalyzed() != nil:
			analyzed = append(analyzed, ev.GetFailureAnalyzed())
		}
	}
	require.Len(t, started, 3)
	require.Len(t, analyzed, 2)
	require.Len(t, r.calls, 3)
	for i, fa := range analyzed {
		assert.True(t, fa.GetWillRetry())
		assert.Equal(t, r.calls[i+1].Brief, fa.GetNextBrief(), "failure %d announces the brief attempt %d receives", i+1, i+2)
		assert.Equal(t, started[i+1].GetBrief(), fa.GetNextBrief())
		assert.True(t, proto.Equal(r.state.GetFailureHistory()[i], fa.GetFailure()), "the event carries the record as stored")
	}
	assert.Equal(t, []stubbornv1.AttemptOutcome{attemptError, attemptRejected, attemptSucceeded}, outcomes(finished))

	last := evs[len(evs)-1].GetRunFinished().GetState()
	assert.True(t, proto.Equal(r.state, last), "run_finished carries the final state")
}

// TestRetryWithLearningExhaustedEvents checks that the last failure says no
// attempt follows.
func TestRetryWithLearningExhaustedEvents(t *testing.T) {
	t.Parallel()
	f := newFixture(map[string][]controlstest.Reply{"target": {unavailable("backend down")}})
	r := f.run(t, testCtx(t), learning(proto.Int32(2)))
	require.Equal(t, exhausted, r.out.Status)
	fa := failureEvents(f.events.All())
	require.Len(t, fa, 2)
	assert.True(t, fa[0].GetWillRetry())
	assert.Equal(t, r.calls[1].Brief, fa[0].GetNextBrief())
	assert.False(t, fa[1].GetWillRetry())
	assert.Empty(t, fa[1].GetNextBrief())
}

func TestRetryWithLearningRunContext(t *testing.T) {
	t.Parallel()

	t.Run("cancelled during an attempt: CANCELLED, no further attempt", func(t *testing.T) {
		t.Parallel()
		f := newFixture(map[string][]controlstest.Reply{"target": {hang, ok("never asked")}})
		ctx, cancel := context.WithCancelCause(testCtx(t))
		defer cancel(nil)
		done := f.start(ctx, learning(proto.Int32(5)))
		f.waitStarted(t, "target")
		cancel(errors.New("CancelRun"))
		r := f.end(t, done)

		assert.Equal(t, cancelled, r.out.Status)
		assert.Equal(t, "cancelled: CancelRun", r.out.Reason)
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_CANCELLED, r.out.Code)
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_CANCELLED, r.state.GetStatusReasonCode())
		assert.Nil(t, r.out.Result)
		assert.Len(t, r.calls, 1, "no attempt after the run was cancelled")
		assert.Equal(t, []stubbornv1.AttemptOutcome{attemptCancelled}, outcomes(r.state.GetAttemptLog()))
		assert.ErrorIs(t, f.waitReturned(t, "target")["target"].ctxErr, context.Canceled)
	})

	t.Run("an expired deadline: FAILED, run timeout exceeded, no call", func(t *testing.T) {
		t.Parallel()
		f := newFixture(map[string][]controlstest.Reply{"target": {ok("never asked")}})
		ctx, cancel := context.WithDeadline(testCtx(t), time.Now().Add(-time.Second))
		defer cancel()
		r := f.run(t, ctx, learning(nil))

		assert.Equal(t, failed, r.out.Status)
		assert.Equal(t, "run timeout exceeded", r.out.Reason)
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_RUN_TIMEOUT, r.out.Code)
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_RUN_TIMEOUT, r.state.GetStatusReasonCode())
		assert.Empty(t, r.calls)
		assert.Zero(t, r.state.GetAttempts())
	})

	t.Run("the deadline passes during an attempt: FAILED, no further attempt", func(t *testing.T) {
		t.Parallel()
		f := newFixture(map[string][]controlstest.Reply{"target": {hang, ok("never asked")}})
		ctx, cancel := context.WithTimeout(testCtx(t), 10*time.Millisecond)
		defer cancel()
		r := f.run(t, ctx, learning(nil))

		assert.Equal(t, failed, r.out.Status)
		assert.Equal(t, "run timeout exceeded", r.out.Reason)
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_RUN_TIMEOUT, r.out.Code)
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_RUN_TIMEOUT, r.state.GetStatusReasonCode())
		// One call, unless the deadline passed before it could start.
		assert.LessOrEqual(t, len(r.calls), 1, "no attempt after the deadline")
	})
}
