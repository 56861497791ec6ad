package conversation_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/conversation"
)

// Requests as the SDKs send them (openai npm / openai-go, @anthropic-ai/sdk).
var chatRequests = map[string]string{
	"plain":                      `{"model":"smart","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],"temperature":0.2,"max_tokens":50,"stop":"\n\n","seed":7,"user":"u1"}`,
	"parts and images":           `{"model":"smart","messages":[{"role":"user","content":[{"type":"text","text":"What is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo=","detail":"low"}},{"type":"image_url","image_url":{"url":"https://example.com/cat.jpg"}}]}]}`,
	"tools":                      `{"model":"smart","messages":[{"role":"user","content":"Weather in Paris?"}],"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},"strict":true}}],"tool_choice":{"type":"function","function":{"name":"get_weather"}},"parallel_tool_calls":false}`,
	"second turn":                `{"model":"smart","messages":[{"role":"user","content":"Weather in Paris and Rome?"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},{"id":"call_2","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Rome\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"18C"},{"role":"tool","tool_call_id":"call_2","content":"24C"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],"tool_choice":"auto"}`,
	"response format and extras": `{"model":"smart","messages":[{"role":"user","content":"JSON please"}],"response_format":{"type":"json_schema","json_schema":{"name":"answer","schema":{"type":"object","properties":{"a":{"type":"number"}}},"strict":true}},"logprobs":true,"top_logprobs":2,"n":2,"presence_penalty":0.5,"frequency_penalty":0.1,"max_completion_tokens":99,"stream":true,"stream_options":{"include_usage":true},"stubborn":{"drop_params":true}}`,
}

var messagesRequests = map[string]string{
	"plain":                    `{"model":"smart","max_tokens":1024,"system":"Be brief.","messages":[{"role":"user","content":"Hi"}],"temperature":0.2,"top_k":5,"stop_sequences":["END"],"metadata":{"user_id":"u1"}}`,
	"system blocks and images": `{"model":"smart","max_tokens":10,"system":[{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":[{"type":"text","text":"What is this?"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},{"type":"image","source":{"type":"url","url":"https://example.com/cat.jpg"}}]}]}`,
	"tools":                    `{"model":"smart","max_tokens":10,"messages":[{"role":"user","content":"Weather in Paris?"}],"tools":[{"name":"get_weather","description":"Weather of a city","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}],"tool_choice":{"type":"any","disable_parallel_tool_use":true}}`,
	"second turn":              `{"model":"smart","max_tokens":10,"messages":[{"role":"user","content":"Weather in Paris and Rome?"},{"role":"assistant","content":[{"type":"text","text":"Let me look."},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}},{"type":"tool_use","id":"toolu_2","name":"get_weather","input":{"city":"Rome"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"18C"},{"type":"tool_result","tool_use_id":"toolu_2","content":[{"type":"text","text":"no data"}],"is_error":true},{"type":"text","text":"And tomorrow?"}]}],"tools":[{"name":"get_weather","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"get_weather"}}`,
	"extras":                   `{"model":"smart","max_tokens":2048,"messages":[{"role":"user","content":"Think"}],"thinking":{"type":"enabled","budget_tokens":1024},"service_tier":"auto","stream":true}`,
}

func decode(t *testing.T, c conversation.Codec, body string) *conversation.Request {
	t.Helper()
	req, err := c.DecodeRequest([]byte(body))
	require.NoError(t, err)
	return req
}

// A request decoded, encoded by the same API's codec and decoded again is the
// same typed conversation: nothing is lost on the way through Stubborn.
func TestARequestRoundTripsThroughItsOwnAPI(t *testing.T) {
	t.Parallel()
	for api, corpus := range map[conversation.Codec]map[string]string{conversation.Chat{}: chatRequests, conversation.Messages{}: messagesRequests, conversation.Responses{}: responsesRequests} {
		for name, body := range corpus {
			t.Run(api.API().String()+"/"+name, func(t *testing.T) {
				t.Parallel()
				first := decode(t, api, body)
				first.Conversation.DropAllParams = true // what Carry would refuse is not this test's business
				out, err := api.EncodeRequest(first.Conversation, conversation.Entry{Model: "m"}, first.Stream)
				require.NoError(t, err)
				second := decode(t, api, string(out))
				second.Conversation.DropAllParams = true
				assert.True(t, proto.Equal(first.Conversation, second.Conversation), "first:  %v\nsecond: %v\nbody: %s", first.Conversation, second.Conversation, out)
				assert.Equal(t, "m", second.Model)
			})
		}
	}
}

