package controls_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// toolAnswer is a model's answer of text (may be empty) and tool calls,
// each {name, arguments}.
func toolAnswer(text string, calls ...[2]string) *stubbornv1.Result {
	m := &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT}
	if text != "" {
		m.Content = []*stubbornv1.ContentPart{{Kind: &stubbornv1.ContentPart_Text{Text: text}}}
	}
	for i, c := range calls {
		m.ToolCalls = append(m.ToolCalls, &stubbornv1.ToolCall{Id: "call_" + string(rune('a'+i)), Name: c[0], Arguments: c[1]})
	}
	return &stubbornv1.Result{Text: text, Choices: []*stubbornv1.Choice{{
		Message: m, FinishReason: stubbornv1.FinishReason_FINISH_REASON_TOOL_CALLS,
	}}}
}

func TestAddedIsWhatRetryWithLearningAddsEvenThroughAPreset(t *testing.T) {
	t.Parallel()
	// Retry-with-learning over a preset (a retry of "model"): the
	// preset's control starts from the enriched brief, and its calls'
	// Added is the enrichment, so Brief is the run's brief followed by
	// Added (fixture.end checks it for every call).
	f := newFixture(map[string][]controlstest.Reply{"model": {unavailable("one"), ok("fine")}})
	f.env.Presets = presetMap{"with-retry": retryOf("model", 1)}
	spec := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_RetryWithLearning{
		RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "with-retry"},
	}}
	r := f.run(t, testCtx(t), spec)
	require.Equal(t, succeeded, r.out.Status)
	require.Len(t, r.calls, 2)
	assert.Empty(t, r.calls[0].Added, "the first attempt gets the run's brief")
	assert.True(t, strings.HasPrefix(r.calls[1].Added, "\n\nPrior attempts failed."), "%q", r.calls[1].Added)
	assert.Equal(t, taskBrief+r.calls[1].Added, r.calls[1].Brief)
}

func TestResultStringReadsToolCalls(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		r    *stubbornv1.Result
		want string
	}{
		{"tool calls alone", toolAnswer("", [2]string{"get_weather", `{ "city": "Paris" }`}),
			`[{"name":"get_weather","arguments":{"city":"Paris"}}]`},
		{"text first", toolAnswer("Let me check.", [2]string{"get_weather", `{"city":"Paris"}`}, [2]string{"get_time", `{}`}),
			"Let me check.\n" + `[{"name":"get_weather","arguments":{"city":"Paris"}},{"name":"get_time","arguments":{}}]`},
		{"arguments that are not JSON", toolAnswer("", [2]string{"run", `{"cmd": "ls <dir>`}),
			`[{"name":"run","arguments":"{\"cmd\": \"ls <dir>"}]`},
		{"text alone", &stubbornv1.Result{Text: "hello"}, "hello"},
		{"data alone", &stubbornv1.Result{Data: structpb.NewNumberValue(3)}, "3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, controls.ResultString(tc.r))
		})
	}
}

func TestAToolCallAnswerReadsAsItsCallsInItsFailure(t *testing.T) {
	t.Parallel()
	// What the analyst and the next brief read of a rejected answer that
	// is only tool calls: the calls, not nothing.
	answer := toolAnswer("", [2]string{"get_weather", `{"city":"Paris"}`})
	f := newFixture(map[string][]controlstest.Reply{"target": {{Result: answer}, ok("fine")}})
	e, err := controls.CompileExpr("failure_when", `size(result.choices) > 0 && result.choices[0].message.tool_calls[0].name == "get_weather"`)
	require.NoError(t, err)
	f.env.Criteria = e
	r := f.run(t, testCtx(t), learning(nil))
	require.Equal(t, succeeded, r.out.Status)
	require.Len(t, r.state.GetFailureHistory(), 1)
	assert.Equal(t, `[{"name":"get_weather","arguments":{"city":"Paris"}}]`, r.state.GetFailureHistory()[0].GetSummary())
}

func TestCELSeesChoices(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		src  string
		r    *stubbornv1.Result
		want bool
	}{
		{`result.choices[0].message.tool_calls[0].name == "get_weather"`, toolAnswer("", [2]string{"get_weather", `{}`}), true},
		{`result.choices[0].message.tool_calls[0].name == "get_weather"`, toolAnswer("", [2]string{"get_time", `{}`}), false},
		{`result.choices.exists(c, c.finish_reason == 4 && c.message.tool_calls.exists(t, t.arguments.contains("Paris")))`,
			toolAnswer("", [2]string{"get_weather", `{"city":"Paris"}`}), true},
		{`size(result.choices) == 0`, &stubbornv1.Result{Text: "plain"}, true},
		{`result.choices[0].message.content[0].text + "!" == "hi!"`, toolAnswer("hi"), true},
	} {
		e, err := controls.CompileExpr("failure_when", tc.src)
		require.NoError(t, err, tc.src)
		got, err := e.Eval(context.Background(), 1, "model", tc.r)
		require.NoError(t, err, tc.src)
		assert.Equal(t, tc.want, got, tc.src)
	}
}

