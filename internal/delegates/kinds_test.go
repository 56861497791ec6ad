package delegates_test

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/delegates"
)

// fakeHTTP is a local HTTP server for one test: it records each request
// and answers with reply.
type fakeHTTP struct {
	*httptest.Server
	mu    sync.Mutex
	reqs  []recorded
	reply func(w http.ResponseWriter, r *http.Request, n int)
}

type recorded struct {
	method string
	path   string
	header http.Header
	body   []byte
}

func newFakeHTTP(t *testing.T, reply func(w http.ResponseWriter, r *http.Request, n int)) *fakeHTTP {
	t.Helper()
	f := &fakeHTTP{reply: reply}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.reqs = append(f.reqs, recorded{r.Method, r.URL.Path, r.Header.Clone(), body})
		n := len(f.reqs)
		f.mu.Unlock()
		f.reply(w, r, n)
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeHTTP) last(t *testing.T) recorded {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	require.NotEmpty(t, f.reqs)
	return f.reqs[len(f.reqs)-1]
}

// poolFrom parses a config and builds a pool over it.
func poolFrom(t *testing.T, yaml string) *delegates.Pool {
	t.Helper()
	cfg, err := delegates.Parse([]byte(yaml))
	require.NoError(t, err)
	return newPool(t, cfg)
}

