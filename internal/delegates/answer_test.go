package delegates_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/conversation"
)

// deltas collects what a call streams to its Deltas.
type deltas struct {
	mu  sync.Mutex
	got []*stubbornv1.OutputDelta
}

func (d *deltas) add(ds []*stubbornv1.OutputDelta) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.got = append(d.got, ds...)
}

// text is choice i's streamed text; args is call k of choice i's
// arguments, as the deltas carried them.
func (d *deltas) text(i int32) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var b strings.Builder
	for _, x := range d.got {
		if x.GetChoice() == i && x.GetToolCall() == nil {
			b.WriteString(x.GetText())
		}
	}
	return b.String()
}

func (d *deltas) call(i, k int32) (id, name, args string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, x := range d.got {
		if tc := x.GetToolCall(); x.GetChoice() == i && tc != nil && tc.GetIndex() == k {
			id += tc.GetId()
			name += tc.GetName()
			args += tc.GetArguments()
		}
	}
	return id, name, args
}

// chatConversation decodes a Chat Completions request body into the typed
// conversation a door makes of it.
func chatConversation(t *testing.T, body string) *stubbornv1.Conversation {
	t.Helper()
	req, err := conversation.Chat{}.DecodeRequest([]byte(body))
	require.NoError(t, err)
	return req.Conversation
}

func sentBody(t *testing.T, f *fakeHTTP) map[string]any {
	t.Helper()
	var sent map[string]any
	require.NoError(t, json.Unmarshal(f.last(t).body, &sent))
	return sent
}

const weatherAnswer = `{"id":"c1","model":"m-1","object":"chat.completion",
	"choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},"finish_reason":"tool_calls"}],
	"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}`

// TestAnOpenAIAnswerKeepsItsToolCalls: a Chat Completions answer that is a
// tool call comes back with its call, whole and streamed (the fragments of
// its arguments joined, and passed to Deltas as they come).
func TestAnOpenAIAnswerKeepsItsToolCalls(t *testing.T) {
	whole := newFakeHTTP(t, reply(200, map[string]string{"Content-Type": "application/json"}, weatherAnswer))
	streamed := newFakeHTTP(t, sse(
		`data: {"model":"m-1","choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}`,
		`data: {"model":"m-1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]}`,
		`data: {"model":"m-1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]},"finish_reason":"tool_calls"}]}`,
		`data: [DONE]`,
	))
	p := poolFrom(t, fmt.Sprintf("delegates:\n  - {name: whole, openai: {base_url: %q, model: m}, stream: \"off\"}\n  - {name: streamed, openai: {base_url: %q, model: m}}\n", whole.URL, streamed.URL))
	for _, name := range []string{"whole", "streamed"} {
		t.Run(name, func(t *testing.T) {
			var ds deltas
			var out pieces
			res, err := p.Call(testCtx(t), controls.Call{Delegate: name, Brief: "Weather in Paris?", Output: out.out, Deltas: ds.add})
			require.NoError(t, err)
			require.Len(t, res.GetChoices(), 1)
			c := res.GetChoices()[0]
			assert.Equal(t, stubbornv1.FinishReason_FINISH_REASON_TOOL_CALLS, c.GetFinishReason())
			require.Len(t, c.GetMessage().GetToolCalls(), 1)
			call := c.GetMessage().GetToolCalls()[0]
			assert.Equal(t, "call_1", call.GetId())
			assert.Equal(t, "get_weather", call.GetName())
			assert.JSONEq(t, `{"city":"Paris"}`, call.GetArguments())
			assert.Empty(t, res.GetText())
			assert.Equal(t, "tool_calls", res.GetData().GetStructValue().GetFields()["finish_reason"].GetStringValue(), "data as before")
			assert.Equal(t, "m-1", res.GetModel())
			assert.Empty(t, out.all(), "no text")
			if name == "streamed" {
				id, fn, args := ds.call(0, 0)
				assert.Equal(t, []string{"call_1", "get_weather", `{"city":"Paris"}`}, []string{id, fn, args})
			}
		})
	}
}