func TestTheDoorsFieldsAreTheCallersBusiness(t *testing.T) {
	t.Parallel()
	req := decode(t, conversation.Chat{}, chatRequests["response format and extras"])
	assert.Equal(t, "smart", req.Model)
	assert.True(t, req.Stream)
	assert.True(t, req.IncludeUsage)
	assert.JSONEq(t, `{"drop_params":true}`, string(req.Stubborn))
	extra := req.Conversation.GetOptions().GetExtra().AsMap()
	assert.Equal(t, map[string]any{"logprobs": true, "top_logprobs": float64(2)}, extra, "unknown fields are kept, the door's are not")
	assert.Equal(t, stubbornv1.ConversationAPI_CONVERSATION_API_CHAT_COMPLETIONS, req.Conversation.GetApi())
}

// field is the JSON of one field of an encoded body.
func field(t *testing.T, body []byte, name string) string {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(body, &m))
	if m[name] == nil {
		return "null"
	}
	return string(m[name])
}

func encode(t *testing.T, c conversation.Codec, conv *stubbornv1.Conversation) []byte {
	t.Helper()
	conv.DropAllParams = true
	out, err := c.EncodeRequest(conv, conversation.Entry{Model: "m"}, false)
	require.NoError(t, err)
	return out
}

// The translation table, Chat Completions → Anthropic Messages, one row per
// concept (README, "Model front doors").
func TestChatCompletionsTranslatesToAnthropic(t *testing.T) {
	t.Parallel()
	for _, row := range []struct {
		concept, chat, field, anthropic string
	}{
		{"system messages join the top-level system", `{"messages":[{"role":"system","content":"A"},{"role":"developer","content":"B"},{"role":"user","content":"Hi"}]}`,
			"system", `"A\n\nB"`},
		{"tools take input_schema", chatRequests["tools"], "tools",
			`[{"name":"get_weather","description":"Weather of a city","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}]`},
		{"tool_choice named is tool; parallel_tool_calls false disables parallel use", chatRequests["tools"], "tool_choice",
			`{"type":"tool","name":"get_weather","disable_parallel_tool_use":true}`},
		{"tool_choice required is any", `{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required"}`,
			"tool_choice", `{"type":"any"}`},
		{"tool_choice none is none", `{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"none","parallel_tool_calls":false}`,
			"tool_choice", `{"type":"none"}`},
		{"parallel_tool_calls false alone is auto without parallel use", `{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"parallel_tool_calls":false}`,
			"tool_choice", `{"type":"auto","disable_parallel_tool_use":true}`},
		{"assistant tool_calls are tool_use blocks; tool messages merge into one user turn", chatRequests["second turn"], "messages",
			`[{"role":"user","content":"Weather in Paris and Rome?"},
			  {"role":"assistant","content":[{"type":"tool_use","id":"call_1","name":"get_weather","input":{"city":"Paris"}},{"type":"tool_use","id":"call_2","name":"get_weather","input":{"city":"Rome"}}]},
			  {"role":"user","content":[{"type":"tool_result","tool_use_id":"call_1","content":"18C"},{"type":"tool_result","tool_use_id":"call_2","content":"24C"}]}]`},
		{"a user message after tool results joins their turn", `{"messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":""}}]},{"role":"tool","tool_call_id":"c","content":"ok"},{"role":"user","content":"Next?"}]}`,
			"messages", `[{"role":"assistant","content":[{"type":"tool_use","id":"c","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"c","content":"ok"},{"type":"text","text":"Next?"}]}]`},
		{"a data URL is a base64 source, an http URL a url source", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBO"}},{"type":"image_url","image_url":{"url":"https://x/c.jpg","detail":"auto"}}]}]}`,
			"messages", `[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBO"}},{"type":"image","source":{"type":"url","url":"https://x/c.jpg"}}]}]`},
		{"stop is stop_sequences", chatRequests["plain"], "stop_sequences", `["\n\n"]`},
		{"user is metadata.user_id", chatRequests["plain"], "metadata", `{"user_id":"u1"}`},
		{"max_tokens is max_tokens", chatRequests["plain"], "max_tokens", `50`},
		{"max_completion_tokens is max_tokens", chatRequests["response format and extras"], "max_tokens", `99`},
		{"no max_tokens is Anthropic's default", `{"messages":[{"role":"user","content":"x"}]}`, "max_tokens", `1024`},
		{"temperature is never rescaled", chatRequests["plain"], "temperature", `0.2`},
		{"seed is dropped only when allowed", chatRequests["plain"], "seed", `null`},
		{"Chat Completions' extras are dropped only when allowed", chatRequests["response format and extras"], "logprobs", `null`},
	} {
		t.Run(row.concept, func(t *testing.T) {
			t.Parallel()
			out := encode(t, conversation.Messages{}, decode(t, conversation.Chat{}, row.chat).Conversation)
			assert.JSONEq(t, row.anthropic, field(t, out, row.field), "%s", out)
		})
	}
}

