package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

const noResultsCriteria = "result contains 'no results found' or is empty"

// byAttempt answers attempt n with results[n-1]; the last one repeats.
func byAttempt(results ...*stubbornv1.Result) *demo.Scripted {
	return demo.NewScripted(func(_ context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		i := min(int(req.GetAttempt()), len(results)) - 1
		return &stubbornv1.ExecuteResponse{Result: results[max(i, 0)]}, nil
	})
}

func text(s string) *stubbornv1.Result { return &stubbornv1.Result{Text: s} }

// items is a result whose data is {"items": [0, 1, …, n-1]}.
func items(t *testing.T, n int) *stubbornv1.Result {
	t.Helper()
	l := make([]any, n)
	for i := range l {
		l[i] = i
	}
	v, err := structpb.NewValue(map[string]any{"items": l})
	require.NoError(t, err)
	return &stubbornv1.Result{Data: v}
}

// judgeServer is a real judge delegate: it reads the result out of the
// reference brief and answers, in prose around JSON as models do, that "no
// results found" (or nothing) is a failure.
func judgeServer() *demo.Scripted {
	return demo.NewScripted(func(_ context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		_, rest, found := strings.Cut(req.GetBrief(), "\n\nResult:\n")
		result, _, _ := strings.Cut(rest, "\n\nRespond with JSON:")
		if !found {
			return nil, status.Error(codes.InvalidArgument, "not a judge brief")
		}
		answer := `Verdict: {"is_failure": false, "reason": "the result has sources"}`
		if result == "" || strings.Contains(result, "no results found") {
			answer = fmt.Sprintf("Looking at it.\n{\"is_failure\": true, \"reason\": \"attempt %d found no results\"}\nDone.", req.GetAttempt())
		}
		return &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{Text: answer}}, nil
	})
}

// TestJudgeEndToEnd is the issue's scenario: the delegate answers "no
// results found" twice, then a real answer; a real judge delegate (the
// server's configured judge) rejects the first two.
func TestJudgeEndToEnd(t *testing.T) {
	judge := judgeServer()
	search := byAttempt(text("no results found"), text("no results found"), text("three sources: A, B, C"))
	e := startWith(t, setup{judge: "judge", extra: map[string]stubbornv1.DelegateServiceServer{"judge": judge, "search": search}})
	ctx := testCtx(t)
	stream, err := e.client.Run(ctx, &stubbornv1.RunRequest{
		TaskBrief:         "find sources",
		RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "search", FailureCriteria: noResultsCriteria},
	})
	require.NoError(t, err)
	evs := collect(t, stream)
	assertDense(t, evs, 1)
	st := lastState(t, evs)

	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus())
	assert.Equal(t, "three sources: A, B, C", st.GetResult().GetText())
	assert.EqualValues(t, 3, st.GetAttempts())
	require.Len(t, st.GetAttemptLog(), 3, "the judge's calls are not attempts")

	history1 := "\nAttempt 1: no results found\nFailure reason: attempt 1 found no results\n"
	history2 := "\nAttempt 2: no results found\nFailure reason: attempt 2 found no results\n"
	header := "find sources\n\nPrior attempts failed. You MUST try a different approach.\n"
	wantBriefs := []string{"find sources", header + history1, header + history1 + history2}
	var got []string
	for _, r := range search.Received() {
		got = append(got, r.Request.GetBrief())
	}
	assert.Equal(t, wantBriefs, got, "the second and third briefs carry the history with the judge's reasons")

	// The judge got the reference brief, byte for byte, once per attempt.
	judgeBrief := func(result string) string {
		return `Does this result satisfy the failure criteria? Criteria: "` + noResultsCriteria + `"` +
			"\n\nResult:\n" + result + "\n\n" + `Respond with JSON: { "is_failure": true/false, "reason": "..." }`
	}
	var judged []string
	for i, r := range judge.Received() {
		judged = append(judged, r.Request.GetBrief())
		assert.EqualValues(t, i+1, r.Request.GetAttempt())
		assert.Equal(t, st.GetRunId(), r.Request.GetRunId())
	}
	assert.Equal(t, []string{judgeBrief("no results found"), judgeBrief("no results found"), judgeBrief("three sources: A, B, C")}, judged)

	// Each failure_analyzed event shows the reason, who judged and the brief
	// the next attempt got.
	fas := events(evs, "failure_analyzed")
	require.Len(t, fas, 2)
	for i, ev := range fas {
		fa := ev.GetFailureAnalyzed()
		assert.Equal(t, fmt.Sprintf("attempt %d found no results", i+1), fa.GetFailure().GetReason())
		assert.Equal(t, stubbornv1.FailureSource_FAILURE_SOURCE_JUDGE, fa.GetFailure().GetSource())
		assert.True(t, fa.GetWillRetry())
		assert.Equal(t, wantBriefs[i+1], fa.GetNextBrief())
	}
	var notes []string
	var outcomes []stubbornv1.AttemptOutcome
	for _, ev := range events(evs, "attempt_finished") {
		notes = append(notes, ev.GetAttemptFinished().GetNote())
		outcomes = append(outcomes, ev.GetAttemptFinished().GetAttempt().GetOutcome())
	}
	assert.Equal(t, []string{`judge "judge" rejected the result`, `judge "judge" rejected the result`, `judge "judge" accepted the result`}, notes)
	assert.Equal(t, []stubbornv1.AttemptOutcome{
		stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_REJECTED,
		stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_REJECTED,
		stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED,
	}, outcomes)
}

