package conversation_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/conversation"
)

// feed gives d every event of a text/event-stream body and returns the
// deltas and whether the end marker came.
func feed(t *testing.T, d conversation.StreamDecoder, stream string) ([]*stubbornv1.OutputDelta, bool) {
	t.Helper()
	var all []*stubbornv1.OutputDelta
	for _, block := range strings.Split(strings.TrimSpace(stream), "\n\n") {
		var ev conversation.Event
		for _, line := range strings.Split(block, "\n") {
			if name, ok := strings.CutPrefix(line, "event: "); ok {
				ev.Name = name
			} else if data, ok := strings.CutPrefix(line, "data: "); ok {
				ev.Data = []byte(data)
			}
		}
		ds, done, err := d.Next(ev)
		require.NoError(t, err)
		all = append(all, ds...)
		if done {
			return all, true
		}
	}
	return all, false
}

// n = 2: chunks of two choices interleaved, each routed by its own index.
func TestInterleavedChoicesDecodeIntoTwoChoices(t *testing.T) {
	t.Parallel()
	d := conversation.Chat{}.NewStreamDecoder()
	deltas, done := feed(t, d, `
data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}},{"index":1,"delta":{"role":"assistant","content":""}}]}

data: {"choices":[{"index":1,"delta":{"content":"model "}}]}

data: {"choices":[{"index":0,"delta":{"content":"model "}}]}

data: {"choices":[{"index":0,"delta":{"content":"says: A"}}]}

data: {"choices":[{"index":1,"delta":{"content":"says: B"}}]}

data: {"choices":[{"index":1,"delta":{},"finish_reason":"length"}]}

data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}

data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":8,"total_tokens":11}}

data: [DONE]`)
	require.True(t, done)
	r := d.Result()
	require.Len(t, r.GetChoices(), 2)
	assert.Equal(t, "model says: A", r.GetText())
	assert.Equal(t, "model says: A", conversation.Text(r.GetChoices()[0].GetMessage()))
	assert.Equal(t, "model says: B", conversation.Text(r.GetChoices()[1].GetMessage()))
	assert.Equal(t, stubbornv1.FinishReason_FINISH_REASON_LENGTH, r.GetChoices()[1].GetFinishReason())
	assert.Equal(t, int64(11), r.GetUsage().GetTotalTokens())
	require.Len(t, deltas, 4)
	assert.Equal(t, int32(1), deltas[0].GetChoice())
	assert.Equal(t, int64(len("model ")), deltas[3].GetOffset(), "offsets count each choice's own text")
}

func TestStreamedToolCallFragmentsAccumulateIntoArguments(t *testing.T) {
	t.Parallel()
	d := conversation.Chat{}.NewStreamDecoder()
	deltas, done := feed(t, d, `
data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}

data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"ci"}}]}}]}

data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_2","type":"function","function":{"name":"get_time","arguments":"{}"}}]}}]}

data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"ty\":\"Paris\"}"}}]}}]}

data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}

data: [DONE]`)
	require.True(t, done)
	calls := d.Result().GetChoices()[0].GetMessage().GetToolCalls()
	require.Len(t, calls, 2)
	assert.True(t, proto.Equal(&stubbornv1.ToolCall{Id: "call_1", Name: "get_weather", Arguments: `{"city":"Paris"}`}, calls[0]))
	assert.True(t, proto.Equal(&stubbornv1.ToolCall{Id: "call_2", Name: "get_time", Arguments: `{}`}, calls[1]))
	require.Len(t, deltas, 4)
	assert.Equal(t, int64(len(`{"ci`)), deltas[3].GetOffset())
	assert.Empty(t, d.Result().GetText(), "an answer of tool calls only has no text")
}

