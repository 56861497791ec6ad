package server_test

import (
	"bufio"
	"encoding/json"
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
	"github.com/stubbornhq/stubborn/internal/delegates"
)

// postMessages posts a Messages request as Anthropic's SDKs do: the API
// key as X-Api-Key, anthropic-version set.
func postMessages(t *testing.T, base, key, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, base+"/v1/messages", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Anthropic-Version", "2023-06-01")
	if key != "" {
		req.Header.Set("X-Api-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

// namedEvent is one server-sent event of a Messages stream.
type namedEvent struct {
	name string
	data map[string]any
}

func namedEvents(t *testing.T, resp *http.Response) []namedEvent {
	t.Helper()
	var (
		out  []namedEvent
		name string
	)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if n, ok := strings.CutPrefix(line, "event: "); ok {
			name = n
			continue
		}
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			var m map[string]any
			require.NoError(t, json.Unmarshal([]byte(d), &m), d)
			assert.Equal(t, name, m["type"], "an event's name is its data's type")
			out = append(out, namedEvent{name, m})
		}
	}
	return out
}

func TestTheMessagesDoorAnswersThroughAPreset(t *testing.T) {
	e, base := frontDoorEnv(t, setup{})
	resp := postMessages(t, base, "", `{"model": "smart", "max_tokens": 100, "system": "Be brief.",
		"messages": [{"role": "user", "content": [{"type": "text", "text": "What is it?"}]}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var m struct {
		ID, Type, Role, Model string
		Content               []struct{ Type, Text string }
		StopReason            string         `json:"stop_reason"`
		Usage                 map[string]int `json:"usage"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&m))
	assert.Equal(t, "message", m.Type)
	assert.Equal(t, "assistant", m.Role)
	assert.Equal(t, "smart", m.Model)
	require.Len(t, m.Content, 1)
	assert.Equal(t, "text", m.Content[0].Type)
	assert.Equal(t, "The answer is 42.", m.Content[0].Text)
	assert.Equal(t, "end_turn", m.StopReason, "the model's finish_reason stop, in the Messages API's words")
	assert.Equal(t, map[string]int{"input_tokens": 3, "output_tokens": 4}, m.Usage)
	assert.Equal(t, resp.Header.Get("Stubborn-Run-Id"), m.ID, "the message's id is the run's")
	got, err := e.client.GetRun(testCtx(t), &stubbornv1.GetRunRequest{RunId: m.ID})
	require.NoError(t, err)
	assert.Equal(t, "good", got.GetState().GetWinner())
	require.Len(t, got.GetState().GetAttemptLog(), 2, "the 503, then the answer")
	conv := got.GetState().GetConversation()
	msgs := conv.GetMessages()
	require.Len(t, msgs, 2, "the system prompt is the conversation's first message")
	assert.Equal(t, stubbornv1.ChatRole_CHAT_ROLE_SYSTEM, msgs[0].GetRole())
	assert.Equal(t, "Be brief.", msgs[0].GetContent()[0].GetText())
	assert.Equal(t, int64(100), conv.GetOptions().GetMaxTokens())
	assert.Equal(t, stubbornv1.ConversationAPI_CONVERSATION_API_ANTHROPIC_MESSAGES, conv.GetApi())
}

