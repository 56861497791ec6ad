package conversation_test

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/conversation"
)

func structs(t *testing.T, js string) []*structpb.Struct {
	t.Helper()
	var list []map[string]any
	require.NoError(t, json.Unmarshal([]byte(js), &list))
	out := make([]*structpb.Struct, len(list))
	for i, m := range list {
		s, err := structpb.NewStruct(m)
		require.NoError(t, err)
		out[i] = s
	}
	return out
}

func params(t *testing.T, js string) *structpb.Struct {
	t.Helper()
	if js == "" {
		return nil
	}
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(js), &m))
	s, err := structpb.NewStruct(m)
	require.NoError(t, err)
	return s
}

func text(s string) []*stubbornv1.ContentPart {
	return []*stubbornv1.ContentPart{{Kind: &stubbornv1.ContentPart_Text{Text: s}}}
}

// TestFromLegacy: the legacy Structs (Chat Completions messages and the
// rest of a body) read as the typed conversation, meaning kept: names the
// typed form has become typed, every other field an extra one, the fields a
// delegate always set itself (model, stream) gone.
func TestFromLegacy(t *testing.T) {
	user := stubbornv1.ChatRole_CHAT_ROLE_USER
	for _, c := range []struct {
		name, msgs, params string
		want               *stubbornv1.Conversation
		err                string
	}{
		{name: "messages only", msgs: `[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]`,
			want: &stubbornv1.Conversation{Api: conversation.ChatCompletions, Options: &stubbornv1.ModelOptions{}, Messages: []*stubbornv1.ChatMessage{
				{Role: stubbornv1.ChatRole_CHAT_ROLE_SYSTEM, Content: text("Be brief.")}, {Role: user, Content: text("Hi")}}}},
		{name: "params typed, extra kept, delegate's own gone",
			msgs:   `[{"role":"user","content":[{"type":"text","text":"Hi"}],"x_tag":1}]`,
			params: `{"model":"ignored","stream":true,"stream_options":{"include_usage":false},"temperature":0.1,"max_tokens":77,"stop":["END"],"seed":4,"logprobs":true,"stubborn":{"k":"v"}}`,
			want: &stubbornv1.Conversation{Api: conversation.ChatCompletions,
				Messages: []*stubbornv1.ChatMessage{{Role: user, Content: text("Hi"), ContentAsParts: true,
					Extra: &structpb.Struct{Fields: map[string]*structpb.Value{"x_tag": structpb.NewNumberValue(1)}}}},
				Options: &stubbornv1.ModelOptions{Temperature: proto.Float64(0.1), MaxTokens: proto.Int64(77), Stop: []string{"END"}, Seed: proto.Int64(4),
					Extra: &structpb.Struct{Fields: map[string]*structpb.Value{"logprobs": structpb.NewBoolValue(true),
						"stubborn": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"k": structpb.NewStringValue("v")}})}}}}},
		{name: "a max_tokens past int32 is bounded, as anthropic delegates bounded it", msgs: `[{"role":"user","content":"Hi"}]`, params: `{"max_tokens":1e300}`,
			want: &stubbornv1.Conversation{Api: conversation.ChatCompletions, Messages: []*stubbornv1.ChatMessage{{Role: user, Content: text("Hi")}},
				Options: &stubbornv1.ModelOptions{MaxTokens: proto.Int64(math.MaxInt32)}}},
		{name: "tool turn", msgs: `[{"role":"user","content":"Weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"w","arguments":"{}"}}]},{"role":"tool","tool_call_id":"call_1","content":"18C"}]`,
			params: `{"tools":[{"type":"function","function":{"name":"w"}}],"tool_choice":"required"}`,
			want: &stubbornv1.Conversation{Api: conversation.ChatCompletions, Messages: []*stubbornv1.ChatMessage{
				{Role: user, Content: text("Weather?")},
				{Role: stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT, ToolCalls: []*stubbornv1.ToolCall{{Id: "call_1", Name: "w", Arguments: "{}"}}},
				{Role: stubbornv1.ChatRole_CHAT_ROLE_TOOL, ToolCallId: "call_1", Content: text("18C")}},
				Options: &stubbornv1.ModelOptions{Tools: []*stubbornv1.Tool{{Name: "w"}},
					ToolChoice: &stubbornv1.ToolChoice{Mode: stubbornv1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED}}}},
		{name: "an unknown role names its field", msgs: `[{"role":"user","content":"a"},{"role":"robot","content":"b"}]`, err: `messages[1].role: "robot" is not a role`},
		{name: "an ill-typed parameter names its field", msgs: `[{"role":"user","content":"a"}]`, params: `{"stop":["END",5]}`, err: `stop[1]: must be a string`},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := conversation.FromLegacy(structs(t, c.msgs), params(t, c.params))
			if c.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), c.err)
				return
			}
			require.NoError(t, err)
			assert.Empty(t, cmpDiff(c.want, got))
		})
	}
}

