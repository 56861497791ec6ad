package controls_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// The criteria of the judge tests.
const (
	failureCriteria    = "result contains 'no results found' or is empty"
	acceptanceCriteria = "cites at least three sources"
)

// Who decided a failure, shorter.
const (
	byError     = stubbornv1.FailureSource_FAILURE_SOURCE_ERROR
	byJudge     = stubbornv1.FailureSource_FAILURE_SOURCE_JUDGE
	byCEL       = stubbornv1.FailureSource_FAILURE_SOURCE_CEL
	bySomething = stubbornv1.FailureSource_FAILURE_SOURCE_UNSPECIFIED
)

// Reference briefs, written out by hand the way the reference code's
// template literals build them (spec/retry-with-learning.md,
// spec/fallback-chain.md), and the race wording Stubborn chose.
func learningJudgeBrief(criteria, result string) string {
	return `Does this result satisfy the failure criteria? Criteria: "` + criteria + `"` + "\n\n" +
		"Result:\n" + result + "\n\n" +
		`Respond with JSON: { "is_failure": true/false, "reason": "..." }`
}

func fallbackJudgeBrief(criteria, result string) string {
	return "Does this result satisfy the failure criteria?\n\n" +
		`Criteria: "` + criteria + `"` + "\n\n" +
		"Result:\n" + result + "\n\n" +
		`Respond with JSON: { "is_failure": true/false, "reason": "..." }`
}

func raceJudgeBrief(criteria, result string) string {
	return "Does this result satisfy the acceptance criteria?\n\n" +
		`Criteria: "` + criteria + `"` + "\n\n" +
		"Result:\n" + result + "\n\n" +
		`Respond with JSON: { "is_acceptable": true/false, "reason": "..." }`
}

// withCriteria sets failure criteria on a control spec built by learning,
// chain or race.
func withCriteria(spec *stubbornv1.ControlSpec, text, expr string) *stubbornv1.ControlSpec {
	switch k := spec.GetKind().(type) {
	case *stubbornv1.ControlSpec_RetryWithLearning:
		k.RetryWithLearning.FailureCriteria, k.RetryWithLearning.FailureWhen = text, expr
	case *stubbornv1.ControlSpec_FallbackChain:
		k.FallbackChain.FailureCriteria, k.FallbackChain.FailureWhen = text, expr
	case *stubbornv1.ControlSpec_Race:
		k.Race.AcceptanceCriteria, k.Race.AcceptWhen = text, expr
	}
	return spec
}

// judged runs spec with its criteria judged by the fake delegate "judge".
func judged(t *testing.T, f *fixture, spec *stubbornv1.ControlSpec) ran {
	t.Helper()
	f.env.Criteria = controls.NewCriteria(spec, "judge", f.obs)
	require.NotNil(t, f.env.Criteria)
	return f.run(t, testCtx(t), spec)
}

// attemptNotes returns the attempt_finished notes, in order.
func attemptNotes(evs []*stubbornv1.RunEvent) []string {
	var out []string
	for _, ev := range evs {
		if af := ev.GetAttemptFinished(); af != nil {
			out = append(out, af.GetNote())
		}
	}
	return out
}