func reply(status int, header map[string]string, body string) func(http.ResponseWriter, *http.Request, int) {
	return func(w http.ResponseWriter, _ *http.Request, _ int) {
		for k, v := range header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

func TestHTTPDelegateSendsTheCallAndReadsTheAnswer(t *testing.T) {
	t.Setenv("STUBBORN_TEST_TOKEN", "s3cret")
	f := newFakeHTTP(t, reply(200, map[string]string{"Content-Type": "application/json"},
		`{"answer": {"text": "forty-two"}, "tokens": 3}`))
	p := poolFrom(t, fmt.Sprintf(`
delegates:
  - name: api
    http:
      url: %s/v1/ask
      headers: {Authorization: "Bearer ${STUBBORN_TEST_TOKEN}", X-Price: "$$5"}
      body: '{"q": {{.Brief}}, "run": {{.RunID}}, "n": {{.Attempt}}, "who": {{.Meta "user"}}, "none": {{.Meta "absent"}}, "all": {{.Metadata}}}'
      text_pointer: /answer/text
`, f.URL))
	brief := "say \"hi\"\nand </script> {{.RunID}}"
	res, err := p.Call(testCtx(t), controls.Call{
		Delegate: "api", Brief: brief, Attempt: 2, RunID: "run_9", IdempotencyKey: "key-9",
		Metadata: map[string]string{"user": "ann \"o\""},
	})
	require.NoError(t, err)
	assert.Equal(t, "forty-two", res.GetText())
	assert.InDelta(t, 3, res.GetData().GetStructValue().GetFields()["tokens"].GetNumberValue(), 0)

	req := f.last(t)
	assert.Equal(t, "POST", req.method)
	assert.Equal(t, "/v1/ask", req.path)
	assert.Equal(t, "Bearer s3cret", req.header.Get("Authorization"), "the variable is read at load")
	assert.Equal(t, "$5", req.header.Get("X-Price"), "$$ is a literal $")
	assert.Equal(t, "key-9", req.header.Get("Idempotency-Key"))
	assert.Equal(t, "run_9", req.header.Get("Stubborn-Run-Id"))
	assert.Equal(t, "2", req.header.Get("Stubborn-Attempt"))
	assert.Equal(t, "application/json", req.header.Get("Content-Type"))
	var sent map[string]any
	require.NoError(t, json.Unmarshal(req.body, &sent), "always JSON: %s", req.body)
	assert.Equal(t, map[string]any{
		"q": brief, "run": "run_9", "n": 2.0, "who": "ann \"o\"", "none": nil,
		"all": map[string]any{"user": "ann \"o\""},
	}, sent, "every field JSON-escaped; a brief is never parsed as a template")
}

func TestHTTPDelegateDefaultsAndWholeBody(t *testing.T) {
	f := newFakeHTTP(t, reply(200, map[string]string{"Content-Type": "text/plain"}, "plain answer"))
	p := poolFrom(t, fmt.Sprintf(`
delegates:
  - name: api
    http: {url: "%s", idempotency_header: "-"}
`, f.URL))
	res, err := p.Call(testCtx(t), controls.Call{Delegate: "api", Brief: "b", IdempotencyKey: "k"})
	require.NoError(t, err)
	assert.Equal(t, "plain answer", res.GetText())
	assert.Nil(t, res.GetData(), "not JSON: no data")
	req := f.last(t)
	assert.Empty(t, req.header.Get("Idempotency-Key"), `"-" sends no idempotency header`)
	var sent map[string]any
	require.NoError(t, json.Unmarshal(req.body, &sent))
	assert.Equal(t, map[string]any{"brief": "b", "run_id": "", "attempt": 0.0, "idempotency_key": "k", "metadata": map[string]any{}}, sent)
}

// Every failure an HTTP endpoint can give, for each kind.
func TestHTTPKindsMapFailures(t *testing.T) {
	kinds := map[string]func(url string) string{
		"http":      func(url string) string { return fmt.Sprintf("http: {url: %q, text_pointer: /text}", url) },
		"openai":    func(url string) string { return fmt.Sprintf("openai: {base_url: %q, model: m}", url) },
		"anthropic": func(url string) string { return fmt.Sprintf("anthropic: {base_url: %q, model: m}", url) },
	}
	date := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	cases := []struct {
		name      string
		reply     func(http.ResponseWriter, *http.Request, int)
		code      codes.Code
		httpCode  int
		transient bool
		hint      time.Duration // -1: none
		message   string
	}{
		{"400 permanent", reply(400, nil, `{"error": {"message": "bad prompt"}}`), codes.InvalidArgument, 400, false, -1, "HTTP 400 Bad Request: bad prompt"},
		{"429 Retry-After seconds", reply(429, map[string]string{"Retry-After": "7"}, "slow down"), codes.ResourceExhausted, 429, true, 7 * time.Second, "HTTP 429 Too Many Requests: slow down"},
		{"429 retry-after-ms", reply(429, map[string]string{"Retry-After-Ms": "250", "Retry-After": "9"}, ""), codes.ResourceExhausted, 429, true, 250 * time.Millisecond, "HTTP 429"},
		{"503 Retry-After date", reply(503, map[string]string{"Retry-After": date}, `{"message": "maintenance"}`), codes.Unavailable, 503, true, 90 * time.Second, "HTTP 503 Service Unavailable: maintenance"},
		{"500 transient", reply(500, nil, "<html>\n  oops\n</html>"), codes.Internal, 500, true, -1, "HTTP 500 Internal Server Error: <html> oops </html>"},
		{"redirect not followed", reply(307, map[string]string{"Location": "http://elsewhere.invalid/"}, ""), codes.Unknown, 307, false, -1, "HTTP 307 Temporary Redirect"},
		{"malformed 200", reply(200, nil, `{"choices": [`), codes.Internal, 0, false, -1, "the answer could not be read"},
	}
	for kind, entry := range kinds {
		for _, c := range cases {
			t.Run(kind+"/"+c.name, func(t *testing.T) {
				f := newFakeHTTP(t, c.reply)
				p := poolFrom(t, "delegates:\n  - name: d\n    "+entry(f.URL)+"\n")
				res, err := p.Call(testCtx(t), controls.Call{Delegate: "d", Brief: "b", Attempt: 1})
				assert.Nil(t, res)
				ce := callError(t, err)
				assert.Equal(t, c.code, ce.Code)
				assert.Equal(t, c.httpCode, ce.HTTPStatus)
				assert.Contains(t, ce.Message, c.message)
				transient, _ := controls.Transient(ce)
				assert.Equal(t, c.transient, transient)
				assert.False(t, ce.NotSent)
				if c.hint < 0 {
					assert.False(t, ce.HasHint)
				} else {
					assert.True(t, ce.HasHint)
					assert.InDelta(t, c.hint, ce.RetryHint, float64(2*time.Second))
				}
			})
		}
	}
}

func TestHTTPKindsTimeoutRefusedAndTooLarge(t *testing.T) {
	hung := make(chan struct{})
	slow := newFakeHTTP(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		select {
		case <-r.Context().Done():
		case <-hung:
		}
	})
	t.Cleanup(func() { close(hung) })
	big := newFakeHTTP(t, reply(200, nil, `{"text": "`+strings.Repeat("x", 2000)+`"}`))
	dead := "http://" + deadPort(t)
	p := poolFrom(t, fmt.Sprintf(`
limits: {max_result_bytes: 1000}
delegates:
  - {name: hung, timeout: 100ms, http: {url: "%s"}}
  - {name: refused, http: {url: "%s"}}
  - {name: refused-model, openai: {base_url: "%s", model: m}}
  - {name: big, http: {url: "%s", text_pointer: /text}}
`, slow.URL, dead, dead, big.URL))
	ctx := testCtx(t)

	_, err := p.Call(ctx, controls.Call{Delegate: "hung", Brief: "b"})
	ce := callError(t, err)
	assert.Equal(t, codes.DeadlineExceeded, ce.Code)
	assert.Equal(t, "attempt timed out after 100ms", ce.Message)

	for _, name := range []string{"refused", "refused-model"} {
		_, err = p.Call(ctx, controls.Call{Delegate: name, Brief: "b"})
		ce = callError(t, err)
		assert.Equal(t, codes.Unavailable, ce.Code, name)
		assert.True(t, ce.NotSent, "%s: a connection refused was never sent", name)
		assert.Contains(t, ce.Message, "connection refused")
	}

	_, err = p.Call(ctx, controls.Call{Delegate: "big", Brief: "b"})
	ce = callError(t, err)
	assert.Equal(t, codes.ResourceExhausted, ce.Code)
	assert.True(t, ce.Refused, "an answer over the limit is not retried")
	assert.Contains(t, ce.Message, "more than limits.max_result_bytes (1000)")
}

func TestOpenAIDelegate(t *testing.T) {
	t.Setenv("STUBBORN_TEST_OPENAI_KEY", "sk-test")
	t.Setenv("OPENAI_API_KEY", "must-not-be-sent")
	f := newFakeHTTP(t, reply(200, map[string]string{"Content-Type": "application/json"}, `{
		"id": "c1", "model": "m-2024", "object": "chat.completion",
		"choices": [{"index": 0, "message": {"role": "assistant", "content": "{\"is_failure\": false}"}, "finish_reason": "stop"}],
		"usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}}`))
	p := poolFrom(t, fmt.Sprintf(`
delegates:
  - name: gpt
    openai: {base_url: "%s/v1/", model: m, api_key_env: STUBBORN_TEST_OPENAI_KEY, system: "Be brief.", temperature: 0.2, max_tokens: 64}
  - name: local
    openai: {base_url: "%s/v1", model: llama}
`, f.URL, f.URL))
	res, err := p.Call(testCtx(t), controls.Call{Delegate: "gpt", Brief: "Is it?", RunID: "r1", Attempt: 1})
	require.NoError(t, err)
	assert.Equal(t, `{"is_failure": false}`, res.GetText())
	data := res.GetData().GetStructValue().GetFields()
	assert.Equal(t, "stop", data["finish_reason"].GetStringValue())
	assert.Equal(t, "m-2024", data["model"].GetStringValue())
	assert.InDelta(t, 16, data["usage"].GetStructValue().GetFields()["total_tokens"].GetNumberValue(), 0)

	req := f.last(t)
	assert.Equal(t, "/v1/chat/completions", req.path)
	assert.Equal(t, "Bearer sk-test", req.header.Get("Authorization"))
	var sent map[string]any
	require.NoError(t, json.Unmarshal(req.body, &sent))
	assert.Equal(t, map[string]any{
		"model": "m", "temperature": 0.2, "max_tokens": 64.0,
		"stream": true, "stream_options": map[string]any{"include_usage": true}, // a server that answers JSON anyway is read as before
		"messages": []any{
			map[string]any{"role": "system", "content": "Be brief."},
			map[string]any{"role": "user", "content": "Is it?"},
		},
	}, sent)

	_, err = p.Call(testCtx(t), controls.Call{Delegate: "local", Brief: "x"})
	require.NoError(t, err)
	assert.Empty(t, f.last(t).header.Get("Authorization"), "no api_key_env: no key, not even OPENAI_API_KEY")
}

func TestAnthropicDelegate(t *testing.T) {
	t.Setenv("STUBBORN_TEST_ANTHROPIC_KEY", "ak-test")
	f := newFakeHTTP(t, reply(200, map[string]string{"Content-Type": "application/json"}, `{
		"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
		"content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": ", world"}],
		"stop_reason": "end_turn", "usage": {"input_tokens": 4, "output_tokens": 3}}`))
	p := poolFrom(t, fmt.Sprintf(`
delegates:
  - name: claude
    anthropic: {base_url: "%s", model: claude-x, api_key_env: STUBBORN_TEST_ANTHROPIC_KEY}
`, f.URL))
	res, err := p.Call(testCtx(t), controls.Call{Delegate: "claude", Brief: "Hi"})
	require.NoError(t, err)
	assert.Equal(t, "Hello, world", res.GetText())
	assert.Equal(t, "end_turn", res.GetData().GetStructValue().GetFields()["stop_reason"].GetStringValue())
	req := f.last(t)
	assert.Equal(t, "/v1/messages", req.path)
	assert.Equal(t, "ak-test", req.header.Get("X-Api-Key"))
	assert.Equal(t, "2023-06-01", req.header.Get("Anthropic-Version"))
	var sent map[string]any
	require.NoError(t, json.Unmarshal(req.body, &sent))
	assert.Equal(t, 1024.0, sent["max_tokens"], "the API requires max_tokens")
}

func TestHTTPKindsHealth(t *testing.T) {
	healthy := newFakeHTTP(t, reply(200, nil, "ok"))
	sick := newFakeHTTP(t, reply(503, nil, "down"))
	p := poolFrom(t, fmt.Sprintf(`
delegates:
  - {name: up, http: {url: "%s", health_url: "%s/healthz"}}
  - {name: down, openai: {base_url: "%s", model: m, health_url: "%s/healthz"}}
  - {name: unknown, http: {url: "%s"}}
  - {name: unreachable, http: {url: "%s", health_url: "http://%s/healthz"}}
`, healthy.URL, healthy.URL, sick.URL, sick.URL, sick.URL, sick.URL, deadPort(t)))
	ctx := testCtx(t)
	assert.True(t, p.Serving(ctx, "up"))
	assert.False(t, p.Serving(ctx, "down"), "a non-2xx health answer is not serving")
	assert.True(t, p.Serving(ctx, "unknown"), "no health_url: serving")
	assert.True(t, p.Serving(ctx, "unreachable"), "no answer says nothing")
	assert.Equal(t, "/healthz", healthy.last(t).path)
}

func TestHTTPKindsConfigErrors(t *testing.T) {
	t.Setenv("STUBBORN_TEST_SECRET", "hunter2\r\nX-Evil: 1")
	for _, c := range []struct{ name, entry, want string }{
		{"no kind", `{name: a}`, `delegates[0] ("a"): target is empty, and no other kind is set: set one of target (gRPC), http, openai or anthropic`},
		{"two kinds", `{name: a, target: "127.0.0.1:1", http: {url: "http://x"}}`, `delegates[0] ("a"): sets target and http: a delegate has one kind`},
		{"missing url", `{name: a, http: {method: GET}}`, `delegates[0] ("a"): http.url: is empty`},
		{"bad scheme", `{name: a, http: {url: "ftp://x"}}`, `delegates[0] ("a"): http.url: "ftp://x": the scheme must be http or https`},
		{"credentials in url", `{name: a, http: {url: "http://u:p@x"}}`, `http.url: must not carry credentials`},
		{"unreadable template", `{name: a, http: {url: "http://x", body: "{{.Brief"}}`, `delegates[0] ("a"): http.body: template: body:1: unclosed action`},
		{"unknown field in template", `{name: a, http: {url: "http://x", body: "{{.Secret}}"}}`, `delegates[0] ("a"): http.body: template: body:1:2: executing "body" at <.Secret>: can't evaluate field Secret`},
		{"template not JSON", `{name: a, http: {url: "http://x", body: '{"q": "{{.Brief}}"}'}}`, `http.body: does not make JSON`},
		{"env var not set", `{name: a, http: {url: "http://x", headers: {Authorization: "Bearer ${STUBBORN_TEST_UNSET}"}}}`, `delegates[0] ("a"): http.headers.Authorization: environment variable STUBBORN_TEST_UNSET is not set`},
		{"secret with a line break", `{name: a, http: {url: "http://x", headers: {Authorization: "${STUBBORN_TEST_SECRET}"}}}`, `http.headers.Authorization: the value (after expanding variables) has control characters`},
		{"bad header name", `{name: a, http: {url: "http://x", headers: {"Bad Name": v}}}`, `http.headers: "Bad Name" is not a header name`},
		{"bad pointer", `{name: a, http: {url: "http://x", text_pointer: "choices.0"}}`, `http.text_pointer: "choices.0" is not a JSON pointer`},
		{"model missing", `{name: a, openai: {base_url: "http://x"}}`, `delegates[0] ("a"): openai.model: is empty`},
		{"key env not set", `{name: a, anthropic: {base_url: "http://x", model: m, api_key_env: STUBBORN_TEST_UNSET}}`, `delegates[0] ("a"): anthropic.api_key_env: environment variable STUBBORN_TEST_UNSET is not set`},
		{"unknown kind field", `{name: a, grpc: {target: x}}`, `delegates[0] ("a").grpc: unknown field`},
		{"misspelled key on a one-line entry", `{name: a, target: "127.0.0.1:1", idempotnt: true}`, `delegates[0] ("a").idempotnt: unknown field`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := delegates.Parse([]byte("delegates:\n  - " + c.entry + "\n"))
			require.Error(t, err)
			assert.ErrorIs(t, err, delegates.ErrInvalidConfig)
			assert.Contains(t, err.Error(), c.want)
			assert.NotContains(t, err.Error(), "hunter2", "a header's value is never quoted")
		})
	}
}

