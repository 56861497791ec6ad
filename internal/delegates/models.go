package delegates

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/conversation"
)

// The model kinds speak two stable JSON APIs directly, over the same
// httpClient as the http kind, rather than through a vendor SDK: the wire
// types are the conversation codecs the front doors use too (one
// translation, one set of bounds), every failure maps the same way as an
// http delegate's (status, Retry-After, not sent, the size
// bound), and nothing but the config decides where a key is sent. (The
// official OpenAI Go SDK reads OPENAI_API_KEY, OPENAI_BASE_URL and
// OPENAI_CUSTOM_HEADERS from the environment whatever the caller sets,
// with no public switch to turn that off, so a key meant for one endpoint
// would reach a local one configured without a key.)

// The request and the answer are the conversation codecs' (package
// conversation): the same types and the same translation as the front
// doors', so what a door took is what the model is sent, and the model's
// whole answer (every choice, its text and tool calls) is what comes back.

// modelEntry is what an entry adds to every request of a model kind.
func modelEntry(model, system string, temperature *float64, maxTokens int) conversation.Entry {
	return conversation.Entry{Model: model, System: system, Temperature: temperature, MaxTokens: int64(maxTokens)}
}

// encodeRequest is the body of call c in codec's API: the conversation
// (conversationOf) over the entry's defaults. A field the API cannot carry
// is c's INVALID_ARGUMENT, not sent.
func encodeRequest(codec conversation.Codec, c controls.Call, e conversation.Entry, stream bool) ([]byte, error) {
	conv, err := conversationOf(c, c.Delegate)
	if err != nil {
		return nil, err
	}
	body, err := codec.EncodeRequest(conv, e, stream)
	if err != nil {
		var problems conversation.Problems
		if errors.As(err, &problems) {
			return nil, refusedConversation(c.Delegate, err)
		}
		return nil, &controls.CallError{Code: codes.Internal, Refused: true, NotSent: true, Message: err.Error()}
	}
	return body, nil
}

type openAITransport struct {
	*httpClient
	cfg    *OpenAI
	url    string
	stream bool
}

func newOpenAITransport(cfg *OpenAI, mode string, h *httpClient) *openAITransport {
	return &openAITransport{
		httpClient: h,
		cfg:        cfg,
		url:        strings.TrimSuffix(cfg.BaseURL, "/") + "/chat/completions",
		stream:     mode != streamOff,
	}
}

func (t *openAITransport) mayStream() bool { return t.stream }

func (t *openAITransport) call(ctx context.Context, c controls.Call, s *stream) (*stubbornv1.Result, error) {
	body, err := encodeRequest(conversation.Chat{}, c, modelEntry(t.cfg.Model, t.cfg.System, t.cfg.Temperature, t.cfg.MaxTokens), t.stream)
	if err != nil {
		return nil, err
	}
	req, err := jsonRequest(ctx, t.url, body, c)
	if err != nil {
		return nil, err
	}
	if t.cfg.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+t.cfg.apiKey)
	}
	if !t.stream {
		a, err := t.do(req)
		if err != nil {
			return nil, err
		}
		return t.answer(a)
	}
	var (
		dec   = conversation.Chat{}.NewStreamDecoder()
		usage map[string]any
		done  bool
	)
	a, err := t.doStream(req, s, formatSSE, func(ev event) error {
		ds, end, err := dec.Next(conversation.Event{Name: ev.name, Data: decodable(ev.data)})
		var se *conversation.StreamError
		switch {
		case errors.As(err, &se):
			return &controls.CallError{Code: codes.Unavailable, Message: "the model's stream failed: " + controls.Cut(se.Message, maxErrorExcerpt)}
		case err != nil:
			return unreadable("not a Chat Completions chunk: %v", err)
		case end:
			done = true
			return errStreamDone
		}
		if bytes.Contains(ev.data, []byte(`"usage"`)) {
			// The usage as the API said it, for Result.data (the last
			// chunk has it).
			var u struct {
				Usage map[string]any `json:"usage"`
			}
			if json.Unmarshal(ev.data, &u) == nil && u.Usage != nil {
				usage = u.Usage
			}
		}
		return route(s, ds)
	})
	switch {
	case err != nil:
		return nil, err
	case a != nil:
		return t.answer(a) // the server did not stream
	}
	r := dec.Result()
	first := choice0(r)
	finish := first.GetNativeFinishReason()
	switch {
	case !done && finish == "":
		return nil, cutShort("its finish_reason or [DONE]")
	case refused(first):
		return nil, refusal(first.GetMessage().GetRefusal())
	}
	return modelResult(r, map[string]any{"model": r.GetModel(), "finish_reason": finish, "usage": usage})
}

