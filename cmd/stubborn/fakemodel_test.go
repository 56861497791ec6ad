package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/fakemodel"
)

// doorPost posts body to the front door at base+path and returns the
// status and the body.
func doorPost(t *testing.T, ctx context.Context, base, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// checkDoorAnswers asks the front door at base what the README shows: smart
// (fake-down fails, fake-gpt answers), the same streamed, a tool call from
// fake-weather and its answer to the tool's result, and smart over
// Anthropic's Messages.
func checkDoorAnswers(t *testing.T, ctx context.Context, base string) {
	t.Helper()
	code, body := doorPost(t, ctx, base, "/v1/chat/completions", `{"model": "smart", "messages": [{"role": "user", "content": "What is the answer?"}]}`)
	require.Equal(t, http.StatusOK, code, body)
	var chat struct {
		Choices []struct {
			Message struct {
				Content   *string `json:"content"`
				ToolCalls []struct {
					ID       string `json:"id"`
					Function struct{ Name, Arguments string }
				} `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Stubborn struct {
			Attempts int    `json:"attempts"`
			Winner   string `json:"winner"`
		} `json:"stubborn"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &chat), body)
	require.Len(t, chat.Choices, 1, body)
	require.NotNil(t, chat.Choices[0].Message.Content, body)
	assert.Equal(t, "The answer is 42.", *chat.Choices[0].Message.Content)
	assert.Equal(t, 2, chat.Stubborn.Attempts, "fake-down failed first: %s", body)
	assert.Equal(t, "fake-gpt", chat.Stubborn.Winner)

	code, body = doorPost(t, ctx, base, "/v1/chat/completions", `{"model": "smart", "stream": true, "messages": [{"role": "user", "content": "What is the answer?"}]}`)
	require.Equal(t, http.StatusOK, code, body)
	assert.GreaterOrEqual(t, strings.Count(body, `"content":`), 2, "streamed in pieces: %s", body)
	assert.True(t, strings.HasSuffix(body, "data: [DONE]\n\n"), body)

	tools := `"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]`
	code, body = doorPost(t, ctx, base, "/v1/chat/completions", `{"model": "fake-weather", "messages": [{"role": "user", "content": "Weather in Paris?"}], `+tools+`}`)
	require.Equal(t, http.StatusOK, code, body)
	chat.Choices = nil
	require.NoError(t, json.Unmarshal([]byte(body), &chat), body)
	require.Len(t, chat.Choices, 1, body)
	assert.Equal(t, "tool_calls", chat.Choices[0].FinishReason, body)
	require.Len(t, chat.Choices[0].Message.ToolCalls, 1, body)
	call := chat.Choices[0].Message.ToolCalls[0]
	assert.Equal(t, fakemodel.Tool, call.Function.Name)
	assert.JSONEq(t, fakemodel.ToolArgs, call.Function.Arguments)

	code, body = doorPost(t, ctx, base, "/v1/chat/completions", fmt.Sprintf(`{"model": "fake-weather", "messages": [{"role": "user", "content": "Weather in Paris?"},
		{"role": "assistant", "content": null, "tool_calls": [{"id": %q, "type": "function", "function": {"name": "get_weather", "arguments": %q}}]},
		{"role": "tool", "tool_call_id": %q, "content": "sunny, 24°C"}], %s}`, call.ID, call.Function.Arguments, call.ID, tools))
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"content":"`+fakemodel.Sunny+`"`)

	code, body = doorPost(t, ctx, base, "/v1/messages", `{"model": "smart", "max_tokens": 100, "messages": [{"role": "user", "content": "What is the answer?"}]}`)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"text":"The answer is 42."`)
}

// `stubborn demo` serves the fake models and smart on its HTTP listener,
// and prints a curl line that works as printed.
func TestDemoFrontDoorAnswersSmart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	demoCtx, interrupt := context.WithCancel(ctx)
	defer interrupt()
	var out syncBuffer
	done := goCLI(demoCtx, &out, "demo", "-latency", "1ms", "-http-listen", "127.0.0.1:0")
	var curl []string
	require.Eventually(t, func() bool {
		m := regexp.MustCompile(`(?m)^  (curl -s (http://\S+)/v1/chat/completions .*)$`).FindStringSubmatch(out.String())
		if m != nil {
			curl = m
		}
		return m != nil
	}, 20*time.Second, 10*time.Millisecond)
	assert.Contains(t, out.String(), "Front door: fake models fake-down (always fails), fake-gpt (streams its answer) and fake-weather (calls get_weather), and the preset smart")

	// The curl line, as a shell would split it: its -d body is the request.
	_, data, ok := strings.Cut(curl[1], " -d '")
	require.True(t, ok, curl[1])
	code, body := doorPost(t, ctx, curl[2], "/v1/chat/completions", strings.TrimSuffix(data, "'"))
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"content":"The answer is 42."`)
	checkDoorAnswers(t, ctx, curl[2])

	interrupt()
	res := <-done
	require.NoError(t, res.err)
	assert.Equal(t, 0, res.code)
}

// `stubborn delegates` serves the fake models too, and prints a config
// with them and smart, which `serve -http-listen` answers at the door.
func TestDelegatesAndServeAnswerSmart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dctx, stop := context.WithCancel(ctx)
	defer stop()
	var out syncBuffer
	done := goCLI(dctx, &out, "delegates", "-listen", "127.0.0.1:0", "-latency", "1ms")
	require.Eventually(t, func() bool {
		return strings.Contains(out.String(), "fallback_chain: {chain: [fake-down, fake-gpt]}}\n")
	}, 20*time.Second, 10*time.Millisecond)
	printed, err := delegates.Parse([]byte(out.String()))
	require.NoError(t, err, out.String())
	kinds := map[string]string{}
	for _, d := range printed.Delegates {
		kinds[d.Name] = d.Kind()
	}
	assert.Equal(t, delegates.KindOpenAI, kinds["fake-down"])
	assert.Equal(t, delegates.KindOpenAI, kinds["fake-gpt"])
	assert.Equal(t, delegates.KindAnthropic, kinds["fake-weather"])

	s := startServer(t, "-memory", "-config", writeConfig(t, out.String()), "-listen", "127.0.0.1:0", "-http-listen", "127.0.0.1:0")
	checkDoorAnswers(t, ctx, s.loggedURL(t, "http api serving"))

	stop()
	res := <-done
	require.NoError(t, res.err)
	assert.Equal(t, 0, res.code)
}

// The shipped stubborn.yaml names what `stubborn delegates` serves on its
// default ports: the demo delegates, the fake models after them, and smart.
func TestShippedConfigMatchesDelegates(t *testing.T) {
	b, err := os.ReadFile("../../stubborn.yaml")
	require.NoError(t, err)
	cfg, err := delegates.Parse(b)
	require.NoError(t, err)
	byName := map[string]delegates.Delegate{}
	for _, d := range cfg.Delegates {
		byName[d.Name] = d
	}
	port := 7400
	for _, d := range demoDelegates(time.Millisecond) {
		assert.Equal(t, "127.0.0.1:"+strconv.Itoa(port), byName[d.name].Target, d.name)
		port++
	}
	for _, m := range fakeModels {
		want := fakeModelEntry(m, "127.0.0.1:"+strconv.Itoa(port))
		got, ok := byName[m.name]
		require.True(t, ok, "%s is not in stubborn.yaml", m.name)
		assert.Equal(t, want.Kind(), got.Kind(), m.name)
		assert.Equal(t, configLine(want), configLine(got), m.name)
		assert.True(t, got.ReadOnly, "%s: a model is read-only", m.name)
		port++
	}
	var smart *delegates.Preset
	for i, p := range cfg.Presets {
		if p.Name == "smart" {
			smart = &cfg.Presets[i]
		}
	}
	require.NotNil(t, smart, "stubborn.yaml has no preset smart")
	assert.True(t, proto.Equal(smartPreset().Spec, smart.Spec), "stubborn.yaml's smart: %v", smart.Spec)
}
