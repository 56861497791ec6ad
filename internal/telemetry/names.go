package telemetry

import (
	"strings"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	rpccode "google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/grpc/codes"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
)

// scopeName is the instrumentation scope of Stubborn's own spans and
// metrics.
const scopeName = "github.com/stubbornhq/stubborn/internal/telemetry"

// Attribute keys of Stubborn's spans, span events and metrics. Where an
// OpenTelemetry semantic convention exists (error.type,
// rpc.response.status_code) it is used instead.
const (
	// runIDKey is the run's id (spans and logs only: unbounded).
	runIDKey = attribute.Key("stubborn.run.id")
	// controlKey is the run's control: retry, retry_with_learning,
	// fallback_chain or race.
	controlKey = attribute.Key("stubborn.control")
	// runStatusKey is how a run ended: succeeded, exhausted, failed or
	// cancelled.
	runStatusKey = attribute.Key("stubborn.run.status")
	// runAttemptsKey is ControlState.attempts when the run ended.
	runAttemptsKey = attribute.Key("stubborn.run.attempts")
	// runWinnerKey is the delegate whose result won; absent when none did.
	runWinnerKey = attribute.Key("stubborn.run.winner")
	// runResumedKey says the run was taken over after a restart.
	runResumedKey = attribute.Key("stubborn.run.resumed")
	// delegateKey is a delegate's (or preset's) registry name.
	delegateKey = attribute.Key("stubborn.delegate")
	// attemptNumberKey is the run-wide attempt number (Attempt.number).
	attemptNumberKey = attribute.Key("stubborn.attempt.number")
	// attemptOutcomeKey is how an attempt ended: succeeded, error, rejected,
	// cancelled, skipped, interrupted (or unfinished when the run ended
	// first).
	attemptOutcomeKey = attribute.Key("stubborn.attempt.outcome")
	// attemptTransientKey says a failed attempt's error is one a retry may
	// fix (controls.Transient); false for every other failure.
	attemptTransientKey = attribute.Key("stubborn.attempt.transient")
	// upstreamHTTPStatusKey is the UpstreamStatus a delegate attached.
	upstreamHTTPStatusKey = attribute.Key("stubborn.upstream.http_status")
	// pathKey is where a nested preset's attempt or event sits
	// (Attempt.path); absent for the run's own control.
	pathKey = attribute.Key("stubborn.path")
	// reasonKey is why a retry was suppressed, one of the reason* values.
	reasonKey = attribute.Key("stubborn.reason")
	// backoffFromHintKey says a backoff wait came from the delegate's hint.
	backoffFromHintKey = attribute.Key("stubborn.backoff.from_hint")
	// breakerStateKey is a circuit breaker's new state: closed, open,
	// half-open.
	breakerStateKey = attribute.Key("stubborn.breaker.state")
	// breakerScopeKey is fleet on a change of the fleet-wide breaker (as
	// this server saw it); absent for this server's own breaker.
	breakerScopeKey = attribute.Key("stubborn.breaker.scope")
	// breakerOpenedByKey names the replica that opened the fleet's breaker
	// (fleet scope only).
	breakerOpenedByKey = attribute.Key("stubborn.breaker.opened_by")
	// tenantKey is the tenant whose run it is (ControlState.tenant): empty
	// for the default tenant.
	tenantKey = attribute.Key("stubborn.tenant")
	// attemptCostKey is what an attempt's call cost (Attempt.cost), in the
	// unit of the delegates' prices; absent when it cost nothing.
	attemptCostKey = attribute.Key("stubborn.attempt.cost")
	// guardKey names the guard that refused a call: circuit_breaker,
	// bulkhead, rate_limit.
	guardKey = attribute.Key("stubborn.guard")
)

// Values of reasonKey: why no retry followed a failure (from
// FailureRecord.not_retried_code; see suppressedReason).
const (
	reasonBudget        = "budget"         // the retry budget is exhausted
	reasonNotIdempotent = "not_idempotent" // the delegate is neither idempotent nor read_only (an interrupted attempt's too)
	reasonHintOverCap   = "hint_over_cap"  // the delegate's retry hint exceeds max_wait
	reasonHintNoRetry   = "hint_no_retry"  // the delegate's hint says not to retry
	reasonNotTransient  = "not_transient"  // the error is not one a retry may fix (or Stubborn's middleware refused the call)
	reasonRejected      = "rejected"       // the failure criteria rejected an answer; only errors are retried
	reasonExhausted     = "exhausted"      // the round's retries ran out
	reasonDeadline      = "deadline"       // the wait would end after the run's deadline
	reasonOther         = "other"          // anything else
)

