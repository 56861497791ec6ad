package delegates_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/delegates"
)

// streamer is a gRPC delegate that streams pieces, then hangs (until the
// call ends) or answers.
type streamer struct {
	stubbornv1.UnimplementedDelegateServiceServer
	pieces  []string
	hang    bool   // after the pieces, until the call ends
	text    string // the result's text (empty: the deltas)
	fail    error  // after the pieces, instead of a result
	streams atomic.Int32
	unary   atomic.Int32
}

func (s *streamer) ExecuteStream(_ *stubbornv1.ExecuteStreamRequest, st grpc.ServerStreamingServer[stubbornv1.ExecuteStreamResponse]) error {
	s.streams.Add(1)
	for _, p := range s.pieces {
		if err := st.Send(&stubbornv1.ExecuteStreamResponse{Kind: &stubbornv1.ExecuteStreamResponse_TextDelta{TextDelta: p}}); err != nil {
			return err
		}
	}
	if s.hang {
		<-st.Context().Done()
		return st.Context().Err()
	}
	if s.fail != nil {
		return s.fail
	}
	return st.Send(&stubbornv1.ExecuteStreamResponse{Kind: &stubbornv1.ExecuteStreamResponse_Result{Result: &stubbornv1.Result{Text: s.text}}})
}

// unaryOnly serves Execute only.
type unaryOnly struct {
	stubbornv1.UnimplementedDelegateServiceServer
	calls atomic.Int32
}

func (u *unaryOnly) Execute(context.Context, *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
	u.calls.Add(1)
	return &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{Text: "whole"}}, nil
}

// serveRaw runs svc, as it is, on a loopback port until the test ends.
func serveRaw(t *testing.T, svc stubbornv1.DelegateServiceServer) string {
	t.Helper()
	lis := listen(t)
	s := grpc.NewServer()
	stubbornv1.RegisterDelegateServiceServer(s, svc)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

// pieces collects what a call streams to its Output.
type pieces struct {
	mu  sync.Mutex
	got []string
}

func (p *pieces) out(text string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.got = append(p.got, text)
}

func (p *pieces) all() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.got...)
}

func TestAGRPCDelegateStreamsItsOutput(t *testing.T) {
	s := &streamer{pieces: []string{"Once ", "upon ", "a time"}}
	p := poolFrom(t, fmt.Sprintf("delegates:\n  - name: model\n    target: %s\n", serveRaw(t, s)))
	var got pieces
	res, err := p.Call(testCtx(t), controls.Call{Delegate: "model", Brief: "b", Output: got.out})
	require.NoError(t, err)
	assert.Equal(t, []string{"Once ", "upon ", "a time"}, got.all())
	assert.Equal(t, "Once upon a time", res.GetText(), "a result without text: the deltas joined")

	s.text = "the answer"
	res, err = p.Call(testCtx(t), controls.Call{Delegate: "model", Brief: "b"})
	require.NoError(t, err)
	assert.Equal(t, "the answer", res.GetText(), "a result's own text wins; no Output is fine")
}

func TestAGRPCDelegateThatDoesNotStreamIsFoundOnce(t *testing.T) {
	u := &unaryOnly{}
	p := poolFrom(t, fmt.Sprintf("delegates:\n  - name: old\n    target: %s\n  - name: strict\n    target: %s\n    stream: on\n", serveRaw(t, u), serveRaw(t, u)))
	for range 3 {
		res, err := p.Call(testCtx(t), controls.Call{Delegate: "old", Brief: "b"})
		require.NoError(t, err)
		assert.Equal(t, "whole", res.GetText())
	}
	assert.EqualValues(t, 3, u.calls.Load())

	_, err := p.Call(testCtx(t), controls.Call{Delegate: "strict", Brief: "b"})
	assert.Equal(t, codes.Unimplemented, callError(t, err).Code, "stream: on calls ExecuteStream only")
	assert.EqualValues(t, 3, u.calls.Load())
}