// TestAnalystEndToEnd: a judge named in the request (none in the config)
// and an analyst whose advice reaches the next brief.
func TestAnalystEndToEnd(t *testing.T) {
	coach := demo.NewScripted(func(context.Context, *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		return &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{Text: "Search for the exact phrase.\n"}}, nil
	})
	search := byAttempt(text("no results found"), text("three sources: A, B, C"))
	e := startWith(t, setup{extra: map[string]stubbornv1.DelegateServiceServer{"my-judge": judgeServer(), "coach": coach, "search": search}})
	stream, err := e.client.Run(testCtx(t), &stubbornv1.RunRequest{
		TaskBrief:         "find sources",
		RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "search", FailureCriteria: noResultsCriteria, Analyst: "coach"},
		Options:           &stubbornv1.RunOptions{Judge: "my-judge"},
	})
	require.NoError(t, err)
	st := lastState(t, collect(t, stream))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus())

	require.Len(t, coach.Received(), 1)
	assert.Equal(t, "A task was attempted and the attempt failed.\n\nTask:\nfind sources\n\n"+
		"Attempt 1: no results found\nFailure reason: attempt 1 found no results\n\n"+
		"What should the next attempt do differently? Answer with the advice only.",
		coach.Received()[0].Request.GetBrief())
	require.Len(t, search.Received(), 2)
	assert.Equal(t, "find sources\n\nPrior attempts failed. You MUST try a different approach.\n"+
		"\nAttempt 1: no results found\nFailure reason: attempt 1 found no results\n"+
		"What to try differently: Search for the exact phrase.\n",
		search.Received()[1].Request.GetBrief())
	require.Len(t, st.GetFailureHistory(), 1)
	assert.Equal(t, "Search for the exact phrase.", st.GetFailureHistory()[0].GetAnalysis())
}