// route passes a streamed answer's deltas on in order: the first choice's
// text as the call's output (Output), the rest as its deltas (Deltas).
func route(s *stream, ds []*stubbornv1.OutputDelta) error {
	start := 0
	for i, d := range ds {
		if d.GetChoice() != 0 || d.GetToolCall() != nil {
			continue
		}
		if err := s.delta(ds[start:i]); err != nil {
			return err
		}
		if err := s.piece(d.GetText()); err != nil {
			return err
		}
		start = i + 1
	}
	return s.delta(ds[start:])
}

// choice0 is r's first choice (index 0), or nil.
func choice0(r *stubbornv1.Result) *stubbornv1.Choice {
	for _, c := range r.GetChoices() {
		if c.GetIndex() == 0 {
			return c
		}
	}
	return nil
}

// refused reports whether the first choice is a refusal and nothing else:
// no text, no tool call.
func refused(c *stubbornv1.Choice) bool {
	m := c.GetMessage()
	return m.GetRefusal() != "" && conversation.Text(m) == "" && len(m.GetToolCalls()) == 0
}

// refusal is the error of a model that refused to answer: no other try of
// the same request does better.
func refusal(said string) *controls.CallError {
	return &controls.CallError{Code: codes.FailedPrecondition, Message: "the model refused: " + controls.Cut(said, maxErrorExcerpt)}
}

// answer reads a Chat Completions answer that came whole.
func (t *openAITransport) answer(a *answer) (*stubbornv1.Result, error) {
	r, err := conversation.Chat{}.DecodeResponse(decodable(a.body))
	if err != nil {
		return nil, unreadable("not a Chat Completions answer: %v", err)
	}
	first := choice0(r)
	switch {
	case first == nil:
		return nil, unreadable("a Chat Completions answer with no choices")
	case refused(first):
		return nil, refusal(first.GetMessage().GetRefusal())
	}
	return modelResult(r, map[string]any{"model": r.GetModel(), "finish_reason": first.GetNativeFinishReason(), "usage": rawUsage(a.body)})
}

// decodable is an answer's JSON body (or a streamed event's) as the codecs
// read it: as it is, unless a field besides the answer itself (choices,
// content) nests deeper than the codecs take; such a field (a broken or
// hostile server's usage) is left out of what they read, rather than fail
// the whole answer, and Result.data keeps it, bounded (BoundResult).
func decodable(body []byte) []byte {
	if conversation.DepthWithin(body, conversation.MaxDepth) {
		return body
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return body // the codec says what is wrong
	}
	for k, v := range top {
		if k != "choices" && k != "content" && !conversation.DepthWithin(v, conversation.MaxDepth-1) {
			delete(top, k)
		}
	}
	b, err := json.Marshal(top)
	if err != nil {
		return body
	}
	return b
}

// rawUsage is an answer's usage as its API said it (Result.data keeps
// that shape), or nil.
func rawUsage(body []byte) map[string]any {
	var u struct {
		Usage map[string]any `json:"usage"`
	}
	_ = json.Unmarshal(body, &u)
	return u.Usage
}

// anthropicVersion is the Messages API version the requests ask for.
const anthropicVersion = "2023-06-01"

type anthropicTransport struct {
	*httpClient
	cfg    *Anthropic
	url    string
	stream bool
}

func newAnthropicTransport(cfg *Anthropic, mode string, h *httpClient) *anthropicTransport {
	return &anthropicTransport{
		httpClient: h,
		cfg:        cfg,
		url:        strings.TrimSuffix(cfg.BaseURL, "/") + "/v1/messages",
		stream:     mode != streamOff,
	}
}

func (t *anthropicTransport) mayStream() bool { return t.stream }

// anthropicUsageKeys are the usage counts Result.data keeps of a streamed
// answer, merged from message_start and message_delta; no other key is
// kept (a hostile stream's keys would pile up).
var anthropicUsageKeys = []string{"input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"}

