package delegatekit

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
)

// httpCodes are the HTTP statuses google/rpc/code.proto names for a code.
var httpCodes = map[int]codes.Code{
	http.StatusBadRequest:         codes.InvalidArgument,
	http.StatusUnauthorized:       codes.Unauthenticated,
	http.StatusForbidden:          codes.PermissionDenied,
	http.StatusNotFound:           codes.NotFound,
	http.StatusConflict:           codes.Aborted,
	http.StatusTooManyRequests:    codes.ResourceExhausted,
	499:                           codes.Canceled, // Client Closed Request
	http.StatusNotImplemented:     codes.Unimplemented,
	http.StatusServiceUnavailable: codes.Unavailable,
	http.StatusGatewayTimeout:     codes.DeadlineExceeded,
}

// CodeForHTTP is the gRPC code for an HTTP status, as google/rpc/code.proto
// maps them (the inverse of its HTTP Mapping lines): 400 INVALID_ARGUMENT,
// 401 UNAUTHENTICATED, 403 PERMISSION_DENIED, 404 NOT_FOUND, 409 ABORTED,
// 429 RESOURCE_EXHAUSTED, 499 CANCELLED, 501 UNIMPLEMENTED, 503 UNAVAILABLE,
// 504 DEADLINE_EXCEEDED; any other 4xx FAILED_PRECONDITION, any other 5xx
// INTERNAL; 2xx OK; anything else (1xx, 3xx, out of range) UNKNOWN.
//
// Stubborn's retry control decides on the HTTP status itself when a failure
// carries one ([Upstream]): the code is for everything else that reads the
// status (logs, metrics, other gRPC clients).
func CodeForHTTP(httpStatus int) codes.Code {
	if c, ok := httpCodes[httpStatus]; ok {
		return c
	}
	switch {
	case httpStatus >= 200 && httpStatus <= 299:
		return codes.OK
	case httpStatus >= 400 && httpStatus <= 499:
		return codes.FailedPrecondition
	case httpStatus >= 500 && httpStatus <= 599:
		return codes.Internal
	}
	return codes.Unknown
}

// ParseRetryAfter reads the value of an HTTP Retry-After header (RFC 9110,
// section 10.2.3) as a wait from now: a number of seconds ("120"), or an
// HTTP-date ("Wed, 21 Oct 2026 07:28:00 GMT", or the obsolete RFC 850 and
// asctime forms) less now, and zero for a date already past. ok is false for
// an empty or malformed value (a negative or fractional number of seconds
// included), which gives no hint. A number of seconds too large for a
// time.Duration gives the largest one.
func ParseRetryAfter(value string, now time.Time) (d time.Duration, ok bool) {
	value = strings.TrimSpace(value)
	if value == "" {
		return 0, false
	}
	if value[0] >= '0' && value[0] <= '9' {
		secs, err := strconv.ParseUint(value, 10, 64)
		if err != nil {
			return parseHugeSeconds(value)
		}
		if secs > math.MaxInt64/uint64(time.Second) {
			return math.MaxInt64, true
		}
		return time.Duration(secs) * time.Second, true
	}
	t, err := http.ParseTime(value)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

// parseHugeSeconds accepts a run of digits too long for a uint64 as the
// largest wait, and rejects anything else ("1.5", "10s").
func parseHugeSeconds(value string) (time.Duration, bool) {
	for _, r := range value {
		if r < '0' || r > '9' {
			return 0, false
		}
	}
	return math.MaxInt64, true
}
