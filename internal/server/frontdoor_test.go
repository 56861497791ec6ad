package server_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/delegates"
)

// chatModel is a Chat Completions server: it fails with code (when not
// 200), or answers words, streamed when asked.
func chatModel(t testing.TB, code int, words ...string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Stream bool `json:"stream"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		if code != http.StatusOK {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			_, _ = io.WriteString(w, `{"error":{"message":"overloaded"}}`)
			return
		}
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			b, _ := json.Marshal(map[string]any{"model": "m", "choices": []any{map[string]any{"message": map[string]any{"content": strings.Join(words, "")}, "finish_reason": "stop"}},
				"usage": map[string]any{"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}})
			_, _ = w.Write(b)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, word := range words {
			_, _ = fmt.Fprintf(w, "data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", word)
			w.(http.Flusher).Flush()
		}
		_, _ = io.WriteString(w, "data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n")
		_, _ = io.WriteString(w, "data: {\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4,\"total_tokens\":7}}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// frontDoorEnv is a server with model delegates behind fake model servers
// and presets over them, and its HTTP listener.
func frontDoorEnv(t testing.TB, su setup) (*env, string) {
	t.Helper()
	model := func(name, url string) delegates.Delegate {
		return delegates.Delegate{Name: name, OpenAI: &delegates.OpenAI{ModelAPI: delegates.ModelAPI{BaseURL: url, Model: "m"}}, ReadOnly: true, Timeout: delegates.Duration(time.Minute)}
	}
	su.entries = append(su.entries,
		model("busy", chatModel(t, http.StatusServiceUnavailable)),
		model("good", chatModel(t, http.StatusOK, "The ", "answer ", "is ", "42.")),
		model("bad", chatModel(t, http.StatusOK, "I ", "refuse.")),
	)
	su.presets = append(su.presets,
		delegates.Preset{Name: "smart", Spec: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"busy", "good"}}}}},
		delegates.Preset{Name: "judged", Spec: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{
			Chain: []string{"bad", "good"}, FailureWhen: `result.text.contains("refuse")`}}}},
		delegates.Preset{Name: "asks", Spec: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{Target: "busy", Attempts: new(int32(0))}}}},
		delegates.Preset{Name: "wrapper", Spec: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"asks", "good"}}}}},
	)
	e := startWith(t, su)
	h, err := e.st.HTTPHandler()
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return e, srv.URL
}

func postChat(t *testing.T, base, token, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

// sseData reads a stream's data lines, up to [DONE].
func sseData(t *testing.T, resp *http.Response) (chunks []map[string]any, done bool) {
	t.Helper()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			return chunks, true
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		chunks = append(chunks, m)
	}
	return chunks, false
}

func contentOf(chunks []map[string]any) string {
	var b strings.Builder
	for _, c := range chunks {
		for _, ch := range asList(c["choices"]) {
			if d, ok := ch.(map[string]any)["delta"].(map[string]any); ok {
				s, _ := d["content"].(string)
				b.WriteString(s)
			}
		}
	}
	return b.String()
}

func asList(v any) []any { l, _ := v.([]any); return l }

func TestTheFrontDoorAnswersThroughAPreset(t *testing.T) {
	e, base := frontDoorEnv(t, setup{})
	resp := postChat(t, base, "", `{"model": "smart", "messages": [{"role": "user", "content": "What is it?"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var c struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Choices []struct {
			Message      struct{ Role, Content string } `json:"message"`
			FinishReason string                         `json:"finish_reason"`
		} `json:"choices"`
		Usage map[string]int `json:"usage"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&c))
	assert.Equal(t, "chat.completion", c.Object)
	require.Len(t, c.Choices, 1)
	assert.Equal(t, "The answer is 42.", c.Choices[0].Message.Content)
	assert.Equal(t, "assistant", c.Choices[0].Message.Role)
	assert.Equal(t, "stop", c.Choices[0].FinishReason)
	assert.Equal(t, 7, c.Usage["total_tokens"])
	assert.Equal(t, resp.Header.Get("Stubborn-Run-Id"), c.ID, "the completion's id is the run's")
	got, err := e.client.GetRun(testCtx(t), &stubbornv1.GetRunRequest{RunId: c.ID})
	require.NoError(t, err)
	assert.Equal(t, "good", got.GetState().GetWinner())
	require.Len(t, got.GetState().GetAttemptLog(), 2, "the run's timeline: the 503, then the answer")
	assert.Equal(t, "What is it?", got.GetState().GetTaskBrief())
}

func TestTheFrontDoorStreamsTheAnsweringAttempt(t *testing.T) {
	_, base := frontDoorEnv(t, setup{})
	resp := postChat(t, base, "", `{"model": "smart", "stream": true, "stream_options": {"include_usage": true},
		"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "What is it?"}]}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	runID := resp.Header.Get("Stubborn-Run-Id")
	require.NotEmpty(t, runID)
	chunks, done := sseData(t, resp)
	require.True(t, done, "the stream ends with [DONE]")
	assert.Equal(t, "The answer is 42.", contentOf(chunks), "the second model's text, once; nothing of the 503")
	first := asList(chunks[0]["choices"])[0].(map[string]any)["delta"].(map[string]any)
	assert.Equal(t, "assistant", first["role"])
	last := chunks[len(chunks)-1]
	assert.Empty(t, asList(last["choices"]), "the usage chunk")
	assert.InDelta(t, 7, last["usage"].(map[string]any)["total_tokens"], 0)
	for _, c := range chunks {
		assert.Equal(t, runID, c["id"])
		assert.Equal(t, "chat.completion.chunk", c["object"])
	}
}

func TestTheFrontDoorNeverStreamsARejectedAnswer(t *testing.T) {
	_, base := frontDoorEnv(t, setup{})
	resp := postChat(t, base, "", `{"model": "judged", "stream": true, "messages": [{"role": "user", "content": "Will you?"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	chunks, done := sseData(t, resp)
	require.True(t, done)
	assert.Equal(t, "The answer is 42.", contentOf(chunks), "the refusal was held, rejected and dropped")
}

func TestTheFrontDoorSpeaksOpenAIErrors(t *testing.T) {
	_, base := frontDoorEnv(t, setup{})
	for _, tc := range []struct {
		body, code string
		status     int
	}{
		{`{"model": "nope", "messages": [{"role": "user", "content": "x"}]}`, "model_not_found", http.StatusNotFound},
		{`{"model": "smart", "messages": []}`, "invalid_request", http.StatusBadRequest},
		{`{"model": `, "invalid_json", http.StatusBadRequest},
		// A retry that would ask a person fails instead: no request waits.
		{`{"model": "asks", "messages": [{"role": "user", "content": "x"}]}`, "run_failed", http.StatusServiceUnavailable},
	} {
		resp := postChat(t, base, "", tc.body)
		assert.Equal(t, tc.status, resp.StatusCode, tc.body)
		var e struct {
			Error struct{ Message, Type, Code string } `json:"error"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&e), tc.body)
		assert.Equal(t, tc.code, e.Error.Code, tc.body)
		assert.NotEmpty(t, e.Error.Message)
		if tc.code == "run_failed" {
			assert.Equal(t, "false", resp.Header.Get("X-Should-Retry"), "Stubborn retried already")
			assert.NotEmpty(t, resp.Header.Get("Stubborn-Run-Id"))
		}
	}
}

func TestTheFrontDoorAuthenticatesWithTheTenantsToken(t *testing.T) {
	_, base := frontDoorEnv(t, setup{tenants: []delegates.Tenant{{Name: "acme", TokenSHA256: []string{delegates.HashToken("s3cret")}}}})
	resp := postChat(t, base, "", `{"model": "smart", "messages": [{"role": "user", "content": "x"}]}`)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	resp = postChat(t, base, "wrong", `{"model": "smart", "messages": [{"role": "user", "content": "x"}]}`)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	resp = postChat(t, base, "s3cret", `{"model": "smart", "messages": [{"role": "user", "content": "x"}]}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	ids := listModels(t, base, "s3cret")
	assert.Contains(t, ids, "smart")
	assert.Contains(t, ids, "good")
}

// TestTheWholeConversationReachesTheModel: a conversation's messages, its
// tools and other parameters reach an openai delegate intact, and
// retry-with-learning appends its failure history to the last user
// message exactly as it appends it to a brief.
func TestTheWholeConversationReachesTheModel(t *testing.T) {
	var (
		mu     sync.Mutex
		bodies []map[string]any
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		mu.Lock()
		bodies = append(bodies, body)
		n := len(bodies)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if n == 1 {
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, `{"error":{"message":"model crashed"}}`)
			return
		}
		_, _ = io.WriteString(w, `{"model":"m","choices":[{"message":{"content":"fine"},"finish_reason":"stop"}]}`)
	}))
	t.Cleanup(srv.Close)
	_, base := frontDoorEnv(t, setup{
		entries: []delegates.Delegate{{Name: "recorder", OpenAI: &delegates.OpenAI{ModelAPI: delegates.ModelAPI{BaseURL: srv.URL, Model: "m", System: "Configured system."}}, ReadOnly: true, Timeout: delegates.Duration(time.Minute)}},
		presets: []delegates.Preset{{Name: "learner", Spec: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_RetryWithLearning{RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "recorder", MaxRetries: new(int32(2))}}}}},
	})
	resp := postChat(t, base, "", `{"model": "learner", "seed": 7, "tools": [{"type": "function", "function": {"name": "f"}}],
		"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
		             {"role": "user", "content": [{"type": "text", "text": "Sum it up."}]}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, bodies, 2)
	for _, b := range bodies {
		assert.Equal(t, "m", b["model"], "the entry's model")
		assert.InDelta(t, 7, b["seed"], 0, "parameters pass through")
		assert.Len(t, asList(b["tools"]), 1)
	}
	first := asList(bodies[0]["messages"])
	require.Len(t, first, 5, "the entry's system prompt, then the conversation intact")
	assert.Equal(t, map[string]any{"role": "system", "content": "Configured system."}, first[0])
	assert.Equal(t, map[string]any{"role": "assistant", "content": "Hello"}, first[3])
	assert.Equal(t, []any{map[string]any{"type": "text", "text": "Sum it up."}}, first[4].(map[string]any)["content"])
	second := asList(bodies[1]["messages"])
	require.Len(t, second, 5)
	parts := asList(second[4].(map[string]any)["content"])
	require.Len(t, parts, 2, "the failure history is a text part after the last user message's own")
	brief := "system: Be brief.\n\nuser: Hi\n\nassistant: Hello\n\nuser: Sum it up."
	history := strings.TrimPrefix(controls.EnrichBrief(brief, []*stubbornv1.FailureRecord{{Summary: "Error: HTTP 500 Internal Server Error: model crashed", Reason: "HTTP 500 Internal Server Error: model crashed"}}), brief)
	assert.Equal(t, map[string]any{"type": "text", "text": history}, parts[1], "the contract's text, byte for byte")
	assert.Equal(t, first[1], second[1])
}

// TestAFrontDoorRunNeverWaitsForAPerson: a nested preset's retry that
// would ask fails instead (never_ask), and its chain answers.
func TestAFrontDoorRunNeverWaitsForAPerson(t *testing.T) {
	_, base := frontDoorEnv(t, setup{})
	resp := postChat(t, base, "", `{"model": "wrapper", "messages": [{"role": "user", "content": "x"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var c struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&c))
	require.Len(t, c.Choices, 1)
	assert.Equal(t, "The answer is 42.", c.Choices[0].Message.Content)
}

// TestARejectedAnswerIsNeverStreamedThroughTheFrontDoor: a request's own
// criteria (its "stubborn" field) are the run's: the refusal streamed by
// the first model is held, rejected and never reaches the client.
func TestARejectedAnswerIsNeverStreamedThroughTheFrontDoor(t *testing.T) {
	e, base := frontDoorEnv(t, setup{presets: []delegates.Preset{{Name: "pair", Spec: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"bad", "good"}}}}}}})
	resp := postChat(t, base, "", `{"model": "pair", "stream": true, "stubborn": {"failure_when": "result.text.contains('refuse')"},
		"messages": [{"role": "user", "content": "Will you?"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	chunks, done := sseData(t, resp)
	require.True(t, done)
	assert.Equal(t, "The answer is 42.", contentOf(chunks))
	got, err := e.client.GetRun(testCtx(t), &stubbornv1.GetRunRequest{RunId: resp.Header.Get("Stubborn-Run-Id")})
	require.NoError(t, err)
	require.Len(t, got.GetState().GetAttemptLog(), 2)
	assert.Equal(t, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_REJECTED, got.GetState().GetAttemptLog()[0].GetOutcome())

	for body, field := range map[string]string{
		`{"model": "asks", "stubborn": {"failure_when": "true"}, "messages": [{"role": "user", "content": "x"}]}`: "does not take these criteria",
		`{"model": "pair", "stubborn": {"judge": "x"}, "messages": [{"role": "user", "content": "x"}]}`:           "stubborn.judge",
		`{"model": "pair", "stubborn": {"failure_when": "(("}, "messages": [{"role": "user", "content": "x"}]}`:   "failure_when",
	} {
		resp := postChat(t, base, "", body)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, body)
		b, _ := io.ReadAll(resp.Body)
		assert.Contains(t, string(b), field, body)
	}
}

// TestAModelOutsideTheTenantsListIsUnknownToIt: the front door's model
// lookup sees what ListDelegates lists to the tenant, no more: a preset
// or delegate outside the tenant's list is 404, as an unknown one is, and
// /v1/models does not list it.
func TestAModelOutsideTheTenantsListIsUnknownToIt(t *testing.T) {
	_, base := frontDoorEnv(t, setup{tenants: []delegates.Tenant{
		{Name: "acme", TokenSHA256: []string{delegates.HashToken("acme-token")}, Delegates: []string{"good"}},
		{Name: "other", TokenSHA256: []string{delegates.HashToken("other-token")}},
	}})
	for _, model := range []string{"smart", "busy", "nope"} {
		resp := postChat(t, base, "acme-token", `{"model": "`+model+`", "messages": [{"role": "user", "content": "x"}]}`)
		assert.Equal(t, http.StatusNotFound, resp.StatusCode, model)
	}
	resp := postChat(t, base, "acme-token", `{"model": "good", "messages": [{"role": "user", "content": "x"}]}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	resp = postChat(t, base, "other-token", `{"model": "smart", "messages": [{"role": "user", "content": "x"}]}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "a tenant without a list may use every model")

	assert.Equal(t, []string{"good"}, listModels(t, base, "acme-token"))
}

// listModels is GET /v1/models's ids, as the tenant of token sees them.
func listModels(t *testing.T, base, token string) []string {
	t.Helper()
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodGet, base+"/v1/models", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var list struct {
		Data []struct{ ID string } `json:"data"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	return ids
}

// TestAChatRequestOfTheWrongShapeNamesItsField: the fields the front door
// acts on are checked, each error naming its field.
func TestAChatRequestOfTheWrongShapeNamesItsField(t *testing.T) {
	_, base := frontDoorEnv(t, setup{})
	for body, field := range map[string]string{
		`{"model": 5, "messages": [{"role": "user", "content": "x"}]}`:                                              "model: must be a string",
		`{"model": "good", "stream": "yes", "messages": [{"role": "user", "content": "x"}]}`:                        "stream: must be true or false",
		`{"model": "good", "stream_options": [], "messages": [{"role": "user", "content": "x"}]}`:                   "stream_options: must be an object",
		`{"model": "good", "stream_options": {"include_usage": 1}, "messages": [{"role": "user", "content": "x"}]}`: "stream_options.include_usage: must be true or false",
		`{"model": "good", "messages": {"role": "user"}}`:                                                           "messages: must be an array",
		`{"model": "good", "messages": ["hi"]}`:                                                                     "messages[0]: must be an object",
		`[1, 2]`:                                                                                                    "must be a JSON object",
		`null`:                                                                                                      "model: required",
	} {
		resp := postChat(t, base, "", body)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, body)
		var e struct {
			Error struct{ Message, Code string } `json:"error"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&e), body)
		assert.Contains(t, e.Error.Message, field, body)
	}
}

// TestAnIdempotencyKeyForAnotherRequestIsAConflict: the same
// Idempotency-Key answers the same run again; with another request it is
// a 409 that the SDKs do not retry (x-should-retry: false).
func TestAnIdempotencyKeyForAnotherRequestIsAConflict(t *testing.T) {
	_, base := frontDoorEnv(t, setup{})
	post := func(body string) *http.Response {
		req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "k-1")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { _ = resp.Body.Close() })
		return resp
	}
	first := post(`{"model": "good", "messages": [{"role": "user", "content": "x"}]}`)
	require.Equal(t, http.StatusOK, first.StatusCode)
	again := post(`{"model": "good", "messages": [{"role": "user", "content": "x"}]}`)
	require.Equal(t, http.StatusOK, again.StatusCode)
	assert.Equal(t, first.Header.Get("Stubborn-Run-Id"), again.Header.Get("Stubborn-Run-Id"), "the same run")
	other := post(`{"model": "good", "messages": [{"role": "user", "content": "y"}]}`)
	assert.Equal(t, http.StatusConflict, other.StatusCode)
	assert.Equal(t, "false", other.Header.Get("X-Should-Retry"))
}
