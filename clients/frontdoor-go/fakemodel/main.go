// Command fakemodel is a fake Chat Completions server for
// clients/check-frontdoor.sh: Stubborn's `openai` delegates call it, and
// the official SDKs call Stubborn's front door in front of it. One process
// plays one model, by -mode:
//
//	busy      every request: 503, an OpenAI-shaped error
//	good      answers "The answer is 42.": as JSON, or (stream: true) over
//	          SSE in four chunks -delay apart, then the usage chunk, [DONE]
//	breaks    as good, but the connection drops after the first two words
//	          (before any byte when not streamed)
//	throttle  every request: 429 with Retry-After: 1
//	stall     accepts the request and never answers (until the caller goes)
//
// GET /hits answers how many chat requests it has had, as {"hits": N}.
// It prints "fakemodel MODE serving on http://ADDR" once it listens.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

// Words is what the good model answers, one streamed chunk each.
var Words = []string{"The ", "answer ", "is ", "42."}

func main() {
	mode := flag.String("mode", "good", "busy, good, breaks, throttle or stall")
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	delay := flag.Duration("delay", 50*time.Millisecond, "good: the pause between streamed chunks")
	flag.Parse()
	log.SetPrefix("fakemodel " + *mode + ": ")
	log.SetFlags(log.Lmicroseconds)

	var hits atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hits", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]int64{"hits": hits.Load()})
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		n := hits.Add(1)
		var req struct {
			Model    string `json:"model"`
			Stream   bool   `json:"stream"`
			Messages []struct {
				Role    string `json:"role"`
				Content any    `json:"content"`
			} `json:"messages"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			apiError(w, http.StatusBadRequest, "invalid_request_error", "the body is not JSON: "+err.Error())
			return
		}
		log.Printf("request %d: model %q, stream %v, %d messages, run %s attempt %s",
			n, req.Model, req.Stream, len(req.Messages), r.Header.Get("Stubborn-Run-Id"), r.Header.Get("Stubborn-Attempt"))
		switch *mode {
		case "busy":
			apiError(w, http.StatusServiceUnavailable, "server_error", "the engine is overloaded")
		case "throttle":
			w.Header().Set("Retry-After", "1")
			apiError(w, http.StatusTooManyRequests, "rate_limit_error", "rate limit reached: retry in 1s")
		case "stall":
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Minute):
			}
		case "breaks":
			answer(w, req.Model, req.Stream, *delay, 2)
		default:
			answer(w, req.Model, req.Stream, *delay, len(Words))
		}
	})

	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("fakemodel %s serving on http://%s\n", *mode, lis.Addr())
	_ = os.Stdout.Sync()
	log.Fatal(http.Serve(lis, mux))
}

// usage is what the good model reports using.
var usage = map[string]int{"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}

// answer answers with Words, but drops the connection after the first n.
func answer(w http.ResponseWriter, model string, stream bool, delay time.Duration, n int) {
	const id = "chatcmpl-fake"
	created := time.Now().Unix()
	if !stream && n < len(Words) {
		panic(http.ErrAbortHandler)
	}
	if !stream {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"id": id, "object": "chat.completion", "created": created, "model": model,
			"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": strings.Join(Words, "")}, "finish_reason": "stop"}},
			"usage":   usage,
		})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl, _ := w.(http.Flusher)
	event := func(v any) {
		b, _ := json.Marshal(v)
		_, _ = fmt.Fprintf(w, "data: %s\n\n", b)
		if fl != nil {
			fl.Flush()
		}
	}
	chunk := func(delta map[string]any, finish any) map[string]any {
		return map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}}
	}
	event(chunk(map[string]any{"role": "assistant", "content": ""}, nil))
	for i, word := range Words {
		if i > 0 {
			time.Sleep(delay)
		}
		if i == n {
			panic(http.ErrAbortHandler) // the connection drops mid-answer
		}
		event(chunk(map[string]any{"content": word}, nil))
	}
	event(chunk(map[string]any{}, "stop"))
	event(map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": model, "choices": []any{}, "usage": usage})
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}

func apiError(w http.ResponseWriter, code int, kind, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": kind, "code": nil, "param": nil}})
}