// suppressedReason classifies why no retry followed a failure, a
// FailureRecord's not_retried_code and not_retried_reason, into one of the
// fixed reason* values, so that metrics never carry free text. It returns ""
// when a retry followed (no code and no words).
//
// The code decides. A record without one was made by a release before
// not_retried_code existed (a journal a server resumes, or replays to a
// watcher), and its words are classified instead, by the substring rules
// below: they follow the words those releases wrote, so keep them as long
// as such journals may be around.
func suppressedReason(code stubbornv1.NotRetried, reason string) string {
	switch code {
	case stubbornv1.NotRetried_NOT_RETRIED_UNSPECIFIED:
		return suppressedByWords(reason)
	case stubbornv1.NotRetried_NOT_RETRIED_NOT_TRANSIENT,
		stubbornv1.NotRetried_NOT_RETRIED_REFUSED: // its words always began "not transient"
		return reasonNotTransient
	case stubbornv1.NotRetried_NOT_RETRIED_REJECTED:
		return reasonRejected
	case stubbornv1.NotRetried_NOT_RETRIED_NOT_IDEMPOTENT,
		stubbornv1.NotRetried_NOT_RETRIED_INTERRUPTED_NOT_IDEMPOTENT:
		return reasonNotIdempotent
	case stubbornv1.NotRetried_NOT_RETRIED_HINT_NO_RETRY:
		return reasonHintNoRetry
	case stubbornv1.NotRetried_NOT_RETRIED_HINT_OVER_CAP:
		return reasonHintOverCap
	case stubbornv1.NotRetried_NOT_RETRIED_EXHAUSTED:
		return reasonExhausted
	case stubbornv1.NotRetried_NOT_RETRIED_DEADLINE:
		return reasonDeadline
	case stubbornv1.NotRetried_NOT_RETRIED_BUDGET:
		return reasonBudget
	}
	return reasonOther // NOT_RETRIED_OTHER, or a value newer than this server
}

// suppressedByWords classifies a not_retried_reason without a code, as
// every release before not_retried_code did: "" for "".
func suppressedByWords(s string) string {
	switch {
	case s == "":
		return ""
	case strings.Contains(s, "failure criteria rejected"):
		return reasonRejected
	case strings.HasPrefix(s, "not transient"):
		return reasonNotTransient
	case strings.Contains(s, "neither idempotent nor read_only"), strings.Contains(s, "not idempotent"):
		return reasonNotIdempotent
	case strings.HasPrefix(s, "retry hint") && strings.Contains(s, "exceeds"):
		return reasonHintOverCap
	case strings.HasPrefix(s, "retry hint"), strings.Contains(s, "pushback"):
		return reasonHintNoRetry
	case strings.Contains(s, "budget"):
		return reasonBudget
	case strings.HasPrefix(s, "retries exhausted"):
		return reasonExhausted
	case strings.Contains(s, "deadline"):
		return reasonDeadline
	}
	return reasonOther
}

// decisionReason classifies why a run asks for a decision (a
// decision_requested event's reason_code and reason) as suppressedReason
// does: the retries that ran out. An event without a code, recorded by a
// release before reason_code, is classified by its words.
func decisionReason(code stubbornv1.StatusReason, reason string) string {
	switch code {
	case stubbornv1.StatusReason_STATUS_REASON_UNSPECIFIED:
		return suppressedByWords(reason)
	case stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED:
		return reasonExhausted
	}
	return reasonOther
}

// controlName is the name of a spec's control as attributes carry it
// (controls.ControlName).
func controlName(spec *stubbornv1.ControlSpec) string { return controls.ControlName(spec) }

// enumNames maps each value of a proto enum to its name without prefix, in
// lower case (RUN_STATUS_SUCCEEDED → succeeded), computed once.
func enumNames(names map[int32]string, prefix string) map[int32]string {
	out := make(map[int32]string, len(names))
	for v, n := range names {
		out[v] = strings.ToLower(strings.TrimPrefix(n, prefix))
	}
	return out
}

var (
	statusNames   = enumNames(stubbornv1.RunStatus_name, "RUN_STATUS_")
	outcomeNames  = enumNames(stubbornv1.AttemptOutcome_name, "ATTEMPT_OUTCOME_")
	decisionNames = enumNames(stubbornv1.Decision_name, "DECISION_")
)

// statusName is a run status as attributes carry it (succeeded, failed, …).
func statusName(s stubbornv1.RunStatus) string {
	if n, ok := statusNames[int32(s)]; ok {
		return n
	}
	return "unknown"
}

// outcomeName is an attempt outcome as attributes carry it (succeeded,
// error, …).
func outcomeName(o stubbornv1.AttemptOutcome) string {
	if o == stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_UNSPECIFIED {
		return "unfinished"
	}
	if n, ok := outcomeNames[int32(o)]; ok {
		return n
	}
	return "unknown"
}

func decisionName(d stubbornv1.Decision) string {
	if n, ok := decisionNames[int32(d)]; ok {
		return n
	}
	return "unknown"
}

// codeName is a gRPC code's canonical name (google.rpc.Code), as
// rpc.response.status_code and error.type carry them.
func codeName(c codes.Code) string {
	if n, ok := rpccode.Code_name[int32(c)]; ok {
		return n
	}
	return "CODE_" + c.String()
}

// errorAttrs are the semantic-convention attributes of a failed attempt.
func errorAttrs(c codes.Code) []attribute.KeyValue {
	n := codeName(c)
	return []attribute.KeyValue{semconv.ErrorTypeKey.String(n), semconv.RPCResponseStatusCode(n)}
}
