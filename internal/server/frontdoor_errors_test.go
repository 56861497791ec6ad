package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/metadata"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// temperatureError is what OpenAI answers to temperature: 5.
const temperatureError = `Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 5 instead.`

// failingModel is a model server (either API: it reads no path) that
// answers every request with code and body.
func failingModel(t testing.TB, code int, body string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func openAIEntry(name, url string) delegates.Delegate {
	return delegates.Delegate{Name: name, OpenAI: &delegates.OpenAI{ModelAPI: delegates.ModelAPI{BaseURL: url, Model: "m"}}, ReadOnly: true, Timeout: delegates.Duration(time.Minute)}
}

func anthropicEntry(name, url string) delegates.Delegate {
	return delegates.Delegate{Name: name, Anthropic: &delegates.Anthropic{ModelAPI: delegates.ModelAPI{BaseURL: url, Model: "claude-x"}}, ReadOnly: true, Timeout: delegates.Duration(time.Minute)}
}

func chain(name string, names ...string) delegates.Preset {
	return delegates.Preset{Name: name, Spec: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: names}}}}
}

// openAIErrorBody is an OpenAI-shaped error body, its param as any JSON.
type openAIErrorBody struct {
	Error struct {
		Message, Type, Code string
		Param               any
	} `json:"error"`
}

func decodeOpenAIError(t *testing.T, resp *http.Response) openAIErrorBody {
	t.Helper()
	var e openAIErrorBody
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
	return e
}

