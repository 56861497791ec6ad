package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
)

// postResponses posts a Responses API request as the openai SDKs do, with
// the token as a bearer token and, when key is set, an Idempotency-Key.
func postResponses(t *testing.T, base, token, key, body string) *http.Response {
	t.Helper()
	return postResponsesCtx(t, testCtx(t), base, token, key, body)
}

func postResponsesCtx(t *testing.T, ctx context.Context, base, token, key, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/responses", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

// responseObject is what the tests read of a response object.
type responseObject struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	Status string `json:"status"`
	Model  string `json:"model"`
	Output []struct {
		Type    string `json:"type"`
		Role    string `json:"role"`
		Content []struct {
			Type, Text string
		} `json:"content"`
		CallID    string `json:"call_id"`
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"output"`
	Usage    map[string]any `json:"usage"`
	Stubborn struct {
		RunID  string `json:"run_id"`
		Winner string `json:"winner"`
	} `json:"stubborn"`
}

// text is the response's output_text, joined.
func (r responseObject) text() string {
	var b strings.Builder
	for _, o := range r.Output {
		for _, c := range o.Content {
			if c.Type == "output_text" {
				b.WriteString(c.Text)
			}
		}
	}
	return b.String()
}

func decodeResponse(t *testing.T, resp *http.Response) responseObject {
	t.Helper()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(raw))
	var r responseObject
	require.NoError(t, json.Unmarshal(raw, &r), string(raw))
	return r
}

// responseEvents reads a Responses stream's events, checking that each
// is named by its type and numbered one after the other from 0.
func responseEvents(t *testing.T, resp *http.Response) []namedEvent {
	t.Helper()
	evs := namedEvents(t, resp)
	for i, ev := range evs {
		assert.InDelta(t, i, ev.data["sequence_number"], 0, "event %d (%s) is numbered in order", i, ev.name)
	}
	return evs
}

// deltaText joins a stream's response.output_text.delta events.
func deltaText(evs []namedEvent) string {
	var b strings.Builder
	for _, ev := range evs {
		if ev.name == "response.output_text.delta" {
			s, _ := ev.data["delta"].(string)
			b.WriteString(s)
		}
	}
	return b.String()
}

// names are evs' names, each run of the same name once.
func names(evs []namedEvent) []string {
	var out []string
	for _, ev := range evs {
		if len(out) == 0 || out[len(out)-1] != ev.name {
			out = append(out, ev.name)
		}
	}
	return out
}

func TestTheResponsesDoorAnswersThroughAPreset(t *testing.T) {
	e, base := frontDoorEnv(t, setup{})
	resp := postResponses(t, base, "", "", `{"model": "smart", "input": "What is it?"}`)
	r := decodeResponse(t, resp)
	assert.Equal(t, "response", r.Object)
	assert.Equal(t, "completed", r.Status)
	assert.Equal(t, "smart", r.Model)
	assert.Equal(t, "The answer is 42.", r.text())
	require.Len(t, r.Output, 1)
	assert.Equal(t, "message", r.Output[0].Type)
	assert.Equal(t, "assistant", r.Output[0].Role)
	assert.InDelta(t, 7, r.Usage["total_tokens"], 0)
	assert.InDelta(t, 3, r.Usage["input_tokens"], 0)
	assert.Equal(t, resp.Header.Get("Stubborn-Run-Id"), r.ID, "the response's id is the run's")
	assert.Equal(t, r.ID, r.Stubborn.RunID)
	assert.Equal(t, "good", r.Stubborn.Winner)
	got, err := e.client.GetRun(testCtx(t), &stubbornv1.GetRunRequest{RunId: r.ID})
	require.NoError(t, err)
	assert.Equal(t, "good", got.GetState().GetWinner())
	require.Len(t, got.GetState().GetAttemptLog(), 2, "the 503, then the answer")
	assert.Equal(t, "What is it?", got.GetState().GetTaskBrief())
}

// TestTheResponsesDoorSendsInstructionsAndItems: instructions, a list of
// input items with input_text parts, and the options reach an openai
// delegate as Chat Completions has them.
func TestTheResponsesDoorSendsInstructionsAndItems(t *testing.T) {
	var rec recorder
	_, base := frontDoorEnv(t, setup{entries: []delegates.Delegate{openAIEntry("rec", toolChatModel(t, &rec, fakeChoice{text: "Fine."}))}})
	r := decodeResponse(t, postResponses(t, base, "", "", `{"model": "rec", "instructions": "Be brief.", "max_output_tokens": 50, "temperature": 0.5,
		"input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}, {"role": "assistant", "content": "Hello"},
		          {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Sum it up."}]}]}`))
	assert.Equal(t, "Fine.", r.text())
	sent := rec.last(t)
	msgs := asList(sent["messages"])
	require.Len(t, msgs, 4, "the instructions, then the three messages: %v", msgs)
	first := msgs[0].(map[string]any)
	assert.Contains(t, []any{"system", "developer"}, first["role"])
	assert.Contains(t, fmt.Sprint(first["content"]), "Be brief.")
	assert.Equal(t, "user", msgs[1].(map[string]any)["role"])
	assert.Contains(t, fmt.Sprint(msgs[1].(map[string]any)["content"]), "Hi")
	assert.Equal(t, "assistant", msgs[2].(map[string]any)["role"])
	assert.Contains(t, fmt.Sprint(msgs[3].(map[string]any)["content"]), "Sum it up.")
	assert.InDelta(t, 0.5, sent["temperature"], 0)
	tokens := sent["max_completion_tokens"]
	if tokens == nil {
		tokens = sent["max_tokens"]
	}
	assert.InDelta(t, 50, tokens, 0, "max_output_tokens reached the model")
}

// TestTheResponsesDoorStreamsInTheAPIsOrder: a streamed answer is the
// API's events in its order, numbered, with nothing of the 503 before it.
func TestTheResponsesDoorStreamsInTheAPIsOrder(t *testing.T) {
	_, base := frontDoorEnv(t, setup{})
	resp := postResponses(t, base, "", "", `{"model": "smart", "stream": true, "instructions": "Be brief.", "input": [{"role": "user", "content": [{"type": "input_text", "text": "What is it?"}]}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	runID := resp.Header.Get("Stubborn-Run-Id")
	require.NotEmpty(t, runID)
	evs := responseEvents(t, resp)
	require.Equal(t, []string{
		"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.done", "response.content_part.done", "response.output_item.done",
		"response.completed",
	}, names(evs))
	assert.Equal(t, "The answer is 42.", deltaText(evs))
	created, _ := evs[0].data["response"].(map[string]any)
	assert.Equal(t, runID, created["id"], "the response's id is the run's")
	last, ok := evs[len(evs)-1].data["response"].(map[string]any)
	require.True(t, ok, "response.completed has the response: %v", evs[len(evs)-1].data)
	assert.Equal(t, runID, last["id"])
	assert.Equal(t, "completed", last["status"])
	usage, _ := last["usage"].(map[string]any)
	assert.InDelta(t, 7, usage["total_tokens"], 0)
	out := asList(last["output"])
	require.Len(t, out, 1)
	item, _ := out[0].(map[string]any)
	parts := asList(item["content"])
	require.Len(t, parts, 1)
	part, _ := parts[0].(map[string]any)
	assert.Equal(t, "The answer is 42.", part["text"])
}

// toolAnthropicModel is a Messages server that answers a get_weather
// tool_use block, whole or streamed (its input in two input_json_delta
// fragments).
func toolAnthropicModel(t testing.TB, rec *recorder) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := rec.take(r)
		if stream, _ := body["stream"].(bool); !stream {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]any{"type": "message", "role": "assistant", "model": "claude-x",
				"content":     []any{map[string]any{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": map[string]any{"city": "Paris"}}},
				"stop_reason": "tool_use", "usage": map[string]any{"input_tokens": 5, "output_tokens": 2}})
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		ev := func(name string, v map[string]any) {
			v["type"] = name
			b, _ := json.Marshal(v)
			_, _ = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b)
		}
		ev("message_start", map[string]any{"message": map[string]any{"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x", "content": []any{}, "usage": map[string]any{"input_tokens": 5, "output_tokens": 0}}})
		ev("content_block_start", map[string]any{"index": 0, "content_block": map[string]any{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": map[string]any{}}})
		ev("content_block_delta", map[string]any{"index": 0, "delta": map[string]any{"type": "input_json_delta", "partial_json": `{"city": `}})
		ev("content_block_delta", map[string]any{"index": 0, "delta": map[string]any{"type": "input_json_delta", "partial_json": `"Paris"}`}})
		ev("content_block_stop", map[string]any{"index": 0})
		ev("message_delta", map[string]any{"delta": map[string]any{"stop_reason": "tool_use"}, "usage": map[string]any{"output_tokens": 2}})
		ev("message_stop", map[string]any{})
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

const responsesWeatherTool = `"tools": [{"type": "function", "name": "get_weather", "description": "The weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]`

// TestTheResponsesDoorReturnsToolCalls: a model's tool call, from either
// kind of delegate, comes back as a function_call item with its call_id,
// name and JSON arguments, whole and streamed; the function tool reached
// the model in its API's shape.
func TestTheResponsesDoorReturnsToolCalls(t *testing.T) {
	var openaiRec, anthropicRec recorder
	_, base := frontDoorEnv(t, setup{entries: []delegates.Delegate{
		openAIEntry("tooly", toolChatModel(t, &openaiRec, fakeChoice{calls: []fakeCall{weatherCall}})),
		anthropicEntry("claude-tools", toolAnthropicModel(t, &anthropicRec)),
	}})
	for _, tc := range []struct{ model, id string }{{"tooly", "call_1"}, {"claude-tools", "toolu_1"}} {
		body := `{"model": "` + tc.model + `", ` + responsesWeatherTool + `, "tool_choice": "auto", "input": "Weather in Paris?"}`
		t.Run(tc.model+" whole", func(t *testing.T) {
			r := decodeResponse(t, postResponses(t, base, "", "", body))
			var calls int
			for _, o := range r.Output {
				if o.Type == "function_call" {
					calls++
					assert.Equal(t, tc.id, o.CallID)
					assert.Equal(t, "get_weather", o.Name)
					assert.JSONEq(t, `{"city":"Paris"}`, o.Arguments)
				}
			}
			assert.Equal(t, 1, calls, "one function_call item: %+v", r.Output)
			assert.Equal(t, "completed", r.Status)
		})
		t.Run(tc.model+" streamed", func(t *testing.T) {
			resp := postResponses(t, base, "", "", strings.Replace(body, `{"model"`, `{"stream": true, "model"`, 1))
			require.Equal(t, http.StatusOK, resp.StatusCode)
			evs := responseEvents(t, resp)
			var (
				args  strings.Builder
				added map[string]any
				done  map[string]any
			)
			for _, ev := range evs {
				switch ev.name {
				case "response.output_item.added":
					if it, _ := ev.data["item"].(map[string]any); it["type"] == "function_call" {
						added = it
					}
				case "response.function_call_arguments.delta":
					s, _ := ev.data["delta"].(string)
					args.WriteString(s)
				case "response.function_call_arguments.done":
					done = ev.data
				}
			}
			require.NotNil(t, added, "a function_call item was added: %v", names(evs))
			assert.Equal(t, tc.id, added["call_id"])
			assert.Equal(t, "get_weather", added["name"])
			assert.JSONEq(t, `{"city":"Paris"}`, args.String(), "the arguments' fragments, once each")
			require.NotNil(t, done)
			doneArgs, _ := done["arguments"].(string)
			assert.JSONEq(t, `{"city":"Paris"}`, doneArgs)
			assert.Equal(t, "response.completed", evs[len(evs)-1].name)
		})
	}
	tools := asList(openaiRec.last(t)["tools"])
	require.Len(t, tools, 1)
	fn := tools[0].(map[string]any)["function"].(map[string]any)
	assert.Equal(t, "get_weather", fn["name"], "a Chat Completions function tool")
	tools = asList(anthropicRec.last(t)["tools"])
	require.Len(t, tools, 1)
	assert.Equal(t, "get_weather", tools[0].(map[string]any)["name"])
	assert.NotNil(t, tools[0].(map[string]any)["input_schema"], "an Anthropic tool")
}

// TestAFunctionCallOutputReachesAnthropicAsToolResult: the second turn,
// the function_call item and its function_call_output sent back, reaches
// an anthropic delegate as a tool_use block and a tool_result of the same
// id; and an openai delegate as tool_calls and a role "tool" message.
func TestAFunctionCallOutputReachesAnthropicAsToolResult(t *testing.T) {
	var anthropicRec, openaiRec recorder
	_, base := frontDoorEnv(t, setup{entries: []delegates.Delegate{
		anthropicEntry("claude", textAnthropicModel(t, &anthropicRec, "It is 18°C in Paris.")),
		openAIEntry("gpt", toolChatModel(t, &openaiRec, fakeChoice{text: "It is 18°C in Paris."})),
	}})
	input := `"input": [{"role": "user", "content": "Weather in Paris?"},
		{"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
		{"type": "function_call_output", "call_id": "call_1", "output": "18°C, sunny"}]`
	r := decodeResponse(t, postResponses(t, base, "", "", `{"model": "claude", `+responsesWeatherTool+`, `+input+`}`))
	assert.Equal(t, "It is 18°C in Paris.", r.text())
	msgs := asList(anthropicRec.last(t)["messages"])
	require.Len(t, msgs, 3, "%v", msgs)
	assistant := msgs[1].(map[string]any)
	assert.Equal(t, "assistant", assistant["role"])
	var use map[string]any
	for _, b := range asList(assistant["content"]) {
		if b.(map[string]any)["type"] == "tool_use" {
			use = b.(map[string]any)
		}
	}
	require.NotNil(t, use, "the call is a tool_use block: %v", assistant)
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
	assert.Contains(t, fmt.Sprint(result["content"]), "18°C, sunny")

	r = decodeResponse(t, postResponses(t, base, "", "", `{"model": "gpt", `+responsesWeatherTool+`, `+input+`}`))
	assert.Equal(t, "It is 18°C in Paris.", r.text())
	msgs = asList(openaiRec.last(t)["messages"])
	require.Len(t, msgs, 3, "%v", msgs)
	calls := asList(msgs[1].(map[string]any)["tool_calls"])
	require.Len(t, calls, 1)
	assert.Equal(t, "call_1", calls[0].(map[string]any)["id"])
	tool := msgs[2].(map[string]any)
	assert.Equal(t, "tool", tool["role"])
	assert.Equal(t, "call_1", tool["tool_call_id"])
}

// lastError is a Responses stream's last event, which must be the error
// event the openai SDKs raise: the API's error fields, and an OpenAI error
// object naming the run.
func lastError(t *testing.T, evs []namedEvent, runID string) string {
	t.Helper()
	require.NotEmpty(t, evs)
	last := evs[len(evs)-1]
	require.Equal(t, "error", last.name, "the stream ends with an error event: %v", names(evs))
	assert.Equal(t, "stream_interrupted", last.data["code"])
	e, ok := last.data["error"].(map[string]any)
	require.True(t, ok, "an error object the SDKs raise: %v", last.data)
	assert.Equal(t, "stream_interrupted", e["code"])
	assert.Equal(t, runID, e["run_id"])
	msg, _ := e["message"].(string)
	assert.Equal(t, last.data["message"], msg)
	assert.Contains(t, msg, runID, "the error names the run")
	return msg
}

// TestAResponsesStreamThatFailsMidAnswerEndsWithAnError: the chain's first
// model stalls after its answer began: the stream ends with an error
// event naming the run and saying what it did; not streamed, the app gets
// the second model's answer. A stall before any output is never seen.
func TestAResponsesStreamThatFailsMidAnswerEndsWithAnError(t *testing.T) {
	_, base := failoverEnv(t, nil)
	resp := postResponses(t, base, failoverToken, "", `{"model": "failover", "stream": true, "input": "tell me"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	evs := responseEvents(t, resp)
	assert.Equal(t, "Once upon a ", deltaText(evs))
	msg := lastError(t, evs, resp.Header.Get("Stubborn-Run-Id"))
	assert.Contains(t, msg, `succeeded with delegate "model-b"'s answer`)

	resp = postResponses(t, base, failoverToken, "", `{"model": "dead-end", "stream": true, "input": "tell me"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	evs = responseEvents(t, resp)
	msg = lastError(t, evs, resp.Header.Get("Stubborn-Run-Id"))
	assert.Contains(t, msg, "ended EXHAUSTED")

	r := decodeResponse(t, postResponses(t, base, failoverToken, "", `{"model": "failover", "input": "tell me"}`))
	assert.Equal(t, strings.Join(secondAnswer, ""), r.text(), "nothing of the stalled attempt")
	assert.Equal(t, "model-b", r.Stubborn.Winner)
}

// TestAResponsesStreamOverAStallBeforeOutputIsTheNextModelsAnswer: a
// model that never answers is failed at its first_output_timeout, and the
// stream is the next model's answer alone.
func TestAResponsesStreamOverAStallBeforeOutputIsTheNextModelsAnswer(t *testing.T) {
	done := make(chan struct{})
	stuck := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-done:
		}
	}))
	t.Cleanup(stuck.Close)
	t.Cleanup(func() { close(done) }) // before Close, which waits for the handler
	slow := openAIEntry("stuck", stuck.URL)
	slow.FirstOutputTimeout = delegates.Duration(300 * time.Millisecond)
	_, base := frontDoorEnv(t, setup{entries: []delegates.Delegate{slow}, presets: []delegates.Preset{chain("patient", "stuck", "good")}})
	resp := postResponses(t, base, "", "", `{"model": "patient", "stream": true, "input": "x"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	evs := responseEvents(t, resp)
	assert.Equal(t, "The answer is 42.", deltaText(evs))
	assert.Equal(t, "response.completed", evs[len(evs)-1].name)
}

// breakingModel is a Chat Completions server that streams "The answer "
// and drops its connection, or answers 502 when not asked to stream.
func breakingModel(t testing.TB) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Stream bool `json:"stream"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		if !req.Stream {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, word := range []string{"The ", "answer "} {
			_, _ = fmt.Fprintf(w, "data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", word)
		}
		w.(http.Flusher).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestAResponsesStreamOfAModelThatBreaksEndsWithAnError: the model drops
// its connection mid-answer: streamed, the app has "The answer " and an
// error naming the run; not streamed, the next model's answer.
func TestAResponsesStreamOfAModelThatBreaksEndsWithAnError(t *testing.T) {
	_, base := frontDoorEnv(t, setup{entries: []delegates.Delegate{openAIEntry("breaks", breakingModel(t))}, presets: []delegates.Preset{chain("brittle", "breaks", "good")}})
	resp := postResponses(t, base, "", "", `{"model": "brittle", "stream": true, "input": "x"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	evs := responseEvents(t, resp)
	assert.Equal(t, "The answer ", deltaText(evs))
	lastError(t, evs, resp.Header.Get("Stubborn-Run-Id"))

	r := decodeResponse(t, postResponses(t, base, "", "", `{"model": "brittle", "input": "x"}`))
	assert.Equal(t, "The answer is 42.", r.text())
}

// TestTheResponsesDoorSpeaksOpenAIErrors: errors are OpenAI's JSON with
// the statuses the SDKs map to their classes: an unknown model, no input,
// a model's own 400 with its message, a retry that would ask a person.
func TestTheResponsesDoorSpeaksOpenAIErrors(t *testing.T) {
	_, base := frontDoorEnv(t, setup{entries: []delegates.Delegate{openAIEntry("strict", failingModel(t, http.StatusBadRequest,
		`{"error":{"message":"`+temperatureError+`","type":"invalid_request_error","param":"temperature","code":"decimal_above_max_value"}}`))}})
	for _, tc := range []struct {
		body, code, msg string
		status          int
	}{
		{`{"model": "nope", "input": "x"}`, "model_not_found", "nope", http.StatusNotFound},
		{`{"model": "smart", "input": []}`, "invalid_request", "input", http.StatusBadRequest},
		{`{"model": "smart", "instructions": "Be brief."}`, "invalid_request", "input", http.StatusBadRequest},
		{`{"model": `, "invalid_json", "", http.StatusBadRequest},
		{`{"model": "strict", "temperature": 5, "input": "x"}`, "invalid_request", temperatureError, http.StatusBadRequest},
		{`{"model": "strict", "stream": true, "temperature": 5, "input": "x"}`, "invalid_request", temperatureError, http.StatusBadRequest},
		{`{"model": "asks", "input": "x"}`, "run_failed", "ended", http.StatusServiceUnavailable},
	} {
		resp := postResponses(t, base, "", "", tc.body)
		assert.Equal(t, tc.status, resp.StatusCode, tc.body)
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"), tc.body)
		e := decodeOpenAIError(t, resp)
		assert.Equal(t, tc.code, e.Error.Code, tc.body)
		assert.Contains(t, e.Error.Message, tc.msg, tc.body)
		if tc.status == http.StatusBadRequest {
			assert.Equal(t, "invalid_request_error", e.Error.Type, tc.body)
		}
	}

	_, base = frontDoorEnv(t, setup{tenants: []delegates.Tenant{{Name: "acme", TokenSHA256: []string{delegates.HashToken("s3cret")}}}})
	resp := postResponses(t, base, "wrong", "", `{"model": "smart", "input": "x"}`)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	assert.Equal(t, "authentication_error", decodeOpenAIError(t, resp).Error.Type)
	assert.Equal(t, "The answer is 42.", decodeResponse(t, postResponses(t, base, "s3cret", "", `{"model": "smart", "input": "x"}`)).text())
}

// TestWhatAGatewayCannotDoIsRefusedByName: the Responses API's features
// that need a provider's state, and built-in tools, are 400s naming the
// field, before any call; so is a field a delegate cannot carry.
func TestWhatAGatewayCannotDoIsRefusedByName(t *testing.T) {
	var rec recorder
	_, base := frontDoorEnv(t, setup{entries: []delegates.Delegate{
		openAIEntry("rec", toolChatModel(t, &rec, fakeChoice{text: "Fine."})),
		anthropicEntry("claude", textAnthropicModel(t, &rec, "Fine.")),
	}})
	for _, tc := range []struct{ body, param string }{
		{`{"model": "rec", "previous_response_id": "resp_1", "input": "x"}`, "previous_response_id"},
		{`{"model": "rec", "store": true, "input": "x"}`, "store"},
		{`{"model": "rec", "conversation": "conv_1", "input": "x"}`, "conversation"},
		{`{"model": "rec", "background": true, "input": "x"}`, "background"},
		{`{"model": "rec", "tools": [{"type": "web_search"}], "input": "x"}`, "tools[0]"},
		{`{"model": "rec", "tools": [{"type": "file_search", "vector_store_ids": ["v"]}], "input": "x"}`, "tools[0]"},
		{`{"model": "rec", "tools": [{"type": "code_interpreter", "container": {"type": "auto"}}], "input": "x"}`, "tools[0]"},
		{`{"model": "claude", "text": {"format": {"type": "json_schema", "name": "answer", "schema": {"type": "object"}}}, "input": "x"}`, "text.format"},
	} {
		resp := postResponses(t, base, "", "", tc.body)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, tc.body)
		e := decodeOpenAIError(t, resp)
		assert.Equal(t, "invalid_request_error", e.Error.Type, tc.body)
		param, _ := e.Error.Param.(string)
		assert.True(t, strings.HasPrefix(param, tc.param), "%s: param %q, want %s", tc.body, param, tc.param)
		assert.Contains(t, e.Error.Message, tc.param, tc.body)
	}
	rec.mu.Lock()
	assert.Empty(t, rec.bodies, "no call was made")
	rec.mu.Unlock()

	resp := postResponses(t, base, "", "", `{"model": "rec", "store": false, "input": "x"}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "store: false is what the door does")
}

// TestTheResponsesDoorKeepsTheStubbornField: the request's criteria are
// the run's (the refusal streamed first is held and dropped), and a
// nested retry that would ask a person fails instead.
func TestTheResponsesDoorKeepsTheStubbornField(t *testing.T) {
	_, base := frontDoorEnv(t, setup{presets: []delegates.Preset{chain("pair", "bad", "good")}})
	resp := postResponses(t, base, "", "", `{"model": "pair", "stream": true, "stubborn": {"failure_when": "result.text.contains('refuse')"}, "input": "Will you?"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	evs := responseEvents(t, resp)
	assert.Equal(t, "The answer is 42.", deltaText(evs), "the refusal was held, rejected and dropped")
	assert.Equal(t, "The answer is 42.", decodeResponse(t, postResponses(t, base, "", "", `{"model": "wrapper", "input": "x"}`)).text())

	resp = postResponses(t, base, "", "", `{"model": "pair", "stubborn": {"judge": "x"}, "input": "x"}`)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Equal(t, "stubborn.judge", decodeOpenAIError(t, resp).Error.Param)
}

// TestAResponsesResendGetsTheRunsAnswer: resent with its Idempotency-Key
// after its first stream was cut, the request gets the run's accepted
// answer, streamed or whole; another request with the key is a 409.
func TestAResponsesResendGetsTheRunsAnswer(t *testing.T) {
	e, base := failoverEnv(t, nil)
	const body = `{"model": "failover", "stream": true, "input": "tell me"}`
	first := postResponses(t, base, failoverToken, "responses-1", body)
	require.Equal(t, http.StatusOK, first.StatusCode)
	id := first.Header.Get("Stubborn-Run-Id")
	lastError(t, responseEvents(t, first), id)
	require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, waitEnded(t, e, id).GetStatus())

	again := postResponses(t, base, failoverToken, "responses-1", body)
	require.Equal(t, http.StatusOK, again.StatusCode)
	assert.Equal(t, id, again.Header.Get("Stubborn-Run-Id"), "the same run")
	evs := responseEvents(t, again)
	assert.Equal(t, strings.Join(secondAnswer, ""), deltaText(evs), "the accepted answer, never the discarded one")
	assert.Equal(t, "response.completed", evs[len(evs)-1].name)

	whole := decodeResponse(t, postResponses(t, base, failoverToken, "responses-1", strings.Replace(body, `"stream": true`, `"stream": false`, 1)))
	assert.Equal(t, id, whole.ID)
	assert.Equal(t, strings.Join(secondAnswer, ""), whole.text())

	other := postResponses(t, base, failoverToken, "responses-1", `{"model": "failover", "input": "something else"}`)
	assert.Equal(t, http.StatusConflict, other.StatusCode)
	assert.Equal(t, "false", other.Header.Get("X-Should-Retry"))
}

// TestHangingUpOnTheResponsesDoorCancelsTheRun: a client that hangs up
// mid-answer cancels its run.
func TestHangingUpOnTheResponsesDoorCancelsTheRun(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	e, base := failoverEnv(t, release)
	ctx, hangUp := context.WithCancel(testCtx(t))
	defer hangUp()
	resp := postResponsesCtx(t, ctx, base, failoverToken, "", `{"model": "model-b", "stream": true, "input": "tell me"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	id := resp.Header.Get("Stubborn-Run-Id")
	require.NotEmpty(t, id)
	// Read until the held words are out: the model is answering.
	buf := make([]byte, 4096)
	var got strings.Builder
	for !strings.Contains(got.String(), "response.output_text.delta") {
		n, err := resp.Body.Read(buf)
		got.Write(buf[:n])
		require.NoError(t, err)
	}
	hangUp()
	st := waitEnded(t, e, id)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_CANCELLED, st.GetStatus())
}

// TestAResponsesBodyOverEightMiBIsA413InOpenAIsShape: the body bound's
// 413 is OpenAI's JSON at this door too.
func TestAResponsesBodyOverEightMiBIsA413InOpenAIsShape(t *testing.T) {
	_, base := frontDoorEnv(t, setup{})
	resp := postResponses(t, base, "", "", `{"model": "good", "input": "`+strings.Repeat("x", 9<<20)+`"}`)
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	e := decodeOpenAIError(t, resp)
	assert.Equal(t, "request_too_large", e.Error.Code)
	assert.Equal(t, "invalid_request_error", e.Error.Type)
}
