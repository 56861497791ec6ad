// Command fakemodel is a fake model server for clients/check-frontdoor.sh:
// Stubborn's `openai` and `anthropic` delegates call it, and the official
// SDKs call Stubborn's front door in front of it. It speaks both APIs at
// once: Chat Completions (POST /v1/chat/completions, an openai delegate's
// base URL is http://ADDR/v1) and Anthropic Messages (POST /v1/messages, an
// anthropic delegate's base URL is http://ADDR), each as JSON or (stream:
// true) over SSE in the API's own events. One process plays one model, by
// -mode:
//
//	busy         every request: -status (503 by default), the API's error
//	good         answers "The answer is 42.": as JSON, or streamed in four
//	             pieces -delay apart. Chat Completions takes n: choice i
//	             answers "The answer is 42+i.", streamed interleaved, each
//	             chunk with its choice's index
//	breaks       as good, but the connection drops after the first two words
//	             (before any byte when not streamed)
//	throttle     every request: 429 with Retry-After: 1
//	stall        accepts the request and never answers (until the caller goes)
//	tools        when the conversation's last message is the user's: a call
//	             of the get_weather tool with arguments {"city": "Paris"}
//	             (Chat Completions tool_calls, Messages a tool_use block;
//	             streamed, the arguments in two fragments); when it is a tool
//	             result (a role "tool" message, a tool_result block): the
//	             text "It is sunny in Paris.". A request without a
//	             get_weather tool is a 400, so a tool lost on the way shows.
//	bad-request  every request: 400 invalid_request_error about temperature
//
// GET /hits answers how many model requests it has had, as {"hits": N}.
// GET /last answers what the last request of each API carried, as
// {"chat": LAST, "messages": LAST}, LAST being {"tools": [names],
// "tool_result_ids": [the tool_call_id / tool_use_id of the last message's
// tool results], "tool_results": [their text], "messages": N}.
// It prints "fakemodel MODE serving on http://ADDR" once it listens.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"time"
)

func main() {
	mode := flag.String("mode", "good", "busy, good, breaks, throttle, stall, tools or bad-request")
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	delay := flag.Duration("delay", 50*time.Millisecond, "the pause between streamed pieces")
	status := flag.Int("status", http.StatusServiceUnavailable, "busy: the HTTP status it answers")
	flag.Parse()
	switch *mode {
	case "busy", "good", "breaks", "throttle", "stall", "tools", "bad-request":
	default:
		fmt.Fprintf(os.Stderr, "fakemodel: unknown -mode %q\n", *mode)
		os.Exit(2)
	}
	log.SetPrefix("fakemodel " + *mode + ": ")
	log.SetFlags(log.Lmicroseconds)

	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("fakemodel %s serving on http://%s\n", *mode, lis.Addr())
	_ = os.Stdout.Sync()
	log.Fatal(http.Serve(lis, New(*mode, *status, *delay)))
}