// TestAnOpenAIStreamRoutesChoicesByIndex: n = 2 streams the two choices'
// chunks interleaved; each chunk goes to its own choice by its index:
// choice 0's text is the call's output and Result.text, choice 1's goes to
// Deltas, and the result has both.
func TestAnOpenAIStreamRoutesChoicesByIndex(t *testing.T) {
	f := newFakeHTTP(t, sse(
		`data: {"model":"m-1","choices":[{"index":0,"delta":{"content":"model "}}]}`,
		`data: {"model":"m-1","choices":[{"index":1,"delta":{"content":"model "}}]}`,
		`data: {"model":"m-1","choices":[{"index":1,"delta":{"content":"two"},"finish_reason":"stop"}]}`,
		`data: {"model":"m-1","choices":[{"index":0,"delta":{"content":"one"},"finish_reason":"length"}]}`,
		`data: {"model":"m-1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`,
		`data: [DONE]`,
	))
	p := poolFrom(t, fmt.Sprintf("delegates:\n  - name: gpt\n    openai: {base_url: %q, model: m}\n", f.URL))
	conv := chatConversation(t, `{"model":"x","messages":[{"role":"user","content":"Say it"}],"n":2}`)
	var out pieces
	var ds deltas
	res, err := p.Call(testCtx(t), controls.Call{Delegate: "gpt", Brief: "Say it", TaskBrief: "Say it", Task: true, Conversation: conv,
		Output: out.out, Deltas: ds.add})
	require.NoError(t, err)
	assert.Equal(t, 2.0, sentBody(t, f)["n"])
	assert.Equal(t, "model one", res.GetText())
	assert.Equal(t, []string{"model ", "one"}, out.all(), "only choice 0's text is the output")
	assert.Equal(t, "model two", ds.text(1))
	assert.Empty(t, ds.text(0), "choice 0's text is not a delta")
	require.Len(t, res.GetChoices(), 2)
	assert.Equal(t, "model one", conversation.Text(res.GetChoices()[0].GetMessage()))
	assert.Equal(t, "model two", conversation.Text(res.GetChoices()[1].GetMessage()))
	assert.Equal(t, stubbornv1.FinishReason_FINISH_REASON_LENGTH, res.GetChoices()[0].GetFinishReason())
	assert.Equal(t, stubbornv1.FinishReason_FINISH_REASON_STOP, res.GetChoices()[1].GetFinishReason())
	assert.Equal(t, int64(7), res.GetUsage().GetTotalTokens())
	assert.Equal(t, "length", res.GetData().GetStructValue().GetFields()["finish_reason"].GetStringValue(), "choice 0's, as before")
}

// TestAnAnthropicDelegateGetsToolsAndAnswersToolUse: a conversation with
// tools (written in Chat Completions) reaches an anthropic delegate with
// its tools (input_schema) and tool_choice; a tool_use answer comes back
// as the choice's tool call, whole and streamed (input_json_delta).
func TestAnAnthropicDelegateGetsToolsAndAnswersToolUse(t *testing.T) {
	whole := newFakeHTTP(t, reply(200, map[string]string{"Content-Type": "application/json"}, `{
		"id":"msg_1","type":"message","role":"assistant","model":"claude-x",
		"content":[{"type":"text","text":"Let me look."},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}],
		"stop_reason":"tool_use","usage":{"input_tokens":9,"output_tokens":4}}`))
	streamed := newFakeHTTP(t, sse(
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-x\",\"usage\":{\"input_tokens\":9}}}",
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Let me look.\"}}",
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}",
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\",\"input\":{}}}",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"city\\\": \"}}",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\\\"Paris\\\"}\"}}",
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}",
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":4}}",
		"event: message_stop\ndata: {\"type\":\"message_stop\"}",
	))
	p := poolFrom(t, fmt.Sprintf("delegates:\n  - {name: whole, anthropic: {base_url: %q, model: claude-x}, stream: \"off\"}\n  - {name: streamed, anthropic: {base_url: %q, model: claude-x}}\n", whole.URL, streamed.URL))
	conv := chatConversation(t, `{"model":"x","messages":[{"role":"user","content":"Weather in Paris?"}],
		"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],
		"tool_choice":{"type":"function","function":{"name":"get_weather"}}}`)
	for name, f := range map[string]*fakeHTTP{"whole": whole, "streamed": streamed} {
		t.Run(name, func(t *testing.T) {
			var out pieces
			var ds deltas
			res, err := p.Call(testCtx(t), controls.Call{Delegate: name, Brief: "Weather in Paris?", TaskBrief: "Weather in Paris?", Task: true,
				Conversation: conv, Output: out.out, Deltas: ds.add})
			require.NoError(t, err)
			sent := sentBody(t, f)
			assert.Equal(t, []any{map[string]any{"name": "get_weather", "description": "Weather of a city",
				"input_schema": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}}}}, sent["tools"])
			assert.Equal(t, map[string]any{"type": "tool", "name": "get_weather"}, sent["tool_choice"])

			require.Len(t, res.GetChoices(), 1)
			c := res.GetChoices()[0]
			assert.Equal(t, stubbornv1.FinishReason_FINISH_REASON_TOOL_CALLS, c.GetFinishReason())
			require.Len(t, c.GetMessage().GetToolCalls(), 1)
			call := c.GetMessage().GetToolCalls()[0]
			assert.Equal(t, "toolu_1", call.GetId())
			assert.Equal(t, "get_weather", call.GetName())
			assert.JSONEq(t, `{"city":"Paris"}`, call.GetArguments())
			assert.Equal(t, "Let me look.", res.GetText())
			assert.Equal(t, "tool_use", res.GetData().GetStructValue().GetFields()["stop_reason"].GetStringValue(), "data as before")
			if name == "streamed" {
				assert.Equal(t, []string{"Let me look."}, out.all())
				id, fn, args := ds.call(0, 0)
				assert.Equal(t, "toolu_1", id)
				assert.Equal(t, "get_weather", fn)
				assert.JSONEq(t, `{"city":"Paris"}`, args)
			}
		})
	}
}