// TestJudgeAnswers scripts the judge's answer and checks how each ends
// (the decisions documented on RetryWithLearningSpec.failure_criteria).
// The run is one attempt of retry-with-learning whose answer is "no results
// found".
func TestJudgeAnswers(t *testing.T) {
	t.Parallel()
	const (
		rejected = "rejected"
		accepted = "accepted"
		unread   = "unreadable"
	)
	tests := []struct {
		name   string
		answer controlstest.Reply
		ends   string // rejected, accepted or unreadable (accepted: fail open)
		reason string // the failure's reason, when rejected
	}{
		{"valid JSON, a failure", ok(`{"is_failure": true, "reason": "nothing was found"}`), rejected, "nothing was found"},
		{"valid JSON, not a failure", ok(`{"is_failure": false, "reason": "three sources"}`), accepted, ""},
		{"JSON inside prose", ok("Let me look.\nVerdict: {\"is_failure\": true, \"reason\": \"the search came back empty\"}\nHope this helps!"), rejected, "the search came back empty"},
		{"JSON in a fenced block over several lines", ok("```json\n{\n  \"is_failure\": false,\n  \"reason\": \"fine\"\n}\n```"), accepted, ""},
		{"garbage", ok("I am not sure what you mean."), unread, ""},
		{"empty answer", ok(""), unread, ""},
		{"invalid JSON", ok(`{"is_failure": yes, "reason": "x"}`), unread, ""},
		{"greedy match over two objects, as the reference", ok(`{"is_failure": true, "reason": "a"} or maybe {"b": 1}`), unread, ""},
		{"is_failure only in a nested object", ok(`{"verdict": {"is_failure": true}}`), unread, ""},
		{`string "false"`, ok(`{"is_failure": "false", "reason": "looks fine"}`), accepted, ""},
		{`string "true"`, ok(`{"is_failure": "true", "reason": "no sources"}`), rejected, "no sources"},
		{`string " TRUE " (case and spaces)`, ok(`{"is_failure": " TRUE ", "reason": "no sources"}`), rejected, "no sources"},
		{`another string`, ok(`{"is_failure": "probably", "reason": "hmm"}`), unread, ""},
		{"a number", ok(`{"is_failure": 1, "reason": "hmm"}`), unread, ""},
		{"null", ok(`{"is_failure": null, "reason": "hmm"}`), unread, ""},
		{"no reason", ok(`{"is_failure": true}`), rejected, `judge "judge" gave no reason`},
		{"a reason that is not a string", ok(`{"is_failure": true, "reason": {"missing": ["sources"]}}`), rejected, `{"missing": ["sources"]}`},
		{"an error from the judge", fail(codes.Unavailable, "judge is down"), rejected, `judge "judge" failed: judge is down`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(map[string][]controlstest.Reply{
				"target": {ok("no results found")},
				"judge":  {tt.answer},
			})
			r := judged(t, f, withCriteria(learning(proto.Int32(1)), failureCriteria, ""))

			// The judge got the reference brief once, about attempt 1, and
			// its call is not an attempt.
			assert.Equal(t, []controls.Call{{
				Delegate: "judge", Brief: learningJudgeBrief(failureCriteria, "no results found"), Attempt: 1,
			}}, f.fakes.CallsTo("judge"))
			require.Len(t, r.state.GetAttemptLog(), 1)
			assert.EqualValues(t, 1, r.state.GetAttempts())
			notes := attemptNotes(f.events.All())
			require.Len(t, notes, 1)

			switch tt.ends {
			case rejected:
				assert.Equal(t, exhausted, r.out.Status)
				assert.Equal(t, attemptRejected, r.state.GetAttemptLog()[0].GetOutcome())
				require.Len(t, r.state.GetFailureHistory(), 1)
				fr := r.state.GetFailureHistory()[0]
				assert.Equal(t, tt.reason, fr.GetReason())
				assert.Equal(t, byJudge, fr.GetSource())
				assert.Equal(t, "no results found", fr.GetSummary())
				assert.Contains(t, notes[0], `judge "judge"`, "the event says who judged")
				fa := failureEvents(f.events.All())
				require.Len(t, fa, 1)
				assert.Equal(t, byJudge, fa[0].GetFailure().GetSource())
			case accepted, unread:
				assert.Equal(t, succeeded, r.out.Status)
				assert.Equal(t, "no results found", r.out.Result.GetText())
				assert.Empty(t, r.state.GetFailureHistory())
				if tt.ends == unread {
					assert.Contains(t, notes[0], `judge "judge"'s answer could not be read, so the result was accepted (fail open)`)
				} else {
					assert.Equal(t, `judge "judge" accepted the result`, notes[0])
				}
			}
		})
	}
}

