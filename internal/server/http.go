package server

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/vanguard"
	"connectrpc.com/vanguard/vanguardgrpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"

	"github.com/stubbornhq/stubborn/console"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Bounds of the HTTP listener, below what the gRPC server behind it
// accepts: a request's headers become its metadata (gRPC's own limit is
// 8 KiB of it by default on a native connection; browsers send more), and a
// JSON body of a 4 MiB message is larger than the message.
const (
	// maxHTTPHeaderBytes bounds a request's headers.
	maxHTTPHeaderBytes = 16 << 10
	// maxHTTPBodyBytes bounds a request's body.
	maxHTTPBodyBytes = 8 << 20
	// httpBodyTimeout bounds the time to read a request's body, from the
	// end of its headers: a short or dribbled body is cut (HTTP 408, and
	// the connection or HTTP/2 stream closed) rather than holding its
	// connection and goroutine. Only the body: a stream's response
	// (WatchRun, WatchRuns) has no write timeout.
	httpBodyTimeout = 20 * time.Second
	// httpHeaderTimeout bounds the time to read a request's headers: over
	// HTTP/1.1 http.Server's ReadHeaderTimeout; over HTTP/2 (h2c or TLS),
	// whose server has no header timeout, a connection that completes no
	// frame for http2PingAfter is sent a PING, and closed when no answer
	// comes within http2PingTimeout. A client dribbling a HEADERS frame
	// (or its CONTINUATIONs, which the server reads as one frame) cannot
	// answer in the middle of it, so it is cut after at most
	// http2PingAfter+http2PingTimeout, not at the 2-minute idle timeout.
	httpHeaderTimeout = 10 * time.Second
	// http2PingAfter is how long an HTTP/2 connection may read no frame
	// before the server sends it a PING.
	http2PingAfter = 10 * time.Second
	// http2PingTimeout is how long the server waits for the answer.
	http2PingTimeout = 5 * time.Second
)

// HTTPHandler serves the ControlService and health to browsers and plain
// HTTP clients: the Connect protocol (JSON or binary, unary and server
// streaming over HTTP/1.1), gRPC-Web, and gRPC over HTTP/2. It is
// connectrpc.com/vanguard's transcoder in front of s.GRPC, so every call
// goes through the same interceptors as a native gRPC call: the same
// authentication (a bearer token in Authorization), tenants, limits,
// validation and logging. For example:
//
//	curl -H 'Content-Type: application/json' -d '{"taskBrief": "hi", "fallbackChain": {"chain": ["echo"]}}' \
//	    http://127.0.0.1:7301/stubborn.v1.ControlService/StartRun
//
// Serve it on a listener of its own (see NewHTTPServer): on the gRPC
// port, native gRPC would go through grpc-go's slower ServeHTTP as well.
//
// Every other path is the web console (package console): its page at "/"
// calls this API from the browser, on the same origin.
//
// Every route answers only a request whose Host (HTTP/2's :authority) is a
// loopback name or address (localhost, 127.0.0.0/8, ::1, any port) or one
// of allowedHosts (names or addresses, each with an optional port: without
// one, any port), and refuses a POST whose Origin is another host's: see
// checkHost. That is what keeps a web page whose name an attacker's DNS
// rebinds to 127.0.0.1 from calling the API in a user's browser.
func (s *Stubborn) HTTPHandler(allowedHosts ...string) (http.Handler, error) {
	hosts, err := newHostPolicy(append(allowedHosts, s.publicHosts()...))
	if err != nil {
		return nil, err
	}
	t, err := vanguardgrpc.NewTranscoder(s.GRPC,
		vanguard.WithDefaultServiceOptions(vanguard.WithMaxMessageBufferBytes(maxHTTPBodyBytes)),
		vanguard.WithCodec(newJSONCodec))
	if err != nil {
		return nil, err
	}
	s.doorOnce.Do(func() { s.door, s.doorClose, s.doorErr = newFrontDoor(s) })
	if s.doorErr != nil {
		return nil, s.doorErr
	}
	mux := http.NewServeMux()
	api := boundBody(normalContentType(connectByDefault(t)), refuseBody)
	mux.Handle("/"+stubbornv1.ControlService_ServiceDesc.ServiceName+"/", api)
	mux.Handle("/"+healthpb.Health_ServiceDesc.ServiceName+"/", api)
	// The model front doors: OpenAI's Chat Completions and Responses,
	// Anthropic's Messages (frontdoor.go).
	mux.Handle("POST /v1/chat/completions", boundBody(http.HandlerFunc(s.door.chatCompletions), refuseBodyAs(openAIDialect{})))
	mux.Handle("POST /v1/messages", boundBody(http.HandlerFunc(s.door.messages), refuseBodyAs(anthropicDialect{})))
	mux.Handle("POST /v1/responses", boundBody(http.HandlerFunc(s.door.responses), refuseBodyAs(responsesDialect{})))
	mux.Handle("GET /v1/models", http.HandlerFunc(s.door.models))
	s.routeDecide(mux) // the decision links of the notices (notify.go)
	// Everything else is the web console (index.html at "/", its assets;
	// 404 for the rest), which calls the API above on the same origin.
	mux.Handle("/", console.Handler())
	return checkHost(hosts, mux), nil
}