func TestAStreamOffDelegateIsCalledWithExecute(t *testing.T) {
	s := &streamer{pieces: []string{"x"}}
	p := poolFrom(t, fmt.Sprintf("delegates:\n  - name: model\n    target: %s\n    stream: off\n", serveRaw(t, s)))
	_, err := p.Call(testCtx(t), controls.Call{Delegate: "model", Brief: "b"})
	assert.Equal(t, codes.Unimplemented, callError(t, err).Code, "this fake serves ExecuteStream only")
	assert.Zero(t, s.streams.Load())
}

func TestAStalledStreamFailsTransientNamingItsTimeout(t *testing.T) {
	s := &streamer{pieces: []string{"Once ", "upon ", "a time"}, hang: true}
	addr := serveRaw(t, s)
	p := poolFrom(t, fmt.Sprintf("delegates:\n  - name: model\n    target: %s\n    idle_timeout: 50ms\n  - name: quiet\n    target: %s\n    first_output_timeout: 50ms\n", addr, addr))
	var got pieces
	_, err := p.Call(testCtx(t), controls.Call{Delegate: "model", Brief: "b", Output: got.out})
	ce := callError(t, err)
	assert.Equal(t, codes.DeadlineExceeded, ce.Code)
	assert.Equal(t, `stalled: no output for 50ms after 3 chunks (idle_timeout); the output began "Once upon a time"`, ce.Message)
	assert.False(t, ce.NotSent)
	transient, _ := controls.Transient(ce)
	assert.True(t, transient, "a stall is transient")
	assert.Len(t, got.all(), 3)

	s.pieces = nil
	_, err = p.Call(testCtx(t), controls.Call{Delegate: "quiet", Brief: "b"})
	assert.Equal(t, "stalled: no output within 50ms (first_output_timeout)", callError(t, err).Message)

	// A run's own setting replaces the delegate's.
	_, err = p.Call(testCtx(t), controls.Call{Delegate: "model", Brief: "b", FirstOutputTimeout: 20 * 1e6})
	assert.Equal(t, "stalled: no output within 20ms (first_output_timeout)", callError(t, err).Message)
}

func TestAStreamedAnswerOverMaxResultBytesFails(t *testing.T) {
	s := &streamer{pieces: []string{strings.Repeat("a", 600), strings.Repeat("b", 600)}}
	p := poolFrom(t, fmt.Sprintf("limits: {max_result_bytes: 1000}\ndelegates:\n  - name: model\n    target: %s\n", serveRaw(t, s)))
	var got pieces
	_, err := p.Call(testCtx(t), controls.Call{Delegate: "model", Brief: "b", Output: got.out})
	ce := callError(t, err)
	assert.Equal(t, codes.ResourceExhausted, ce.Code)
	assert.Contains(t, ce.Message, "the streamed answer is over 1000 bytes")
	assert.Len(t, got.all(), 1, "the piece past the bound is not handed on")
}

func TestAStreamThatFailsMidwayKeepsItsStatus(t *testing.T) {
	s := &streamer{pieces: []string{"half"}, fail: status.Error(codes.Unavailable, "overloaded")}
	p := poolFrom(t, fmt.Sprintf("delegates:\n  - name: model\n    target: %s\n", serveRaw(t, s)))
	_, err := p.Call(testCtx(t), controls.Call{Delegate: "model", Brief: "b"})
	ce := callError(t, err)
	assert.Equal(t, codes.Unavailable, ce.Code)
	assert.Equal(t, "overloaded", ce.Message)
	assert.EqualValues(t, 1, s.streams.Load(), "a failure after output is no sign the method is missing")
}

// sse writes events as Server-Sent Events, flushing each.
func sse(events ...string) func(http.ResponseWriter, *http.Request, int) {
	return func(w http.ResponseWriter, r *http.Request, _ int) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range events {
			if e == "hang" {
				<-r.Context().Done()
				return
			}
			_, _ = io.WriteString(w, e+"\n\n")
			w.(http.Flusher).Flush()
		}
	}
}

