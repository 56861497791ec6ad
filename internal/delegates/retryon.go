package delegates

import (
	"fmt"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// RetryOn is a delegate's retry_on: the failures a retry may fix, in place
// of the retry control's rules (see stubbornv1.RetryOn).
type RetryOn struct {
	// GRPCCodes are canonical gRPC code names, any case ("unavailable").
	GRPCCodes []string `yaml:"grpc_codes,omitempty"`
	// HTTPStatuses are upstream HTTP statuses, 400 to 599.
	HTTPStatuses []int32 `yaml:"http_statuses,omitempty"`
}

// Proto returns r as the API's message.
func (r *RetryOn) Proto() *stubbornv1.RetryOn {
	return &stubbornv1.RetryOn{GrpcCodes: r.GRPCCodes, HttpStatuses: r.HTTPStatuses}
}

// Bounds of a retry_on's lists.
const (
	maxRetryOnCodes    = 16
	maxRetryOnStatuses = 64
)

// CheckRetryOn returns what is wrong with a retry_on, each problem naming
// its field under field (for example "retry.retry_on"), for the registry
// and for requests alike.
func CheckRetryOn(field string, r *stubbornv1.RetryOn) []string {
	var msgs []string
	codes := r.GetGrpcCodes()
	if len(codes) > maxRetryOnCodes {
		msgs = append(msgs, fmt.Sprintf("%s.grpc_codes: at most %d, got %d", field, maxRetryOnCodes, len(codes)))
		codes = codes[:maxRetryOnCodes]
	}
	seen := map[string]bool{}
	for i, c := range codes {
		u := strings.ToUpper(c)
		v, ok := code.Code_value[u]
		switch {
		case !ok || len(c) > 32:
			msgs = append(msgs, fmt.Sprintf("%s.grpc_codes[%d]: %q is not a gRPC code name (UNAVAILABLE, RESOURCE_EXHAUSTED …)", field, i, cut(c, 32)))
		case v == 0:
			msgs = append(msgs, fmt.Sprintf("%s.grpc_codes[%d]: OK is not a failure", field, i))
		case seen[u]:
			msgs = append(msgs, fmt.Sprintf("%s.grpc_codes[%d]: %s is listed twice", field, i, u))
		}
		seen[u] = true
	}
	statuses := r.GetHttpStatuses()
	if len(statuses) > maxRetryOnStatuses {
		msgs = append(msgs, fmt.Sprintf("%s.http_statuses: at most %d, got %d", field, maxRetryOnStatuses, len(statuses)))
		statuses = statuses[:maxRetryOnStatuses]
	}
	seenStatus := map[int32]bool{}
	for i, s := range statuses {
		switch {
		case s < 400 || s > 599:
			msgs = append(msgs, fmt.Sprintf("%s.http_statuses[%d]: must be between 400 and 599, got %d", field, i, s))
		case seenStatus[s]:
			msgs = append(msgs, fmt.Sprintf("%s.http_statuses[%d]: %d is listed twice", field, i, s))
		}
		seenStatus[s] = true
	}
	return msgs
}

func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Bounds of the guards' settings.
const (
	maxMaxConcurrent     = 1 << 20
	maxRequestsPerMinute = 1 << 30
	maxTokensPerMinute   = 1 << 50
	maxMaxQueueWait      = time.Hour
)

// checkGuards returns what is wrong with d's guards' settings.
func (d Delegate) checkGuards() []string {
	var msgs []string
	if d.CircuitBreaker != nil {
		msgs = append(msgs, d.CircuitBreaker.check()...)
	}
	if d.MaxConcurrent < 0 || d.MaxConcurrent > maxMaxConcurrent {
		msgs = append(msgs, fmt.Sprintf("max_concurrent: must be between 0 and %d, got %d", maxMaxConcurrent, d.MaxConcurrent))
	}
	if d.RequestsPerMinute < 0 || d.RequestsPerMinute > maxRequestsPerMinute {
		msgs = append(msgs, fmt.Sprintf("requests_per_minute: must be between 0 and %d, got %d", maxRequestsPerMinute, d.RequestsPerMinute))
	}
	if d.TokensPerMinute < 0 || d.TokensPerMinute > maxTokensPerMinute {
		msgs = append(msgs, fmt.Sprintf("tokens_per_minute: must be between 0 and %d, got %d", int64(maxTokensPerMinute), d.TokensPerMinute))
	}
	if w := d.MaxQueueWait; w != nil && (*w < 0 || w.Std() > maxMaxQueueWait) {
		msgs = append(msgs, fmt.Sprintf("max_queue_wait: must be between 0 and %s, got %s", maxMaxQueueWait, w))
	}
	if d.RetryOn != nil {
		msgs = append(msgs, CheckRetryOn("retry_on", d.RetryOn.Proto())...)
	}
	return msgs
}