func cmpDiff(want, got proto.Message) string {
	if proto.Equal(want, got) {
		return ""
	}
	return "want " + protojson.Format(want) + "\ngot " + protojson.Format(got)
}

// TestToLegacy: a typed conversation rendered as the legacy Structs is what
// a Chat Completions request would say (a delegate that reads only the
// legacy fields sees what it saw before), and reads back the same.
func TestToLegacy(t *testing.T) {
	for _, c := range []struct{ name, msgs, params string }{
		{"messages only", `[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]`, ""},
		{"parts, options and extras", `[{"role":"user","content":[{"type":"text","text":"Hi"},{"type":"image_url","image_url":{"url":"https://x/cat.png","detail":"low"}}],"x_tag":1}]`,
			`{"temperature":0.1,"max_tokens":77,"stop":["END"],"seed":4,"n":2,"logprobs":true,"response_format":{"type":"json_object"}}`},
		{"tool turn", `[{"role":"user","content":"Weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"w","arguments":"{}"}}]},{"role":"tool","tool_call_id":"call_1","content":"18C"}]`,
			`{"tools":[{"type":"function","function":{"name":"w","parameters":{"type":"object"}}}],"tool_choice":{"type":"function","function":{"name":"w"}},"parallel_tool_calls":false}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			msgs, ps := structs(t, c.msgs), params(t, c.params)
			conv, err := conversation.FromLegacy(msgs, ps)
			require.NoError(t, err)
			gotMsgs, gotParams, err := conversation.ToLegacy(conv)
			require.NoError(t, err)
			require.Len(t, gotMsgs, len(msgs))
			for i := range msgs {
				assert.True(t, proto.Equal(msgs[i], gotMsgs[i]), "message %d: %v, want %v", i, gotMsgs[i], msgs[i])
			}
			assert.True(t, proto.Equal(ps, gotParams), "params: %v, want %v", gotParams, ps)
		})
	}

	// A conversation written for Anthropic: what Chat Completions has no
	// place for (top_k, a tool result's is_error) is left out of the
	// legacy Structs, whatever the conversation allows dropping.
	conv := &stubbornv1.Conversation{Api: conversation.AnthropicMessages,
		Options:  &stubbornv1.ModelOptions{TopK: proto.Int64(5), Temperature: proto.Float64(0.3)},
		Messages: []*stubbornv1.ChatMessage{{Role: stubbornv1.ChatRole_CHAT_ROLE_TOOL, ToolCallId: "toolu_1", IsError: true, Content: text("boom")}}}
	msgs, ps, err := conversation.ToLegacy(conv)
	require.NoError(t, err)
	assert.True(t, proto.Equal(params(t, `{"temperature":0.3}`), ps), "%v", ps)
	assert.True(t, proto.Equal(structs(t, `[{"role":"tool","tool_call_id":"toolu_1","content":"boom"}]`)[0], msgs[0]), "%v", msgs[0])
	assert.Empty(t, conv.GetDropAllParams(), "the caller's conversation is not changed")

	msgs, ps, err = conversation.ToLegacy(nil)
	assert.NoError(t, err)
	assert.Nil(t, msgs)
	assert.Nil(t, ps)
}