func TestAnOpenAIModelStreams(t *testing.T) {
	f := newFakeHTTP(t, sse(
		`data: {"model":"m-1","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
		`data: {"model":"m-1","choices":[{"index":0,"delta":{"content":"Hel"}}]}`,
		": a comment",
		`data: {"model":"m-1","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}`,
		`data: {"model":"m-1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`,
		`data: [DONE]`,
	))
	p := poolFrom(t, fmt.Sprintf("delegates:\n  - name: gpt\n    openai: {base_url: %q, model: m}\n", f.URL))
	var got pieces
	res, err := p.Call(testCtx(t), controls.Call{Delegate: "gpt", Brief: "hi", Output: got.out})
	require.NoError(t, err)
	assert.Equal(t, []string{"Hel", "lo"}, got.all())
	assert.Equal(t, "Hello", res.GetText())
	data := res.GetData().GetStructValue().GetFields()
	assert.Equal(t, "stop", data["finish_reason"].GetStringValue())
	assert.Equal(t, "m-1", data["model"].GetStringValue())
	assert.InDelta(t, 5, data["usage"].GetStructValue().GetFields()["total_tokens"].GetNumberValue(), 0, "usage from the last chunk")
	assert.Equal(t, "text/event-stream", f.last(t).header.Get("Accept"))
}

func TestAnOpenAIStreamThatStallsOrFails(t *testing.T) {
	stall := newFakeHTTP(t, sse(`data: {"choices":[{"delta":{"content":"Hel"}}]}`, "hang"))
	broken := newFakeHTTP(t, sse(`data: {"choices":[{"delta":{"content":"Hel"}}]}`, `data: {"error":{"message":"server overloaded"}}`))
	p := poolFrom(t, fmt.Sprintf("delegates:\n  - name: stall\n    openai: {base_url: %q, model: m}\n    idle_timeout: 50ms\n  - name: broken\n    openai: {base_url: %q, model: m}\n", stall.URL, broken.URL))
	_, err := p.Call(testCtx(t), controls.Call{Delegate: "stall", Brief: "hi"})
	assert.Equal(t, `stalled: no output for 50ms after 1 chunks (idle_timeout); the output began "Hel"`, callError(t, err).Message)
	_, err = p.Call(testCtx(t), controls.Call{Delegate: "broken", Brief: "hi"})
	ce := callError(t, err)
	assert.Equal(t, codes.Unavailable, ce.Code)
	assert.Equal(t, "the model's stream failed: server overloaded", ce.Message)
}

func TestAnAnthropicModelStreams(t *testing.T) {
	f := newFakeHTTP(t, sse(
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-x\",\"usage\":{\"input_tokens\":4}}}",
		"event: ping\ndata: {\"type\":\"ping\"}",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\", world\"}}",
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":3}}",
		"event: message_stop\ndata: {\"type\":\"message_stop\"}",
	))
	overloaded := newFakeHTTP(t, sse("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}"))
	p := poolFrom(t, fmt.Sprintf("delegates:\n  - name: claude\n    anthropic: {base_url: %q, model: claude-x}\n  - name: busy\n    anthropic: {base_url: %q, model: claude-x}\n", f.URL, overloaded.URL))
	var got pieces
	res, err := p.Call(testCtx(t), controls.Call{Delegate: "claude", Brief: "hi", Output: got.out})
	require.NoError(t, err)
	assert.Equal(t, []string{"Hello", ", world"}, got.all())
	assert.Equal(t, "Hello, world", res.GetText())
	data := res.GetData().GetStructValue().GetFields()
	assert.Equal(t, "end_turn", data["stop_reason"].GetStringValue())
	usage := data["usage"].GetStructValue().GetFields()
	assert.InDelta(t, 4, usage["input_tokens"].GetNumberValue(), 0)
	assert.InDelta(t, 3, usage["output_tokens"].GetNumberValue(), 0)
	assert.Contains(t, string(f.last(t).body), `"stream":true`)

	_, err = p.Call(testCtx(t), controls.Call{Delegate: "busy", Brief: "hi"})
	ce := callError(t, err)
	assert.Equal(t, codes.Unavailable, ce.Code)
	assert.Equal(t, "the model's stream failed: overloaded_error: Overloaded", ce.Message)
}

func TestAnHTTPDelegateStreamsNDJSONAndSSE(t *testing.T) {
	nd := newFakeHTTP(t, func(w http.ResponseWriter, _ *http.Request, _ int) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = io.WriteString(w, "{\"response\":\"Hel\",\"done\":false}\n\n{\"response\":\"lo\",\"done\":false}\n{\"done\":true,\"eval_count\":2}\n")
	})
	plain := newFakeHTTP(t, sse("data: Hel", "data: lo", "data: [DONE]"))
	p := poolFrom(t, fmt.Sprintf(`delegates:
  - name: ollama
    http: {url: %q, stream_format: ndjson, delta_pointer: /response}
  - name: plain
    http: {url: %q, stream_format: sse}
`, nd.URL, plain.URL))
	var got pieces
	res, err := p.Call(testCtx(t), controls.Call{Delegate: "ollama", Brief: "hi", Output: got.out})
	require.NoError(t, err)
	assert.Equal(t, []string{"Hel", "lo"}, got.all())
	assert.Equal(t, "Hello", res.GetText())
	assert.InDelta(t, 2, res.GetData().GetStructValue().GetFields()["eval_count"].GetNumberValue(), 0, "the last event is the data")

	res, err = p.Call(testCtx(t), controls.Call{Delegate: "plain", Brief: "hi"})
	require.NoError(t, err)
	assert.Equal(t, "Hello", res.GetText())
}