// TestAnAnthropicDelegateTakesTheParametersItsAPIHas: of a conversation's
// model parameters (Chat Completions' names), an anthropic delegate sends
// those the Messages API has, in its names; one it has not (seed,
// response_format) is refused before any call, naming the field and the
// delegate, never dropped.
func TestAnAnthropicDelegateTakesTheParametersItsAPIHas(t *testing.T) {
	f := newFakeHTTP(t, reply(200, map[string]string{"Content-Type": "application/json"}, `{
		"type": "message", "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn"}`))
	p := poolFrom(t, fmt.Sprintf(`
delegates:
  - name: claude
    anthropic: {base_url: "%s", model: claude-x, system: "Be kind.", temperature: 0.5}
`, f.URL))
	user, err := structpb.NewStruct(map[string]any{"role": "user", "content": "Hi"})
	require.NoError(t, err)
	system, err := structpb.NewStruct(map[string]any{"role": "system", "content": "Be brief."})
	require.NoError(t, err)
	params, err := structpb.NewStruct(map[string]any{
		"max_completion_tokens": 77, "temperature": 0.1, "top_p": 0.9, "stop": []any{"END", "STOP"}, "user": "u-1", "tools": []any{},
	})
	require.NoError(t, err)
	_, err = p.Call(testCtx(t), controls.Call{Delegate: "claude", Brief: "Hi", TaskBrief: "Hi", Task: true,
		Messages: []*structpb.Struct{system, user}, ModelParams: params})
	require.NoError(t, err)
	var sent map[string]any
	require.NoError(t, json.Unmarshal(f.last(t).body, &sent))
	assert.Equal(t, map[string]any{
		"model": "claude-x", "max_tokens": 77.0, "temperature": 0.1, "top_p": 0.9,
		"system": "Be kind.\n\nBe brief.", "stop_sequences": []any{"END", "STOP"}, "metadata": map[string]any{"user_id": "u-1"},
		"messages": []any{map[string]any{"role": "user", "content": "Hi"}}, "stream": true, // stream: auto
	}, sent)

	// What the Messages API has not, once silently left out, is refused.
	params, err = structpb.NewStruct(map[string]any{"seed": 4, "response_format": map[string]any{"type": "json_object"}})
	require.NoError(t, err)
	_, err = p.Call(testCtx(t), controls.Call{Delegate: "claude", Brief: "Hi", TaskBrief: "Hi", Task: true,
		Messages: []*structpb.Struct{user}, ModelParams: params})
	ce := callError(t, err)
	assert.Equal(t, codes.InvalidArgument, ce.Code)
	assert.True(t, ce.NotSent)
	assert.Contains(t, ce.Message, "delegate claude")
	assert.Contains(t, ce.Message, "seed")
	assert.Contains(t, ce.Message, "response_format")
	f.mu.Lock()
	assert.Len(t, f.reqs, 1, "the refused call is not sent")
	f.mu.Unlock()
}

