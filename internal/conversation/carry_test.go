package conversation_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/conversation"
)

// Every field an API cannot carry is named, unless the request allows
// dropping it.
func TestWhatAnAPICannotCarryIsNamed(t *testing.T) {
	t.Parallel()
	for _, row := range []struct {
		why  string
		from conversation.Codec
		to   conversation.Codec
		body string
		want []string
	}{
		{"n > 1 to Anthropic", conversation.Chat{}, conversation.Messages{}, `{"messages":[],"n":2}`, []string{"n"}},
		{"response_format to Anthropic", conversation.Chat{}, conversation.Messages{}, `{"messages":[],"response_format":{"type":"json_object"}}`, []string{"response_format"}},
		{"response_format text needs nothing", conversation.Chat{}, conversation.Messages{}, `{"messages":[],"response_format":{"type":"text"}}`, nil},
		{"seed and penalties to Anthropic", conversation.Chat{}, conversation.Messages{}, `{"messages":[],"seed":1,"presence_penalty":0.1,"frequency_penalty":0.2}`, []string{"seed", "presence_penalty", "frequency_penalty"}},
		{"strict tools to Anthropic", conversation.Chat{}, conversation.Messages{}, `{"messages":[],"tools":[{"type":"function","function":{"name":"a"}},{"type":"function","function":{"name":"b","strict":true}}]}`, []string{"tools[1].strict"}},
		{"Chat Completions' extras to Anthropic", conversation.Chat{}, conversation.Messages{}, `{"messages":[{"role":"user","content":"x","audio":{}}],"logprobs":true}`, []string{"logprobs", "messages[0].audio"}},
		{"a name to Anthropic", conversation.Chat{}, conversation.Messages{}, `{"messages":[{"role":"user","name":"ann","content":"x"}]}`, []string{"messages[0].name"}},
		{"an image in a system message to Anthropic", conversation.Chat{}, conversation.Messages{}, `{"messages":[{"role":"system","content":[{"type":"image_url","image_url":{"url":"https://x/a.png"}}]}]}`, []string{"messages[0].content[0]"}},
		{"an inline image type Anthropic has not", conversation.Chat{}, conversation.Messages{}, `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/bmp;base64,Qk0="}}]}]}`, []string{"messages[0].content[0]"}},
		{"image detail to Anthropic", conversation.Chat{}, conversation.Messages{}, `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/a.png","detail":"high"}}]}]}`, []string{"messages[0].content[0].detail"}},
		{"arguments that are no object to Anthropic", conversation.Chat{}, conversation.Messages{}, `{"messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"[1,2]"}}]}]}`, []string{"messages[0].tool_calls[0].arguments"}},
		{"top_k to Chat Completions", conversation.Messages{}, conversation.Chat{}, `{"messages":[],"top_k":5}`, []string{"top_k"}},
		{"is_error to Chat Completions", conversation.Messages{}, conversation.Chat{}, `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"x","is_error":true}]}]}`, []string{"messages[0].is_error"}},
		{"cache_control to Chat Completions", conversation.Messages{}, conversation.Chat{}, `{"messages":[{"role":"user","content":[{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}]}],"tools":[{"name":"f","input_schema":{},"cache_control":{"type":"ephemeral"}}]}`,
			[]string{"tools[0].cache_control", "messages[0].content[0].cache_control"}},
		{"Anthropic's extras to Chat Completions", conversation.Messages{}, conversation.Chat{}, `{"messages":[],"thinking":{"type":"enabled","budget_tokens":1024}}`, []string{"thinking"}},
		{"an image in a tool result to Chat Completions", conversation.Messages{}, conversation.Chat{}, `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{"type":"url","url":"https://x/a.png"}}]}]}]}`, []string{"messages[0].content[0]"}},
		{"the same API carries its own extras", conversation.Messages{}, conversation.Messages{}, `{"messages":[],"thinking":{"type":"enabled"},"top_k":3}`, nil},
	} {
		t.Run(row.why, func(t *testing.T) {
			t.Parallel()
			c := decode(t, row.from, row.body).Conversation
			var got []string
			for _, u := range conversation.Carry(row.to.API(), c, conversation.DropOf(c)) {
				assert.NotEmpty(t, u.Why)
				got = append(got, u.Field)
			}
			assert.Equal(t, row.want, got)
			if len(row.want) == 0 {
				return
			}
			_, err := row.to.EncodeRequest(c, conversation.Entry{Model: "m"}, false)
			assert.ErrorContains(t, err, row.want[0], "an encoder never drops what it was not allowed to")
			assert.Empty(t, conversation.Carry(row.to.API(), c, conversation.Drop{Paths: row.want}), "each is allowed by its own path")
			assert.Empty(t, conversation.Carry(row.to.API(), c, conversation.Drop{All: true}))
			c.DropAllParams = true
			_, err = row.to.EncodeRequest(c, conversation.Entry{Model: "m"}, false)
			assert.NoError(t, err, "allowed, it is left out")
		})
	}
}

func TestADropPathAllowsWhatIsUnderIt(t *testing.T) {
	t.Parallel()
	c := decode(t, conversation.Chat{}, `{"messages":[],"tools":[{"type":"function","function":{"name":"b","strict":true}}],"n":3}`).Conversation
	got := conversation.Carry(conversation.AnthropicMessages, c, conversation.Drop{Paths: []string{"tools"}})
	assert.Equal(t, conversation.Problems{{Field: "n", Why: "Anthropic answers one choice"}}, got)
	assert.EqualError(t, got, "cannot carry n: Anthropic answers one choice")
}

// TestAConversationWithoutOptionsIsReadAsEmptyOptions: a gRPC client may
// send a conversation with no options at all; no codec reads it as nil.
func TestAConversationWithoutOptionsIsReadAsEmptyOptions(t *testing.T) {
	t.Parallel()
	c := &stubbornv1.Conversation{Messages: []*stubbornv1.ChatMessage{{
		Role: stubbornv1.ChatRole_CHAT_ROLE_USER, Content: []*stubbornv1.ContentPart{{Kind: &stubbornv1.ContentPart_Text{Text: "hi"}}},
	}}}
	for _, api := range []stubbornv1.ConversationAPI{conversation.ChatCompletions, conversation.AnthropicMessages} {
		assert.Empty(t, conversation.Carry(api, c, conversation.Drop{}))
		_, err := conversation.For(api).EncodeRequest(c, conversation.Entry{Model: "m"}, false)
		require.NoError(t, err)
	}
}