// TestJudgeBriefIsTheReferenceWording compares what the judge receives, byte
// for byte, with each control's reference wording.
func TestJudgeBriefIsTheReferenceWording(t *testing.T) {
	t.Parallel()
	t.Run("retry-with-learning", func(t *testing.T) {
		t.Parallel()
		f := newFixture(map[string][]controlstest.Reply{
			"target": {ok("no results found"), ok("")},
			"judge":  {ok(`{"is_failure": true, "reason": "empty"}`)},
		})
		judged(t, f, withCriteria(learning(proto.Int32(2)), failureCriteria, ""))
		assert.Equal(t, []string{
			learningJudgeBrief(failureCriteria, "no results found"),
			learningJudgeBrief(failureCriteria, ""),
		}, briefs(f.fakes.CallsTo("judge")))
	})
	t.Run("fallback-chain", func(t *testing.T) {
		t.Parallel()
		f := newFixture(map[string][]controlstest.Reply{
			"primary":   {ok("no results found")},
			"secondary": {ok("three sources")},
			"judge":     {ok(`{"is_failure": true, "reason": "empty"}`), ok(`{"is_failure": false}`)},
		})
		r := judged(t, f, withCriteria(chain("primary", "secondary"), failureCriteria, ""))
		assert.Equal(t, "secondary", r.out.Winner)
		assert.Equal(t, []string{
			fallbackJudgeBrief(failureCriteria, "no results found"),
			fallbackJudgeBrief(failureCriteria, "three sources"),
		}, briefs(f.fakes.CallsTo("judge")))
		assert.Equal(t, []rec{{1, "primary", "no results found", "empty"}}, recs(r.state.GetFailureHistory()))
	})
	t.Run("race", func(t *testing.T) {
		t.Parallel()
		f := newFixture(map[string][]controlstest.Reply{
			"solo":  {ok("A, B and C")},
			"judge": {ok(`{"is_acceptable": true, "reason": "three sources"}`)},
		})
		r := judged(t, f, withCriteria(race("solo"), acceptanceCriteria, ""))
		assert.Equal(t, succeeded, r.out.Status)
		assert.Equal(t, []string{raceJudgeBrief(acceptanceCriteria, "A, B and C")}, briefs(f.fakes.CallsTo("judge")))
	})
	t.Run("the first 2000 characters, not bytes", func(t *testing.T) {
		t.Parallel()
		long := strings.Repeat("é", 2500)
		f := newFixture(map[string][]controlstest.Reply{
			"target": {ok(long)},
			"judge":  {ok(`{"is_failure": false}`)},
		})
		judged(t, f, withCriteria(learning(proto.Int32(1)), failureCriteria, ""))
		calls := f.fakes.CallsTo("judge")
		require.Len(t, calls, 1)
		assert.Equal(t, learningJudgeBrief(failureCriteria, strings.Repeat("é", 2000)), calls[0].Brief)
	})
	t.Run("data without text is String(result): its JSON", func(t *testing.T) {
		t.Parallel()
		data, err := structpb.NewValue(map[string]any{"items": []any{"a"}})
		require.NoError(t, err)
		r := &stubbornv1.Result{Data: data}
		assert.Equal(t, learningJudgeBrief("c", controls.ResultString(r)), controls.JudgeBrief(controls.WordingRetryWithLearning, "c", r))
		assert.Contains(t, controls.JudgeBrief(controls.WordingRetryWithLearning, "c", r), `"items"`)
	})
}

// TestRaceJudgeAnswers: acceptance criteria read is_acceptable, with the
// same rules as is_failure, the other way round.
func TestRaceJudgeAnswers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		answer   controlstest.Reply
		accepted bool
		reason   string
	}{
		{"acceptable", ok(`{"is_acceptable": true, "reason": "three sources"}`), true, ""},
		{"not acceptable", ok(`Here: {"is_acceptable": false, "reason": "only one source"}`), false, "only one source"},
		{`string "false"`, ok(`{"is_acceptable": "false", "reason": "only one source"}`), false, "only one source"},
		{"an is_failure answer cannot be read: fail open", ok(`{"is_failure": true, "reason": "x"}`), true, ""},
		{"garbage: fail open", ok("yes"), true, ""},
		{"an error from the judge", fail(codes.DeadlineExceeded, "judge timed out"), false, `judge "judge" failed: judge timed out`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(map[string][]controlstest.Reply{"solo": {ok("A")}, "judge": {tt.answer}})
			r := judged(t, f, withCriteria(race("solo"), acceptanceCriteria, ""))
			if tt.accepted {
				assert.Equal(t, succeeded, r.out.Status)
				assert.Equal(t, "solo", r.out.Winner)
				return
			}
			assert.Equal(t, exhausted, r.out.Status)
			require.Len(t, r.state.GetFailureHistory(), 1)
			assert.Equal(t, tt.reason, r.state.GetFailureHistory()[0].GetReason())
			assert.Equal(t, attemptRejected, r.state.GetAttemptLog()[0].GetOutcome())
		})
	}
}

