package delegatekit_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/stubbornhq/stubborn/delegatekit"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/delegates"
)

// TestErrorsAsStubbornReadsThem sends every helper's error over gRPC and
// reads it as Stubborn does: delegates.Classify, then controls.Transient.
func TestErrorsAsStubbornReadsThem(t *testing.T) {
	tests := []struct {
		name      string
		err       error
		code      codes.Code
		msg       string
		http      int
		hint      time.Duration
		hasHint   bool
		transient bool
	}{
		{name: "Transient", err: delegatekit.Transient("busy"), code: codes.Unavailable, msg: "busy", transient: true},
		{
			name: "RetryAfter", err: delegatekit.RetryAfter(1500*time.Millisecond, "busy"),
			code: codes.Unavailable, msg: "busy", hint: 1500 * time.Millisecond, hasHint: true, transient: true,
		},
		{
			name: "RetryAfter zero: retry at once", err: delegatekit.RetryAfter(0, "again"),
			code: codes.Unavailable, msg: "again", hint: 0, hasHint: true, transient: true,
		},
		{
			name: "RetryAfter negative: no retry", err: delegatekit.RetryAfter(-time.Millisecond, "never"),
			code: codes.Unavailable, msg: "never", hint: delegates.NoRetryHint, hasHint: true, transient: true,
		},
		{
			name: "DoNotRetry", err: delegatekit.DoNotRetry("quota spent"),
			code: codes.Unavailable, msg: "quota spent", hint: delegates.NoRetryHint, hasHint: true, transient: true,
		},
		{name: "Permanent", err: delegatekit.Permanent("bad input"), code: codes.FailedPrecondition, msg: "bad input"},
		{name: "Upstream 429", err: delegatekit.Upstream(429, "slow down"), code: codes.ResourceExhausted, msg: "slow down", http: 429, transient: true},
		{name: "Upstream 503", err: delegatekit.Upstream(503, "down"), code: codes.Unavailable, msg: "down", http: 503, transient: true},
		{name: "Upstream 500", err: delegatekit.Upstream(500, "oops"), code: codes.Internal, msg: "oops", http: 500, transient: true},
		{name: "Upstream 502", err: delegatekit.Upstream(502, "bad gw"), code: codes.Internal, msg: "bad gw", http: 502, transient: true},
		{name: "Upstream 408: transient by its HTTP status", err: delegatekit.Upstream(408, "timeout"), code: codes.FailedPrecondition, msg: "timeout", http: 408, transient: true},
		{name: "Upstream 425", err: delegatekit.Upstream(425, "too early"), code: codes.FailedPrecondition, msg: "too early", http: 425, transient: true},
		{name: "Upstream 404", err: delegatekit.Upstream(404, "no such page"), code: codes.NotFound, msg: "no such page", http: 404},
		{name: "Upstream 409: permanent by its HTTP status though ABORTED", err: delegatekit.Upstream(409, "conflict"), code: codes.Aborted, msg: "conflict", http: 409},
		{name: "Upstream 200 is still an error", err: delegatekit.Upstream(200, "empty body"), code: codes.Unknown, msg: "empty body", http: 200},
		{name: "Upstream 0: no detail", err: delegatekit.Upstream(0, "no status"), code: codes.Unknown, msg: "no status"},
		{name: "Upstream 700: no detail", err: delegatekit.Upstream(700, "odd"), code: codes.Unknown, msg: "odd"},
		{
			name: "UpstreamRetryAfter 429", err: delegatekit.UpstreamRetryAfter(429, 2*time.Second, "rate limited"),
			code: codes.ResourceExhausted, msg: "rate limited", http: 429, hint: 2 * time.Second, hasHint: true, transient: true,
		},
		{
			name: "UpstreamRetryAfter 404: the hint cannot make it transient", err: delegatekit.UpstreamRetryAfter(404, time.Second, "gone"),
			code: codes.NotFound, msg: "gone", http: 404, hint: time.Second, hasHint: true,
		},
		{
			name: "wrapped: the message is the whole text", err: fmt.Errorf("calling search: %w", delegatekit.RetryAfter(time.Second, "busy")),
			code: codes.Unavailable, msg: "calling search: busy", hint: time.Second, hasHint: true, transient: true,
		},
	}
	errs := make(map[string]error, len(tests))
	for _, tt := range tests {
		errs[tt.name] = tt.err
	}
	s := serve(t, func(_ context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.Result, error) {
		return nil, errs[req.GetBrief()]
	})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var trailer metadata.MD
			_, err := s.delegate.Execute(testCtx(t), req(tt.name), grpc.Trailer(&trailer))
			require.Error(t, err)
			ce := delegates.Classify(err, trailer)
			assert.Equal(t, tt.code, ce.Code)
			assert.Equal(t, tt.msg, ce.Message)
			assert.Equal(t, tt.http, ce.HTTPStatus)
			assert.Equal(t, tt.hasHint, ce.HasHint)
			assert.Equal(t, tt.hint, ce.RetryHint)
			assert.False(t, ce.NotSent)
			transient, why := controls.Transient(ce)
			assert.Equal(t, tt.transient, transient, why)
		})
	}
}

func TestErrorsAreErrors(t *testing.T) {
	for _, err := range []error{
		delegatekit.Transient(""), delegatekit.RetryAfter(0, ""), delegatekit.DoNotRetry(""),
		delegatekit.Permanent(""), delegatekit.Upstream(204, ""), delegatekit.UpstreamRetryAfter(200, 0, ""),
	} {
		assert.Error(t, err)
	}
}
