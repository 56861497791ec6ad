package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
)

// fakeModel is an OpenAI-compatible Chat Completions endpoint on
// loopback: answer gets the user message and returns the status and the
// assistant's text.
func fakeModel(t *testing.T, answer func(prompt string) (int, string)) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Messages []struct{ Role, Content string } `json:"messages"`
		}
		if r.URL.Path != "/v1/chat/completions" || json.NewDecoder(r.Body).Decode(&req) != nil || len(req.Messages) == 0 {
			http.Error(w, `{"error": {"message": "bad request"}}`, http.StatusBadRequest)
			return
		}
		status, text := answer(req.Messages[len(req.Messages)-1].Content)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		if status != http.StatusOK {
			_, _ = io.WriteString(w, `{"error": {"message": "`+text+`"}}`)
			return
		}
		b, _ := json.Marshal(map[string]any{
			"model":   "fake",
			"choices": []any{map[string]any{"message": map[string]any{"role": "assistant", "content": text}, "finish_reason": "stop"}},
			"usage":   map[string]any{"total_tokens": 7},
		})
		_, _ = w.Write(b)
	}))
	t.Cleanup(s.Close)
	return s
}

// A model, a REST API and a gRPC delegate in one fallback chain, from
// config only: the model is overloaded, the API fails, gRPC echo answers.
func TestFallbackChainOverOpenAIHTTPAndGRPC(t *testing.T) {
	model := fakeModel(t, func(string) (int, string) { return http.StatusServiceUnavailable, "overloaded" })
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "upstream broke", http.StatusInternalServerError)
	}))
	t.Cleanup(api.Close)
	e := startWith(t, setup{entries: []delegates.Delegate{
		{Name: "model", OpenAI: &delegates.OpenAI{ModelAPI: delegates.ModelAPI{BaseURL: model.URL + "/v1", Model: "m"}}},
		{Name: "api", HTTP: &delegates.HTTP{URL: api.URL}},
	}})
	stream, err := e.client.Run(testCtx(t), &stubbornv1.RunRequest{
		TaskBrief:     "find it",
		FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"model", "api", "echo"}},
	})
	require.NoError(t, err)
	st := lastState(t, collect(t, stream))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus())
	assert.Equal(t, "echo", st.GetWinner())
	require.Len(t, st.GetFailureHistory(), 2)
	assert.Equal(t, "HTTP 503 Service Unavailable: overloaded", st.GetFailureHistory()[0].GetReason())
	assert.Equal(t, "HTTP 500 Internal Server Error: upstream broke", st.GetFailureHistory()[1].GetReason())
	require.Len(t, st.GetAttemptLog(), 3)
	assert.EqualValues(t, 503, st.GetAttemptLog()[0].GetError().GetHttpStatus())
}

// A model as the judge of a chain's results, from config only.
func TestModelJudgesAFallbackChain(t *testing.T) {
	var judged atomic.Int32
	judge := fakeModel(t, func(prompt string) (int, string) {
		judged.Add(1)
		if strings.Contains(prompt, "wrong answer") {
			return http.StatusOK, `Sure. {"is_failure": true, "reason": "it says wrong"}`
		}
		return http.StatusOK, `{"is_failure": false, "reason": "fine"}`
	})
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, `{"answer": "the wrong answer"}`)
	}))
	t.Cleanup(api.Close)
	e := startWith(t, setup{judge: "judge", entries: []delegates.Delegate{
		{Name: "judge", OpenAI: &delegates.OpenAI{ModelAPI: delegates.ModelAPI{BaseURL: judge.URL + "/v1", Model: "m"}}},
		{Name: "api", HTTP: &delegates.HTTP{URL: api.URL, TextPointer: "/answer"}},
	}})
	stream, err := e.client.Run(testCtx(t), &stubbornv1.RunRequest{
		TaskBrief:     "answer",
		FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"api", "echo"}, FailureCriteria: "the answer is wrong"},
	})
	require.NoError(t, err)
	st := lastState(t, collect(t, stream))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus())
	assert.Equal(t, "echo", st.GetWinner())
	require.Len(t, st.GetFailureHistory(), 1)
	assert.Equal(t, "it says wrong", st.GetFailureHistory()[0].GetReason())
	assert.EqualValues(t, 2, judged.Load())
}

// A 429 with Retry-After from an HTTP delegate: the retry control waits as
// told (from_hint), then the second call succeeds.
func TestRetryHonoursAnHTTPRetryAfter(t *testing.T) {
	var calls atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After-Ms", "50")
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		_, _ = io.WriteString(w, "done after "+r.Header.Get("Stubborn-Attempt"))
	}))
	t.Cleanup(api.Close)
	e := startWith(t, setup{entries: []delegates.Delegate{
		{Name: "api", HTTP: &delegates.HTTP{URL: api.URL}, Idempotent: true},
	}})
	stream, err := e.client.Run(testCtx(t), &stubbornv1.RunRequest{
		TaskBrief: "go",
		Retry:     &stubbornv1.RetrySpec{Target: "api"},
	})
	require.NoError(t, err)
	evs := collect(t, stream)
	st := lastState(t, evs)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus())
	assert.Equal(t, "done after 2", st.GetResult().GetText())
	var backoffs []*stubbornv1.BackoffScheduled
	for _, ev := range evs {
		if b := ev.GetBackoffScheduled(); b != nil {
			backoffs = append(backoffs, b)
		}
	}
	require.Len(t, backoffs, 1)
	assert.True(t, backoffs[0].GetFromHint())
	assert.Equal(t, 50*time.Millisecond, backoffs[0].GetWait().AsDuration())
}