func TestTheMessagesDoorStreamsTheAnsweringAttempt(t *testing.T) {
	_, base := frontDoorEnv(t, setup{})
	resp := postMessages(t, base, "", `{"model": "smart", "max_tokens": 100, "stream": true, "messages": [{"role": "user", "content": "What is it?"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	runID := resp.Header.Get("Stubborn-Run-Id")
	evs := namedEvents(t, resp)
	require.GreaterOrEqual(t, len(evs), 6)
	var names []string
	var text strings.Builder
	for _, ev := range evs {
		if len(names) == 0 || names[len(names)-1] != ev.name {
			names = append(names, ev.name)
		}
		if ev.name == "content_block_delta" {
			d := ev.data["delta"].(map[string]any)
			assert.Equal(t, "text_delta", d["type"])
			text.WriteString(d["text"].(string))
		}
	}
	assert.Equal(t, []string{"message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"}, names)
	assert.Equal(t, "The answer is 42.", text.String(), "the second model's text, once; nothing of the 503")
	assert.Equal(t, runID, evs[0].data["message"].(map[string]any)["id"])
	delta := evs[len(evs)-2].data
	assert.Equal(t, "end_turn", delta["delta"].(map[string]any)["stop_reason"])
	assert.InDelta(t, 4, delta["usage"].(map[string]any)["output_tokens"], 0)
}

func TestTheMessagesDoorNeverStreamsARejectedAnswer(t *testing.T) {
	_, base := frontDoorEnv(t, setup{})
	resp := postMessages(t, base, "", `{"model": "judged", "max_tokens": 10, "stream": true, "messages": [{"role": "user", "content": "Will you?"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var text strings.Builder
	for _, ev := range namedEvents(t, resp) {
		if ev.name == "content_block_delta" {
			text.WriteString(ev.data["delta"].(map[string]any)["text"].(string))
		}
	}
	assert.Equal(t, "The answer is 42.", text.String(), "the refusal was held, rejected and dropped")
}

func TestTheMessagesDoorSpeaksAnthropicErrors(t *testing.T) {
	_, base := frontDoorEnv(t, setup{tenants: []delegates.Tenant{{Name: "acme", TokenSHA256: []string{delegates.HashToken("ak")}}}})
	const ok = `{"model": "smart", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}`
	for _, tc := range []struct {
		key, body, kind, says string
		status                int
	}{
		{"", ok, "authentication_error", "no credentials", http.StatusUnauthorized},
		{"wrong", ok, "authentication_error", "not valid", http.StatusUnauthorized},
		{"ak", `{"model": "nope", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}`, "not_found_error", "nope", http.StatusNotFound},
		{"ak", `{"model": "smart", "max_tokens": 10, "tools": [], "top_k": 3, "messages": [{"role": "user", "content": "x"}]}`, "invalid_request_error", `top_k: delegate "busy" (openai) cannot carry top_k`, http.StatusBadRequest},
		{"ak", `{"model": "smart", "max_tokens": 10, "messages": [{"role": "system", "content": "x"}]}`, "invalid_request_error", `messages[0].role: "system" is not user or assistant`, http.StatusBadRequest},
		{"ak", `{"model": "smart", "system": [{"type": "image"}], "messages": [{"role": "user", "content": "x"}]}`, "invalid_request_error", `system[0].type: "image" is not carried`, http.StatusBadRequest},
		{"ak", `{"model": "smart", "max_tokens": "ten", "messages": [{"role": "user", "content": "x"}]}`, "invalid_request_error", "max_tokens: must be an integer", http.StatusBadRequest},
		{"ak", `{"model": "smart", "system": "only a system prompt"}`, "invalid_request_error", "messages: at least one message is required", http.StatusBadRequest},
		{"ak", `{"model": "smart", "stop_sequences": [1], "messages": [{"role": "user", "content": "x"}]}`, "invalid_request_error", "stop_sequences[0]: must be a string", http.StatusBadRequest},
		{"ak", `{"model": "asks", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}`, "api_error", "ended FAILED", http.StatusServiceUnavailable},
	} {
		resp := postMessages(t, base, tc.key, tc.body)
		assert.Equal(t, tc.status, resp.StatusCode, tc.body)
		var e struct {
			Type  string
			Error struct{ Type, Message string }
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&e), tc.body)
		assert.Equal(t, "error", e.Type)
		assert.Equal(t, tc.kind, e.Error.Type, tc.body)
		assert.Contains(t, e.Error.Message, tc.says, tc.body)
		if tc.status == http.StatusServiceUnavailable {
			assert.Equal(t, "false", resp.Header.Get("X-Should-Retry"), "Stubborn retried already")
		}
	}
}

// TestTheMessagesDoorReachesAnAnthropicDelegate: a Messages request through
// the door reaches an anthropic delegate as a Messages request again, its
// system prompt (in the shape it came), messages and parameters in place.
func TestTheMessagesDoorReachesAnAnthropicDelegate(t *testing.T) {
	var (
		mu   sync.Mutex
		sent map[string]any
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		_ = json.NewDecoder(r.Body).Decode(&sent)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"type":"message","content":[{"type":"text","text":"Bonjour"}],"stop_reason":"max_tokens","usage":{"input_tokens":5,"output_tokens":2}}`)
	}))
	t.Cleanup(srv.Close)
	_, base := frontDoorEnv(t, setup{entries: []delegates.Delegate{{Name: "claude",
		Anthropic: &delegates.Anthropic{ModelAPI: delegates.ModelAPI{BaseURL: srv.URL, Model: "claude-x"}}, ReadOnly: true, Timeout: delegates.Duration(time.Minute)}}})
	resp := postMessages(t, base, "", `{"model": "claude", "max_tokens": 2, "temperature": 0, "stop_sequences": ["\n\n"], "metadata": {"user_id": "u7"},
		"system": [{"type": "text", "text": "Answer in French."}],
		"messages": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Bonjour"}, {"role": "user", "content": [{"type": "text", "text": "Again"}]}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var m struct {
		StopReason string `json:"stop_reason"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&m))
	assert.Equal(t, "max_tokens", m.StopReason)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, map[string]any{
		"model": "claude-x", "max_tokens": 2.0, "temperature": 0.0, "system": []any{map[string]any{"type": "text", "text": "Answer in French."}},
		"stop_sequences": []any{"\n\n"}, "metadata": map[string]any{"user_id": "u7"}, "stream": true,
		"messages": []any{
			map[string]any{"role": "user", "content": "Hello"},
			map[string]any{"role": "assistant", "content": "Bonjour"},
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "Again"}}},
		},
	}, sent)
}