// NewHTTPServer returns an http.Server for h with the listener's bounds:
// HTTP/1.1 and HTTP/2 (over TLS, or cleartext h2c when the caller serves
// plaintext), header and idle timeouts (httpHeaderTimeout, and
// http2PingAfter and http2PingTimeout for HTTP/2), maxHTTPHeaderBytes.
// There is no ReadTimeout, a deadline for the whole request that a
// stream's connection would carry after its body is read: HTTPHandler
// sets the body's own deadline (httpBodyTimeout) and lifts it once the
// body is read. Streams (WatchRun, WatchRuns) have no write timeout.
func NewHTTPServer(h http.Handler) *http.Server {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetHTTP2(true)
	p.SetUnencryptedHTTP2(true)
	return &http.Server{
		Handler:           h,
		Protocols:         p,
		ReadHeaderTimeout: httpHeaderTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    maxHTTPHeaderBytes,
		HTTP2: &http.HTTP2Config{
			SendPingTimeout: http2PingAfter,
			PingTimeout:     http2PingTimeout,
		},
	}
}

// connectByDefault makes a POST of application/json or application/proto
// without a Connect-Protocol-Version header a Connect unary call, as
// connect-go's own handlers take it (the header is optional in the Connect
// protocol): vanguard would take it for REST, which this API does not map,
// and answer 404. So a plain curl -H 'Content-Type: application/json' works.
func connectByDefault(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.Header.Get("Connect-Protocol-Version") == "" {
			switch mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt {
			case "application/json", "application/proto":
				r.Header.Set("Connect-Protocol-Version", "1")
			}
		}
		next.ServeHTTP(w, r)
	})
}