func TestStreamSettingsAreChecked(t *testing.T) {
	for yaml, want := range map[string]string{
		"stream: sometimes":                                                 `stream: "sometimes" is not one of auto, on, off`,
		"idle_timeout: -1s":                                                 "idle_timeout: must be between 0 and 24h0m0s (got -1s)",
		"first_output_timeout: 25h":                                         "first_output_timeout: must be between 0 and 24h0m0s (got 25h0m0s)",
		"http: {url: 'http://x', stream_format: xml}":                       `http.stream_format: "xml" is not sse or ndjson`,
		"http: {url: 'http://x', stream_format: ndjson}":                    "http.delta_pointer: required with stream_format ndjson",
		"http: {url: 'http://x', stream_format: sse, delta_pointer: 'a/b'}": `http.delta_pointer: "a/b" is not a JSON pointer`,
		"http: {url: 'http://x'}\n    stream: on":                           "stream: on needs http.stream_format",
	} {
		cfg := "delegates:\n  - name: d\n    " + yaml + "\n"
		if !strings.Contains(yaml, "http:") {
			cfg += "    target: 127.0.0.1:1\n"
		}
		_, err := delegates.Parse([]byte(cfg))
		require.Error(t, err, yaml)
		assert.Contains(t, err.Error(), want, yaml)
	}
}

func TestListDelegatesShowsStreamSettings(t *testing.T) {
	p := poolFrom(t, `delegates:
  - name: model
    target: 127.0.0.1:1
    first_output_timeout: 5s
    idle_timeout: 2s
  - name: api
    http: {url: 'http://127.0.0.1:1'}
`)
	ds, _ := p.Describe()
	require.Len(t, ds, 2)
	assert.Equal(t, "auto", ds[0].GetStream())
	assert.Equal(t, "5s", ds[0].GetFirstOutputTimeout().AsDuration().String())
	assert.Equal(t, "2s", ds[0].GetIdleTimeout().AsDuration().String())
	assert.Equal(t, "off", ds[1].GetStream(), "an http kind without stream_format cannot stream")
	assert.Nil(t, ds[1].GetIdleTimeout())
}

