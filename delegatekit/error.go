package delegatekit

import (
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// The errors below are gRPC status errors: return them from a Func as they
// are, or wrapped: fmt.Errorf("search: %w", Transient("busy")) reaches
// Stubborn as Transient("search: busy"). Each doc comment says what
// Stubborn's retry control makes of it. A retry also needs the delegate to be declared idempotent or
// read_only in Stubborn's registry, unless the call never reached it.

// Transient is a failure that a later attempt may not have: UNAVAILABLE with
// msg. The retry control retries it after its own backoff (full jitter, up to
// the run's max_wait).
func Transient(msg string) error {
	return status.Error(codes.Unavailable, msg)
}

// RetryAfter is a transient failure with a hint: UNAVAILABLE with msg and a
// google.rpc.RetryInfo of d. The retry control waits d before the next
// attempt, instead of its backoff; a d over the run's max_wait ends the
// retries instead. d = 0 asks for a retry at once; a negative d asks for no
// retry, like [DoNotRetry].
func RetryAfter(d time.Duration, msg string) error {
	return withDetails(codes.Unavailable, msg, retryInfo(d))
}

// DoNotRetry is a failure of a transient kind that must not be retried all
// the same (a quota spent for the day, a circuit breaker open): UNAVAILABLE
// with msg and a negative google.rpc.RetryInfo. The retry control ends the
// run's retries with "retry hint … asks not to retry".
func DoNotRetry(msg string) error {
	return RetryAfter(-time.Second, msg)
}

// Permanent is a failure that no retry can fix: FAILED_PRECONDITION with
// msg. The retry control does not retry it ("not transient:
// FAILED_PRECONDITION").
func Permanent(msg string) error {
	return status.Error(codes.FailedPrecondition, msg)
}

// Upstream is a failure of the service behind the delegate, which answered
// HTTP status httpStatus: the code [CodeForHTTP] gives (UNKNOWN where that is
// OK, for a 2xx) with msg and a stubborn.v1.UpstreamStatus detail of
// httpStatus. The retry control retries 408, 425, 429 and 5xx after its
// backoff and no other 4xx, whatever the code. A status outside 100–599 is
// left out of the detail (the code still applies).
func Upstream(httpStatus int, msg string) error {
	return withDetails(upstreamCode(httpStatus), msg, upstreamStatus(httpStatus)...)
}

// UpstreamRetryAfter is [Upstream] with a hint: the upstream said when to try
// again (an HTTP Retry-After header, see [ParseRetryAfter]). A retry of a
// transient status (429, 503…) waits d instead of the backoff, as with
// [RetryAfter]; a permanent status (404…) is not retried whatever d says.
func UpstreamRetryAfter(httpStatus int, d time.Duration, msg string) error {
	return withDetails(upstreamCode(httpStatus), msg, append(upstreamStatus(httpStatus), retryInfo(d))...)
}

func retryInfo(d time.Duration) protoadapt.MessageV1 {
	return &errdetails.RetryInfo{RetryDelay: durationpb.New(d)}
}

func upstreamStatus(httpStatus int) []protoadapt.MessageV1 {
	if httpStatus < 100 || httpStatus > 599 {
		return nil
	}
	return []protoadapt.MessageV1{&stubbornv1.UpstreamStatus{HttpStatus: int32(httpStatus)}}
}

// upstreamCode is CodeForHTTP, but never OK: an error must be one.
func upstreamCode(httpStatus int) codes.Code {
	if c := CodeForHTTP(httpStatus); c != codes.OK {
		return c
	}
	return codes.Unknown
}

// withDetails is the status error code, msg with details attached.
func withDetails(code codes.Code, msg string, details ...protoadapt.MessageV1) error {
	st, err := status.New(code, msg).WithDetails(details...)
	if err != nil {
		// Only a detail that fails to marshal gets here, and these are
		// plain well-formed messages; the status alone is still right.
		return status.Error(code, msg)
	}
	return st.Err()
}