// TestCELEndToEnd runs the three expressions (and accept_when) over
// gRPC.
func TestCELEndToEnd(t *testing.T) {
	e := startWith(t, setup{extra: map[string]stubbornv1.DelegateServiceServer{
		"blank-then-text": byAttempt(text(""), text("an answer")),
		"no-results":      byAttempt(text("no results found")),
		"growing":         byAttempt(items(t, 2), items(t, 3)),
		"two-items":       byAttempt(items(t, 2)),
		"three-items":     byAttempt(items(t, 3)),
	}})
	ctx := testCtx(t)
	tests := []struct {
		name     string
		req      *stubbornv1.RunRequest
		winner   string
		attempts int32
		reason   string // of the first failure, when one is certain
		// source is the first failure's FailureRecord.source, when set
		// (fallback-chain and race do not fill it in yet).
		source stubbornv1.FailureSource
	}{
		{
			name: `result.text == ""`,
			req: &stubbornv1.RunRequest{TaskBrief: "t", RetryWithLearning: &stubbornv1.RetryWithLearningSpec{
				Target: "blank-then-text", FailureWhen: `result.text == ""`,
			}},
			winner: "blank-then-text", attempts: 2, reason: `failure_when is true: result.text == ""`,
			source: stubbornv1.FailureSource_FAILURE_SOURCE_CEL,
		},
		{
			name: `result.text.contains("no results")`,
			req: &stubbornv1.RunRequest{TaskBrief: "t", FallbackChain: &stubbornv1.FallbackChainSpec{
				Chain: []string{"no-results", "echo"}, FailureWhen: `result.text.contains("no results")`,
			}},
			winner: "echo", attempts: 2, reason: `failure_when is true: result.text.contains("no results")`,
			source: stubbornv1.FailureSource_FAILURE_SOURCE_CEL,
		},
		{
			name: `size(result.data.items) < 3`,
			req: &stubbornv1.RunRequest{TaskBrief: "t", RetryWithLearning: &stubbornv1.RetryWithLearningSpec{
				Target: "growing", FailureWhen: `size(result.data.items) < 3`,
			}},
			winner: "growing", attempts: 2, reason: `failure_when is true: size(result.data.items) < 3`,
			source: stubbornv1.FailureSource_FAILURE_SOURCE_CEL,
		},
		{
			name: `race accept_when size(result.data.items) >= 3`,
			req: &stubbornv1.RunRequest{TaskBrief: "t", Race: &stubbornv1.RaceSpec{
				Candidates: []string{"two-items", "three-items"}, AcceptWhen: `size(result.data.items) >= 3`,
			}},
			winner: "three-items", attempts: 2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stream, err := e.client.Run(ctx, tt.req)
			require.NoError(t, err)
			st := lastState(t, collect(t, stream))
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus(), st.GetStatusReason())
			assert.Equal(t, tt.winner, st.GetWinner())
			assert.Equal(t, tt.attempts, st.GetAttempts())
			if tt.reason != "" {
				require.NotEmpty(t, st.GetFailureHistory())
				f := st.GetFailureHistory()[0]
				assert.Equal(t, tt.reason, f.GetReason())
				if tt.source != stubbornv1.FailureSource_FAILURE_SOURCE_UNSPECIFIED {
					assert.Equal(t, tt.source, f.GetSource())
				}
				assert.Equal(t, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_REJECTED, st.GetAttemptLog()[0].GetOutcome())
			}
		})
	}
}

// TestCELRunawayIsStoppedEndToEnd: a runaway expression hits the cost limit
// and the attempt fails with that reason; the server carries on.
func TestCELRunawayIsStoppedEndToEnd(t *testing.T) {
	e := start(t, delegates.Limits{})
	expr := `result.text != "x"`
	for _, v := range []string{"a", "b", "c", "d", "e", "f"} {
		expr = "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9].all(" + v + ", " + expr + ")"
	}
	one := int32(1)
	stream, err := e.client.Run(testCtx(t), &stubbornv1.RunRequest{
		TaskBrief:         "t",
		RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "echo", MaxRetries: &one, FailureWhen: expr},
	})
	require.NoError(t, err)
	st := lastState(t, collect(t, stream))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED, st.GetStatus())
	require.Len(t, st.GetFailureHistory(), 1)
	assert.Equal(t, "failure_when could not be evaluated: operation cancelled: actual cost limit exceeded", st.GetFailureHistory()[0].GetReason())
}