// slowUnary serves Execute only, answering after a while.
type slowUnary struct {
	stubbornv1.UnimplementedDelegateServiceServer
}

func (slowUnary) Execute(ctx context.Context, _ *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
	select {
	case <-time.After(150 * time.Millisecond):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{Text: "late but whole"}}, nil
}

func TestAUnaryDelegateFoundOutIsNotTimedAsAStream(t *testing.T) {
	p := poolFrom(t, fmt.Sprintf("delegates:\n  - name: old\n    target: %s\n    first_output_timeout: 50ms\n", serveRaw(t, slowUnary{})))
	res, err := p.Call(testCtx(t), controls.Call{Delegate: "old", Brief: "b"})
	require.NoError(t, err, "the Execute that follows an UNIMPLEMENTED ExecuteStream is bounded by the attempt timeout alone")
	assert.Equal(t, "late but whole", res.GetText())
}

// upstream501 fails ExecuteStream with a delegate's own UNIMPLEMENTED (an
// upstream 501), after doing its work; its Execute counts calls.
type upstream501 struct {
	stubbornv1.UnimplementedDelegateServiceServer
	streams, unary atomic.Int32
}

func (u *upstream501) ExecuteStream(*stubbornv1.ExecuteStreamRequest, grpc.ServerStreamingServer[stubbornv1.ExecuteStreamResponse]) error {
	u.streams.Add(1)
	return status.Error(codes.Unimplemented, "upstream answered 501 Not Implemented")
}

func (u *upstream501) Execute(context.Context, *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
	u.unary.Add(1)
	return &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{Text: "done twice"}}, nil
}

func TestADelegatesOwnUnimplementedIsAFailureNotAFallback(t *testing.T) {
	u := &upstream501{}
	p := poolFrom(t, fmt.Sprintf("delegates:\n  - name: d\n    target: %s\n", serveRaw(t, u)))
	for range 2 {
		_, err := p.Call(testCtx(t), controls.Call{Delegate: "d", Brief: "b"})
		ce := callError(t, err)
		assert.Equal(t, codes.Unimplemented, ce.Code)
		assert.Equal(t, "upstream answered 501 Not Implemented", ce.Message)
	}
	assert.EqualValues(t, 2, u.streams.Load(), "still streamed: the delegate serves ExecuteStream")
	assert.Zero(t, u.unary.Load(), "never called again with Execute: the work would be done twice")
}

func TestAModelStreamCutShortFails(t *testing.T) {
	openai := newFakeHTTP(t, sse(`data: {"choices":[{"delta":{"content":"Half an ans"}}]}`))
	anthropic := newFakeHTTP(t, sse(
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"c\"}}",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"Half an ans\"}}",
	))
	empty := newFakeHTTP(t, sse())
	p := poolFrom(t, fmt.Sprintf(`delegates:
  - name: gpt
    openai: {base_url: %q, model: m}
  - name: claude
    anthropic: {base_url: %q, model: c}
  - name: silent
    openai: {base_url: %q, model: m}
`, openai.URL, anthropic.URL, empty.URL))
	for name, want := range map[string]string{
		"gpt":    "the model's stream ended before its finish_reason or [DONE]: the answer is cut short",
		"claude": "the model's stream ended before its stop_reason or message_stop: the answer is cut short",
		"silent": "the model's stream ended before its finish_reason or [DONE]: the answer is cut short",
	} {
		_, err := p.Call(testCtx(t), controls.Call{Delegate: name, Brief: "hi"})
		ce := callError(t, err)
		assert.Equal(t, codes.Unavailable, ce.Code, name)
		assert.Equal(t, want, ce.Message, name)
	}
}

// raw answers a stream of exactly body, of content type ct, and closes.
func raw(ct, body string) func(http.ResponseWriter, *http.Request, int) {
	return func(w http.ResponseWriter, _ *http.Request, _ int) {
		w.Header().Set("Content-Type", ct)
		_, _ = io.WriteString(w, body)
	}
}

