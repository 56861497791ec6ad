package delegates

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/stubbornhq/stubborn/controls"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// The model kinds speak two small, stable JSON APIs directly, over the
// same httpClient as the http kind, rather than through a vendor SDK: the
// request and the fields read are a handful, every failure maps the same
// way as an http delegate's (status, Retry-After, not sent, the size
// bound), and nothing but the config decides where a key is sent. (The
// official OpenAI Go SDK reads OPENAI_API_KEY, OPENAI_BASE_URL and
// OPENAI_CUSTOM_HEADERS from the environment whatever the caller sets,
// with no public switch to turn that off, so a key meant for one endpoint
// would reach a local one configured without a key.)

// chatMessage is one message of a chat request.
type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// openAIRequest is a Chat Completions request.
type openAIRequest struct {
	Model       string        `json:"model"`
	Messages    []chatMessage `json:"messages"`
	Temperature *float64      `json:"temperature,omitempty"`
	MaxTokens   int           `json:"max_tokens,omitempty"`
	// Stream asks for Server-Sent Events, the last with the usage.
	Stream        bool                 `json:"stream,omitempty"`
	StreamOptions *openAIStreamOptions `json:"stream_options,omitempty"`
}

type openAIStreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// openAIChunk is what is read of one streamed Chat Completions chunk.
type openAIChunk struct {
	Model   string `json:"model"`
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
			Refusal string `json:"refusal"`
		} `json:"delta"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage map[string]any `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// openAIAnswer is what is read of a Chat Completions answer.