// TestCriteriaRejectedAtSubmission: criteria that cannot run are refused
// before anything runs, naming the field.
func TestCriteriaRejectedAtSubmission(t *testing.T) {
	e := startWith(t, setup{presets: []delegates.Preset{{
		Name: "echo-chain",
		Spec: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}}},
	}}})
	ctx := testCtx(t)
	learn := func(s *stubbornv1.RetryWithLearningSpec) *stubbornv1.RunRequest {
		s.Target = "echo"
		return &stubbornv1.RunRequest{TaskBrief: "x", RetryWithLearning: s}
	}
	withJudge := func(r *stubbornv1.RunRequest, judge string) *stubbornv1.RunRequest {
		r.Options = &stubbornv1.RunOptions{Judge: judge}
		return r
	}
	tests := []struct {
		name  string
		req   *stubbornv1.RunRequest
		code  codes.Code
		field string // the violation's field, for INVALID_ARGUMENT
		msg   []string
	}{
		{"CEL that does not parse", learn(&stubbornv1.RetryWithLearningSpec{FailureWhen: `result.text ==`}),
			codes.InvalidArgument, "retry_with_learning.failure_when", []string{"is not a valid CEL expression", "Syntax error"}},
		{"CEL with an unknown variable", &stubbornv1.RunRequest{TaskBrief: "x", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}, FailureWhen: `answer == ""`}},
			codes.InvalidArgument, "fallback_chain.failure_when", []string{"undeclared reference to 'answer'"}},
		{"CEL with an unknown field", learn(&stubbornv1.RetryWithLearningSpec{FailureWhen: `result.txt == ""`}),
			codes.InvalidArgument, "retry_with_learning.failure_when", []string{"undefined field 'txt'"}},
		{"CEL that may build gigabytes", learn(&stubbornv1.RetryWithLearningSpec{FailureWhen: `result.text.replace("", result.text + result.text).size() < 0`}),
			codes.InvalidArgument, "retry_with_learning.failure_when", []string{
				"is not a valid CEL expression: replace may build a value of up to 2199026401281 bytes (over an answer of 1048576 bytes), more than the limit of 16777216 bytes",
			}},
		{"CEL accept_when that may build gigabytes", &stubbornv1.RunRequest{TaskBrief: "x", Race: &stubbornv1.RaceSpec{
			Candidates: []string{"echo"}, AcceptWhen: `result.text.split("").join(result.text) != ""`,
		}}, codes.InvalidArgument, "race.accept_when", []string{"is not a valid CEL expression: join may build a value of up to"}},
		{"CEL that is not a bool", &stubbornv1.RunRequest{TaskBrief: "x", Race: &stubbornv1.RaceSpec{Candidates: []string{"echo"}, AcceptWhen: `result.text`}},
			codes.InvalidArgument, "race.accept_when", []string{"must be a bool expression, but has type string"}},
		{"failure_criteria and no judge anywhere", learn(&stubbornv1.RetryWithLearningSpec{FailureCriteria: noResultsCriteria}),
			codes.InvalidArgument, "retry_with_learning.failure_criteria", []string{"needs a judge delegate"}},
		{"fallback failure_criteria and no judge", &stubbornv1.RunRequest{TaskBrief: "x", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}, FailureCriteria: "empty"}},
			codes.InvalidArgument, "fallback_chain.failure_criteria", []string{"needs a judge delegate"}},
		{"acceptance_criteria and no judge", &stubbornv1.RunRequest{TaskBrief: "x", Race: &stubbornv1.RaceSpec{Candidates: []string{"echo"}, AcceptanceCriteria: "long"}},
			codes.InvalidArgument, "race.acceptance_criteria", []string{"needs a judge delegate"}},
		{"blank failure_criteria", withJudge(learn(&stubbornv1.RetryWithLearningSpec{FailureCriteria: " \n"}), "echo"),
			codes.InvalidArgument, "retry_with_learning.failure_criteria", []string{"must not be blank"}},
		{"unknown judge", withJudge(learn(&stubbornv1.RetryWithLearningSpec{FailureCriteria: noResultsCriteria}), "nope"),
			codes.NotFound, "", []string{`options.judge: delegate "nope" is not in the registry`}},
		{"a preset as judge", withJudge(learn(&stubbornv1.RetryWithLearningSpec{FailureCriteria: noResultsCriteria}), "echo-chain"),
			codes.NotFound, "", []string{`options.judge: "echo-chain" is a preset`}},
		{"unknown analyst", learn(&stubbornv1.RetryWithLearningSpec{Analyst: "nope"}),
			codes.NotFound, "", []string{`retry_with_learning.analyst: delegate "nope" is not in the registry`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{
				TaskBrief: tt.req.GetTaskBrief(), RetryWithLearning: tt.req.GetRetryWithLearning(),
				FallbackChain: tt.req.GetFallbackChain(), Race: tt.req.GetRace(), Options: tt.req.GetOptions(),
			})
			st := status.Convert(err)
			require.Equal(t, tt.code, st.Code(), st.Message())
			for _, m := range tt.msg {
				assert.Contains(t, st.Message(), m)
			}
			if tt.code == codes.InvalidArgument {
				assert.Contains(t, st.Message(), tt.field+": ")
				var fields []string
				for _, d := range st.Details() {
					if br, ok := d.(*errdetails.BadRequest); ok {
						for _, v := range br.GetFieldViolations() {
							fields = append(fields, v.GetField())
						}
					}
				}
				assert.Equal(t, []string{tt.field}, fields)
			}
		})
	}
	list, err := e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{})
	require.NoError(t, err)
	assert.Empty(t, list.GetRuns(), "nothing ran")
}