// TestModelKindsAreReadOnlyUnlessTheEntrySays: an openai or anthropic
// entry that does not set read_only is read-only (retry retries its 429);
// read_only: false keeps it not; the other kinds keep the old default.
func TestModelKindsAreReadOnlyUnlessTheEntrySays(t *testing.T) {
	cfg, err := delegates.Parse([]byte(`
delegates:
  - {name: gpt, openai: {base_url: "http://127.0.0.1:1/v1", model: m}}
  - {name: claude, anthropic: {base_url: "http://127.0.0.1:1", model: m}}
  - {name: gpt-tools, openai: {base_url: "http://127.0.0.1:1/v1", model: m}, read_only: false}
  - {name: gpt-idem, openai: {base_url: "http://127.0.0.1:1/v1", model: m}, idempotent: true}
  - {name: api, http: {url: "http://127.0.0.1:1"}}
  - {name: svc, target: "127.0.0.1:1"}
`))
	require.NoError(t, err)
	got := map[string]bool{}
	for _, d := range cfg.Delegates {
		got[d.Name] = d.ReadOnly
		assert.Equal(t, d.ReadOnly, d.Info().ReadOnly, d.Name)
	}
	assert.Equal(t, map[string]bool{"gpt": true, "claude": true, "gpt-tools": false, "gpt-idem": true, "api": false, "svc": false}, got)
}

