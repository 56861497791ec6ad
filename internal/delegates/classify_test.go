package delegates_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/delegates"
)

// withDetails returns a status error carrying details.
func withDetails(t *testing.T, c codes.Code, msg string, details ...protoadapt.MessageV1) error {
	t.Helper()
	st, err := status.New(c, msg).WithDetails(details...)
	require.NoError(t, err)
	return st.Err()
}

func upstream(code int32) *stubbornv1.UpstreamStatus {
	return &stubbornv1.UpstreamStatus{HttpStatus: code}
}

func retryIn(d time.Duration) *errdetails.RetryInfo {
	return &errdetails.RetryInfo{RetryDelay: durationpb.New(d)}
}

func pushbackMD(v string) metadata.MD { return metadata.Pairs(delegates.PushbackTrailer, v) }

func TestClassifyCodes(t *testing.T) {
	for c := codes.Canceled; c <= codes.Unauthenticated; c++ {
		t.Run(c.String(), func(t *testing.T) {
			got := delegates.Classify(status.Error(c, "boom"), nil)
			assert.Equal(t, &controls.CallError{Code: c, Message: "boom"}, got)
		})
	}
}

func TestClassify(t *testing.T) {
	const refused = `connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:1: connect: connection refused"`
	existing := &controls.CallError{Code: codes.NotFound, Message: "x", Refused: true}
	tests := []struct {
		name    string
		err     func(t *testing.T) error
		trailer metadata.MD
		want    *controls.CallError
	}{
		{name: "nil", err: func(*testing.T) error { return nil }, want: nil},
		{
			name: "already classified",
			err:  func(*testing.T) error { return fmt.Errorf("wrapped: %w", existing) },
			want: existing,
		},
		{
			name: "wrapped status",
			err:  func(*testing.T) error { return fmt.Errorf("call: %w", status.Error(codes.Aborted, "conflict")) },
			want: &controls.CallError{Code: codes.Aborted, Message: "conflict"},
		},
		{
			name: "context deadline",
			err:  func(*testing.T) error { return context.DeadlineExceeded },
			want: &controls.CallError{Code: codes.DeadlineExceeded, Message: "context deadline exceeded"},
		},
		{
			name: "context canceled",
			err:  func(*testing.T) error { return fmt.Errorf("x: %w", context.Canceled) },
			want: &controls.CallError{Code: codes.Canceled, Message: "x: context canceled"},
		},
		{
			name: "plain error",
			err:  func(*testing.T) error { return errors.New("weird") },
			want: &controls.CallError{Code: codes.Unknown, Message: "weird"},
		},
		{
			name: "status without message",
			err:  func(*testing.T) error { return status.Error(codes.Internal, "") },
			want: &controls.CallError{Code: codes.Internal},
		},

		// Upstream HTTP statuses are reported whatever the gRPC code.
		{
			name: "upstream 408",
			err:  func(t *testing.T) error { return withDetails(t, codes.Unknown, "timeout", upstream(408)) },
			want: &controls.CallError{Code: codes.Unknown, Message: "timeout", HTTPStatus: 408},
		},
		{
			name: "upstream 425",
			err:  func(t *testing.T) error { return withDetails(t, codes.FailedPrecondition, "too early", upstream(425)) },
			want: &controls.CallError{Code: codes.FailedPrecondition, Message: "too early", HTTPStatus: 425},
		},
		{
			name: "upstream 429",
			err:  func(t *testing.T) error { return withDetails(t, codes.ResourceExhausted, "slow down", upstream(429)) },
			want: &controls.CallError{Code: codes.ResourceExhausted, Message: "slow down", HTTPStatus: 429},
		},
		{
			name: "upstream 500",
			err:  func(t *testing.T) error { return withDetails(t, codes.Internal, "oops", upstream(500)) },
			want: &controls.CallError{Code: codes.Internal, Message: "oops", HTTPStatus: 500},
		},
		{
			name: "upstream 503",
			err:  func(t *testing.T) error { return withDetails(t, codes.Unavailable, "down", upstream(503)) },
			want: &controls.CallError{Code: codes.Unavailable, Message: "down", HTTPStatus: 503},
		},
		{
			name: "upstream 404",
			err:  func(t *testing.T) error { return withDetails(t, codes.NotFound, "no such page", upstream(404)) },
			want: &controls.CallError{Code: codes.NotFound, Message: "no such page", HTTPStatus: 404},
		},
		{
			name: "upstream 400",
			err:  func(t *testing.T) error { return withDetails(t, codes.Unavailable, "bad", upstream(400)) },
			want: &controls.CallError{Code: codes.Unavailable, Message: "bad", HTTPStatus: 400},
		},
		{
			name: "upstream 0 is ignored, first non-zero wins",
			err: func(t *testing.T) error {
				return withDetails(t, codes.Internal, "x", upstream(0), upstream(502), upstream(404))
			},
			want: &controls.CallError{Code: codes.Internal, Message: "x", HTTPStatus: 502},
		},

		// Retry hints.
		{
			name: "RetryInfo",
			err:  func(t *testing.T) error { return withDetails(t, codes.Unavailable, "later", retryIn(2*time.Second)) },
			want: &controls.CallError{Code: codes.Unavailable, Message: "later", HasHint: true, RetryHint: 2 * time.Second},
		},
		{
			name: "RetryInfo zero",
			err:  func(t *testing.T) error { return withDetails(t, codes.Unavailable, "now", retryIn(0)) },
			want: &controls.CallError{Code: codes.Unavailable, Message: "now", HasHint: true},
		},
		{
			name: "RetryInfo negative means do not retry",
			err:  func(t *testing.T) error { return withDetails(t, codes.Unavailable, "never", retryIn(-time.Second)) },
			want: &controls.CallError{Code: codes.Unavailable, Message: "never", HasHint: true, RetryHint: delegates.NoRetryHint},
		},
		{
			name: "RetryInfo without delay is no hint",
			err:  func(t *testing.T) error { return withDetails(t, codes.Unavailable, "x", &errdetails.RetryInfo{}) },
			want: &controls.CallError{Code: codes.Unavailable, Message: "x"},
		},
		{
			name: "RetryInfo and upstream together",
			err: func(t *testing.T) error {
				return withDetails(t, codes.ResourceExhausted, "quota", upstream(429), retryIn(1500*time.Millisecond))
			},
			want: &controls.CallError{Code: codes.ResourceExhausted, Message: "quota", HTTPStatus: 429, HasHint: true, RetryHint: 1500 * time.Millisecond},
		},
		{
			name:    "RetryInfo wins over pushback",
			err:     func(t *testing.T) error { return withDetails(t, codes.Unavailable, "x", retryIn(time.Second)) },
			trailer: pushbackMD("5000"),
			want:    &controls.CallError{Code: codes.Unavailable, Message: "x", HasHint: true, RetryHint: time.Second},
		},
		{
			name:    "pushback",
			err:     func(*testing.T) error { return status.Error(codes.Unavailable, "busy") },
			trailer: pushbackMD("250"),
			want:    &controls.CallError{Code: codes.Unavailable, Message: "busy", HasHint: true, RetryHint: 250 * time.Millisecond},
		},
		{
			name:    "pushback zero",
			err:     func(*testing.T) error { return status.Error(codes.Unavailable, "busy") },
			trailer: pushbackMD("0"),
			want:    &controls.CallError{Code: codes.Unavailable, Message: "busy", HasHint: true},
		},
		{
			name:    "pushback negative means do not retry",
			err:     func(*testing.T) error { return status.Error(codes.Unavailable, "busy") },
			trailer: pushbackMD("-1"),
			want:    &controls.CallError{Code: codes.Unavailable, Message: "busy", HasHint: true, RetryHint: delegates.NoRetryHint},
		},
		{
			name:    "pushback malformed means do not retry",
			err:     func(*testing.T) error { return status.Error(codes.Unavailable, "busy") },
			trailer: pushbackMD("soon"),
			want:    &controls.CallError{Code: codes.Unavailable, Message: "busy", HasHint: true, RetryHint: delegates.NoRetryHint},
		},
		{
			name:    "pushback empty means do not retry",
			err:     func(*testing.T) error { return status.Error(codes.Unavailable, "busy") },
			trailer: pushbackMD(""),
			want:    &controls.CallError{Code: codes.Unavailable, Message: "busy", HasHint: true, RetryHint: delegates.NoRetryHint},
		},
		{
			name:    "other trailers are no hint",
			err:     func(*testing.T) error { return status.Error(codes.Unavailable, "busy") },
			trailer: metadata.Pairs("x-other", "1"),
			want:    &controls.CallError{Code: codes.Unavailable, Message: "busy"},
		},

		// NotSent.
		{
			name: "connection refused",
			err:  func(*testing.T) error { return status.Error(codes.Unavailable, refused) },
			want: &controls.CallError{Code: codes.Unavailable, Message: refused, NotSent: true},
		},
		{
			name: "dial timeout",
			err: func(*testing.T) error {
				return status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp 10.0.0.1:80: i/o timeout"`)
			},
			want: &controls.CallError{Code: codes.Unavailable, NotSent: true,
				Message: `connection error: desc = "transport: Error while dialing: dial tcp 10.0.0.1:80: i/o timeout"`},
		},
		{
			name: "name resolution",
			err: func(*testing.T) error {
				return status.Error(codes.Unavailable, "name resolver error: produced zero addresses")
			},
			want: &controls.CallError{Code: codes.Unavailable, Message: "name resolver error: produced zero addresses", NotSent: true},
		},
		{
			name: "dns lookup",
			err: func(*testing.T) error {
				return status.Error(codes.Unavailable, "last resolver error: dns: A record lookup error: lookup nope.invalid: no such host")
			},
			want: &controls.CallError{Code: codes.Unavailable, NotSent: true,
				Message: "last resolver error: dns: A record lookup error: lookup nope.invalid: no such host"},
		},
		{
			name: "deadline while waiting for a connection",
			err: func(*testing.T) error {
				return status.Error(codes.DeadlineExceeded, "context deadline exceeded while waiting for connections to become ready")
			},
			want: &controls.CallError{Code: codes.DeadlineExceeded, NotSent: true,
				Message: "context deadline exceeded while waiting for connections to become ready"},
		},
		{
			name: "refused wording under another code is sent",
			err:  func(*testing.T) error { return status.Error(codes.Internal, refused) },
			want: &controls.CallError{Code: codes.Internal, Message: refused},
		},
		{
			name: "connection reset after sending is sent",
			err: func(*testing.T) error {
				return status.Error(codes.Unavailable, "error reading from server: read tcp 127.0.0.1:5->127.0.0.1:6: read: connection reset by peer")
			},
			want: &controls.CallError{Code: codes.Unavailable,
				Message: "error reading from server: read tcp 127.0.0.1:5->127.0.0.1:6: read: connection reset by peer"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, delegates.Classify(tt.err(t), tt.trailer))
		})
	}
}
