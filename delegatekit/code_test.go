package delegatekit_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc/codes"

	"github.com/stubbornhq/stubborn/delegatekit"
)

func TestCodeForHTTP(t *testing.T) {
	for status, want := range map[int]codes.Code{
		400: codes.InvalidArgument,
		401: codes.Unauthenticated,
		403: codes.PermissionDenied,
		404: codes.NotFound,
		409: codes.Aborted,
		429: codes.ResourceExhausted,
		499: codes.Canceled,
		501: codes.Unimplemented,
		503: codes.Unavailable,
		504: codes.DeadlineExceeded,
		402: codes.FailedPrecondition,
		405: codes.FailedPrecondition,
		408: codes.FailedPrecondition,
		412: codes.FailedPrecondition,
		422: codes.FailedPrecondition,
		425: codes.FailedPrecondition,
		500: codes.Internal,
		502: codes.Internal,
		505: codes.Internal,
		599: codes.Internal,
		200: codes.OK,
		204: codes.OK,
		299: codes.OK,
		0:   codes.Unknown,
		-1:  codes.Unknown,
		100: codes.Unknown,
		302: codes.Unknown,
		600: codes.Unknown,
	} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			assert.Equal(t, want, delegatekit.CodeForHTTP(status))
		})
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 10, 21, 7, 28, 0, 0, time.UTC)
	for _, tt := range []struct {
		value string
		want  time.Duration
		ok    bool
	}{
		{"120", 2 * time.Minute, true},
		{" 0 ", 0, true},
		{"007", 7 * time.Second, true},
		{"9223372036", 9223372036 * time.Second, true},
		{"9223372037", math.MaxInt64, true},
		{"99999999999999999999999", math.MaxInt64, true},
		{"Wed, 21 Oct 2026 07:28:30 GMT", 30 * time.Second, true},
		{"Wednesday, 21-Oct-26 07:29:00 GMT", time.Minute, true},
		{"Wed Oct 21 07:28:01 2026", time.Second, true},
		{"Wed, 21 Oct 2026 07:00:00 GMT", 0, true}, // past
		{"", 0, false},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"10s", 0, false},
		{"soon", 0, false},
		{"2026-10-21T07:28:30Z", 0, false},
	} {
		t.Run(tt.value, func(t *testing.T) {
			got, ok := delegatekit.ParseRetryAfter(tt.value, now)
			assert.Equal(t, tt.ok, ok)
			assert.Equal(t, tt.want, got)
		})
	}
}