// A stream that ends mid-line, or with an event that has no blank line
// after it, is cut short whatever the kind: the unfinished event is
// dropped (as the WHATWG SSE grammar drops it), never parsed, and the
// attempt fails transient so that retry may try again.
func TestAModelStreamCutMidLineIsRetried(t *testing.T) {
	const (
		oaStart = "data: {\"choices\":[{\"delta\":{\"content\":\"Half\"}}]}\n\n"
		oaStop  = "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"
		anStart = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"c\"}}\n\n"
	)
	cuts := map[string]*fakeHTTP{
		"openai mid-line":           newFakeHTTP(t, raw("text/event-stream", oaStart+`data: {"choices":[{"del`)),
		"openai mid-usage":          newFakeHTTP(t, raw("text/event-stream", oaStart+oaStop+`data: {"choices":[],"usage":{"total_to`)),
		"openai no blank line":      newFakeHTTP(t, raw("text/event-stream", oaStart+"data: {\"choices\":[{\"delta\":{\"content\":\" an\"}}]}\n")),
		"anthropic mid-line":        newFakeHTTP(t, raw("text/event-stream", anStart+"event: content_block_delta\ndata: {\"type\":\"content_bl")),
		"anthropic event, no data":  newFakeHTTP(t, raw("text/event-stream", anStart+"event: message_stop\n")),
		"http sse mid-event":        newFakeHTTP(t, raw("text/event-stream", "data: Hel\n\ndata: lo")),
		"http ndjson mid-line":      newFakeHTTP(t, raw("application/x-ndjson", "{\"response\":\"Hel\"}\n{\"respo")),
		"http ndjson cut in number": newFakeHTTP(t, raw("application/x-ndjson", "{\"response\":\"Hel\"}\n{\"response\":\"lo\",\"n\":12")),
	}
	kind := func(name, url string) string {
		switch {
		case strings.HasPrefix(name, "openai"):
			return fmt.Sprintf("openai: {base_url: %q, model: m}", url)
		case strings.HasPrefix(name, "anthropic"):
			return fmt.Sprintf("anthropic: {base_url: %q, model: c}", url)
		case strings.HasPrefix(name, "http sse"):
			return fmt.Sprintf("http: {url: %q, stream_format: sse}", url)
		}
		return fmt.Sprintf("http: {url: %q, stream_format: ndjson, delta_pointer: /response}", url)
	}
	var cfg strings.Builder
	cfg.WriteString("delegates:\n")
	names := map[string]string{}
	i := 0
	for name, f := range cuts {
		i++
		names[name] = fmt.Sprintf("d%d", i)
		fmt.Fprintf(&cfg, "  - name: d%d\n    %s\n", i, kind(name, f.URL))
	}
	p := poolFrom(t, cfg.String())
	for name := range cuts {
		res, err := p.Call(testCtx(t), controls.Call{Delegate: names[name], Brief: "hi"})
		require.Error(t, err, "%s: %v", name, res)
		ce := callError(t, err)
		assert.Equal(t, codes.Unavailable, ce.Code, name)
		assert.Contains(t, ce.Message, "cut short", name)
		transient, why := controls.Transient(ce)
		assert.True(t, transient, "%s: %s", name, why)
	}
}

// NDJSON (JSON Lines) may leave out the last newline: a last line that is
// a whole JSON value is taken.
func TestAnNDJSONStreamMayEndWithoutANewline(t *testing.T) {
	f := newFakeHTTP(t, raw("application/x-ndjson", "{\"response\":\"Hel\"}\n{\"response\":\"lo\",\"done\":true}"))
	p := poolFrom(t, fmt.Sprintf("delegates:\n  - name: nd\n    http: {url: %q, stream_format: ndjson, delta_pointer: /response}\n", f.URL))
	res, err := p.Call(testCtx(t), controls.Call{Delegate: "nd", Brief: "hi"})
	require.NoError(t, err)
	assert.Equal(t, "Hello", res.GetText())
}