func TestCELOverChoicesStaysBounded(t *testing.T) {
	t.Parallel()
	args := `result.choices[0].message.tool_calls[0].arguments`
	_, err := controls.CompileExpr("failure_when", args+`.replace("a", `+args+`) == ""`)
	require.Error(t, err, "may build a value far over the limit")
	assert.Contains(t, err.Error(), "replace may build")

	e, err := controls.CompileExpr("failure_when", `size(result.choices) > 0`)
	require.NoError(t, err)
	huge := toolAnswer("", [2]string{"f", strings.Repeat("x", controls.MaxResultBytes)})
	_, err = e.Eval(context.Background(), 1, "model", huge)
	assert.True(t, errors.Is(err, controls.ErrTooLarge), "%v", err)
}

func TestBoundsCutChoices(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("é", 40<<10)
	answer := toolAnswer(big, [2]string{"f", `{"s":"` + big + `"}`})
	st := &stubbornv1.ControlState{AttemptLog: []*stubbornv1.Attempt{{Number: 1, Brief: "b", Result: answer}}}
	limit := proto.Size(st) / 4
	out := controls.BoundState(st, limit)
	assert.LessOrEqual(t, proto.Size(out), limit)
	m := out.GetAttemptLog()[0].GetResult().GetChoices()[0].GetMessage()
	assert.Contains(t, m.GetContent()[0].GetText(), "bytes cut]")
	assert.Contains(t, m.GetToolCalls()[0].GetArguments(), "bytes cut]")
	assert.Equal(t, "f", m.GetToolCalls()[0].GetName(), "names stay")
	assert.Equal(t, big, answer.GetChoices()[0].GetMessage().GetContent()[0].GetText(), "st is not changed")

	// An extra field nested deeper than a run keeps is kept as its JSON.
	deep := map[string]any{"v": 1.0}
	for range controls.MaxDataDepth + 5 {
		deep = map[string]any{"n": deep}
	}
	extra, err := structpb.NewStruct(deep)
	require.NoError(t, err)
	r := toolAnswer("hi")
	r.Choices[0].Message.Extra = extra
	bounded := controls.BoundResult(r)
	assert.LessOrEqual(t, controls.DataDepth(structpb.NewStructValue(bounded.GetChoices()[0].GetMessage().GetExtra())), controls.MaxDataDepth)
	assert.Greater(t, controls.DataDepth(structpb.NewStructValue(extra)), controls.MaxDataDepth, "r is not changed")
}

func textDelta(choice int32, text string) *stubbornv1.OutputDelta {
	return &stubbornv1.OutputDelta{Choice: choice, Kind: &stubbornv1.OutputDelta_Text{Text: text}}
}

func callDelta(index int32, id, name, args string) *stubbornv1.OutputDelta {
	return &stubbornv1.OutputDelta{Kind: &stubbornv1.OutputDelta_ToolCall{ToolCall: &stubbornv1.ToolCallDelta{
		Index: index, Id: id, Name: name, Arguments: args,
	}}}
}