// The translation table, Anthropic Messages → Chat Completions.
func TestAnthropicTranslatesToChatCompletions(t *testing.T) {
	t.Parallel()
	for _, row := range []struct {
		concept, anthropic, field, chat string
	}{
		{"system is a system message; tool_use blocks are tool_calls; tool_result blocks split into tool messages", messagesRequests["second turn"], "messages",
			`[{"role":"user","content":"Weather in Paris and Rome?"},
			  {"role":"assistant","content":[{"type":"text","text":"Let me look."}],"tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},{"id":"toolu_2","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Rome\"}"}}]},
			  {"role":"tool","tool_call_id":"toolu_1","content":"18C"},
			  {"role":"tool","tool_call_id":"toolu_2","content":[{"type":"text","text":"no data"}]},
			  {"role":"user","content":[{"type":"text","text":"And tomorrow?"}]}]`},
		{"tool_choice tool is a named function", messagesRequests["second turn"], "tool_choice", `{"type":"function","function":{"name":"get_weather"}}`},
		{"tool_choice any is required", messagesRequests["tools"], "tool_choice", `"required"`},
		{"disable_parallel_tool_use is parallel_tool_calls false", messagesRequests["tools"], "parallel_tool_calls", `false`},
		{"input_schema is parameters", messagesRequests["tools"], "tools",
			`[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`},
		{"a base64 source is a data URL, a url source an http URL", messagesRequests["system blocks and images"], "messages",
			`[{"role":"system","content":[{"type":"text","text":"Be brief."}]},{"role":"user","content":[{"type":"text","text":"What is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}},{"type":"image_url","image_url":{"url":"https://example.com/cat.jpg"}}]}]`},
		{"stop_sequences is stop", messagesRequests["plain"], "stop", `["END"]`},
		{"metadata.user_id is user", messagesRequests["plain"], "user", `"u1"`},
		{"top_k is dropped only when allowed", messagesRequests["plain"], "top_k", `null`},
		{"Anthropic's extras are dropped only when allowed", messagesRequests["extras"], "thinking", `null`},
	} {
		t.Run(row.concept, func(t *testing.T) {
			t.Parallel()
			out := encode(t, conversation.Chat{}, decode(t, conversation.Messages{}, row.anthropic).Conversation)
			assert.JSONEq(t, row.chat, field(t, out, row.field), "%s", out)
		})
	}
}