// secondTurn is a conversation whose last message is a tool's result.
const secondTurn = `{"model":"x","messages":[{"role":"user","content":"Weather in Paris?"},
	{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
	{"role":"tool","tool_call_id":"call_1","content":"18C"}],
	"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]}`

// TestATurnWithAToolResultReachesAnthropicAsToolResult: the second turn of
// a tool call (the assistant's call, the tool's result) reaches an
// anthropic delegate as a tool_use block and a tool_result block with the
// same id.
func TestATurnWithAToolResultReachesAnthropicAsToolResult(t *testing.T) {
	f := newFakeHTTP(t, reply(200, map[string]string{"Content-Type": "application/json"},
		`{"type":"message","model":"claude-x","content":[{"type":"text","text":"18C in Paris."}],"stop_reason":"end_turn"}`))
	p := poolFrom(t, fmt.Sprintf("delegates:\n  - {name: claude, anthropic: {base_url: %q, model: claude-x}, stream: \"off\"}\n", f.URL))
	res, err := p.Call(testCtx(t), controls.Call{Delegate: "claude", Brief: "Weather in Paris?", TaskBrief: "Weather in Paris?", Task: true,
		Conversation: chatConversation(t, secondTurn)})
	require.NoError(t, err)
	assert.Equal(t, "18C in Paris.", res.GetText())
	assert.Equal(t, []any{
		map[string]any{"role": "user", "content": "Weather in Paris?"},
		map[string]any{"role": "assistant", "content": []any{
			map[string]any{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": map[string]any{"city": "Paris"}}}},
		map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "tool_result", "tool_use_id": "call_1", "content": "18C"}}},
	}, sentBody(t, f)["messages"])
}