type openAIAnswer struct {
	Model   string `json:"model"`
	Choices []struct {
		Message struct {
			Content *string `json:"content"`
			Refusal string  `json:"refusal"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage map[string]any `json:"usage"`
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
		stream:     mode != StreamOff,
	}
}

func (t *openAITransport) mayStream() bool { return t.stream }

func (t *openAITransport) call(ctx context.Context, c controls.Call, s *stream) (*stubbornv1.Result, error) {
	body := openAIRequest{Model: t.cfg.Model, Temperature: t.cfg.Temperature, MaxTokens: t.cfg.MaxTokens}
	if t.cfg.System != "" {
		body.Messages = append(body.Messages, chatMessage{Role: "system", Content: t.cfg.System})
	}
	body.Messages = append(body.Messages, chatMessage{Role: "user", Content: c.Brief})
	if t.stream {
		body.Stream, body.StreamOptions = true, &openAIStreamOptions{IncludeUsage: true}
	}
	var sent any = body
	if msgs := messagesOf(c); len(msgs) > 0 {
		sent = t.conversation(body, msgs, modelParamsOf(c))
	}
	req, err := jsonRequest(ctx, t.url, sent, c)
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
		model, finish string
		refusal       strings.Builder
		usage         map[string]any
		done          bool
	)
	a, err := t.doStream(req, s, formatSSE, func(ev event) error {
		if string(ev.data) == "[DONE]" {
			done = true
			return errStreamDone
		}
		var ch openAIChunk
		if err := json.Unmarshal(ev.data, &ch); err != nil {
			return unreadable("not a Chat Completions chunk: %v", err)
		}
		if ch.Error != nil {
			return &controls.CallError{Code: codes.Unavailable, Message: "the model's stream failed: " + controls.Cut(ch.Error.Message, maxErrorExcerpt)}
		}
		model = cmp.Or(ch.Model, model)
		if ch.Usage != nil {
			usage = ch.Usage
		}
		if len(ch.Choices) == 0 {
			return nil
		}
		d := ch.Choices[0]
		finish = cmp.Or(d.FinishReason, finish)
		if refusal.Len() < maxErrorExcerpt {
			refusal.WriteString(d.Delta.Refusal)
		}
		return s.piece(d.Delta.Content)
	})
	switch {
	case err != nil:
		return nil, err
	case a != nil:
		return t.answer(a) // the server did not stream
	case !done && finish == "":
		return nil, cutShort("its finish_reason or [DONE]")
	case refusal.Len() > 0 && !s.streamed():
		return nil, &controls.CallError{Code: codes.FailedPrecondition, Message: "the model refused: " + controls.Cut(refusal.String(), maxErrorExcerpt)}
	}
	return modelResult(s.joined(), map[string]any{"model": model, "finish_reason": finish, "usage": usage})
}

// conversation is the request for a run's conversation: its model
// parameters as they are (tools, response_format, stop, seed, …), the
// entry's temperature and max_tokens where they set none, the entry's
// system prompt first, then the messages intact; the model and stream are
// the entry's.
func (t *openAITransport) conversation(body openAIRequest, msgs []*structpb.Struct, params *structpb.Struct) map[string]any {
	out := params.AsMap()
	if out == nil {
		out = map[string]any{}
	}
	if _, set := out["temperature"]; !set && body.Temperature != nil {
		out["temperature"] = *body.Temperature
	}
	_, setMax := out["max_tokens"]
	_, setMaxCompletion := out["max_completion_tokens"]
	if !setMax && !setMaxCompletion && body.MaxTokens > 0 {
		out["max_tokens"] = body.MaxTokens
	}
	messages := make([]any, 0, len(msgs)+1)
	if t.cfg.System != "" {
		messages = append(messages, map[string]any{"role": "system", "content": t.cfg.System})
	}
	for _, m := range msgs {
		messages = append(messages, m.AsMap())
	}
	out["model"], out["messages"] = body.Model, messages
	delete(out, "stream")
	delete(out, "stream_options")
	if body.Stream {
		out["stream"], out["stream_options"] = true, map[string]any{"include_usage": true}
	}
	return out
}

// answer reads a Chat Completions answer that came whole.
func (t *openAITransport) answer(a *answer) (*stubbornv1.Result, error) {
	var ans openAIAnswer
	if err := json.Unmarshal(a.body, &ans); err != nil {
		return nil, unreadable("not a Chat Completions answer: %v", err)
	}
	if len(ans.Choices) == 0 {
		return nil, unreadable("a Chat Completions answer with no choices")
	}
	ch := ans.Choices[0]
	text := ""
	switch {
	case ch.Message.Content != nil:
		text = *ch.Message.Content
	case ch.Message.Refusal != "":
		return nil, &controls.CallError{Code: codes.FailedPrecondition, Message: "the model refused: " + controls.Cut(ch.Message.Refusal, maxErrorExcerpt)}
	}
	return modelResult(text, map[string]any{"model": ans.Model, "finish_reason": ch.FinishReason, "usage": ans.Usage})
}

// anthropicRequest is a Messages API request.
type anthropicRequest struct {
	Model       string        `json:"model"`
	MaxTokens   int           `json:"max_tokens"`
	System      string        `json:"system,omitempty"`
	Messages    []chatMessage `json:"messages"`
	Temperature *float64      `json:"temperature,omitempty"`
	Stream      bool          `json:"stream,omitempty"`
}

// anthropicAnswer is what is read of a Messages API answer.
type anthropicAnswer struct {
	Type    string `json:"type"`
	Model   string `json:"model"`
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	StopReason string         `json:"stop_reason"`
	Usage      map[string]any `json:"usage"`
}

// anthropicVersion is the Messages API version the requests ask for.
const anthropicVersion = "2023-06-01"

// defaultAnthropicMaxTokens is max_tokens when the entry sets none.
const defaultAnthropicMaxTokens = 1024

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
		stream:     mode != StreamOff,
	}
}

// anthropicEvent is what is read of one streamed Messages API event.
type anthropicEvent struct {
	Type    string `json:"type"`
	Message struct {
		Model string         `json:"model"`
		Usage map[string]any `json:"usage"`
	} `json:"message"`
	Delta struct {
		Type       string `json:"type"`
		Text       string `json:"text"`
		StopReason string `json:"stop_reason"`
	} `json:"delta"`
	Usage map[string]any `json:"usage"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func (t *anthropicTransport) mayStream() bool { return t.stream }

func (t *anthropicTransport) call(ctx context.Context, c controls.Call, s *stream) (*stubbornv1.Result, error) {
	body := anthropicRequest{
		Model: t.cfg.Model, MaxTokens: t.cfg.MaxTokens, System: t.cfg.System, Temperature: t.cfg.Temperature,
		Messages: []chatMessage{{Role: "user", Content: c.Brief}}, Stream: t.stream,
	}
	if body.MaxTokens == 0 {
		body.MaxTokens = defaultAnthropicMaxTokens
	}
	var sent any = body
	if msgs := messagesOf(c); len(msgs) > 0 {
		sent = anthropicConversation(body, msgs, modelParamsOf(c))
	}
	req, err := jsonRequest(ctx, t.url, sent, c)
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
		model, stop string
		usage       = map[string]any{}
		done        bool
	)
	// A usage's counts, merged from message_start and message_delta; no
	// other key is kept (a hostile stream's keys would pile up).
	addUsage := func(u map[string]any) {
		for _, k := range []string{"input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"} {
			if v, ok := u[k]; ok {
				usage[k] = v
			}
		}
	}
	a, err := t.doStream(req, s, formatSSE, func(ev event) error {
		var e anthropicEvent
		if err := json.Unmarshal(ev.data, &e); err != nil {
			return unreadable("not a Messages API event: %v", err)
		}
		switch e.Type {
		case "message_start":
			model = e.Message.Model
			addUsage(e.Message.Usage)
		case "content_block_delta":
			if e.Delta.Type == "text_delta" {
				return s.piece(e.Delta.Text)
			}
		case "message_delta":
			stop = cmp.Or(e.Delta.StopReason, stop)
			addUsage(e.Usage)
		case "message_stop":
			done = true
			return errStreamDone
		case "error":
			// overloaded_error, api_error: the service's trouble, worth
			// another try; any other is the request's.
			code := codes.FailedPrecondition
			if e.Error.Type == "overloaded_error" || e.Error.Type == "api_error" {
				code = codes.Unavailable
			}
			return &controls.CallError{Code: code, Message: "the model's stream failed: " + controls.Cut(e.Error.Type+": "+e.Error.Message, maxErrorExcerpt)}
		}
		return nil
	})
	switch {
	case err != nil:
		return nil, err
	case a != nil:
		return t.answer(a) // the server did not stream
	case !done && stop == "":
		return nil, cutShort("its stop_reason or message_stop")
	}
	if len(usage) == 0 {
		usage = nil
	}
	return modelResult(s.joined(), map[string]any{"model": model, "stop_reason": stop, "usage": usage})
}

// answer reads a Messages API answer that came whole.
func (t *anthropicTransport) answer(a *answer) (*stubbornv1.Result, error) {
	var ans anthropicAnswer
	if err := json.Unmarshal(a.body, &ans); err != nil {
		return nil, unreadable("not a Messages API answer: %v", err)
	}
	if ans.Type != "message" {
		return nil, unreadable("a Messages API answer of type %q, not \"message\"", controls.Cut(ans.Type, 100))
	}
	var text strings.Builder
	for _, b := range ans.Content {
		if b.Type == "text" {
			text.WriteString(b.Text)
		}
	}
	return modelResult(text.String(), map[string]any{"model": ans.Model, "stop_reason": ans.StopReason, "usage": ans.Usage})
}

// jsonRequest is a POST of body as JSON to url, with the call's headers.
func jsonRequest(ctx context.Context, url string, body any, c controls.Call) (*http.Request, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, &controls.CallError{Code: codes.Internal, Refused: true, Message: err.Error()}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return nil, &controls.CallError{Code: codes.FailedPrecondition, Refused: true, Message: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	setCallHeaders(req, c)
	return req, nil
}

// modelResult is a model's answer: its text, and what else it said
// (model, finish reason, token usage) as data.
func modelResult(text string, data map[string]any) (*stubbornv1.Result, error) {
	for k, v := range data {
		if m, isMap := v.(map[string]any); v == nil || v == "" || (isMap && m == nil) {
			delete(data, k)
		}
	}
	d, err := structpb.NewValue(data)
	if err != nil {
		return nil, unreadable("%v", err)
	}
	return &stubbornv1.Result{Text: strings.ToValidUTF8(text, "\uFFFD"), Data: d}, nil
}

// anthropicConversation is the Messages API request for a run's
// conversation: its system and developer messages' text after the
// entry's system prompt, its user and assistant messages with their
// content as it is (a string, or parts: text parts are the same shape in
// both APIs); of the model parameters (Chat Completions' names), those
// the Messages API has too: max_tokens (or max_completion_tokens),
// temperature and top_p over the entry's, stop as stop_sequences, user
// as metadata.user_id. Tool messages and the other parameters are not
// sent (the two APIs' tools differ).
func anthropicConversation(body anthropicRequest, msgs []*structpb.Struct, params *structpb.Struct) map[string]any {
	system := []string{}
	if body.System != "" {
		system = append(system, body.System)
	}
	messages := make([]any, 0, len(msgs))
	for _, m := range msgs {
		f := m.GetFields()
		switch role := f["role"].GetStringValue(); role {
		case "system", "developer":
			if text := f["content"].GetStringValue(); text != "" {
				system = append(system, text)
			}
		case "user", "assistant":
			messages = append(messages, map[string]any{"role": role, "content": f["content"].AsInterface()})
		}
	}
	out := map[string]any{"model": body.Model, "max_tokens": body.MaxTokens, "messages": messages}
	if len(system) > 0 {
		out["system"] = strings.Join(system, "\n\n")
	}
	if body.Temperature != nil {
		out["temperature"] = *body.Temperature
	}
	p := params.GetFields()
	for _, k := range []string{"max_completion_tokens", "max_tokens"} {
		if n := p[k].GetNumberValue(); n >= 1 {
			out["max_tokens"] = int64(min(n, math.MaxInt32)) // a JSON number may be 1e300
		}
	}
	for _, k := range []string{"temperature", "top_p"} {
		if v, ok := p[k].GetKind().(*structpb.Value_NumberValue); ok {
			out[k] = v.NumberValue
		}
	}
	switch stop := p["stop"].GetKind().(type) {
	case *structpb.Value_StringValue:
		out["stop_sequences"] = []string{stop.StringValue}
	case *structpb.Value_ListValue:
		var seqs []string // strings only: the API takes no other
		for _, v := range stop.ListValue.GetValues() {
			if t, ok := v.GetKind().(*structpb.Value_StringValue); ok {
				seqs = append(seqs, t.StringValue)
			}
		}
		if len(seqs) > 0 {
			out["stop_sequences"] = seqs
		}
	}
	if user := p["user"].GetStringValue(); user != "" {
		out["metadata"] = map[string]any{"user_id": user}
	}
	if body.Stream {
		out["stream"] = true
	}
	return out
}
