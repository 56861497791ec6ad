package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Words is what the good model answers, one streamed piece each.
var Words = []string{"The ", "answer ", "is ", "42."}

// Sunny is what the tools model answers to a tool result.
const Sunny = "It is sunny in Paris."

// Tool is the tool the tools model calls, with Args as its arguments'
// streamed fragments (joined, a JSON object).
const Tool = "get_weather"

// Args are the tools model's arguments to Tool, in their streamed pieces.
var Args = []string{`{"city": `, `"Paris"}`}

// BadTemperature is the bad-request model's message (OpenAI's words for
// temperature: 5).
const BadTemperature = "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 5 instead."

// Last is what a request carried that the scenarios check reached the
// model: the tools it offered and the ids of the tool results it ended with.
type Last struct {
	Tools         []string `json:"tools"`
	ToolResultIDs []string `json:"tool_result_ids"`
	ToolResults   []string `json:"tool_results"`
	Messages      int      `json:"messages"`
}

type fake struct {
	mode   string
	status int
	delay  time.Duration
	hits   atomic.Int64
	calls  atomic.Int64 // numbers the tool calls' ids
	mu     sync.Mutex
	last   map[string]Last // by API: "chat", "messages"
}

// New is the fake model's handler.
func New(mode string, status int, delay time.Duration) http.Handler {
	f := &fake{mode: mode, status: status, delay: delay, last: map[string]Last{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hits", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]int64{"hits": f.hits.Load()})
	})
	mux.HandleFunc("GET /last", func(w http.ResponseWriter, _ *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(f.last)
	})
	mux.HandleFunc("POST /v1/chat/completions", f.chat)
	mux.HandleFunc("POST /v1/messages", f.messages)
	return mux
}

// answer is what the model answers: one choice per entry.
type answer []choice

// choice is a choice's text in its streamed pieces, or a tool call.
type choice struct {
	words []string
	call  *call
}

type call struct {
	id, name string
	args     []string
}

func (c choice) text() string { return strings.Join(c.words, "") }

// api is what differs between Chat Completions and Messages.
type api struct {
	name string // "chat" or "messages"
	// fail writes the API's error.
	fail func(w http.ResponseWriter, code int, kind, msg string)
	// whole writes a as one JSON answer; stream streams it, dropping the
	// connection after cut words of choice 0 (cut < 0: never).
	whole  func(w http.ResponseWriter, model string, a answer)
	stream func(w http.ResponseWriter, model string, a answer, cut int, delay time.Duration)
}

// serve answers a request of the API after it was decoded: the mode's
// failure, or the mode's answer. toolResult says the conversation ends with
// tool results; n is the choices asked for.
func (f *fake) serve(w http.ResponseWriter, r *http.Request, a api, model string, stream bool, n int, last Last) {
	k := f.hits.Add(1)
	log.Printf("%s request %d: model %q, stream %v, n %d, %+v, run %s attempt %s",
		a.name, k, model, stream, n, last, r.Header.Get("Stubborn-Run-Id"), r.Header.Get("Stubborn-Attempt"))
	f.mu.Lock()
	f.last[a.name] = last
	f.mu.Unlock()
	cut := -1
	var ans answer
	switch f.mode {
	case "busy":
		kind := "api_error"
		if f.status == http.StatusServiceUnavailable && a.name == "chat" {
			kind = "server_error"
		} else if f.status == http.StatusServiceUnavailable {
			kind = "overloaded_error"
		}
		a.fail(w, f.status, kind, "the engine is overloaded")
		return
	case "throttle":
		w.Header().Set("Retry-After", "1")
		a.fail(w, http.StatusTooManyRequests, "rate_limit_error", "rate limit reached: retry in 1s")
		return
	case "bad-request":
		a.fail(w, http.StatusBadRequest, "invalid_request_error", BadTemperature)
		return
	case "stall":
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Minute):
		}
		return
	case "tools":
		if !contains(last.Tools, Tool) {
			a.fail(w, http.StatusBadRequest, "invalid_request_error", fmt.Sprintf("tools: the request offers %v, not %s", last.Tools, Tool))
			return
		}
		if len(last.ToolResultIDs) > 0 {
			ans = answer{{words: []string{"It is ", "sunny ", "in Paris."}}}
			break
		}
		id := fmt.Sprintf("call_fake_%d", f.calls.Add(1))
		if a.name == "messages" {
			id = fmt.Sprintf("toolu_fake_%d", f.calls.Load())
		}
		ans = answer{{call: &call{id: id, name: Tool, args: Args}}}
	case "breaks":
		if !stream {
			panic(http.ErrAbortHandler) // before any byte
		}
		cut = 2
		fallthrough
	default:
		for i := range max(n, 1) {
			words := append([]string(nil), Words...)
			if i > 0 {
				words[len(words)-1] = fmt.Sprintf("%d.", 42+i)
			}
			ans = append(ans, choice{words: words})
		}
	}
	if stream {
		a.stream(w, model, ans, cut, f.delay)
		return
	}
	a.whole(w, model, ans)
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// sse writes server-sent events, flushed one by one.
type sse struct {
	w  http.ResponseWriter
	fl http.Flusher
}

func newSSE(w http.ResponseWriter) sse {
	w.Header().Set("Content-Type", "text/event-stream")
	fl, _ := w.(http.Flusher)
	return sse{w, fl}
}

// event writes v as an event's data, named when name is not empty.
func (s sse) event(name string, v any) {
	b, _ := json.Marshal(v)
	if name != "" {
		_, _ = fmt.Fprintf(s.w, "event: %s\n", name)
	}
	_, _ = fmt.Fprintf(s.w, "data: %s\n\n", b)
	s.flush()
}

func (s sse) raw(text string) {
	_, _ = io.WriteString(s.w, text)
	s.flush()
}

func (s sse) flush() {
	if s.fl != nil {
		s.fl.Flush()
	}
}

// pieces is how many pieces choice c streams in.
func (c choice) pieces() int {
	if c.call != nil {
		return len(c.call.args)
	}
	return len(c.words)
}

// writeJSON writes v as a 200 JSON answer.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// errorJSON writes code with v as its JSON body.
func errorJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