// TestTheHistoryGoesAfterAToolResult: what the control added to the brief
// (retry-with-learning's history) is appended to the text of the last
// message when it is the user's, byte for byte; after a tool result it is
// the user's next turn: a user message of its own (to Anthropic, a text
// block after the tool_result in the same user turn). A run journaled
// with the legacy messages gets it the same way.
func TestTheHistoryGoesAfterAToolResult(t *testing.T) {
	const added = "\n\nPrevious attempts failed:\n1. too vague"
	answer := reply(200, map[string]string{"Content-Type": "application/json"}, `{"type":"message","choices":[{"index":0,"message":{"content":"ok"}}],"content":[{"type":"text","text":"ok"}]}`)
	gpt, claude := newFakeHTTP(t, answer), newFakeHTTP(t, answer)
	p := poolFrom(t, fmt.Sprintf("delegates:\n  - {name: gpt, openai: {base_url: %q, model: m}, stream: \"off\"}\n  - {name: claude, anthropic: {base_url: %q, model: m}, stream: \"off\"}\n", gpt.URL, claude.URL))
	call := func(t *testing.T, name string, c controls.Call) []any {
		t.Helper()
		c.Delegate, c.Task, c.TaskBrief, c.Added = name, true, "Weather in Paris?", added
		c.Brief = c.TaskBrief + added
		_, err := p.Call(testCtx(t), c)
		require.NoError(t, err)
		f := map[string]*fakeHTTP{"gpt": gpt, "claude": claude}[name]
		msgs, _ := sentBody(t, f)["messages"].([]any)
		return msgs
	}
	conv := chatConversation(t, secondTurn)

	msgs := call(t, "gpt", controls.Call{Conversation: conv})
	require.Len(t, msgs, 4)
	assert.Equal(t, map[string]any{"role": "tool", "tool_call_id": "call_1", "content": "18C"}, msgs[2])
	assert.Equal(t, map[string]any{"role": "user", "content": strings.TrimPrefix(added, "\n\n")}, msgs[3])
	assert.Len(t, conv.GetMessages(), 3, "the run's conversation is not changed")

	msgs = call(t, "claude", controls.Call{Conversation: conv})
	require.Len(t, msgs, 3)
	assert.Equal(t, map[string]any{"role": "user", "content": []any{
		map[string]any{"type": "tool_result", "tool_use_id": "call_1", "content": "18C"},
		map[string]any{"type": "text", "text": strings.TrimPrefix(added, "\n\n")},
	}}, msgs[2])

	// Ending with the user's message: appended to its text.
	msgs = call(t, "gpt", controls.Call{Conversation: chatConversation(t, `{"model":"x","messages":[{"role":"user","content":"Weather in Paris?"}]}`)})
	assert.Equal(t, []any{map[string]any{"role": "user", "content": "Weather in Paris?" + added}}, msgs)

	// The same for a run journaled with the legacy messages.
	var legacy []*structpb.Struct
	for _, m := range []map[string]any{
		{"role": "user", "content": "Weather in Paris?"},
		{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": "call_1", "type": "function", "function": map[string]any{"name": "get_weather", "arguments": "{}"}}}},
		{"role": "tool", "tool_call_id": "call_1", "content": "18C"},
	} {
		s, err := structpb.NewStruct(m)
		require.NoError(t, err)
		legacy = append(legacy, s)
	}
	msgs = call(t, "gpt", controls.Call{Messages: legacy})
	require.Len(t, msgs, 4)
	assert.Equal(t, map[string]any{"role": "user", "content": strings.TrimPrefix(added, "\n\n")}, msgs[3])
}

// recorder is a gRPC delegate that records what it is sent, and answers a
// stream with a delta of another choice and a result with two choices (twoChoices).
type recorder struct {
	stubbornv1.UnimplementedDelegateServiceServer
	mu      sync.Mutex
	unary   []*stubbornv1.ExecuteRequest
	streams []*stubbornv1.ExecuteStreamRequest
}

var twoChoices = &stubbornv1.Result{Text: "one", Choices: []*stubbornv1.Choice{
	{Index: 0, Message: &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT, Content: []*stubbornv1.ContentPart{{Kind: &stubbornv1.ContentPart_Text{Text: "one"}}}}},
	{Index: 1, Message: &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT, Content: []*stubbornv1.ContentPart{{Kind: &stubbornv1.ContentPart_Text{Text: "two"}}}}},
}}

func (r *recorder) Execute(_ context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unary = append(r.unary, req)
	return &stubbornv1.ExecuteResponse{Result: twoChoices}, nil
}

func (r *recorder) ExecuteStream(req *stubbornv1.ExecuteStreamRequest, st grpc.ServerStreamingServer[stubbornv1.ExecuteStreamResponse]) error {
	r.mu.Lock()
	r.streams = append(r.streams, req)
	r.mu.Unlock()
	for _, m := range []*stubbornv1.ExecuteStreamResponse{
		{Kind: &stubbornv1.ExecuteStreamResponse_TextDelta{TextDelta: "one"}},
		{Kind: &stubbornv1.ExecuteStreamResponse_Delta{Delta: &stubbornv1.OutputDelta{Choice: 1, Kind: &stubbornv1.OutputDelta_Text{Text: "two"}}}},
		{Kind: &stubbornv1.ExecuteStreamResponse_Result{Result: twoChoices}},
	} {
		if err := st.Send(m); err != nil {
			return err
		}
	}
	return nil
}

