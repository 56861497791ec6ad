package controls_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// withAnalyst sets the analyst of a retry-with-learning spec.
func withAnalyst(spec *stubbornv1.ControlSpec, analyst string) *stubbornv1.ControlSpec {
	spec.GetRetryWithLearning().Analyst = analyst
	return spec
}

// analystBrief is the analyst's brief, written out by hand as documented on
// RetryWithLearningSpec.analyst.
func analystBrief(n int, summary, reason string) string {
	return "A task was attempted and the attempt failed.\n\n" +
		"Task:\n" + taskBrief + "\n\n" +
		"Attempt " + strconv.Itoa(n) + ": " + summary + "\n" +
		"Failure reason: " + reason + "\n\n" +
		"What should the next attempt do differently? Answer with the advice only."
}

// TestWithoutAnalystBriefsAreTheReferenceFormat: no analyst, criteria
// judged by a judge: every brief is the reference format, byte for byte.
func TestWithoutAnalystBriefsAreTheReferenceFormat(t *testing.T) {
	t.Parallel()
	f := newFixture(map[string][]controlstest.Reply{
		"target": {ok("no results found"), unavailable("backend down"), ok("three sources")},
		"judge":  {ok(`{"is_failure": true, "reason": "the search found nothing"}`), ok(`{"is_failure": false}`)},
	})
	r := judged(t, f, withCriteria(learning(nil), failureCriteria, ""))
	assert.Equal(t, succeeded, r.out.Status)
	assert.Equal(t, []string{
		taskBrief,
		taskBrief + "\n\nPrior attempts failed. You MUST try a different approach.\n" +
			"\nAttempt 1: no results found\nFailure reason: the search found nothing\n",
		taskBrief + "\n\nPrior attempts failed. You MUST try a different approach.\n" +
			"\nAttempt 1: no results found\nFailure reason: the search found nothing\n" +
			"\nAttempt 2: Error: backend down\nFailure reason: backend down\n",
	}, briefs(f.fakes.CallsTo("target")))
	for _, fr := range r.state.GetFailureHistory() {
		assert.Empty(t, fr.GetAnalysis())
		assert.Empty(t, fr.GetAnalysisError())
	}
}

// TestAnalyst: the analyst is asked after each failure that another attempt
// follows; its advice joins the record and every later brief; it never
// fails the run and its calls are not attempts.
func TestAnalyst(t *testing.T) {
	t.Parallel()
	header := taskBrief + "\n\nPrior attempts failed. You MUST try a different approach.\n"

	t.Run("advice joins the record and every later brief", func(t *testing.T) {
		t.Parallel()
		f := newFixture(map[string][]controlstest.Reply{
			"target": {ok("no results found"), unavailable("backend down"), ok("three sources")},
			"coach":  {ok("  Broaden the search terms.\n"), ok("Try again later.")},
		})
		f.env.Criteria = noSources
		r := f.run(t, testCtx(t), withAnalyst(learning(nil), "coach"))
		assert.Equal(t, succeeded, r.out.Status)

		assert.Equal(t, []controls.Call{
			{Delegate: "coach", Brief: analystBrief(1, "no results found", "the result has no sources"), Attempt: 1},
			{Delegate: "coach", Brief: analystBrief(2, "Error: backend down", "backend down"), Attempt: 2},
		}, f.fakes.CallsTo("coach"))
		assert.Equal(t, []string{
			taskBrief,
			header +
				"\nAttempt 1: no results found\nFailure reason: the result has no sources\n" +
				"What to try differently: Broaden the search terms.\n",
			header +
				"\nAttempt 1: no results found\nFailure reason: the result has no sources\n" +
				"What to try differently: Broaden the search terms.\n" +
				"\nAttempt 2: Error: backend down\nFailure reason: backend down\n" +
				"What to try differently: Try again later.\n",
		}, briefs(f.fakes.CallsTo("target")))

		hist := r.state.GetFailureHistory()
		require.Len(t, hist, 2)
		assert.Equal(t, "Broaden the search terms.", hist[0].GetAnalysis())
		assert.Equal(t, "Try again later.", hist[1].GetAnalysis())
		assert.Len(t, r.state.GetAttemptLog(), 3, "analyst calls are not attempts")

		fa := failureEvents(f.events.All())
		require.Len(t, fa, 2)
		assert.Equal(t, "Broaden the search terms.", fa[0].GetFailure().GetAnalysis(), "the event carries the advice")
		assert.Equal(t, f.fakes.CallsTo("target")[1].Brief, fa[0].GetNextBrief())
	})

	t.Run("not asked when no attempt follows", func(t *testing.T) {
		t.Parallel()
		f := newFixture(map[string][]controlstest.Reply{"target": {unavailable("down")}, "coach": {ok("advice")}})
		r := f.run(t, testCtx(t), withAnalyst(learning(proto.Int32(2)), "coach"))
		assert.Equal(t, exhausted, r.out.Status)
		assert.Len(t, f.fakes.CallsTo("coach"), 1, "asked after attempt 1, not after the last")
		assert.Empty(t, r.state.GetFailureHistory()[1].GetAnalysis())
	})

	for _, tc := range []struct {
		name   string
		answer controlstest.Reply
		why    string
	}{
		{"an error leaves no advice and the run goes on", fail(codes.Unavailable, "coach is down"), `analyst "coach" failed: coach is down`},
		{"an empty answer leaves no advice", ok(" \n"), `analyst "coach" gave no advice (empty answer)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(map[string][]controlstest.Reply{
				"target": {unavailable("backend down"), ok("three sources")},
				"coach":  {tc.answer},
			})
			r := f.run(t, testCtx(t), withAnalyst(learning(nil), "coach"))
			assert.Equal(t, succeeded, r.out.Status)
			hist := r.state.GetFailureHistory()
			require.Len(t, hist, 1)
			assert.Empty(t, hist[0].GetAnalysis())
			assert.Equal(t, tc.why, hist[0].GetAnalysisError())
			assert.Equal(t, header+"\nAttempt 1: Error: backend down\nFailure reason: backend down\n",
				f.fakes.CallsTo("target")[1].Brief, "the reference format, nothing about the analyst")
		})
	}

	t.Run("long advice is cut to 2000 characters", func(t *testing.T) {
		t.Parallel()
		f := newFixture(map[string][]controlstest.Reply{
			"target": {unavailable("backend down"), ok("three sources")},
			"coach":  {ok(strings.Repeat("é", 2500))},
		})
		r := f.run(t, testCtx(t), withAnalyst(learning(nil), "coach"))
		assert.Equal(t, strings.Repeat("é", controls.AnalystAdviceChars), r.state.GetFailureHistory()[0].GetAnalysis())
	})
	t.Run("and to MaxReasonBytes", func(t *testing.T) {
		t.Parallel()
		f := newFixture(map[string][]controlstest.Reply{
			"target": {unavailable("backend down"), ok("three sources")},
			"coach":  {ok(strings.Repeat("日", 2500))},
		})
		r := f.run(t, testCtx(t), withAnalyst(learning(nil), "coach"))
		// 1365 characters of 3 bytes fit 4096; the 635 of the 2000 left are cut.
		assert.Equal(t, strings.Repeat("日", 1365)+" …[1905 bytes cut]", r.state.GetFailureHistory()[0].GetAnalysis())
	})
}