// TestCELThenJudge: with both, failure_when is evaluated first and the judge
// is asked only about the answers it passes; the record says who rejected.
func TestCELThenJudge(t *testing.T) {
	t.Parallel()
	f := newFixture(map[string][]controlstest.Reply{
		"target": {unavailable("backend down"), ok(""), ok("no results found"), ok("three sources")},
		"judge":  {ok(`{"is_failure": true, "reason": "nothing found"}`), ok(`{"is_failure": false}`)},
	})
	r := judged(t, f, withCriteria(learning(proto.Int32(4)), failureCriteria, `result.text == ""`))

	assert.Equal(t, succeeded, r.out.Status)
	assert.Equal(t, "three sources", r.out.Result.GetText())
	assert.Equal(t, []rec{
		{1, "target", "Error: backend down", "backend down"},
		{2, "target", "", `failure_when is true: result.text == ""`},
		{3, "target", "no results found", "nothing found"},
	}, recs(r.state.GetFailureHistory()))
	var sources []stubbornv1.FailureSource
	for _, fr := range r.state.GetFailureHistory() {
		sources = append(sources, fr.GetSource())
	}
	assert.Equal(t, []stubbornv1.FailureSource{byError, byCEL, byJudge}, sources)

	// The judge saw attempts 3 and 4 only: CEL rejected attempt 2 first.
	var judgedAttempts []int32
	for _, c := range f.fakes.CallsTo("judge") {
		judgedAttempts = append(judgedAttempts, c.Attempt)
	}
	assert.Equal(t, []int32{3, 4}, judgedAttempts)
	assert.Equal(t, []string{
		"",
		"CEL (failure_when) rejected the result",
		`judge "judge" rejected the result`,
		`CEL (failure_when) accepted the result; judge "judge" accepted the result`,
	}, attemptNotes(f.events.All()))

	// The failure_analyzed events carry the reason, who judged and the next
	// brief, which is the reference format with the judge's reasons.
	fa := failureEvents(f.events.All())
	require.Len(t, fa, 3)
	assert.Equal(t, byCEL, fa[1].GetFailure().GetSource())
	assert.Equal(t, byJudge, fa[2].GetFailure().GetSource())
	assert.Equal(t, enriched(taskBrief,
		[2]string{"Error: backend down", "backend down"},
		[2]string{"", `failure_when is true: result.text == ""`},
		[2]string{"no results found", "nothing found"},
	), fa[2].GetNextBrief())
	targetCalls := f.fakes.CallsTo("target")
	require.Len(t, targetCalls, 4)
	assert.Equal(t, fa[2].GetNextBrief(), targetCalls[3].Brief, "the next brief is what the next attempt got")
}

// TestNewCriteria: which specs have criteria, and criteria that cannot be
// built fail every attempt with the reason why.
func TestNewCriteria(t *testing.T) {
	t.Parallel()
	d := controlstest.NewDelegates(nil)
	assert.Nil(t, controls.NewCriteria(learning(nil), "judge", d), "no criteria")
	assert.Nil(t, controls.NewCriteria(chain("a"), "", d), "no criteria")
	assert.Nil(t, controls.NewCriteria(&stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{Target: "a"}}}, "judge", d))
	assert.Nil(t, controls.NewCriteria(nil, "judge", d))

	for _, tc := range []struct {
		name   string
		spec   *stubbornv1.ControlSpec
		judge  string
		reason string
		source stubbornv1.FailureSource
	}{
		{"bad CEL", withCriteria(learning(proto.Int32(1)), "", "result.nope"), "judge", "failure_when does not compile: ", byCEL},
		{"no judge", withCriteria(learning(proto.Int32(1)), failureCriteria, ""), "", "no judge delegate is configured for the failure criteria", byJudge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(map[string][]controlstest.Reply{"target": {ok("fine")}})
			f.env.Criteria = controls.NewCriteria(tc.spec, tc.judge, f.obs)
			r := f.run(t, testCtx(t), tc.spec)
			assert.Equal(t, exhausted, r.out.Status)
			require.Len(t, r.state.GetFailureHistory(), 1)
			assert.Contains(t, r.state.GetFailureHistory()[0].GetReason(), tc.reason)
			assert.Equal(t, tc.source, r.state.GetFailureHistory()[0].GetSource())
		})
	}
}

// TestFailureSourceWithoutRunCriteria: criteria of another kind leave the
// source unspecified; errors are still errors.
func TestFailureSourceWithoutRunCriteria(t *testing.T) {
	t.Parallel()
	f := newFixture(map[string][]controlstest.Reply{"target": {unavailable("down"), ok("no results found"), ok("fine")}})
	f.env.Criteria = noSources
	r := f.run(t, testCtx(t), learning(nil))
	require.Len(t, r.state.GetFailureHistory(), 2)
	assert.Equal(t, byError, r.state.GetFailureHistory()[0].GetSource())
	assert.Equal(t, bySomething, r.state.GetFailureHistory()[1].GetSource())
}
