package runs_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
	"github.com/stubbornhq/stubborn/internal/runs/memstore"
)

// weatherConversation is a typed conversation that offers the tool named.
func weatherConversation(tool string) *stubbornv1.Conversation {
	return &stubbornv1.Conversation{
		Messages: []*stubbornv1.ChatMessage{{
			Role:    stubbornv1.ChatRole_CHAT_ROLE_USER,
			Content: []*stubbornv1.ContentPart{{Kind: &stubbornv1.ContentPart_Text{Text: "Weather in Paris?"}}},
		}},
		Options: &stubbornv1.ModelOptions{Tools: []*stubbornv1.Tool{{Name: tool}}},
		Api:     stubbornv1.ConversationAPI_CONVERSATION_API_CHAT_COMPLETIONS,
	}
}

// takenOver starts task on server a, whose call to x hangs, kills a once
// x is called, and lets server b take the run over to its end: x answers
// the second call.
func takenOver(t *testing.T, task runs.Task) (d *controlstest.Delegates, started *stubbornv1.ControlState, evs []*stubbornv1.RunEvent, b *runs.Manager) {
	t.Helper()
	const lease = 300 * time.Millisecond
	store := memstore.NewMemory(lease)
	d = controlstest.NewDelegates(map[string][]controlstest.Reply{"x": {{Hang: true}, controlstest.OK("sunny")}})
	d.SetInfo("x", controls.DelegateInfo{Idempotent: true})
	a := runstest.NewManager(t, d, runs.Config{Store: store, Lease: lease, Owner: "a"})
	st, _, err := a.Start(runstest.Ctx(t), task, presetRetryOf("x"), nil) // a retry: x again after its interrupted call
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(d.Calls()) == 1 }, 5*time.Second, time.Millisecond, "x is called")
	a.Kill()
	b = runstest.NewManager(t, d, runs.Config{Store: store, Lease: lease, Owner: "b"})
	evs = watchToEnd(t, b, st.GetRunId())
	return d, st, evs, b
}

func TestARunKeepsItsConversationAndResumesWithIt(t *testing.T) {
	conv := weatherConversation("get_weather")
	d, st, evs, b := takenOver(t, runs.Task{Conversation: conv})
	assert.True(t, proto.Equal(conv, st.GetConversation()), "the state has the run's conversation")
	end := runstest.Final(t, evs)
	require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, end.GetStatus(), end.GetStatusReason())
	assert.True(t, proto.Equal(conv, end.GetConversation()), "the final state too")
	calls := d.CallsTo("x")
	require.Len(t, calls, 2)
	for i, c := range calls {
		assert.True(t, proto.Equal(conv, c.Conversation), "call %d carries the conversation", i+1)
		assert.Empty(t, c.Messages)
		assert.Nil(t, c.ModelParams)
	}
	got, err := b.Get(runstest.Ctx(t), st.GetRunId())
	require.NoError(t, err)
	assert.True(t, proto.Equal(conv, got.GetConversation()), "the resumed run's state keeps it")
	assert.True(t, proto.Equal(end, controls.Fold(evs)), "the journal folds to the final state")
}

// A run of the legacy task (messages and model parameters, no typed
// conversation), whose journal is what a release before the typed
// conversation wrote: it resumes and replays as it did, its calls
// carrying the messages and parameters and no conversation.
func TestARunOfTaskMessagesResumesUnchanged(t *testing.T) {
	msg, err := structpb.NewStruct(map[string]any{"role": "user", "content": "Weather in Paris?"})
	require.NoError(t, err)
	params, err := structpb.NewStruct(map[string]any{"temperature": 0.2})
	require.NoError(t, err)
	d, st, evs, _ := takenOver(t, runs.Task{Messages: []*structpb.Struct{msg}, ModelParams: params})
	assert.Nil(t, st.GetConversation())
	for _, ev := range evs {
		if s := ev.GetRunStarted().GetState(); s != nil {
			assert.False(t, s.ProtoReflect().Has(s.ProtoReflect().Descriptor().Fields().ByName("conversation")),
				"the journal is what an older release wrote")
		}
	}
	end := runstest.Final(t, evs)
	require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, end.GetStatus(), end.GetStatusReason())
	assert.Equal(t, "sunny", end.GetResult().GetText())
	calls := d.CallsTo("x")
	require.Len(t, calls, 2)
	for i, c := range calls {
		require.Len(t, c.Messages, 1, "call %d", i+1)
		assert.True(t, proto.Equal(msg, c.Messages[0]))
		assert.True(t, proto.Equal(params, c.ModelParams))
		assert.Nil(t, c.Conversation)
	}
	assert.True(t, proto.Equal(end, controls.Fold(evs)), "the journal folds to the final state")
}