func TestInputJSONDeltasAccumulateIntoArguments(t *testing.T) {
	t.Parallel()
	d := conversation.Messages{}.NewStreamDecoder()
	deltas, done := feed(t, d, `
event: message_start
data: {"type":"message_start","message":{"id":"msg_1","model":"claude-x","usage":{"input_tokens":12,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Let me look."}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: ping
data: {"type":"ping"}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"city\": \"Pa"}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"ris\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: content_block_start
data: {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_2","name":"get_time","input":{}}}

event: content_block_stop
data: {"type":"content_block_stop","index":2}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":30}}

event: message_stop
data: {"type":"message_stop"}`)
	require.True(t, done)
	r := d.Result()
	assert.Equal(t, "Let me look.", r.GetText())
	calls := r.GetChoices()[0].GetMessage().GetToolCalls()
	require.Len(t, calls, 2)
	assert.Equal(t, `{"city": "Paris"}`, calls[0].GetArguments())
	assert.Equal(t, `{}`, calls[1].GetArguments(), "a call streamed without input_json_delta has its start's input")
	assert.Equal(t, stubbornv1.FinishReason_FINISH_REASON_TOOL_CALLS, r.GetChoices()[0].GetFinishReason())
	assert.True(t, proto.Equal(&stubbornv1.Usage{InputTokens: 12, OutputTokens: 30, TotalTokens: 42}, r.GetUsage()))
	assert.Equal(t, int32(1), deltas[len(deltas)-1].GetToolCall().GetIndex(), "call index = tool_use blocks before it, not the block index")
}

func TestAStreamErrorIsReturned(t *testing.T) {
	t.Parallel()
	_, _, err := conversation.Chat{}.NewStreamDecoder().Next(conversation.Event{Data: []byte(`{"error":{"type":"server_error","message":"boom"}}`)})
	var se *conversation.StreamError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, "boom", se.Message)
	_, _, err = conversation.Messages{}.NewStreamDecoder().Next(conversation.Event{Name: "error", Data: []byte(`{"type":"error","error":{"type":"overloaded_error","message":"busy"}}`)})
	require.ErrorAs(t, err, &se)
	assert.Equal(t, "overloaded_error", se.Type)
}

// What a door's stream encoder writes, the same API's decoder reads back
// into the same answer — including what the deltas had not carried yet,
// which End sends.
func TestAStreamEncodedByADoorDecodesIntoTheSameAnswer(t *testing.T) {
	t.Parallel()
	answer := &stubbornv1.Result{Text: "Let me look.", Choices: []*stubbornv1.Choice{{
		Message: &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT,
			Content:   []*stubbornv1.ContentPart{{Kind: &stubbornv1.ContentPart_Text{Text: "Let me look."}}},
			ToolCalls: []*stubbornv1.ToolCall{{Id: "c1", Name: "get_weather", Arguments: `{"city":"Paris"}`}, {Id: "c2", Name: "get_time", Arguments: `{}`}}},
		FinishReason: stubbornv1.FinishReason_FINISH_REASON_TOOL_CALLS}},
		Usage: &stubbornv1.Usage{InputTokens: 5, OutputTokens: 7, TotalTokens: 12}}
	text := func(s string) *stubbornv1.OutputDelta {
		return &stubbornv1.OutputDelta{Kind: &stubbornv1.OutputDelta_Text{Text: s}}
	}
	call := func(k int32, id, name, args string) *stubbornv1.OutputDelta {
		return &stubbornv1.OutputDelta{Kind: &stubbornv1.OutputDelta_ToolCall{ToolCall: &stubbornv1.ToolCallDelta{Index: k, Id: id, Name: name, Arguments: args}}}
	}
	for _, codec := range []conversation.Codec{conversation.Chat{}, conversation.Messages{}} {
		t.Run(codec.API().String(), func(t *testing.T) {
			t.Parallel()
			enc := codec.NewStreamEncoder(conversation.Meta{ID: "run-1", Model: "smart", IncludeUsage: true})
			evs, err := enc.Deltas([]*stubbornv1.OutputDelta{text("Let me "), text("look."), call(0, "c1", "get_weather", `{"ci`)})
			require.NoError(t, err)
			end, err := enc.End(answer) // the rest of call 0, and call 1, were never streamed
			require.NoError(t, err)
			var body []byte
			for _, ev := range append(evs, end...) {
				body = ev.AppendSSE(body)
			}
			dec := codec.NewStreamDecoder()
			_, done := feed(t, dec, string(body))
			require.True(t, done, "%s", body)
			got := dec.Result()
			got.Model = ""
			assert.True(t, proto.Equal(answer.GetChoices()[0].GetMessage(), got.GetChoices()[0].GetMessage()), "%v\n%s", got, body)
			assert.Equal(t, stubbornv1.FinishReason_FINISH_REASON_TOOL_CALLS, got.GetChoices()[0].GetFinishReason())
			assert.Equal(t, int64(7), got.GetUsage().GetOutputTokens())
		})
	}
}
