package server

import (
	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"mime"
	"net/http"
	"time"

	"connectrpc.com/vanguard"
	"connectrpc.com/vanguard/vanguardgrpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/stubbornhq/stubborn/console"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Bounds of the HTTP listener, below what the gRPC server behind it
// accepts: a request's headers become its metadata (gRPC's own limit is
// 8 KiB of it by default on a native connection; browsers send more), and a
// JSON body of a 4 MiB message is larger than the message.
const (
	// MaxHTTPHeaderBytes bounds a request's headers.
	MaxHTTPHeaderBytes = 16 << 10
	// MaxHTTPBodyBytes bounds a request's body.
	MaxHTTPBodyBytes = 8 << 20
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
func (s *Stubborn) HTTPHandler() (http.Handler, error) {
	t, err := vanguardgrpc.NewTranscoder(s.GRPC,
		vanguard.WithDefaultServiceOptions(vanguard.WithMaxMessageBufferBytes(MaxHTTPBodyBytes)),
		vanguard.WithCodec(newJSONCodec))
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	api := http.MaxBytesHandler(connectByDefault(t), MaxHTTPBodyBytes)
	mux.Handle("/"+stubbornv1.ControlService_ServiceDesc.ServiceName+"/", api)
	mux.Handle("/"+healthpb.Health_ServiceDesc.ServiceName+"/", api)
	// Everything else is the web console (index.html at "/", its assets;
	// 404 for the rest), which calls the API above on the same origin.
	mux.Handle("/", console.Handler())
	return mux, nil
}

// NewHTTPServer returns an http.Server for h with the listener's bounds:
// HTTP/1.1 and HTTP/2 (over TLS, or cleartext h2c when the caller serves
// plaintext), header and idle timeouts, MaxHTTPHeaderBytes. Streams
// (WatchRun) have no write timeout.
func NewHTTPServer(h http.Handler) *http.Server {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetHTTP2(true)
	p.SetUnencryptedHTTP2(true)
	return &http.Server{
		Handler:           h,
		Protocols:         p,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    MaxHTTPHeaderBytes,
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