func TestAnIdempotencyKeyAsksForTheSameConversation(t *testing.T) {
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {controlstest.OK("x")}})
	m := runstest.NewManager(t, d, runs.Config{Store: memstore.NewMemory(time.Second), Lease: time.Second})
	ctx := runstest.Ctx(t)
	first, existing, err := m.Start(ctx, runs.Task{Conversation: weatherConversation("get_weather")}, runstest.Chain("a"), keyed("k", nil))
	require.NoError(t, err)
	assert.False(t, existing)
	again, existing, err := m.Start(ctx, runs.Task{Conversation: weatherConversation("get_weather")}, runstest.Chain("a"), keyed("k", nil))
	require.NoError(t, err)
	assert.True(t, existing)
	assert.Equal(t, first.GetRunId(), again.GetRunId())
	for name, task := range map[string]runs.Task{
		"other tools":     {Conversation: weatherConversation("get_time")},
		"no conversation": {},
	} {
		_, _, err = m.Start(ctx, task, runstest.Chain("a"), keyed("k", nil))
		var conflict *runs.KeyConflictError
		require.ErrorAs(t, err, &conflict, name)
		assert.Equal(t, first.GetRunId(), conflict.RunID, name)
	}
}

// A model that streams text and a tool call in fragments: after the first
// piece, what comes within the interval goes out as one attempt_output,
// the text with the call's fragments merged into one, each with its
// offset.
func TestStreamedToolCallsAreCoalescedWithTheText(t *testing.T) {
	frag := func(id, name, args string) []*stubbornv1.OutputDelta {
		return []*stubbornv1.OutputDelta{{Kind: &stubbornv1.OutputDelta_ToolCall{ToolCall: &stubbornv1.ToolCallDelta{Id: id, Name: name, Arguments: args}}}}
	}
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"x": {{
		Chunks: []string{"Let me ", "check."},
		Deltas: [][]*stubbornv1.OutputDelta{frag("call_1", "get_weather", `{"city":`), frag("", "", `"Paris"}`)},
		Result: &stubbornv1.Result{Text: "Let me check."},
	}}})
	m := runstest.NewManager(t, d, runs.Config{Store: memstore.NewMemory(time.Second), Lease: time.Second, OutputFlushInterval: time.Hour})
	st, err := runstest.Start(m, runstest.Ctx(t), "brief", runstest.Chain("x"), nil)
	require.NoError(t, err)
	var outs []*stubbornv1.AttemptOutput
	for _, ev := range watchToEnd(t, m, st.GetRunId()) {
		if o := ev.GetAttemptOutput(); o != nil {
			outs = append(outs, o)
		}
	}
	require.Len(t, outs, 2)
	assert.Equal(t, "Let me ", outs[0].GetText())
	assert.Empty(t, outs[0].GetDeltas())
	assert.Equal(t, "check.", outs[1].GetText())
	assert.EqualValues(t, 7, outs[1].GetOffset())
	require.Len(t, outs[1].GetDeltas(), 1)
	tc := outs[1].GetDeltas()[0].GetToolCall()
	assert.Equal(t, "call_1", tc.GetId())
	assert.Equal(t, "get_weather", tc.GetName())
	assert.Equal(t, `{"city":"Paris"}`, tc.GetArguments())
	assert.Zero(t, outs[1].GetDeltas()[0].GetOffset())
}