// normalContentType writes the request's Content-Type in lower case (its
// parameters' values as sent): media types are case-insensitive (RFC 9110
// 8.3.1), and vanguard compares them as strings, answering 415 to
// application/JSON.
func normalContentType(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ct := r.Header.Get("Content-Type"); ct != "" {
			if mt, params, err := mime.ParseMediaType(ct); err == nil {
				if norm := mime.FormatMediaType(mt, params); norm != "" && norm != ct {
					r.Header.Set("Content-Type", norm)
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// boundBody refuses a request whose body is over maxHTTPBodyBytes, in the
// request's own protocol, with a code that tells clients not to send it
// again: INVALID_ARGUMENT, and HTTP 413 for a Connect unary call (or plain
// HTTP). Not RESOURCE_EXHAUSTED, which vanguard answers (HTTP 429), nor
// UNAVAILABLE, which an http.MaxBytesReader's error became (HTTP 503):
// Connect's and gRPC's clients, Stubborn's retry control and HTTP clients
// all take those two for "try again later", and would resend the same
// body forever. A Content-Length over the bound is refused before the body
// is read; otherwise the body is read whole first, up to the bound (every
// method of the API takes one request message, which vanguard buffers
// whole anyway), within httpBodyTimeout: a body that takes longer (short,
// or dribbled) is answered HTTP 408 and its connection (HTTP/1.1) or
// stream (HTTP/2) closed. The deadline is lifted once the body is read, so
// a stream's response is not cut. refuse writes each refusal (413, 408,
// 400) in the route's shape: the API's (refuseBody) or a model door's.
func boundBody(next http.Handler, refuse func(w http.ResponseWriter, r *http.Request, status int, msg string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > maxHTTPBodyBytes {
			w.Header().Set("Connection", "close") // the rest of the body is not read
			refuse(w, r, http.StatusRequestEntityTooLarge, bodyTooLarge)
			return
		}
		if r.Body != nil && r.Body != http.NoBody {
			rc := http.NewResponseController(w)
			// An error means the connection cannot have a deadline (not
			// net/http's): read it without one.
			_ = rc.SetReadDeadline(time.Now().Add(httpBodyTimeout))
			b, err := io.ReadAll(io.LimitReader(r.Body, maxHTTPBodyBytes+1))
			if err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) {
					w.Header().Set("Connection", "close")
					refuse(w, r, http.StatusRequestTimeout, fmt.Sprintf("reading the request body: not done in %v", httpBodyTimeout))
					return
				}
				// The client went away or broke the stream: nobody to
				// answer, but say so.
				refuse(w, r, http.StatusBadRequest, "reading the request body: "+err.Error())
				return
			}
			_ = rc.SetReadDeadline(time.Time{})
			if len(b) > maxHTTPBodyBytes {
				w.Header().Set("Connection", "close")
				refuse(w, r, http.StatusRequestEntityTooLarge, bodyTooLarge)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(b))
			r.ContentLength = int64(len(b))
		}
		next.ServeHTTP(w, r)
	})
}

// bodyTooLarge is what a request over maxHTTPBodyBytes is told.
var bodyTooLarge = fmt.Sprintf("request body over %d bytes (8 MiB): not retryable, send a smaller request", maxHTTPBodyBytes)

// refuseBody is the API's answer to a body boundBody refuses: over
// maxHTTPBodyBytes, apiTooLarge; else the status, in plain text.
func refuseBody(w http.ResponseWriter, r *http.Request, status int, msg string) {
	if status == http.StatusRequestEntityTooLarge {
		apiTooLarge(w, r)
		return
	}
	http.Error(w, msg, status)
}

// apiTooLarge answers a request over maxHTTPBodyBytes with INVALID_ARGUMENT in
// its protocol: gRPC and gRPC-Web as a trailers-only response (HTTP 200,
// grpc-status 3), a Connect stream as an end-of-stream message (HTTP 200),
// and a Connect unary call, or anything else, as HTTP 413 with a Connect
// error (connect clients read the code from the body). The connection is
// closed after: the rest of the body is not read.
func apiTooLarge(w http.ResponseWriter, r *http.Request) {
	msg := bodyTooLarge
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	h := w.Header()
	h.Set("Connection", "close")
	switch {
	case strings.HasPrefix(mt, "application/grpc"): // gRPC and gRPC-Web, every codec
		h.Set("Content-Type", mt)
		h.Set("Grpc-Status", strconv.Itoa(int(connect.CodeInvalidArgument)))
		h.Set("Grpc-Message", msg) // printable ASCII without %: sent as is
		w.WriteHeader(http.StatusOK)
	case strings.HasPrefix(mt, "application/connect+"):
		end, _ := json.Marshal(map[string]any{"error": map[string]string{"code": connect.CodeInvalidArgument.String(), "message": msg}})
		h.Set("Content-Type", mt)
		w.WriteHeader(http.StatusOK)
		var head [5]byte
		head[0] = 0x02 // end of stream
		binary.BigEndian.PutUint32(head[1:], uint32(len(end)))
		_, _ = w.Write(append(head[:], end...))
	default:
		body, _ := json.Marshal(map[string]string{"code": connect.CodeInvalidArgument.String(), "message": msg})
		h.Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusRequestEntityTooLarge)
		_, _ = w.Write(body)
	}
}

// jsonCodec is vanguard's JSON codec, strict and clear about bad input: an
// unknown field is an error (a misspelled option is not silently dropped),
// and a body that is not the message is INVALID_ARGUMENT naming the field
// (vanguard's own reports it as UNKNOWN). Unpopulated fields are written,
// so a browser sees every field of every answer.
type jsonCodec struct {
	*vanguard.JSONCodec
}

func newJSONCodec(res vanguard.TypeResolver) vanguard.Codec {
	c := vanguard.NewJSONCodec(res)
	c.UnmarshalOptions.DiscardUnknown = false
	return jsonCodec{c}
}

func (c jsonCodec) Unmarshal(b []byte, msg proto.Message) error {
	if err := c.JSONCodec.Unmarshal(b, msg); err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	return nil
}
