package conversation_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/conversation"
)

const (
	chatToolAnswer = `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-x","choices":[
		{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},"finish_reason":"tool_calls","logprobs":null}],
		"usage":{"prompt_tokens":20,"completion_tokens":10,"total_tokens":30,"prompt_tokens_details":{"cached_tokens":4},"completion_tokens_details":{"reasoning_tokens":2}}}`
	anthropicToolAnswer = `{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[
		{"type":"text","text":"Let me look."},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}],
		"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":10,"cache_creation_input_tokens":6,"cache_read_input_tokens":4}}`
)

func TestAWholeAnswerKeepsItsToolCallsChoicesAndUsage(t *testing.T) {
	t.Parallel()
	r, err := conversation.Chat{}.DecodeResponse([]byte(chatToolAnswer))
	require.NoError(t, err)
	require.Len(t, r.GetChoices(), 1)
	c := r.GetChoices()[0]
	assert.Equal(t, "get_weather", c.GetMessage().GetToolCalls()[0].GetName())
	assert.Equal(t, `{"city":"Paris"}`, c.GetMessage().GetToolCalls()[0].GetArguments())
	assert.Equal(t, stubbornv1.FinishReason_FINISH_REASON_TOOL_CALLS, c.GetFinishReason())
	assert.True(t, proto.Equal(&stubbornv1.Usage{InputTokens: 20, OutputTokens: 10, TotalTokens: 30, CacheReadTokens: 4, ReasoningTokens: 2}, r.GetUsage()))
	assert.Equal(t, "gpt-x", r.GetModel())

	// The same answer through the Messages door: a tool_use block, stop_reason tool_use.
	out, err := conversation.Messages{}.EncodeResponse(r, conversation.Meta{ID: "run-1", Model: "smart"})
	require.NoError(t, err)
	assert.JSONEq(t, `{"id":"run-1","type":"message","role":"assistant","model":"smart",
		"content":[{"type":"tool_use","id":"call_1","name":"get_weather","input":{"city":"Paris"}}],
		"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":16,"output_tokens":10,"cache_read_input_tokens":4}}`, string(out))

	a, err := conversation.Messages{}.DecodeResponse([]byte(anthropicToolAnswer))
	require.NoError(t, err)
	assert.Equal(t, "Let me look.", a.GetText())
	assert.True(t, proto.Equal(&stubbornv1.Usage{InputTokens: 20, OutputTokens: 10, TotalTokens: 30, CacheReadTokens: 4, CacheWriteTokens: 6}, a.GetUsage()))
	out, err = conversation.Chat{}.EncodeResponse(a, conversation.Meta{ID: "run-2", Model: "smart", Created: 5})
	require.NoError(t, err)
	assert.JSONEq(t, `{"id":"run-2","object":"chat.completion","created":5,"model":"smart","choices":[
		{"index":0,"message":{"role":"assistant","content":"Let me look.","tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},"finish_reason":"tool_calls","logprobs":null}],
		"usage":{"prompt_tokens":20,"completion_tokens":10,"total_tokens":30,"prompt_tokens_details":{"cached_tokens":4}}}`, string(out))
}

func TestAWholeAnswerRoundTripsThroughItsOwnAPI(t *testing.T) {
	t.Parallel()
	for _, row := range []struct {
		codec conversation.Codec
		body  string
	}{{conversation.Chat{}, chatToolAnswer}, {conversation.Messages{}, anthropicToolAnswer}} {
		first, err := row.codec.DecodeResponse([]byte(row.body))
		require.NoError(t, err)
		out, err := row.codec.EncodeResponse(first, conversation.Meta{Model: first.GetModel()})
		require.NoError(t, err)
		second, err := row.codec.DecodeResponse(out)
		require.NoError(t, err)
		assert.True(t, proto.Equal(first, second), "%v\n%v", first, second)
	}
}

// stop_reason ↔ finish_reason, both ways.
func TestFinishReasonsTranslate(t *testing.T) {
	t.Parallel()
	for _, row := range []struct{ anthropic, chat, back string }{
		{"end_turn", "stop", "end_turn"},
		{"stop_sequence", "stop", "end_turn"}, // Chat Completions cannot say which
		{"max_tokens", "length", "max_tokens"},
		{"model_context_window_exceeded", "length", "max_tokens"},
		{"tool_use", "tool_calls", "tool_use"},
		{"refusal", "content_filter", "refusal"},
		{"pause_turn", "length", "max_tokens"},
	} {
		t.Run(row.anthropic, func(t *testing.T) {
			t.Parallel()
			a, err := conversation.Messages{}.DecodeResponse([]byte(`{"content":[{"type":"text","text":"x"}],"stop_reason":"` + row.anthropic + `"}`))
			require.NoError(t, err)
			out, err := conversation.Chat{}.EncodeResponse(a, conversation.Meta{})
			require.NoError(t, err)
			assert.Contains(t, string(out), `"finish_reason":"`+row.chat+`"`)
			c, err := conversation.Chat{}.DecodeResponse(out)
			require.NoError(t, err)
			out, err = conversation.Messages{}.EncodeResponse(c, conversation.Meta{})
			require.NoError(t, err)
			assert.Contains(t, string(out), `"stop_reason":"`+row.back+`"`)
		})
	}
}

func TestAnAnswerAnthropicCannotCarryIsAnError(t *testing.T) {
	t.Parallel()
	r, err := conversation.Chat{}.DecodeResponse([]byte(`{"choices":[{"index":0,"message":{"tool_calls":[{"id":"c","function":{"name":"f","arguments":"[1"}}]},"finish_reason":"tool_calls"}]}`))
	require.NoError(t, err)
	_, err = conversation.Messages{}.EncodeResponse(r, conversation.Meta{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "choices[0].message.tool_calls[0].arguments")
}