func TestDeltasStreamWithTheirOwnOffsets(t *testing.T) {
	t.Parallel()
	f := newFixture(map[string][]controlstest.Reply{"target": {
		{
			Chunks: []string{"Let me "},
			Deltas: [][]*stubbornv1.OutputDelta{
				{callDelta(0, "call_1", "get_weather", `{"ci`)},
				{callDelta(0, "", "", `ty":"Paris"}`), textDelta(1, "Sunny")},
				{textDelta(0, "check"), textDelta(1, " today")},
			},
			Err: unavailable("gone").Err,
		},
		{Deltas: [][]*stubbornv1.OutputDelta{{callDelta(0, "call_2", "get_time", `{}`)}}, Result: toolAnswer("", [2]string{"get_time", "{}"})},
	}})
	r := f.run(t, testCtx(t), learning(nil))
	require.Equal(t, succeeded, r.out.Status)

	var outs []*stubbornv1.AttemptOutput
	var finished []*stubbornv1.AttemptFinished
	for _, ev := range f.events.All() {
		if o := ev.GetAttemptOutput(); o != nil {
			outs = append(outs, o)
		}
		if a := ev.GetAttemptFinished(); a != nil {
			finished = append(finished, a)
		}
	}
	require.Len(t, outs, 5)
	assert.Equal(t, "Let me ", outs[0].GetText())
	assert.Empty(t, outs[1].GetText())
	assert.Equal(t, int64(0), outs[1].GetDeltas()[0].GetOffset())
	assert.Equal(t, "call_1", outs[1].GetDeltas()[0].GetToolCall().GetId())
	assert.Equal(t, int64(4), outs[2].GetDeltas()[0].GetOffset(), "bytes of the call's arguments before it")
	assert.Equal(t, int64(0), outs[2].GetDeltas()[1].GetOffset(), "choice 1's text is a stream of its own")
	assert.Equal(t, "check", outs[3].GetText(), "choice 0's text given as a delta is the event's text")
	assert.Equal(t, int64(7), outs[3].GetOffset())
	require.Len(t, outs[3].GetDeltas(), 1)
	assert.Equal(t, int64(5), outs[3].GetDeltas()[0].GetOffset())
	assert.Equal(t, int32(2), outs[4].GetAttempt())
	assert.Equal(t, int64(0), outs[4].GetDeltas()[0].GetOffset(), "a new attempt's streams start at 0")

	require.Len(t, finished, 2)
	assert.True(t, finished[0].GetOutputDiscarded())
	assert.Equal(t, int64(12), finished[0].GetOutputBytes(), "text bytes")
	assert.False(t, finished[1].GetOutputDiscarded())
}

func TestDeltasAloneCountAsDiscardedOutput(t *testing.T) {
	t.Parallel()
	f := newFixture(map[string][]controlstest.Reply{"target": {
		{Deltas: [][]*stubbornv1.OutputDelta{{callDelta(0, "call_1", "f", `{}`)}}, Err: unavailable("gone").Err},
		ok("fine"),
	}})
	f.run(t, testCtx(t), learning(nil))
	var finished []*stubbornv1.AttemptFinished
	for _, ev := range f.events.All() {
		if a := ev.GetAttemptFinished(); a != nil {
			finished = append(finished, a)
		}
	}
	require.NotEmpty(t, finished)
	assert.True(t, finished[0].GetOutputDiscarded(), "an attempt that streamed only a tool call and failed discards it")
	assert.Zero(t, finished[0].GetOutputBytes())
}

func TestDeltasOfAnEndedAttemptAreDropped(t *testing.T) {
	t.Parallel()
	events := &controlstest.Events{}
	env := controlstest.NewEnv(controlstest.NewDelegates(nil), controlstest.NewClock(), events, "x")
	tr := env.Tracker
	tr.Start()
	n := tr.BeginAttempt("", "model", "x", 0)
	tr.Piece(n, "", []*stubbornv1.OutputDelta{callDelta(0, "c", "f", "{")}, false)
	tr.EndAttempt(n, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_CANCELLED, nil, nil, "")
	tr.Piece(n, "late", []*stubbornv1.OutputDelta{callDelta(0, "", "", "}")}, false)
	var kinds []string
	for _, k := range events.Kinds() {
		if k != "run_started" {
			kinds = append(kinds, k)
		}
	}
	assert.Equal(t, []string{"attempt_started", "attempt_output", "attempt_finished"}, kinds)
}

func TestAResumedTrackerContinuesEachStreamsOffset(t *testing.T) {
	t.Parallel()
	// A run taken over mid-attempt: the journal's outputs say how far each
	// stream got, and the interrupted attempt's end counts them.
	events := &controlstest.Events{}
	env := controlstest.NewEnv(controlstest.NewDelegates(nil), controlstest.NewClock(), events, "x")
	tr := env.Tracker
	tr.Start()
	n := tr.BeginAttempt("", "model", "x", 0)
	tr.Piece(n, "", []*stubbornv1.OutputDelta{callDelta(0, "c", "f", `{"a"`)}, false)
	recorded := events.All()

	st := proto.CloneOf(recorded[0].GetRunStarted().GetState())
	again := &controlstest.Events{}
	tr2 := controls.NewReplayTracker(st, controlstest.NewClock(), func(ev *stubbornv1.RunEvent, _ *stubbornv1.ControlState) {
		again.Sink(proto.CloneOf(ev))
	}, recorded)
	tr2.Piece(n, "", []*stubbornv1.OutputDelta{callDelta(0, "", "", `:1}`)}, false)
	tr2.EndAttempt(n, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_INTERRUPTED, nil, controls.ErrInterrupted, "")
	evs := again.All()
	require.Len(t, evs, 2)
	assert.Equal(t, int64(4), evs[0].GetAttemptOutput().GetDeltas()[0].GetOffset())
	assert.True(t, evs[1].GetAttemptFinished().GetOutputDiscarded())
}
