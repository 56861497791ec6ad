// Package fakemodel is a model server for trying Stubborn without a model:
// it speaks OpenAI's Chat Completions (POST /v1/chat/completions) and
// Anthropic's Messages (POST /v1/messages), reading and writing both
// through the conversation package's codecs, and answers as its Behavior
// says: always failing, streaming a fixed answer, or calling a tool. The
// demo and `stubborn delegates` serve one of each, registered as model
// delegates, so the front doors answer with no key and no network.
package fakemodel

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/conversation"
)

// Behavior is how a fake model answers.
type Behavior int

const (
	// Fails answers every request with a 500 in the API's error shape: a
	// transient failure, which a retry or a fallback chain gets past.
	Fails Behavior = iota
	// Streams answers words, streamed a word at a time when asked to
	// stream.
	Streams
	// Tools calls Tool (get_weather) when the request offers it and does
	// not end with its result, and answers a tool result with Sunny; a
	// request that offers no such tool gets words, as Streams.
	Tools
)

// words is the answer of Streams (and of Tools without its tool), in its
// streamed pieces.
var words = []string{"The ", "answer ", "is ", "42."}

// Tool is the tool the Tools model calls, with ToolArgs as its arguments.
const (
	Tool     = "get_weather"
	ToolArgs = `{"city": "Paris"}`
)

// Sunny is what the Tools model answers a tool result with.
const Sunny = "It is sunny in Paris."

// overloaded is the Fails model's error message.
const overloaded = "the fake model is overloaded (it always is: it is there to fail)"

// maxBody bounds a request's body: a fake model has no use for more, and a
// bound keeps a stray client from filling memory.
const maxBody = 4 << 20

// Model is a fake model's HTTP handler.
type Model struct {
	behavior Behavior
	// pace is the pause between two streamed pieces.
	pace time.Duration
	// calls numbers the tool calls' ids; hits counts requests.
	calls, hits atomic.Int64
	mux         *http.ServeMux
}

// New returns a fake model that answers as b, pausing pace between two
// streamed pieces.
func New(b Behavior, pace time.Duration) *Model {
	m := &Model{behavior: b, pace: max(pace, 0), mux: http.NewServeMux()}
	m.mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, conversation.Chat{})
	})
	m.mux.HandleFunc("POST /v1/messages", func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, conversation.Messages{})
	})
	return m
}

// Hits is how many requests the model has had.
func (m *Model) Hits() int64 { return m.hits.Load() }

func (m *Model) ServeHTTP(w http.ResponseWriter, r *http.Request) { m.mux.ServeHTTP(w, r) }