func TestADelegateGetsItsEntrysDefaultsUnderTheRequests(t *testing.T) {
	t.Parallel()
	temp := 0.7
	e := conversation.Entry{Model: "gpt-x", System: "House rules.", Temperature: &temp, MaxTokens: 300}
	bare := decode(t, conversation.Chat{}, `{"messages":[{"role":"user","content":"Hi"}]}`).Conversation
	out, err := conversation.Chat{}.EncodeRequest(bare, e, true)
	require.NoError(t, err)
	assert.JSONEq(t, `{"model":"gpt-x","messages":[{"role":"system","content":"House rules."},{"role":"user","content":"Hi"}],
		"temperature":0.7,"max_tokens":300,"stream":true,"stream_options":{"include_usage":true}}`, string(out))
	out, err = conversation.Messages{}.EncodeRequest(decode(t, conversation.Chat{}, chatRequests["plain"]).Conversation, conversation.Entry{Model: "claude", System: "House rules."}, true)
	require.Error(t, err, "seed cannot go to Anthropic unless dropped")
	assert.Contains(t, err.Error(), "seed")
	conv := decode(t, conversation.Chat{}, chatRequests["plain"]).Conversation
	conv.DropParams = []string{"seed"}
	out, err = conversation.Messages{}.EncodeRequest(conv, conversation.Entry{Model: "claude", System: "House rules."}, true)
	require.NoError(t, err)
	assert.JSONEq(t, `{"model":"claude","system":"House rules.\n\nBe brief.","messages":[{"role":"user","content":"Hi"}],
		"max_tokens":50,"temperature":0.2,"stop_sequences":["\n\n"],"metadata":{"user_id":"u1"},"stream":true}`, string(out))
}

// Every decoder bounds what it takes, and its error names the field.
func TestARequestOutOfBoundsNamesItsField(t *testing.T) {
	t.Parallel()
	deep := `{"type":"object"` + strings.Repeat(`,"p":{"a":[`, 13) + `1` + strings.Repeat(`]}`, 13) + `}`
	many := func(n int, item string) string { return strings.TrimSuffix(strings.Repeat(item+",", n), ",") }
	for _, row := range []struct {
		name  string
		codec conversation.Codec
		body  string
		err   string
	}{
		{"an audio part", conversation.Chat{}, `{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"user","content":"c"},{"role":"user","content":[{"type":"text","text":"x"},{"type":"input_audio","input_audio":{}}]}]}`,
			`messages[3].content[1].type: "input_audio" is not carried`},
		{"a role that is none", conversation.Chat{}, `{"messages":[{"role":"robot","content":"x"}]}`, `messages[0].role: "robot" is not a role`},
		{"1001 messages", conversation.Chat{}, `{"messages":[` + many(1001, `{"role":"user","content":"x"}`) + `]}`, `messages: has 1001 elements, more than 1000`},
		{"129 tools", conversation.Chat{}, `{"messages":[],"tools":[` + many(129, `{"type":"function","function":{"name":"f"}}`) + `]}`, `tools: has 129 elements, more than 128`},
		{"n 129", conversation.Chat{}, `{"messages":[],"n":129}`, `n: must be 1 to 128, not 129`},
		{"a schema 25 deep", conversation.Chat{}, `{"messages":[],"tools":[{"type":"function","function":{"name":"f","parameters":` + deep + `}}]}`, `nests more than 24 levels deep`},
		{"a custom tool", conversation.Chat{}, `{"messages":[],"tools":[{"type":"custom","custom":{"name":"f"}}]}`, `tools[0].type: "custom" is not carried`},
		{"a document block", conversation.Messages{}, `{"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}`, `messages[0].content[0].type: "document" is not carried`},
		{"a thinking block", conversation.Messages{}, `{"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"}]}]}`, `messages[0].content[0].type: "thinking" is not carried`},
		{"a server tool", conversation.Messages{}, `{"messages":[],"tools":[{"type":"web_search_20250305","name":"web_search"}]}`, `tools[0].type: "web_search_20250305" is not carried`},
		{"a tool result without its id", conversation.Messages{}, `{"messages":[{"role":"user","content":[{"type":"tool_result","content":"x"}]}]}`, `messages[0].content[0].tool_use_id: is required`},
		{"129 tools to Anthropic", conversation.Messages{}, `{"messages":[],"tools":[` + many(129, `{"name":"f","input_schema":{}}`) + `]}`, `tools: has 129 elements, more than 128`},
		{"not an object", conversation.Messages{}, `[1]`, `the body must be a JSON object`},
	} {
		t.Run(row.name, func(t *testing.T) {
			t.Parallel()
			_, err := row.codec.DecodeRequest([]byte(row.body))
			require.Error(t, err)
			assert.Contains(t, err.Error(), row.err)
		})
	}
}