func (t *anthropicTransport) call(ctx context.Context, c controls.Call, s *stream) (*stubbornv1.Result, error) {
	body, err := encodeRequest(conversation.Messages{}, c, modelEntry(t.cfg.Model, t.cfg.System, t.cfg.Temperature, t.cfg.MaxTokens), t.stream)
	if err != nil {
		return nil, err
	}
	req, err := jsonRequest(ctx, t.url, body, c)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Anthropic-Version", anthropicVersion)
	if t.cfg.apiKey != "" {
		req.Header.Set("X-Api-Key", t.cfg.apiKey)
	}
	if !t.stream {
		a, err := t.do(req)
		if err != nil {
			return nil, err
		}
		return t.answer(a)
	}
	var (
		dec   = conversation.Messages{}.NewStreamDecoder()
		usage = map[string]any{}
		done  bool
	)
	a, err := t.doStream(req, s, formatSSE, func(ev event) error {
		ds, end, err := dec.Next(conversation.Event{Name: ev.name, Data: decodable(ev.data)})
		var se *conversation.StreamError
		switch {
		case errors.As(err, &se):
			// overloaded_error, api_error: the service's trouble, worth
			// another try; any other is the request's.
			code := codes.FailedPrecondition
			if se.Type == "overloaded_error" || se.Type == "api_error" {
				code = codes.Unavailable
			}
			return &controls.CallError{Code: code, Message: "the model's stream failed: " + controls.Cut(se.Type+": "+se.Message, maxErrorExcerpt)}
		case err != nil:
			return unreadable("not a Messages API event: %v", err)
		case end:
			done = true
			return errStreamDone
		}
		if bytes.Contains(ev.data, []byte(`"usage"`)) {
			var e struct {
				Message struct {
					Usage map[string]any `json:"usage"`
				} `json:"message"`
				Usage map[string]any `json:"usage"`
			}
			if json.Unmarshal(ev.data, &e) == nil {
				for _, u := range []map[string]any{e.Message.Usage, e.Usage} {
					for _, k := range anthropicUsageKeys {
						if v, ok := u[k]; ok {
							usage[k] = v
						}
					}
				}
			}
		}
		return route(s, ds)
	})
	switch {
	case err != nil:
		return nil, err
	case a != nil:
		return t.answer(a) // the server did not stream
	}
	r := dec.Result()
	stop := choice0(r).GetNativeFinishReason()
	if !done && stop == "" {
		return nil, cutShort("its stop_reason or message_stop")
	}
	if len(usage) == 0 {
		usage = nil
	}
	return modelResult(r, map[string]any{"model": r.GetModel(), "stop_reason": stop, "usage": usage})
}

// answer reads a Messages API answer that came whole.
func (t *anthropicTransport) answer(a *answer) (*stubbornv1.Result, error) {
	var head struct {
		Type  string         `json:"type"`
		Usage map[string]any `json:"usage"`
	}
	if err := json.Unmarshal(a.body, &head); err != nil {
		return nil, unreadable("not a Messages API answer: %v", err)
	}
	if head.Type != "message" {
		return nil, unreadable("a Messages API answer of type %q, not \"message\"", controls.Cut(head.Type, 100))
	}
	r, err := conversation.Messages{}.DecodeResponse(decodable(a.body))
	if err != nil {
		return nil, unreadable("not a Messages API answer: %v", err)
	}
	return modelResult(r, map[string]any{"model": r.GetModel(), "stop_reason": choice0(r).GetNativeFinishReason(), "usage": head.Usage})
}

// jsonRequest is a POST of body (JSON) to url, with the call's headers.
func jsonRequest(ctx context.Context, url string, body []byte, c controls.Call) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, &controls.CallError{Code: codes.FailedPrecondition, Refused: true, Message: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	setCallHeaders(req, c)
	return req, nil
}

// modelResult is a model's answer r (its choices, text, usage and model)
// with data: what else it said (model, finish reason, the API's own usage)
// as Result.data has always had it.
func modelResult(r *stubbornv1.Result, data map[string]any) (*stubbornv1.Result, error) {
	for k, v := range data {
		if m, isMap := v.(map[string]any); v == nil || v == "" || (isMap && m == nil) {
			delete(data, k)
		}
	}
	d, err := structpb.NewValue(data)
	if err != nil {
		return nil, unreadable("%v", err)
	}
	r.Data = d
	r.Text = strings.ToValidUTF8(r.GetText(), "\uFFFD")
	return r, nil
}