func (m *Model) serve(w http.ResponseWriter, r *http.Request, codec conversation.Codec) {
	m.hits.Add(1)
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			apiError(w, codec, http.StatusRequestEntityTooLarge, "invalid_request_error", fmt.Sprintf("the body is over %d bytes", maxBody))
			return
		}
		apiError(w, codec, http.StatusBadRequest, "invalid_request_error", "the body cannot be read: "+err.Error())
		return
	}
	req, err := codec.DecodeRequest(body)
	if err != nil {
		apiError(w, codec, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	if m.behavior == Fails {
		kind := "server_error"
		if codec.API() == conversation.AnthropicMessages {
			kind = "api_error"
		}
		apiError(w, codec, http.StatusInternalServerError, kind, overloaded)
		return
	}
	ans := m.answer(req.Conversation, codec.API())
	meta := conversation.Meta{ID: "fake-" + fmt.Sprint(m.hits.Load()), Model: req.Model, Created: time.Now().Unix(), IncludeUsage: req.IncludeUsage}
	if !req.Stream {
		out, err := codec.EncodeResponse(ans.result(req.Model), meta)
		if err != nil {
			apiError(w, codec, http.StatusInternalServerError, "api_error", err.Error())
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(out)
		return
	}
	m.stream(w, r, codec.NewStreamEncoder(meta), ans, req.Model)
}

// answer is what the model says: text in pieces, or one tool call.
type answer struct {
	pieces []string
	call   *stubbornv1.ToolCall
}

// answer decides the answer to c.
func (m *Model) answer(c *stubbornv1.Conversation, api stubbornv1.ConversationAPI) answer {
	if m.behavior != Tools || !offers(c, Tool) {
		return answer{pieces: words}
	}
	msgs := c.GetMessages()
	if n := len(msgs); n > 0 && msgs[n-1].GetRole() == stubbornv1.ChatRole_CHAT_ROLE_TOOL {
		return answer{pieces: strings.SplitAfter(Sunny, " ")}
	}
	id := fmt.Sprintf("call_fake_%d", m.calls.Add(1))
	if api == conversation.AnthropicMessages {
		id = fmt.Sprintf("toolu_fake_%d", m.calls.Load())
	}
	return answer{call: &stubbornv1.ToolCall{Id: id, Name: Tool, Arguments: ToolArgs}}
}

// offers says whether c offers the tool name.
func offers(c *stubbornv1.Conversation, name string) bool {
	for _, t := range c.GetOptions().GetTools() {
		if t.GetName() == name {
			return true
		}
	}
	return false
}

// result is a whole, as a Result of one choice.
func (a answer) result(model string) *stubbornv1.Result {
	msg := &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT}
	finish := stubbornv1.FinishReason_FINISH_REASON_STOP
	text := strings.Join(a.pieces, "")
	if a.call != nil {
		msg.ToolCalls = []*stubbornv1.ToolCall{a.call}
		finish = stubbornv1.FinishReason_FINISH_REASON_TOOL_CALLS
	} else {
		msg.Content = []*stubbornv1.ContentPart{{Kind: &stubbornv1.ContentPart_Text{Text: text}}}
	}
	return &stubbornv1.Result{
		Text:    text,
		Choices: []*stubbornv1.Choice{{Index: 0, Message: msg, FinishReason: finish}},
		Usage:   &stubbornv1.Usage{InputTokens: 3, OutputTokens: 4, TotalTokens: 7},
		Model:   model,
	}
}

// stream writes a as server-sent events: a piece at a time, m.pace apart,
// then the end. A client that goes away ends it.
func (m *Model) stream(w http.ResponseWriter, r *http.Request, enc conversation.StreamEncoder, a answer, model string) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	fl, _ := w.(http.Flusher)
	send := func(evs []conversation.Event) {
		var out []byte
		for _, ev := range evs {
			out = ev.AppendSSE(out)
		}
		_, _ = w.Write(out)
		if fl != nil {
			fl.Flush()
		}
	}
	var deltas []*stubbornv1.OutputDelta
	if a.call != nil {
		deltas = []*stubbornv1.OutputDelta{{Kind: &stubbornv1.OutputDelta_ToolCall{ToolCall: &stubbornv1.ToolCallDelta{
			Id: a.call.Id, Name: a.call.Name, Arguments: a.call.Arguments,
		}}}}
	}
	var offset int64
	for _, p := range a.pieces {
		deltas = append(deltas, &stubbornv1.OutputDelta{Kind: &stubbornv1.OutputDelta_Text{Text: p}, Offset: offset})
		offset += int64(len(p))
	}
	for i, d := range deltas {
		if i > 0 && m.pace > 0 {
			select {
			case <-time.After(m.pace):
			case <-r.Context().Done():
				return
			}
		}
		evs, err := enc.Deltas([]*stubbornv1.OutputDelta{d})
		if err != nil {
			return // the fake's own answer always encodes; nothing to tell a client mid-stream
		}
		send(evs)
	}
	evs, err := enc.End(a.result(model))
	if err != nil {
		return
	}
	send(evs)
}

// apiError writes an error as the API shapes it: Chat Completions'
// {"error": {...}}, Messages' {"type": "error", "error": {...}}.
func apiError(w http.ResponseWriter, codec conversation.Codec, code int, kind, msg string) {
	type detail struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}
	var body any = struct {
		Error detail `json:"error"`
	}{detail{kind, msg}}
	if codec.API() == conversation.AnthropicMessages {
		body = struct {
			Type  string `json:"type"`
			Error detail `json:"error"`
		}{"error", detail{kind, msg}}
	}
	b, _ := json.Marshal(body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(b)
}