// TestAGRPCDelegateGetsTheTypedConversation: a gRPC delegate gets a typed
// run's conversation (the control's addition applied, and said in
// brief_addition) and the legacy messages and model_params rendered from
// it, so a delegate that reads only those sees what it saw; a legacy run's
// delegate gets its Structs and the typed conversation read from them. A
// streamed delta goes to Deltas, and the result's choices come back.
func TestAGRPCDelegateGetsTheTypedConversation(t *testing.T) {
	r := &recorder{}
	addr := serveRaw(t, r)
	p := poolFrom(t, fmt.Sprintf("delegates:\n  - {name: unary, target: %s, stream: \"off\"}\n  - {name: streamed, target: %s}\n", addr, addr))
	const added = "\n\nPrevious attempts failed:\n1. too vague"
	conv := chatConversation(t, `{"model":"x","messages":[{"role":"user","content":"Hi"}],"temperature":0.3,"logprobs":true}`)
	withAdded := chatConversation(t, `{"model":"x","messages":[{"role":"user","content":"Hi`+strings.ReplaceAll(added, "\n", `\n`)+`"}],"temperature":0.3,"logprobs":true}`)

	res, err := p.Call(testCtx(t), controls.Call{Delegate: "unary", Brief: "Hi" + added, TaskBrief: "Hi", Added: added, Task: true, Conversation: conv})
	require.NoError(t, err)
	assert.True(t, proto.Equal(twoChoices, res), "the result's choices pass through: %v", res)
	r.mu.Lock()
	req := r.unary[len(r.unary)-1]
	r.mu.Unlock()
	assert.True(t, proto.Equal(withAdded, req.GetConversation()), "got %s", protojson.Format(req.GetConversation()))
	assert.Equal(t, added, req.GetBriefAddition())
	require.Len(t, req.GetMessages(), 1)
	assert.Equal(t, map[string]any{"role": "user", "content": "Hi" + added}, req.GetMessages()[0].AsMap())
	assert.Equal(t, map[string]any{"temperature": 0.3, "logprobs": true}, req.GetModelParams().AsMap())

	// A judge's call about the run gets no conversation.
	_, err = p.Call(testCtx(t), controls.Call{Delegate: "unary", Brief: "Judge it", Conversation: conv})
	require.NoError(t, err)
	r.mu.Lock()
	req = r.unary[len(r.unary)-1]
	r.mu.Unlock()
	assert.Nil(t, req.GetConversation())
	assert.Empty(t, req.GetMessages())

	// A legacy run: its Structs, and the conversation read from them.
	user, err := structpb.NewStruct(map[string]any{"role": "user", "content": "Hi"})
	require.NoError(t, err)
	params, err := structpb.NewStruct(map[string]any{"temperature": 0.3, "logprobs": true})
	require.NoError(t, err)
	var out pieces
	var ds deltas
	res, err = p.Call(testCtx(t), controls.Call{Delegate: "streamed", Brief: "Hi" + added, TaskBrief: "Hi", Added: added, Task: true,
		Messages: []*structpb.Struct{user}, ModelParams: params, Output: out.out, Deltas: ds.add})
	require.NoError(t, err)
	assert.Len(t, res.GetChoices(), 2)
	assert.Equal(t, []string{"one"}, out.all())
	assert.Equal(t, "two", ds.text(1))
	r.mu.Lock()
	sreq := r.streams[len(r.streams)-1]
	r.mu.Unlock()
	assert.True(t, proto.Equal(withAdded, sreq.GetConversation()), "got %s", protojson.Format(sreq.GetConversation()))
	assert.Equal(t, added, sreq.GetBriefAddition())
	assert.Equal(t, map[string]any{"role": "user", "content": "Hi" + added}, sreq.GetMessages()[0].AsMap())
	assert.True(t, proto.Equal(params, sreq.GetModelParams()))
}