// TestAnAnthropicDelegatesMaxTokensIsBounded: a max_tokens past int32 (a
// JSON number may be 1e300) is sent as the largest int32, not a wrapped
// negative number.
func TestAnAnthropicDelegatesMaxTokensIsBounded(t *testing.T) {
	f := newFakeHTTP(t, reply(200, map[string]string{"Content-Type": "application/json"}, `{"type": "message", "content": [{"type": "text", "text": "ok"}]}`))
	p := poolFrom(t, fmt.Sprintf("delegates: [{name: claude, anthropic: {base_url: %q, model: m}, stream: \"off\"}]", f.URL))
	user, err := structpb.NewStruct(map[string]any{"role": "user", "content": "Hi"})
	require.NoError(t, err)
	params, err := structpb.NewStruct(map[string]any{"max_tokens": 1e300})
	require.NoError(t, err)
	_, err = p.Call(testCtx(t), controls.Call{Delegate: "claude", Brief: "Hi", TaskBrief: "Hi", Task: true, Messages: []*structpb.Struct{user}, ModelParams: params})
	require.NoError(t, err)
	var sent map[string]any
	require.NoError(t, json.Unmarshal(f.last(t).body, &sent))
	assert.InDelta(t, float64(math.MaxInt32), sent["max_tokens"], 0)
}
