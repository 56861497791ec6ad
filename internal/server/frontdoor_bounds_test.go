package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/internal/delegates"
)

// bodyOf is a request of about n bytes: one user message of n bytes of
// text.
func bodyOf(model string, n int) string {
	return `{"model": "` + model + `", "max_tokens": 10, "messages": [{"role": "user", "content": "` + strings.Repeat("x", n) + `"}]}`
}

// openAIError is an error answer in OpenAI's shape.
type openAIError struct {
	Error *struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// anthropicError is an error answer in Anthropic's shape.
type anthropicError struct {
	Type  string `json:"type"`
	Error *struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// A body the door takes (under 8 MiB) that the run cannot (over the
// conversation's bound, 4 × limits.max_brief_bytes = 256 KiB by default)
// is a 400 in the door's shape naming messages and the limit: not a 429,
// not gRPC's words about its message size.
func TestAConversationOverItsBoundIsABadRequestAtEitherDoor(t *testing.T) {
	_, base := frontDoorEnv(t, setup{})
	for _, n := range []int{300 << 10, 7 << 20} {
		resp := postChat(t, base, "", bodyOf("good", n))
		raw, _ := io.ReadAll(resp.Body)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%d bytes: %s", n, raw)
		var e openAIError
		require.NoError(t, json.Unmarshal(raw, &e), string(raw))
		require.NotNil(t, e.Error, string(raw))
		assert.Equal(t, "invalid_request_error", e.Error.Type)
		assert.Contains(t, e.Error.Message, "messages")
		assert.Contains(t, e.Error.Message, "262144", "the limit")
		assert.NotContains(t, e.Error.Message, "grpc")
		assert.NotContains(t, e.Error.Message, "task_messages", "the door's field, not the run's")
		require.NotNil(t, e.Error.Param)
		assert.Equal(t, "messages", *e.Error.Param)
		assert.Empty(t, resp.Header.Get("Retry-After"))

		resp = postMessages(t, base, "", bodyOf("good", n))
		raw, _ = io.ReadAll(resp.Body)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%d bytes: %s", n, raw)
		var a anthropicError
		require.NoError(t, json.Unmarshal(raw, &a), string(raw))
		require.NotNil(t, a.Error, string(raw))
		assert.Equal(t, "error", a.Type)
		assert.Equal(t, "invalid_request_error", a.Error.Type)
		assert.Contains(t, a.Error.Message, "messages")
		assert.Contains(t, a.Error.Message, "262144")
		assert.NotContains(t, a.Error.Message, "grpc")
	}
}

// A body over the door's 8 MiB is a 413 in the door's own shape:
// OpenAI's on /v1/chat/completions, Anthropic's (request_too_large) on
// /v1/messages, never Connect's.
func TestABodyOverEightMiBIsA413InTheDoorsShape(t *testing.T) {
	_, base := frontDoorEnv(t, setup{})
	body := bodyOf("good", 9<<20)

	resp := postChat(t, base, "", body)
	raw, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, string(raw))
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	var e openAIError
	require.NoError(t, json.Unmarshal(raw, &e), string(raw))
	require.NotNil(t, e.Error, string(raw))
	assert.Equal(t, "invalid_request_error", e.Error.Type)
	assert.Contains(t, e.Error.Message, "8388608")
	require.NotNil(t, e.Error.Code)
	assert.Equal(t, "request_too_large", *e.Error.Code)

	resp = postMessages(t, base, "", body)
	raw, _ = io.ReadAll(resp.Body)
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, string(raw))
	var a anthropicError
	require.NoError(t, json.Unmarshal(raw, &a), string(raw))
	require.NotNil(t, a.Error, string(raw))
	assert.Equal(t, "error", a.Type)
	assert.Equal(t, "request_too_large", a.Error.Type, "Anthropic's own type for a 413")
	assert.Contains(t, a.Error.Message, "8388608")
}

// With a max_brief_bytes so large that 4 times it is more than an event
// holds, the bound is the event's (runs.MaxEventBytes): a 2 MB
// conversation is a 400 that says so, before any run.
func TestAConversationOverWhatAnEventHoldsIsABadRequest(t *testing.T) {
	_, base := frontDoorEnv(t, setup{limits: delegates.Limits{MaxBriefBytes: 2 << 20}})
	resp := postChat(t, base, "", bodyOf("good", 2<<20))
	raw, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, string(raw))
	assert.Contains(t, string(raw), "messages: the conversation with its parameters is")
	assert.Contains(t, string(raw), "3 MiB")
}