// postChatKeyed posts a Chat Completions request with an Idempotency-Key,
// as failoverEnv's tenant when base is its.
func postChatKeyed(t *testing.T, base, key, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Authorization", "Bearer "+failoverToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

// streamErrors are the error objects of a Chat Completions stream.
func streamErrors(chunks []map[string]any) []map[string]any {
	var out []map[string]any
	for _, c := range chunks {
		if e, ok := c["error"].(map[string]any); ok {
			out = append(out, e)
		}
	}
	return out
}

// asTenant is a context for a gRPC call as failoverEnv's tenant.
func asTenant(t *testing.T) context.Context {
	return metadata.AppendToOutgoingContext(testCtx(t), "authorization", "Bearer "+failoverToken)
}

// waitEnded waits for run id to end and returns its state.
func waitEnded(t *testing.T, e *env, id string) *stubbornv1.ControlState {
	t.Helper()
	var st *stubbornv1.ControlState
	require.Eventually(t, func() bool {
		resp, err := e.client.GetRun(asTenant(t), &stubbornv1.GetRunRequest{RunId: id})
		require.NoError(t, err)
		st = resp.GetState()
		return st.GetEndTime() != nil
	}, 20*time.Second, 10*time.Millisecond)
	return st
}

// TestAModelsOwnErrorReachesTheApp: a model's 400 about the request is the
// door's 400 with the model's message, in either door's shape; a
// delegate's 401 or 404 is the operator's (a 502 naming the delegate, never
// the door's own model_not_found); an answer over max_result_bytes says
// so.
func TestAModelsOwnErrorReachesTheApp(t *testing.T) {
	_, base := frontDoorEnv(t, setup{
		limits: delegates.Limits{MaxResultBytes: 300},
		entries: []delegates.Delegate{
			openAIEntry("strict", failingModel(t, http.StatusBadRequest,
				`{"error":{"message":"`+temperatureError+`","type":"invalid_request_error","param":"temperature","code":"decimal_above_max_value"}}`)),
			openAIEntry("picky", failingModel(t, http.StatusUnprocessableEntity, `{"error":{"message":"messages: too many images"}}`)),
			anthropicEntry("claude", failingModel(t, http.StatusBadRequest,
				`{"type":"error","error":{"type":"invalid_request_error","message":"temperature: range: 0..1"}}`)),
			openAIEntry("locked", failingModel(t, http.StatusUnauthorized, `{"error":{"message":"Incorrect API key provided"}}`)),
			anthropicEntry("gone", failingModel(t, http.StatusNotFound, `{"type":"error","error":{"type":"not_found_error","message":"model: claude-x"}}`)),
			openAIEntry("verbose", chatModel(t, http.StatusOK, strings.Repeat("many words ", 100))),
		},
		presets: []delegates.Preset{chain("then-strict", "busy", "strict")},
	})
	for _, tc := range []struct {
		model, says, code string
		status            int
	}{
		{"strict", temperatureError, "invalid_request", http.StatusBadRequest},
		// The last attempt's 400 is the run's answer, after a 503 before it.
		{"then-strict", temperatureError, "invalid_request", http.StatusBadRequest},
		{"picky", "messages: too many images", "invalid_request", http.StatusUnprocessableEntity},
		{"claude", "temperature: range: 0..1", "invalid_request", http.StatusBadRequest},
		{"locked", `delegate "locked"`, "delegate_misconfigured", http.StatusBadGateway},
		{"gone", `delegate "gone"`, "delegate_misconfigured", http.StatusBadGateway},
		{"verbose", "max_result_bytes", "run_failed", http.StatusServiceUnavailable},
	} {
		for _, stream := range []bool{false, true} {
			body := `{"model": "` + tc.model + `", "temperature": 5, "stream": ` + map[bool]string{false: "false", true: "true"}[stream] + `, "messages": [{"role": "user", "content": "x"}]}`
			resp := postChat(t, base, "", body)
			assert.Equal(t, tc.status, resp.StatusCode, body)
			assert.NotEmpty(t, resp.Header.Get("Stubborn-Run-Id"), body)
			er := decodeOpenAIError(t, resp)
			assert.Contains(t, er.Error.Message, tc.says, body)
			assert.Equal(t, tc.code, er.Error.Code, body)
			if tc.status == http.StatusBadGateway {
				assert.Equal(t, "false", resp.Header.Get("X-Should-Retry"), "a misconfiguration is not fixed by a retry")
				assert.Contains(t, er.Error.Message, map[string]string{"locked": "401", "gone": "404"}[tc.model], "the delegate's status")
			}
		}
	}

	// The Messages door: the same answers in Anthropic's shape.
	for _, tc := range []struct {
		model, says, kind string
		status            int
	}{
		{"claude", "temperature: range: 0..1", "invalid_request_error", http.StatusBadRequest},
		{"strict", temperatureError, "invalid_request_error", http.StatusBadRequest},
		{"gone", `delegate "gone"`, "api_error", http.StatusBadGateway},
		{"verbose", "max_result_bytes", "api_error", http.StatusServiceUnavailable},
	} {
		resp := postMessages(t, base, "", `{"model": "`+tc.model+`", "max_tokens": 10, "temperature": 5, "messages": [{"role": "user", "content": "x"}]}`)
		assert.Equal(t, tc.status, resp.StatusCode, tc.model)
		var er struct {
			Type  string
			Error struct{ Type, Message string }
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&er), tc.model)
		assert.Equal(t, "error", er.Type)
		assert.Equal(t, tc.kind, er.Error.Type, tc.model)
		assert.Contains(t, er.Error.Message, tc.says, tc.model)
	}
}

// failoverToken is failoverEnv's tenant's token: a replay's look-up of
// its run is the tenant's too.
const failoverToken = "acme-token"

// failoverEnv is the door over issue 33's mid-answer failover: model-a
// streams three words and stalls (a transient failure after its answer
// began), model-b answers through a gate (gatedSSE, when release is set)
// or at once; "failover" chains them, "dead-end" chains model-a and a
// model that is down.
func failoverEnv(t *testing.T, release <-chan struct{}) (*env, string) {
	t.Helper()
	stalls := &demo.Storyteller{Story: "Once upon a time, in a model that stalls", Pace: time.Millisecond, StallFirst: 1 << 30, StallAfter: 3}
	second := chatModel(t, http.StatusOK, secondAnswer...)
	if release != nil {
		second = gatedSSE(t, 4, release).URL
	}
	return frontDoorEnv(t, setup{
		tenants: []delegates.Tenant{{Name: "acme", TokenSHA256: []string{delegates.HashToken(failoverToken)}}},
		extra:   map[string]stubbornv1.DelegateServiceServer{"model-a": stalls},
		entries: []delegates.Delegate{openAIEntry("model-b", second)},
		presets: []delegates.Preset{chain("failover", "model-a", "model-b"), chain("dead-end", "model-a", "busy")},
		configure: func(cfg *delegates.Config) {
			for i := range cfg.Delegates {
				if cfg.Delegates[i].Name == "model-a" {
					cfg.Delegates[i].IdleTimeout = delegates.Duration(200 * time.Millisecond)
				}
			}
		},
	})
}