// TestAModelsTextCountsOnceTowardMaxResultBytes: a model's first choice's
// text is in Result.text and in its choice; the answer is bounded by
// max_result_bytes counting it once.
func TestAModelsTextCountsOnceTowardMaxResultBytes(t *testing.T) {
	answer := func(n int) string {
		return `{"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"` + strings.Repeat("x", n) + `"},"finish_reason":"stop"}]}`
	}
	fits, over := newFakeHTTP(t, reply(200, map[string]string{"Content-Type": "application/json"}, answer(700))),
		newFakeHTTP(t, reply(200, map[string]string{"Content-Type": "application/json"}, answer(1100)))
	p := poolFrom(t, fmt.Sprintf("limits: {max_result_bytes: 1000}\ndelegates:\n  - {name: fits, openai: {base_url: %q, model: m}, stream: \"off\"}\n  - {name: over, openai: {base_url: %q, model: m}, stream: \"off\"}\n", fits.URL, over.URL))
	res, err := p.Call(testCtx(t), controls.Call{Delegate: "fits", Brief: "b"})
	require.NoError(t, err)
	assert.Len(t, res.GetText(), 700)
	_, err = p.Call(testCtx(t), controls.Call{Delegate: "over", Brief: "b"})
	assert.Equal(t, codes.ResourceExhausted, callError(t, err).Code)
}

// TestAFieldTheAPICannotCarryIsRefusedBeforeAnyCall: n = 2 to an anthropic
// delegate is INVALID_ARGUMENT naming n and the delegate, not sent and not
// retried; a conversation that allows dropping it is sent without it. A
// conversation without options (a gRPC client's) is all defaults.
func TestAFieldTheAPICannotCarryIsRefusedBeforeAnyCall(t *testing.T) {
	f := newFakeHTTP(t, reply(200, map[string]string{"Content-Type": "application/json"},
		`{"type":"message","model":"claude-x","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn"}`))
	p := poolFrom(t, fmt.Sprintf("delegates:\n  - {name: claude, anthropic: {base_url: %q, model: claude-x}, stream: \"off\"}\n", f.URL))
	task := func(conv *stubbornv1.Conversation) controls.Call {
		return controls.Call{Delegate: "claude", Brief: "Hi", TaskBrief: "Hi", Task: true, Conversation: conv}
	}
	_, err := p.Call(testCtx(t), task(chatConversation(t, `{"model":"x","messages":[{"role":"user","content":"Hi"}],"n":2}`)))
	ce := callError(t, err)
	assert.Equal(t, codes.InvalidArgument, ce.Code)
	assert.True(t, ce.NotSent)
	assert.True(t, ce.Refused, "no other try does better")
	assert.Contains(t, ce.Message, "delegate claude")
	assert.Contains(t, ce.Message, "n: ")
	f.mu.Lock()
	assert.Empty(t, f.reqs, "not sent")
	f.mu.Unlock()

	conv := chatConversation(t, `{"model":"x","messages":[{"role":"user","content":"Hi"}],"n":2}`)
	conv.DropParams = []string{"n"}
	_, err = p.Call(testCtx(t), task(conv))
	require.NoError(t, err)
	assert.NotContains(t, sentBody(t, f), "n")

	_, err = p.Call(testCtx(t), task(&stubbornv1.Conversation{Messages: []*stubbornv1.ChatMessage{
		{Role: stubbornv1.ChatRole_CHAT_ROLE_USER, Content: []*stubbornv1.ContentPart{{Kind: &stubbornv1.ContentPart_Text{Text: "Hi"}}}}}}))
	require.NoError(t, err)
	assert.Equal(t, []any{map[string]any{"role": "user", "content": "Hi"}}, sentBody(t, f)["messages"])
}

// TestAModelAnswerWithADeepUsageIsRead: a usage nested past what the codecs
// take does not fail the answer: the choices are read, and Result.data
// keeps the usage (bounded by the pool like any data).
func TestAModelAnswerWithADeepUsageIsRead(t *testing.T) {
	deep := strings.Repeat(`{"a":`, 100) + "1" + strings.Repeat("}", 100)
	f := newFakeHTTP(t, reply(200, map[string]string{"Content-Type": "application/json"},
		`{"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"the answer"},"finish_reason":"stop"}],"usage":`+deep+`}`))
	p := poolFrom(t, fmt.Sprintf("delegates:\n  - {name: gpt, openai: {base_url: %q, model: m}, stream: \"off\"}\n", f.URL))
	res, err := p.Call(testCtx(t), controls.Call{Delegate: "gpt", Brief: "b"})
	require.NoError(t, err)
	assert.Equal(t, "the answer", res.GetText())
	assert.Len(t, res.GetChoices(), 1)
	assert.Equal(t, "stop", res.GetData().GetStructValue().GetFields()["finish_reason"].GetStringValue())
	assert.NotNil(t, res.GetData().GetStructValue().GetFields()["usage"])
}
