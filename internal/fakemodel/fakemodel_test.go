package fakemodel_test

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/conversation"
	"github.com/stubbornhq/stubborn/internal/fakemodel"
)

// post sends body to path of m and returns the status and the body.
func post(t *testing.T, m *fakemodel.Model, path, body string) (int, string) {
	t.Helper()
	srv := httptest.NewServer(m)
	t.Cleanup(srv.Close)
	resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// decodeStream reads a streamed answer with the API's own decoder.
func decodeStream(t *testing.T, codec conversation.Codec, body string) *stubbornv1.Result {
	t.Helper()
	dec := codec.NewStreamDecoder()
	sc := bufio.NewScanner(strings.NewReader(body))
	var ev conversation.Event
	done := false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			ev.Name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			ev.Data = []byte(strings.TrimPrefix(line, "data: "))
		case line == "" && ev.Data != nil:
			_, end, err := dec.Next(ev)
			require.NoError(t, err, string(ev.Data))
			done = done || end
			ev = conversation.Event{}
		}
	}
	require.True(t, done, "no end marker in %s", body)
	return dec.Result()
}

const weatherTool = `"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]`

func TestFailsAnswers500InEachAPIsShape(t *testing.T) {
	m := fakemodel.New(fakemodel.Fails, 0)
	code, body := post(t, m, "/v1/chat/completions", `{"model": "x", "messages": [{"role": "user", "content": "hi"}]}`)
	assert.Equal(t, http.StatusInternalServerError, code)
	assert.JSONEq(t, `{"error": {"type": "server_error", "message": "`+fakemodel.Overloaded+`"}}`, body)
	code, body = post(t, m, "/v1/messages", `{"model": "x", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}`)
	assert.Equal(t, http.StatusInternalServerError, code)
	assert.JSONEq(t, `{"type": "error", "error": {"type": "api_error", "message": "`+fakemodel.Overloaded+`"}}`, body)
	assert.Equal(t, int64(2), m.Hits())
}

func TestStreamsAnswersWholeAndStreamed(t *testing.T) {
	m := fakemodel.New(fakemodel.Streams, 0)
	code, body := post(t, m, "/v1/chat/completions", `{"model": "fake-gpt", "messages": [{"role": "user", "content": "hi"}]}`)
	require.Equal(t, http.StatusOK, code, body)
	r, err := conversation.Chat{}.DecodeResponse([]byte(body))
	require.NoError(t, err)
	assert.Equal(t, "The answer is 42.", r.GetText())
	assert.Equal(t, "fake-gpt", r.GetModel())

	code, body = post(t, m, "/v1/chat/completions", `{"model": "fake-gpt", "stream": true, "messages": [{"role": "user", "content": "hi"}]}`)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, len(fakemodel.Words), strings.Count(body, `"content"`), "a chunk per word: %s", body)
	r = decodeStream(t, conversation.Chat{}, body)
	assert.Equal(t, "The answer is 42.", r.GetChoices()[0].GetMessage().GetContent()[0].GetText())
	assert.Equal(t, stubbornv1.FinishReason_FINISH_REASON_STOP, r.GetChoices()[0].GetFinishReason())

	code, body = post(t, m, "/v1/messages", `{"model": "fake-gpt", "max_tokens": 10, "stream": true, "messages": [{"role": "user", "content": "hi"}]}`)
	require.Equal(t, http.StatusOK, code, body)
	r = decodeStream(t, conversation.Messages{}, body)
	assert.Equal(t, "The answer is 42.", r.GetChoices()[0].GetMessage().GetContent()[0].GetText())
}

// The tools model calls get_weather, then answers its result; in both
// APIs, whole and streamed.
func TestToolsCallsGetWeatherThenAnswersItsResult(t *testing.T) {
	m := fakemodel.New(fakemodel.Tools, 0)
	code, body := post(t, m, "/v1/chat/completions", `{"model": "w", "messages": [{"role": "user", "content": "weather?"}], `+weatherTool+`}`)
	require.Equal(t, http.StatusOK, code, body)
	r, err := conversation.Chat{}.DecodeResponse([]byte(body))
	require.NoError(t, err)
	calls := r.GetChoices()[0].GetMessage().GetToolCalls()
	require.Len(t, calls, 1, body)
	assert.Equal(t, fakemodel.Tool, calls[0].GetName())
	assert.JSONEq(t, fakemodel.ToolArgs, calls[0].GetArguments())
	assert.Equal(t, stubbornv1.FinishReason_FINISH_REASON_TOOL_CALLS, r.GetChoices()[0].GetFinishReason())

	code, body = post(t, m, "/v1/chat/completions", `{"model": "w", "stream": true, "messages": [{"role": "user", "content": "weather?"},
		{"role": "assistant", "tool_calls": [{"id": "`+calls[0].GetId()+`", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
		{"role": "tool", "tool_call_id": "`+calls[0].GetId()+`", "content": "sunny"}], `+weatherTool+`}`)
	require.Equal(t, http.StatusOK, code, body)
	r = decodeStream(t, conversation.Chat{}, body)
	assert.Equal(t, fakemodel.Sunny, r.GetChoices()[0].GetMessage().GetContent()[0].GetText())

	anthropicTool := `"tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]`
	code, body = post(t, m, "/v1/messages", `{"model": "w", "max_tokens": 10, "stream": true, "messages": [{"role": "user", "content": "weather?"}], `+anthropicTool+`}`)
	require.Equal(t, http.StatusOK, code, body)
	r = decodeStream(t, conversation.Messages{}, body)
	calls = r.GetChoices()[0].GetMessage().GetToolCalls()
	require.Len(t, calls, 1, body)
	assert.True(t, strings.HasPrefix(calls[0].GetId(), "toolu_"), calls[0].GetId())
	assert.JSONEq(t, fakemodel.ToolArgs, calls[0].GetArguments())

	// Without the tool offered, it answers as Streams does.
	code, body = post(t, m, "/v1/chat/completions", `{"model": "w", "messages": [{"role": "user", "content": "hi"}]}`)
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "The answer is 42.")
}

func TestBadRequestsNameTheField(t *testing.T) {
	m := fakemodel.New(fakemodel.Streams, 0)
	code, body := post(t, m, "/v1/chat/completions", `{"model": "x", "messages": [{"role": "nobody", "content": "hi"}]}`)
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "messages[0].role")
	code, body = post(t, m, "/v1/chat/completions", `{"model": "x", "messages": [{"role": "user", "content": "`+strings.Repeat("a", 5<<20)+`"}]}`)
	assert.Equal(t, http.StatusRequestEntityTooLarge, code)
	assert.Contains(t, body, "over 4194304 bytes")
}