// TestAnInterruptedStreamSaysWhatTheRunDid: a stream whose attempt failed
// after its answer began ends with an error that says whether the run
// goes on (the next attempt follows) or how it ended.
func TestAnInterruptedStreamSaysWhatTheRunDid(t *testing.T) {
	_, base := failoverEnv(t, nil)

	resp := postChat(t, base, failoverToken, `{"model": "failover", "stream": true, "messages": [{"role": "user", "content": "tell me"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	chunks, done := sseData(t, resp)
	assert.False(t, done)
	assert.Equal(t, "Once upon a ", contentOf(chunks))
	errs := streamErrors(chunks)
	require.Len(t, errs, 1)
	assert.Equal(t, "stream_interrupted", errs[0]["code"])
	assert.Contains(t, errs[0]["message"], `succeeded with delegate "model-b"'s answer`)
	assert.Contains(t, errs[0]["message"], resp.Header.Get("Stubborn-Run-Id"), "the error names the run")

	resp = postChat(t, base, failoverToken, `{"model": "dead-end", "stream": true, "messages": [{"role": "user", "content": "tell me"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	chunks, _ = sseData(t, resp)
	assert.Equal(t, "Once upon a ", contentOf(chunks))
	errs = streamErrors(chunks)
	require.Len(t, errs, 1)
	assert.Equal(t, "stream_interrupted", errs[0]["code"])
	msg, _ := errs[0]["message"].(string)
	assert.Contains(t, msg, "ended EXHAUSTED")
	assert.Contains(t, msg, "overloaded", "the last attempt's error")
	assert.NotContains(t, msg, "goes on")
	assert.Contains(t, msg, resp.Header.Get("Stubborn-Run-Id"), "the error names the run")

	// The Messages door says it the same way.
	resp = postMessages(t, base, failoverToken, `{"model": "dead-end", "stream": true, "max_tokens": 10, "messages": [{"role": "user", "content": "tell me"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	evs := namedEvents(t, resp)
	require.NotEmpty(t, evs)
	last := evs[len(evs)-1]
	require.Equal(t, "error", last.name)
	assert.Contains(t, last.data["error"].(map[string]any)["message"], "ended EXHAUSTED")
}

// TestAResendGetsTheRunsAnswer: a request resent with its Idempotency-Key
// after its run succeeded, past an attempt that failed after its answer
// began, gets the accepted answer only, streamed or whole.
func TestAResendGetsTheRunsAnswer(t *testing.T) {
	e, base := failoverEnv(t, nil)
	const body = `{"model": "failover", "stream": true, "messages": [{"role": "user", "content": "tell me"}]}`
	first := postChatKeyed(t, base, "resend-1", body)
	require.Equal(t, http.StatusOK, first.StatusCode)
	chunks, _ := sseData(t, first)
	require.Len(t, streamErrors(chunks), 1, "the first stream was interrupted")
	id := first.Header.Get("Stubborn-Run-Id")
	st := waitEnded(t, e, id)
	require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus())

	again := postChatKeyed(t, base, "resend-1", body)
	require.Equal(t, http.StatusOK, again.StatusCode)
	assert.Equal(t, id, again.Header.Get("Stubborn-Run-Id"), "the same run")
	chunks, done := sseData(t, again)
	assert.True(t, done)
	assert.Empty(t, streamErrors(chunks))
	assert.Equal(t, strings.Join(secondAnswer, ""), contentOf(chunks), "the accepted answer, never the discarded one")

	whole := postChatKeyed(t, base, "resend-1", strings.Replace(body, `"stream": true`, `"stream": false`, 1))
	require.Equal(t, http.StatusOK, whole.StatusCode)
	var c struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	require.NoError(t, json.NewDecoder(whole.Body).Decode(&c))
	require.Len(t, c.Choices, 1)
	assert.Equal(t, strings.Join(secondAnswer, ""), c.Choices[0].Message.Content)
}

// TestAResendOfAFailedRunGetsItsError: a run that ended without an answer
// answers a resend with the same error, streamed or not, and never
// replays the text of a dead attempt.
func TestAResendOfAFailedRunGetsItsError(t *testing.T) {
	e, base := failoverEnv(t, nil)
	const body = `{"model": "dead-end", "stream": true, "messages": [{"role": "user", "content": "tell me"}]}`
	first := postChatKeyed(t, base, "resend-2", body)
	require.Equal(t, http.StatusOK, first.StatusCode)
	_, _ = sseData(t, first)
	waitEnded(t, e, first.Header.Get("Stubborn-Run-Id"))
	for _, b := range []string{body, strings.Replace(body, `"stream": true`, `"stream": false`, 1)} {
		again := postChatKeyed(t, base, "resend-2", b)
		assert.Equal(t, http.StatusServiceUnavailable, again.StatusCode, b)
		er := decodeOpenAIError(t, again)
		assert.Contains(t, er.Error.Message, "ended EXHAUSTED", b)
		assert.NotContains(t, er.Error.Message, "goes on", b)
	}

	// A model's 400: the same 400 again.
	_, base = frontDoorEnv(t, setup{tenants: []delegates.Tenant{{Name: "acme", TokenSHA256: []string{delegates.HashToken(failoverToken)}}},
		entries: []delegates.Delegate{openAIEntry("strict", failingModel(t, http.StatusBadRequest,
			`{"error":{"message":"`+temperatureError+`","type":"invalid_request_error","param":"temperature","code":"decimal_above_max_value"}}`))}})
	const bad = `{"model": "strict", "temperature": 5, "messages": [{"role": "user", "content": "x"}]}`
	firstBad := postChatKeyed(t, base, "resend-3", bad)
	require.Equal(t, http.StatusBadRequest, firstBad.StatusCode)
	want := decodeOpenAIError(t, firstBad)
	for _, b := range []string{bad, strings.Replace(bad, `"temperature": 5,`, `"temperature": 5, "stream": true,`, 1)} {
		again := postChatKeyed(t, base, "resend-3", b)
		assert.Equal(t, http.StatusBadRequest, again.StatusCode, b)
		assert.Equal(t, want, decodeOpenAIError(t, again), b)
	}
}

// TestAResendWhileTheRunGoesOnStreamsItsLiveAttempt: a request resent
// while its run is in flight streams the attempt that is answering, from
// its start, to its end — not the dead attempt before it.
func TestAResendWhileTheRunGoesOnStreamsItsLiveAttempt(t *testing.T) {
	release := make(chan struct{})
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	e, base := failoverEnv(t, release)
	const body = `{"model": "failover", "stream": true, "messages": [{"role": "user", "content": "tell me"}]}`
	first := postChatKeyed(t, base, "resend-4", body)
	require.Equal(t, http.StatusOK, first.StatusCode)
	chunks, _ := sseData(t, first)
	errs := streamErrors(chunks)
	require.Len(t, errs, 1, "the first stream was interrupted")
	assert.Contains(t, errs[0]["message"], "goes on: attempt 2 is answering")
	id := first.Header.Get("Stubborn-Run-Id")
	// Attempt 2 is answering, held at its gate.
	require.Eventually(t, func() bool {
		resp, err := e.client.GetRun(asTenant(t), &stubbornv1.GetRunRequest{RunId: id})
		require.NoError(t, err)
		return len(resp.GetState().GetAttemptLog()) == 2
	}, 10*time.Second, 10*time.Millisecond)

	again := postChatKeyed(t, base, "resend-4", body)
	require.Equal(t, http.StatusOK, again.StatusCode)
	close(release)
	released = true
	chunks, done := sseData(t, again)
	assert.True(t, done)
	assert.Empty(t, streamErrors(chunks))
	assert.Equal(t, strings.Join(secondAnswer, ""), contentOf(chunks), "the live attempt from its start")
}
