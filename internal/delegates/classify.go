package delegates

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
)

// pushbackTrailer is the trailer a server sets to tell a client how long to
// wait before retrying (gRFC A6), in milliseconds.
const pushbackTrailer = "grpc-retry-pushback-ms"

// NoRetryHint is the RetryHint of a CallError whose delegate said not to retry
// at all: a negative or malformed grpc-retry-pushback-ms trailer (gRFC A6
// says such a pushback means "do not retry"), or a negative
// google.rpc.RetryInfo delay. HasHint is true with it, so the retry control
// can end retries with the reason "server pushback says do not retry". Any
// negative RetryHint means the same.
const NoRetryHint time.Duration = -1

// notSentMarkers are pieces of the messages grpc-go's client writes when an
// RPC failed before it was handed to any connection: dialing failed, the
// target's name did not resolve, or it resolved to nothing. An RPC that ends
// so never left this process. See [Classify].
var notSentMarkers = []string{
	// Dial failed: "connection error: desc = \"transport: Error while
	// dialing: dial tcp 127.0.0.1:1: connect: connection refused\"" (also
	// "no route to host", a dial timeout, a missing unix socket, …).
	"connection refused",
	"Error while dialing",
	// TLS handshake failed before any stream was opened.
	"authentication handshake failed",
	// Name resolution: "name resolver error: produced zero addresses",
	// "last resolver error: dns: A record lookup error: … no such host".
	"name resolver error",
	"last resolver error",
	"produced zero addresses",
	"no such host",
	// A load balancer with no addresses to pick from.
	"no children to pick from",
}

// waitingForConnection is the tail grpc-go puts on a DEADLINE_EXCEEDED or
// CANCELLED status when the RPC's context ended while it was still waiting
// for a connection: "context deadline exceeded while waiting for connections
// to become ready".
const waitingForConnection = "while waiting for connections to become ready"

// Classify turns the error of a failed Execute call (and the call's trailer,
// which may be nil) into a *controls.CallError. It returns nil for a nil err
// and err itself when err already is a *controls.CallError. It does not look
// at any caller context: Pool.Call returns the run's ctx.Err() instead of
// calling Classify when the run's context is done.
//
//   - Code and Message are the gRPC status code and message (of the
//     innermost status when err wraps one). A bare context
//     error becomes DEADLINE_EXCEEDED or CANCELLED; any other non-status
//     error becomes UNKNOWN with err.Error() as its message.
//   - HTTPStatus is the first non-zero stubborn.v1.UpstreamStatus detail.
//   - RetryHint/HasHint come from a google.rpc.RetryInfo detail with a
//     retry_delay (an unset delay is no hint) or, when there is none, from
//     the grpc-retry-pushback-ms trailer. A negative delay, or a negative or
//     unparseable pushback, gives HasHint with RetryHint = NoRetryHint.
//   - NotSent is a heuristic over grpc-go's own wording, which is the only
//     signal grpc-go exposes (it tracks "never sent" internally for its
//     transparent retries but does not report it): the status is UNAVAILABLE
//     and its message contains one of the markers grpc-go uses for failures
//     before any connection carried the RPC: "connection refused", "Error
//     while dialing", "authentication handshake failed", a name resolver
//     failure ("name resolver error", "last resolver error", "produced zero
//     addresses", "no such host") or "no children to pick from"; or the
//     status is DEADLINE_EXCEEDED/CANCELLED "… while waiting for connections
//     to become ready". A delegate could put the same words in a status of
//     its own (say, relaying its upstream's "connection refused"), so
//     Pool.Call vetoes NotSent when the call did get a connection to the
//     delegate (grpc.Peer was set).
func Classify(err error, trailer metadata.MD) *controls.CallError {
	if err == nil {
		return nil
	}
	var ce *controls.CallError
	if errors.As(err, &ce) {
		return ce
	}
	// The innermost status's own message, even when err wraps it (where
	// status.FromError would return the whole wrapped text).
	var st *status.Status
	var gs interface{ GRPCStatus() *status.Status }
	if errors.As(err, &gs) {
		st = gs.GRPCStatus()
	}
	if st == nil {
		st = status.FromContextError(err)
	}
	// A status message is whatever bytes the delegate sent; the API's
	// strings must be UTF-8 to be encoded.
	ce = &controls.CallError{Code: st.Code(), Message: strings.ToValidUTF8(st.Message(), "\uFFFD")}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *stubbornv1.UpstreamStatus:
			if ce.HTTPStatus == 0 && d.GetHttpStatus() != 0 {
				ce.HTTPStatus = int(d.GetHttpStatus())
			}
		case *errdetails.RetryInfo:
			if !ce.HasHint && d.GetRetryDelay() != nil {
				ce.HasHint = true
				ce.RetryHint = d.GetRetryDelay().AsDuration()
				if ce.RetryHint < 0 {
					ce.RetryHint = NoRetryHint
				}
			}
		}
	}
	if !ce.HasHint {
		if v := trailer.Get(pushbackTrailer); len(v) > 0 {
			ce.HasHint = true
			ce.RetryHint = pushback(v[0])
		}
	}
	ce.NotSent = notSent(st.Code(), st.Message())
	return ce
}

// pushback parses a grpc-retry-pushback-ms value.
func pushback(v string) time.Duration {
	ms, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || ms < 0 {
		return NoRetryHint
	}
	if ms > math.MaxInt64/int64(time.Millisecond) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(ms) * time.Millisecond
}

// notSent applies the heuristic documented on Classify.
func notSent(code codes.Code, msg string) bool {
	switch code {
	case codes.Unavailable:
		for _, m := range notSentMarkers {
			if strings.Contains(msg, m) {
				return true
			}
		}
	case codes.DeadlineExceeded, codes.Canceled:
		return strings.Contains(msg, waitingForConnection)
	}
	return false
}
