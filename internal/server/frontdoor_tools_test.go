package server_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
)

// fakeCall is a tool call a fake model answers with.
type fakeCall struct{ id, name, args string }

// fakeChoice is one choice of a fake model's answer: text, or tool calls
// (then its finish reason is tool_calls).
type fakeChoice struct {
	text  string
	calls []fakeCall
}

// recorder keeps the bodies a fake model was sent.
type recorder struct {
	mu     sync.Mutex
	bodies []map[string]any
}

func (r *recorder) take(req *http.Request) map[string]any {
	var body map[string]any
	_ = json.NewDecoder(req.Body).Decode(&body)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.bodies = append(r.bodies, body)
	return body
}

func (r *recorder) last(t *testing.T) map[string]any {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	require.NotEmpty(t, r.bodies, "the model was called")
	return r.bodies[len(r.bodies)-1]
}

// toolChatModel is a Chat Completions server that answers choices, whole
// or streamed as OpenAI streams them: a call's id and name first, its
// arguments in two fragments, each choice's chunks by its index.
func toolChatModel(t testing.TB, rec *recorder, choices ...fakeChoice) string {
	t.Helper()
	finish := func(c fakeChoice) string {
		if len(c.calls) > 0 {
			return "tool_calls"
		}
		return "stop"
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := rec.take(r)
		if stream, _ := body["stream"].(bool); !stream {
			var out []any
			for i, c := range choices {
				msg := map[string]any{"role": "assistant", "content": c.text}
				if len(c.calls) > 0 {
					var calls []any
					for _, call := range c.calls {
						calls = append(calls, map[string]any{"id": call.id, "type": "function", "function": map[string]any{"name": call.name, "arguments": call.args}})
					}
					msg["tool_calls"], msg["content"] = calls, nil
				}
				out = append(out, map[string]any{"index": i, "message": msg, "finish_reason": finish(c)})
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]any{"model": "m", "choices": out, "usage": map[string]any{"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}})
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := func(i int, delta map[string]any, finish any) {
			b, _ := json.Marshal(map[string]any{"model": "m", "choices": []any{map[string]any{"index": i, "delta": delta, "finish_reason": finish}}})
			_, _ = fmt.Fprintf(w, "data: %s\n\n", b)
		}
		for i, c := range choices {
			if c.text != "" {
				chunk(i, map[string]any{"role": "assistant", "content": c.text[:len(c.text)/2]}, nil)
				chunk(i, map[string]any{"content": c.text[len(c.text)/2:]}, nil)
			}
			for k, call := range c.calls {
				chunk(i, map[string]any{"tool_calls": []any{map[string]any{"index": k, "id": call.id, "type": "function", "function": map[string]any{"name": call.name, "arguments": ""}}}}, nil)
				half := len(call.args) / 2
				for _, frag := range []string{call.args[:half], call.args[half:]} {
					chunk(i, map[string]any{"tool_calls": []any{map[string]any{"index": k, "function": map[string]any{"arguments": frag}}}}, nil)
				}
			}
		}
		for i, c := range choices {
			chunk(i, map[string]any{}, finish(c))
		}
		_, _ = io.WriteString(w, "data: {\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4,\"total_tokens\":7}}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// textAnthropicModel is a Messages server that answers text, whole or
// streamed.
func textAnthropicModel(t testing.TB, rec *recorder, text string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := rec.take(r)
		if stream, _ := body["stream"].(bool); !stream {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]any{"type": "message", "role": "assistant", "model": "claude-x",
				"content": []any{map[string]any{"type": "text", "text": text}}, "stop_reason": "end_turn", "usage": map[string]any{"input_tokens": 5, "output_tokens": 2}})
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		ev := func(name string, v map[string]any) {
			v["type"] = name
			b, _ := json.Marshal(v)
			_, _ = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b)
		}
		ev("message_start", map[string]any{"message": map[string]any{"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x", "content": []any{}, "usage": map[string]any{"input_tokens": 5, "output_tokens": 0}}})
		ev("content_block_start", map[string]any{"index": 0, "content_block": map[string]any{"type": "text", "text": ""}})
		ev("content_block_delta", map[string]any{"index": 0, "delta": map[string]any{"type": "text_delta", "text": text}})
		ev("content_block_stop", map[string]any{"index": 0})
		ev("message_delta", map[string]any{"delta": map[string]any{"stop_reason": "end_turn"}, "usage": map[string]any{"output_tokens": 2}})
		ev("message_stop", map[string]any{})
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

var weatherCall = fakeCall{id: "call_1", name: "get_weather", args: `{"city":"Paris"}`}

const weatherTools = `"tools": [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]`

// TestTheDoorReturnsTheModelsToolCalls: a model's tool call comes back
// through the Chat Completions door as the model made it, whole and
// streamed, with the finish reason tool_calls.
func TestTheDoorReturnsTheModelsToolCalls(t *testing.T) {
	var rec recorder
	_, base := frontDoorEnv(t, setup{entries: []delegates.Delegate{openAIEntry("tooly", toolChatModel(t, &rec, fakeChoice{calls: []fakeCall{weatherCall}}))}})
	body := `{"model": "tooly", ` + weatherTools + `, "messages": [{"role": "user", "content": "Weather in Paris?"}]}`

	t.Run("whole", func(t *testing.T) {
		resp := postChat(t, base, "", body)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		var c struct {
			Choices []struct {
				Message struct {
					Content   *string `json:"content"`
					ToolCalls []struct {
						ID, Type string
						Function struct{ Name, Arguments string }
					} `json:"tool_calls"`
				} `json:"message"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Stubborn struct{ Winner string } `json:"stubborn"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&c))
		require.Len(t, c.Choices, 1)
		ch := c.Choices[0]
		assert.Equal(t, "tool_calls", ch.FinishReason)
		require.Len(t, ch.Message.ToolCalls, 1)
		assert.Equal(t, "call_1", ch.Message.ToolCalls[0].ID)
		assert.Equal(t, "function", ch.Message.ToolCalls[0].Type)
		assert.Equal(t, "get_weather", ch.Message.ToolCalls[0].Function.Name)
		assert.JSONEq(t, `{"city":"Paris"}`, ch.Message.ToolCalls[0].Function.Arguments)
		assert.Equal(t, "tooly", c.Stubborn.Winner)
		tools := asList(rec.last(t)["tools"])
		require.Len(t, tools, 1, "the tools reached the model")
	})

	t.Run("streamed", func(t *testing.T) {
		resp := postChat(t, base, "", strings.Replace(body, `{"model"`, `{"stream": true, "model"`, 1))
		require.Equal(t, http.StatusOK, resp.StatusCode)
		chunks, done := sseData(t, resp)
		require.True(t, done)
		var (
			id, name string
			args     strings.Builder
			finish   []string
		)
		for _, c := range chunks {
			for _, ch := range asList(c["choices"]) {
				m := ch.(map[string]any)
				if f, ok := m["finish_reason"].(string); ok {
					finish = append(finish, f)
				}
				for _, tc := range asList(m["delta"].(map[string]any)["tool_calls"]) {
					call := tc.(map[string]any)
					assert.InDelta(t, 0, call["index"], 0)
					if s, ok := call["id"].(string); ok && s != "" {
						id = s
					}
					fn := call["function"].(map[string]any)
					if s, ok := fn["name"].(string); ok && s != "" {
						name = s
					}
					s, _ := fn["arguments"].(string)
					args.WriteString(s)
				}
			}
		}
		assert.Equal(t, "call_1", id)
		assert.Equal(t, "get_weather", name)
		assert.JSONEq(t, `{"city":"Paris"}`, args.String(), "the arguments' fragments, once each")
		assert.Equal(t, []string{"tool_calls"}, finish)
	})
}

// TestTheMessagesDoorTakesToolsToAnOpenAIDelegate: a Messages request's
// tools and tool_choice reach an openai delegate as Chat Completions'
// functions, and its tool call comes back as a tool_use block.
func TestTheMessagesDoorTakesToolsToAnOpenAIDelegate(t *testing.T) {
	var rec recorder
	_, base := frontDoorEnv(t, setup{entries: []delegates.Delegate{openAIEntry("tooly", toolChatModel(t, &rec, fakeChoice{calls: []fakeCall{weatherCall}}))}})
	resp := postMessages(t, base, "", `{"model": "tooly", "max_tokens": 50,
		"tools": [{"name": "get_weather", "description": "The weather in a city", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
		"tool_choice": {"type": "tool", "name": "get_weather"},
		"messages": [{"role": "user", "content": "Weather in Paris?"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var m struct {
		StopReason string `json:"stop_reason"`
		Content    []struct {
			Type, ID, Name string
			Input          map[string]any
		}
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&m))
	assert.Equal(t, "tool_use", m.StopReason)
	var uses int
	for _, b := range m.Content {
		if b.Type == "tool_use" {
			uses++
			assert.Equal(t, "call_1", b.ID)
			assert.Equal(t, "get_weather", b.Name)
			assert.Equal(t, map[string]any{"city": "Paris"}, b.Input)
		}
	}
	assert.Equal(t, 1, uses, "one tool_use block: %+v", m.Content)

	sent := rec.last(t)
	tools := asList(sent["tools"])
	require.Len(t, tools, 1)
	tool := tools[0].(map[string]any)
	assert.Equal(t, "function", tool["type"])
	fn := tool["function"].(map[string]any)
	assert.Equal(t, "get_weather", fn["name"])
	assert.Equal(t, "The weather in a city", fn["description"])
	assert.Equal(t, map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}}, fn["parameters"])
	assert.Equal(t, map[string]any{"type": "function", "function": map[string]any{"name": "get_weather"}}, sent["tool_choice"])
}

// TestAToolResultReachesAnthropicAsToolResult: the second turn of a tool
// conversation, asked at the Chat Completions door, reaches an anthropic
// delegate with the assistant's call as a tool_use block and the tool's
// answer as a tool_result block of the same id.
func TestAToolResultReachesAnthropicAsToolResult(t *testing.T) {
	var rec recorder
	e, base := frontDoorEnv(t, setup{entries: []delegates.Delegate{anthropicEntry("claude", textAnthropicModel(t, &rec, "It is 18°C in Paris."))}})
	resp := postChat(t, base, "", `{"model": "claude", `+weatherTools+`, "messages": [
		{"role": "user", "content": "Weather in Paris?"},
		{"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
		{"role": "tool", "tool_call_id": "call_1", "content": "18°C, sunny"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var c struct {
		ID      string `json:"id"`
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&c))
	require.Len(t, c.Choices, 1)
	assert.Equal(t, "It is 18°C in Paris.", c.Choices[0].Message.Content)

	msgs := asList(rec.last(t)["messages"])
	require.Len(t, msgs, 3)
	assistant := msgs[1].(map[string]any)
	assert.Equal(t, "assistant", assistant["role"])
	var use map[string]any
	for _, b := range asList(assistant["content"]) {
		if b.(map[string]any)["type"] == "tool_use" {
			use = b.(map[string]any)
		}
	}
	require.NotNil(t, use, "the assistant's call is a tool_use block: %v", assistant)
	assert.Equal(t, "call_1", use["id"])
	assert.Equal(t, "get_weather", use["name"])
	assert.Equal(t, map[string]any{"city": "Paris"}, use["input"])
	user := msgs[2].(map[string]any)
	assert.Equal(t, "user", user["role"])
	blocks := asList(user["content"])
	require.NotEmpty(t, blocks)
	result := blocks[0].(map[string]any)
	assert.Equal(t, "tool_result", result["type"])
	assert.Equal(t, "call_1", result["tool_use_id"], "the same id")
	assert.Equal(t, "18°C, sunny", result["content"])

	got, err := e.client.GetRun(testCtx(t), &stubbornv1.GetRunRequest{RunId: c.ID})
	require.NoError(t, err)
	brief := got.GetState().GetTaskBrief()
	assert.Contains(t, brief, `get_weather#call_1({"city":"Paris"})`, "the run's brief shows the tool call")
	assert.Contains(t, brief, "tool#call_1: 18°C, sunny", "and the tool's answer")
}

// TestNTwoComesBackAsTwoChoices: n = 2 reaches an openai delegate, and
// both its choices come back, whole and streamed.
func TestNTwoComesBackAsTwoChoices(t *testing.T) {
	var rec recorder
	_, base := frontDoorEnv(t, setup{entries: []delegates.Delegate{openAIEntry("twice", toolChatModel(t, &rec, fakeChoice{text: "First answer."}, fakeChoice{text: "Second answer."}))}})
	body := `{"model": "twice", "n": 2, "messages": [{"role": "user", "content": "Say something."}]}`

	resp := postChat(t, base, "", body)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var c struct {
		Choices []struct {
			Index   int                      `json:"index"`
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&c))
	require.Len(t, c.Choices, 2)
	assert.Equal(t, 0, c.Choices[0].Index)
	assert.Equal(t, "First answer.", c.Choices[0].Message.Content)
	assert.Equal(t, 1, c.Choices[1].Index)
	assert.Equal(t, "Second answer.", c.Choices[1].Message.Content)
	assert.InDelta(t, 2, rec.last(t)["n"], 0, "n reached the model")

	resp = postChat(t, base, "", strings.Replace(body, `{"model"`, `{"stream": true, "model"`, 1))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	chunks, done := sseData(t, resp)
	require.True(t, done)
	texts := map[int]string{}
	for _, ch := range chunks {
		for _, x := range asList(ch["choices"]) {
			m := x.(map[string]any)
			s, _ := m["delta"].(map[string]any)["content"].(string)
			texts[int(m["index"].(float64))] += s
		}
	}
	assert.Equal(t, map[int]string{0: "First answer.", 1: "Second answer."}, texts)
}

// TestAFieldADelegateCannotCarryIs400: a field a delegate the run reaches
// cannot carry is a 400 in the door's shape naming the field (param) and
// the delegate, before any call; "stubborn": {"drop_params": …} lets it be
// left out.
func TestAFieldADelegateCannotCarryIs400(t *testing.T) {
	var rec recorder
	_, base := frontDoorEnv(t, setup{
		entries: []delegates.Delegate{anthropicEntry("claude", textAnthropicModel(t, &rec, "Hi."))},
		presets: []delegates.Preset{{Name: "mixed", Spec: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"good", "claude"}}}}}},
	})
	type openAIError struct {
		Error struct{ Message, Type, Code, Param string } `json:"error"`
	}
	for _, tc := range []struct {
		name, body, param string
	}{
		{"n to anthropic", `{"model": "claude", "n": 2, "messages": [{"role": "user", "content": "x"}]}`, "n"},
		{"response_format to anthropic, through a preset", `{"model": "mixed", "response_format": {"type": "json_object"}, "messages": [{"role": "user", "content": "x"}]}`, "response_format"},
		{"seed to anthropic", `{"model": "claude", "seed": 7, "messages": [{"role": "user", "content": "x"}]}`, "seed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := postChat(t, base, "", tc.body)
			require.Equal(t, http.StatusBadRequest, resp.StatusCode)
			var e openAIError
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
			assert.Equal(t, tc.param, e.Error.Param)
			assert.Equal(t, "invalid_request_error", e.Error.Type)
			assert.Contains(t, e.Error.Message, `delegate "claude" (anthropic) cannot carry `+tc.param)
			assert.True(t, strings.HasPrefix(e.Error.Message, tc.param+": "), e.Error.Message)
		})
	}
	rec.mu.Lock()
	assert.Empty(t, rec.bodies, "no call was made")
	rec.mu.Unlock()

	t.Run("the Messages door's shape", func(t *testing.T) {
		resp := postMessages(t, base, "", `{"model": "mixed", "max_tokens": 5, "top_k": 3, "messages": [{"role": "user", "content": "x"}]}`)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
		var e struct {
			Type  string
			Error struct{ Type, Message string }
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
		assert.Equal(t, "invalid_request_error", e.Error.Type)
		assert.Contains(t, e.Error.Message, `top_k: delegate "good" (openai) cannot carry top_k`)
	})

	t.Run("dropped when allowed", func(t *testing.T) {
		for _, drop := range []string{`["n"]`, `true`} {
			resp := postChat(t, base, "", `{"model": "claude", "n": 2, "stubborn": {"drop_params": `+drop+`}, "messages": [{"role": "user", "content": "x"}]}`)
			require.Equal(t, http.StatusOK, resp.StatusCode, drop)
			_, hasN := rec.last(t)["n"]
			assert.False(t, hasN, drop)
		}
		resp := postChat(t, base, "", `{"model": "claude", "n": 2, "stubborn": {"drop_params": ["seed"]}, "messages": [{"role": "user", "content": "x"}]}`)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "dropping another field does not drop n")
		resp = postChat(t, base, "", `{"model": "claude", "stubborn": {"drop_params": 3}, "messages": [{"role": "user", "content": "x"}]}`)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
		var e openAIError
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
		assert.Equal(t, "stubborn.drop_params", e.Error.Param)
	})
}

// TestAToolNameAtFaultIsNamedAsEachDoorsBodyHasIt: a tool name no
// provider takes is a 400 before any call, naming the field where the
// door's own body has it: in Chat Completions' "function" object, at the
// top of a Responses or Messages tool.
func TestAToolNameAtFaultIsNamedAsEachDoorsBodyHasIt(t *testing.T) {
	var rec recorder
	_, base := frontDoorEnv(t, setup{entries: []delegates.Delegate{openAIEntry("rec", toolChatModel(t, &rec, fakeChoice{text: "Fine."}))}})
	long := strings.Repeat("n", 100000)
	for _, tc := range []struct{ path, body, param string }{
		{"/v1/chat/completions", `{"model": "rec", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "` + long + `"}}]}`, "tools[0].function.name"},
		{"/v1/chat/completions", `{"model": "rec", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "a.b"}}}`, "tool_choice.function.name"},
		{"/v1/chat/completions", `{"model": "rec", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get weather", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}`, "messages[1].tool_calls[0].function.name"},
		{"/v1/responses", `{"model": "rec", "input": "x", "tools": [{"type": "function", "name": "` + long + `", "parameters": {}}]}`, "tools[0].name"},
		{"/v1/messages", `{"model": "rec", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "` + long + `", "input_schema": {"type": "object"}}]}`, "tools[0].name"},
	} {
		resp, err := http.Post(base+tc.path, "application/json", strings.NewReader(tc.body))
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, tc.param)
		assert.Contains(t, string(body), `"`+tc.param+`: `, "the message names %s", tc.param)
		if tc.path != "/v1/messages" {
			assert.Contains(t, string(body), `"param":"`+tc.param+`"`)
		}
		assert.Less(t, len(body), 2000, "the error does not echo the name")
	}
	rec.mu.Lock()
	assert.Empty(t, rec.bodies, "no call was made")
	rec.mu.Unlock()
}
