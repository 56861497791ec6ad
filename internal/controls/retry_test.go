package controls_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

const retryBrief = "fetch the invoice"

// The retry tests use helpers_test.go's shared names (succeeded, failed,
// cancelled, unavailable, recv, failureEvents) and their own, prefixed to
// stay clear of the other controls' tests in this package.
var (
	declIdempotent   = controls.DelegateInfo{Idempotent: true}
	declReadOnly     = controls.DelegateInfo{ReadOnly: true}
	retryUnavailable = unavailable("connection reset")
)

const (
	onExhaustedAsk  = stubbornv1.OnExhausted_ON_EXHAUSTED_ASK
	onExhaustedFail = stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL
)

// The codes of why a run ended (Outcome.Code) and why a failure was not
// retried (FailureRecord.not_retried_code), short.
const (
	endOK           = stubbornv1.StatusReason_STATUS_REASON_UNSPECIFIED
	endNotRetried   = stubbornv1.StatusReason_STATUS_REASON_NOT_RETRIED
	endExhausted    = stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED
	endPastDeadline = stubbornv1.StatusReason_STATUS_REASON_RETRY_PAST_DEADLINE
	endDecisionFail = stubbornv1.StatusReason_STATUS_REASON_DECISION_FAIL
	endNoDecision   = stubbornv1.StatusReason_STATUS_REASON_DECISION_TIMEOUT
	endRunTimeout   = stubbornv1.StatusReason_STATUS_REASON_RUN_TIMEOUT
	endCancelled    = stubbornv1.StatusReason_STATUS_REASON_CANCELLED

	nrNone          = stubbornv1.NotRetried_NOT_RETRIED_UNSPECIFIED
	nrNotTransient  = stubbornv1.NotRetried_NOT_RETRIED_NOT_TRANSIENT
	nrRefused       = stubbornv1.NotRetried_NOT_RETRIED_REFUSED
	nrRejected      = stubbornv1.NotRetried_NOT_RETRIED_REJECTED
	nrNotIdempotent = stubbornv1.NotRetried_NOT_RETRIED_NOT_IDEMPOTENT
	nrHintNoRetry   = stubbornv1.NotRetried_NOT_RETRIED_HINT_NO_RETRY
	nrHintOverCap   = stubbornv1.NotRetried_NOT_RETRIED_HINT_OVER_CAP
	nrExhausted     = stubbornv1.NotRetried_NOT_RETRIED_EXHAUSTED
	nrDeadline      = stubbornv1.NotRetried_NOT_RETRIED_DEADLINE
	nrBudget        = stubbornv1.NotRetried_NOT_RETRIED_BUDGET
)

// retryHarness is one run of the retry control over a fake delegate "d" and a
// fake clock, with a seeded random source.
type retryHarness struct {
	d      *controlstest.Delegates
	clock  *controlstest.Clock
	events *controlstest.Events
	env    *controls.Env
	asked  chan struct{} // one value per decision_requested event
}

func newRetryHarness(info controls.DelegateInfo, replies ...controlstest.Reply) *retryHarness {
	h := &retryHarness{
		d:      controlstest.NewDelegates(map[string][]controlstest.Reply{"d": replies}),
		clock:  controlstest.NewClock(),
		events: &controlstest.Events{},
		asked:  make(chan struct{}, 16),
	}
	h.d.SetInfo("d", info)
	st := &stubbornv1.ControlState{RunId: "run-test", TaskBrief: retryBrief, Status: stubbornv1.RunStatus_RUN_STATUS_PENDING}
	// A sink of our own, so that a test can wait for a decision request
	// without polling.
	tr := controls.NewTracker(st, h.clock, func(ev *stubbornv1.RunEvent) {
		h.events.Sink(ev)
		if controlstest.Kind(ev) == "decision_requested" {
			h.asked <- struct{}{}
		}
	})
	h.env = &controls.Env{Delegates: h.d, Tracker: tr, Clock: h.clock, Rand: rand.New(rand.NewPCG(1, 2))}
	return h
}

// run runs the control. Tests pass t.Context(), not a context with a real
// deadline: Retry compares a deadline with env's clock, and the fake clock's
// time line is not the wall clock's (see fakeDeadlineCtx).
func (h *retryHarness) run(ctx context.Context, spec *stubbornv1.RetrySpec) controls.Outcome {
	return controls.Retry(ctx, h.env, retryBrief, spec)
}

// runAsync runs the control in its own goroutine, for tests that answer a
// decision request.
func (h *retryHarness) runAsync(ctx context.Context, spec *stubbornv1.RetrySpec) <-chan controls.Outcome {
	out := make(chan controls.Outcome, 1)
	go func() { out <- h.run(ctx, spec) }()
	return out
}

// awaitAsk waits for the next decision request.
func (h *retryHarness) awaitAsk(t *testing.T) {
	t.Helper()
	recv(t, h.asked, "decision_requested")
}

func (h *retryHarness) failures() []*stubbornv1.FailureAnalyzed {
	return failureEvents(h.events.All())
}

func (h *retryHarness) backoffs() []*stubbornv1.RunEvent {
	var out []*stubbornv1.RunEvent
	for _, ev := range h.events.All() {
		if ev.GetBackoffScheduled() != nil {
			out = append(out, ev)
		}
	}
	return out
}

func (h *retryHarness) bounds() []time.Duration {
	var out []time.Duration
	for _, ev := range h.backoffs() {
		out = append(out, ev.GetBackoffScheduled().GetBound().AsDuration())
	}
	return out
}

func retrySpec(attempts int32, onExhausted stubbornv1.OnExhausted) *stubbornv1.RetrySpec {
	return &stubbornv1.RetrySpec{Target: "d", Attempts: proto.Int32(attempts), OnExhausted: onExhausted}
}

func checkRetryOutcome(t *testing.T, got controls.Outcome, status stubbornv1.RunStatus, code stubbornv1.StatusReason, reason string) {
	t.Helper()
	if got.Status != status || got.Reason != reason || got.Code != code {
		t.Fatalf("outcome %v %v %q, want %v %v %q", got.Status, got.Code, got.Reason, status, code, reason)
	}
}

func checkRetryCalls(t *testing.T, h *retryHarness, want int) {
	t.Helper()
	calls := h.d.Calls()
	if len(calls) != want {
		t.Fatalf("%d calls, want %d", len(calls), want)
	}
	for i, c := range calls {
		if c.Brief != retryBrief || c.Delegate != "d" || c.Attempt != int32(i+1) {
			t.Errorf("call %d = %+v, want attempt %d of d with the original brief", i, c, i+1)
		}
	}
}

// checkNotRetried checks that the last failure record says no retry
// follows, and why, in words and as a value; and that every earlier record
// has a value exactly when it has words.
func checkNotRetried(t *testing.T, h *retryHarness, code stubbornv1.NotRetried, reason string) {
	t.Helper()
	fs := h.failures()
	if len(fs) == 0 {
		t.Fatal("no failure_analyzed event")
	}
	last := fs[len(fs)-1]
	if last.GetWillRetry() || last.GetNextBrief() != "" || last.GetFailure().GetNotRetriedReason() != reason ||
		last.GetFailure().GetNotRetriedCode() != code {
		t.Errorf("last failure: will_retry %v, next_brief %q, not_retried_reason %q, not_retried_code %v; want false, \"\", %q, %v",
			last.GetWillRetry(), last.GetNextBrief(), last.GetFailure().GetNotRetriedReason(), last.GetFailure().GetNotRetriedCode(), reason, code)
	}
	for _, f := range fs {
		if r := f.GetFailure(); (r.GetNotRetriedReason() == "") != (r.GetNotRetriedCode() == nrNone) {
			t.Errorf("failure %d: not_retried_reason %q with not_retried_code %v", r.GetAttempt(), r.GetNotRetriedReason(), r.GetNotRetriedCode())
		}
	}
	if st := h.env.Tracker.Snapshot(); len(st.GetFailureHistory()) != len(fs) {
		t.Errorf("failure_history has %d records, %d events", len(st.GetFailureHistory()), len(fs))
	}
}

// Acceptance: UNAVAILABLE twice, then success → two backoffs within their
// bounds, then the result.
func TestRetryTransientFailuresThenSuccess(t *testing.T) {
	t.Parallel()
	h := newRetryHarness(declIdempotent, retryUnavailable, retryUnavailable, controlstest.OK("invoice #7"))
	out := h.run(t.Context(), &stubbornv1.RetrySpec{Target: "d"})

	checkRetryOutcome(t, out, succeeded, endOK, "")
	if out.Result.GetText() != "invoice #7" || out.Winner != "d" {
		t.Errorf("result %q winner %q", out.Result.GetText(), out.Winner)
	}
	checkRetryCalls(t, h, 3)
	want := []string{
		"attempt_started", "attempt_finished", "failure_analyzed", "backoff_scheduled",
		"attempt_started", "attempt_finished", "failure_analyzed", "backoff_scheduled",
		"attempt_started", "attempt_finished",
	}
	if got := h.events.Kinds(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("events %v\nwant %v", got, want)
	}
	for i, ev := range h.backoffs() {
		b := ev.GetBackoffScheduled()
		bound := time.Second << i // default base 1s
		if b.GetBound().AsDuration() != bound || b.GetWait().AsDuration() > bound || b.GetFromHint() {
			t.Errorf("backoff %d: wait %v bound %v from_hint %v; want a wait within %v", i+1,
				b.GetWait().AsDuration(), b.GetBound().AsDuration(), b.GetFromHint(), bound)
		}
	}
	for i, f := range h.failures() {
		r := f.GetFailure()
		if !f.GetWillRetry() || f.GetNextBrief() != retryBrief || !r.GetTransient() || r.GetNotRetriedReason() != "" || r.GetNotRetriedCode() != nrNone ||
			r.GetAttempt() != int32(i+1) || r.GetSummary() != "Error: connection reset" || r.GetReason() != "connection reset" {
			t.Errorf("failure %d: %v", i+1, f)
		}
	}
}

// Acceptance: INVALID_ARGUMENT → one attempt, no retry, reason recorded.
func TestRetryPermanentFailureIsNotRetried(t *testing.T) {
	t.Parallel()
	h := newRetryHarness(declIdempotent, controlstest.Fail(codes.InvalidArgument, "bad invoice id"))
	out := h.run(t.Context(), &stubbornv1.RetrySpec{Target: "d"})
	checkRetryOutcome(t, out, failed, endNotRetried, "not transient: INVALID_ARGUMENT")
	checkRetryCalls(t, h, 1)
	checkNotRetried(t, h, nrNotTransient, "not transient: INVALID_ARGUMENT")
	if len(h.clock.Sleeps()) != 0 || len(h.backoffs()) != 0 {
		t.Error("a permanent failure waited")
	}
}

func TestTransient(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		ce        *controls.CallError
		transient bool
		reason    string
	}{
		{"not a CallError", nil, false, "not transient: not a classified delegate error"},
		{"UNAVAILABLE", &controls.CallError{Code: codes.Unavailable}, true, ""},
		{"NOT_FOUND", &controls.CallError{Code: codes.NotFound}, false, "not transient: NOT_FOUND"},
		{"HTTP 503 beats the code", &controls.CallError{Code: codes.InvalidArgument, HTTPStatus: 503}, true, ""},
		{"HTTP 404 beats the code", &controls.CallError{Code: codes.Unavailable, HTTPStatus: 404}, false, "not transient: HTTP 404"},
		{"HTTP 200 leaves it to the code", &controls.CallError{Code: codes.Aborted, HTTPStatus: 200}, true, ""},
		{"refused beats everything", &controls.CallError{Code: codes.Unavailable, HTTPStatus: 503, Refused: true}, false, "not transient: refused by Stubborn's own middleware"},
		{"unknown code", &controls.CallError{Code: codes.Code(42)}, false, "not transient: CODE_42"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			transient, reason := controls.Transient(tt.ce)
			if transient != tt.transient || reason != tt.reason {
				t.Errorf("Transient = %v, %q; want %v, %q", transient, reason, tt.transient, tt.reason)
			}
		})
	}
}

// The transient rules and the idempotency rule, driven through Retry: one
// row per gRPC code and per HTTP status class, crossed with the delegate's
// declaration and a call that never reached it.
func TestRetryTransientRulesTable(t *testing.T) {
	t.Parallel()
	type row struct {
		name      string
		err       func(notSent bool) error
		transient bool
		reason    string                // not_retried_reason when not transient
		code      stubbornv1.NotRetried // not_retried_code when not transient
	}
	var rows []row
	transientCodes := map[codes.Code]bool{
		codes.Unavailable: true, codes.DeadlineExceeded: true, codes.ResourceExhausted: true, codes.Aborted: true,
	}
	names := []string{
		"", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
		"PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
		"UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
	}
	for c := codes.Canceled; c <= codes.Unauthenticated; c++ {
		r := row{name: names[c], transient: transientCodes[c]}
		r.err = func(notSent bool) error { return &controls.CallError{Code: c, Message: "boom", NotSent: notSent} }
		if !r.transient {
			r.reason, r.code = "not transient: "+names[c], nrNotTransient
		}
		rows = append(rows, r)
	}
	for _, h := range []struct {
		status    int
		code      codes.Code
		transient bool
	}{
		{408, codes.Unknown, true},
		{425, codes.Unknown, true},
		{429, codes.Unknown, true},
		{500, codes.Unknown, true},
		{503, codes.Unknown, true},
		{503, codes.InvalidArgument, true}, // the HTTP status wins over the code
		{400, codes.Unknown, false},
		{404, codes.Unknown, false},
		{404, codes.Unavailable, false}, // a 4xx is never transient
	} {
		r := row{name: fmt.Sprintf("HTTP %d with %s", h.status, names[h.code]), transient: h.transient}
		r.err = func(notSent bool) error {
			return &controls.CallError{Code: h.code, Message: "upstream", HTTPStatus: h.status, NotSent: notSent}
		}
		if !r.transient {
			r.reason, r.code = fmt.Sprintf("not transient: HTTP %d", h.status), nrNotTransient
		}
		rows = append(rows, r)
	}
	rows = append(rows,
		row{
			name: "refused by middleware", reason: "not transient: refused by Stubborn's own middleware", code: nrRefused,
			err: func(notSent bool) error {
				return &controls.CallError{Code: codes.Unavailable, Message: "limit", Refused: true, NotSent: notSent}
			},
		},
		row{
			name: "unclassified error", reason: "not transient: not a classified delegate error", code: nrNotTransient,
			err: func(bool) error { return errors.New("boom") },
		},
	)

	declarations := []struct {
		name    string
		info    controls.DelegateInfo
		notSent bool
		safe    bool // a retry may follow
	}{
		{"idempotent", declIdempotent, false, true},
		{"read_only", declReadOnly, false, true},
		{"neither", controls.DelegateInfo{}, false, false},
		{"neither, connection refused", controls.DelegateInfo{}, true, true},
	}
	for _, r := range rows {
		for _, decl := range declarations {
			t.Run(r.name+"/"+decl.name, func(t *testing.T) {
				t.Parallel()
				h := newRetryHarness(decl.info, controlstest.Reply{Err: r.err(decl.notSent)}, controlstest.OK("done"))
				out := h.run(t.Context(), &stubbornv1.RetrySpec{
					Target: "d", Attempts: proto.Int32(1), OnExhausted: onExhaustedFail, MaxWait: durationpb.New(time.Second),
				})
				reason, code := r.reason, r.code
				if reason == "" && !decl.safe {
					reason, code = `delegate "d" is neither idempotent nor read_only`, nrNotIdempotent
				}
				if rec := h.failures()[0].GetFailure(); rec.GetTransient() != r.transient {
					t.Errorf("record transient = %v, want %v", rec.GetTransient(), r.transient)
				}
				if reason == "" {
					checkRetryOutcome(t, out, succeeded, endOK, "")
					checkRetryCalls(t, h, 2)
					if f := h.failures()[0]; !f.GetWillRetry() || f.GetFailure().GetNotRetriedReason() != "" ||
						f.GetFailure().GetNotRetriedCode() != nrNone {
						t.Errorf("retried failure recorded as %v", f)
					}
					return
				}
				checkRetryOutcome(t, out, failed, endNotRetried, reason)
				checkRetryCalls(t, h, 1)
				checkNotRetried(t, h, code, reason)
			})
		}
	}
}

func hintedFailure(code codes.Code, hint time.Duration) controlstest.Reply {
	return controlstest.Reply{Err: &controls.CallError{Code: code, Message: "slow down", HasHint: true, RetryHint: hint}}
}

// Server hints replace the backoff, capped by max_wait: a longer or a
// negative hint ends the retries instead.
func TestRetryHints(t *testing.T) {
	t.Parallel()
	maxWait := durationpb.New(time.Second)
	tests := []struct {
		name    string
		replies []controlstest.Reply
		status  stubbornv1.RunStatus
		reason  string
		code    stubbornv1.NotRetried
		sleeps  []time.Duration
	}{
		{
			name:    "hint beyond max_wait ends the retries",
			replies: []controlstest.Reply{hintedFailure(codes.ResourceExhausted, 2*time.Second), controlstest.OK("late")},
			status:  failed, reason: "retry hint 2s exceeds max_wait 1s", code: nrHintOverCap,
		},
		{
			name:    "negative hint ends the retries",
			replies: []controlstest.Reply{hintedFailure(codes.Unavailable, -time.Millisecond), controlstest.OK("late")},
			status:  failed, reason: "retry hint -1ms asks not to retry", code: nrHintNoRetry,
		},
		{
			name: "hints within max_wait replace the backoff",
			replies: []controlstest.Reply{
				hintedFailure(codes.Unavailable, 300*time.Millisecond), hintedFailure(codes.Unavailable, 0),
				hintedFailure(codes.Unavailable, time.Second), controlstest.OK("ok"),
			},
			status: succeeded, sleeps: []time.Duration{300 * time.Millisecond, 0, time.Second},
		},
		{
			name:    "a hint does not make a permanent failure transient",
			replies: []controlstest.Reply{hintedFailure(codes.InvalidArgument, 10*time.Millisecond), controlstest.OK("ok")},
			status:  failed, reason: "not transient: INVALID_ARGUMENT", code: nrNotTransient,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newRetryHarness(declIdempotent, tt.replies...)
			out := h.run(t.Context(), &stubbornv1.RetrySpec{Target: "d", MaxWait: maxWait, OnExhausted: onExhaustedFail})
			end := endOK
			if tt.reason != "" {
				end = endNotRetried
			}
			checkRetryOutcome(t, out, tt.status, end, tt.reason)
			if got := h.clock.Sleeps(); fmt.Sprint(got) != fmt.Sprint(tt.sleeps) {
				t.Errorf("slept %v, want %v", got, tt.sleeps)
			}
			if tt.reason != "" {
				checkRetryCalls(t, h, 1)
				checkNotRetried(t, h, tt.code, tt.reason)
				return
			}
			for i, ev := range h.backoffs() {
				b := ev.GetBackoffScheduled()
				if !b.GetFromHint() || b.GetWait().AsDuration() != tt.sleeps[i] || b.GetBound().AsDuration() != time.Second {
					t.Errorf("backoff %d: %v, want the hint %v, bound max_wait, from_hint", i+1, b, tt.sleeps[i])
				}
			}
		})
	}
}

// Every wait is announced first, and the wait slept is the one announced.
func TestRetryBackoffEventsMatchSleeps(t *testing.T) {
	t.Parallel()
	h := newRetryHarness(declReadOnly, retryUnavailable)
	out := h.run(t.Context(), &stubbornv1.RetrySpec{
		Target: "d", OnExhausted: onExhaustedFail, BaseWait: durationpb.New(100 * time.Millisecond), MaxWait: durationpb.New(time.Second),
	})
	checkRetryOutcome(t, out, failed, endExhausted, "retries exhausted")

	sleeps, backoffs := h.clock.Sleeps(), h.backoffs()
	if len(sleeps) != 6 || len(backoffs) != 6 {
		t.Fatalf("%d sleeps, %d backoff events; want 6 of each", len(sleeps), len(backoffs))
	}
	wantBounds := []time.Duration{100, 200, 400, 800, 1000, 1000}
	var waitBefore []time.Duration
	for _, ev := range h.events.All() {
		if a := ev.GetAttemptStarted().GetAttempt(); a != nil && a.GetNumber() > 1 {
			waitBefore = append(waitBefore, a.GetWaitBefore().AsDuration())
		}
	}
	for i, ev := range backoffs {
		b := ev.GetBackoffScheduled()
		wait := b.GetWait().AsDuration()
		if wait != sleeps[i] {
			t.Errorf("backoff %d announced %v, slept %v", i+1, wait, sleeps[i])
		}
		if got := b.GetUntil().AsTime(); !got.Equal(ev.GetTime().AsTime().Add(wait)) {
			t.Errorf("backoff %d: until %v, want event time %v + %v", i+1, got, ev.GetTime().AsTime(), wait)
		}
		if b.GetNextAttempt() != int32(i+2) {
			t.Errorf("backoff %d: next_attempt %d, want %d", i+1, b.GetNextAttempt(), i+2)
		}
		if bound := wantBounds[i] * time.Millisecond; b.GetBound().AsDuration() != bound || wait > bound {
			t.Errorf("backoff %d: wait %v bound %v, want bound %v", i+1, wait, b.GetBound().AsDuration(), bound)
		}
		if waitBefore[i] != wait {
			t.Errorf("attempt %d: wait_before %v, want %v", i+2, waitBefore[i], wait)
		}
	}
}

func TestRetryAttempts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		attempts *int32
		calls    int
		reason   string
		bounds   []time.Duration
	}{
		{"unset means 6 retries", nil, 7, "retries exhausted (6 of 6)", []time.Duration{
			time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second,
		}},
		{"0 means a single try", proto.Int32(0), 1, "retries exhausted (0 of 0)", nil},
		{"2 retries", proto.Int32(2), 3, "retries exhausted (2 of 2)", []time.Duration{time.Second, 2 * time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newRetryHarness(declIdempotent, retryUnavailable)
			out := h.run(t.Context(), &stubbornv1.RetrySpec{Target: "d", Attempts: tt.attempts, OnExhausted: onExhaustedFail})
			checkRetryOutcome(t, out, failed, endExhausted, "retries exhausted")
			checkRetryCalls(t, h, tt.calls)
			checkNotRetried(t, h, nrExhausted, tt.reason)
			if got := h.bounds(); fmt.Sprint(got) != fmt.Sprint(tt.bounds) {
				t.Errorf("backoff bounds %v, want %v", got, tt.bounds)
			}
			if st := h.env.Tracker.Snapshot(); st.GetAttempts() != int32(tt.calls) {
				t.Errorf("state attempts %d, want %d", st.GetAttempts(), tt.calls)
			}
		})
	}
}

// on_exhausted FAIL ends the run at once: no decision is requested.
func TestRetryOnExhaustedFail(t *testing.T) {
	t.Parallel()
	h := newRetryHarness(declIdempotent, retryUnavailable)
	out := h.run(t.Context(), retrySpec(3, onExhaustedFail))
	checkRetryOutcome(t, out, failed, endExhausted, "retries exhausted")
	checkRetryCalls(t, h, 4)
	checkNotRetried(t, h, nrExhausted, "retries exhausted (3 of 3)")
	for _, k := range h.events.Kinds() {
		if k == "decision_requested" {
			t.Error("on_exhausted FAIL requested a decision")
		}
	}
}

// on_exhausted ASK (and unspecified): the run waits for a person. RETRY
// grants a new round whose backoff starts again from the base; FAIL ends
// the run.
func TestRetryAskRetryThenFail(t *testing.T) {
	t.Parallel()
	for _, onExhausted := range []stubbornv1.OnExhausted{stubbornv1.OnExhausted_ON_EXHAUSTED_UNSPECIFIED, onExhaustedAsk} {
		t.Run(onExhausted.String(), func(t *testing.T) {
			t.Parallel()
			h := newRetryHarness(declIdempotent, retryUnavailable)
			if err := h.env.Tracker.Decide(stubbornv1.Decision_DECISION_RETRY, nil); !errors.Is(err, controls.ErrNotAwaitingDecision) {
				t.Fatalf("Decide before the run: %v, want ErrNotAwaitingDecision", err)
			}
			done := h.runAsync(t.Context(), retrySpec(2, onExhausted))

			h.awaitAsk(t)
			if got := h.env.Tracker.Status(); got != stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION {
				t.Fatalf("status %v, want AWAITING_DECISION", got)
			}
			if st := h.env.Tracker.Snapshot(); st.GetStatusReason() != "retries exhausted (2 of 2)" || len(h.d.Calls()) != 3 {
				t.Fatalf("waiting with reason %q after %d calls", st.GetStatusReason(), len(h.d.Calls()))
			}
			if st := h.env.Tracker.Snapshot(); st.GetStatusReasonCode() != endExhausted {
				t.Fatalf("waiting with reason code %v", st.GetStatusReasonCode())
			}
			checkNotRetried(t, h, nrExhausted, "retries exhausted (2 of 2)")
			if err := h.env.Tracker.Decide(stubbornv1.Decision_DECISION_RETRY, nil); err != nil {
				t.Fatal(err)
			}

			h.awaitAsk(t)
			if st := h.env.Tracker.Snapshot(); st.GetStatusReason() != "retries exhausted (2 of 2 in round 2)" {
				t.Fatalf("second wait: reason %q", st.GetStatusReason())
			}
			if st := h.env.Tracker.Snapshot(); st.GetStatusReasonCode() != endExhausted {
				t.Fatalf("second wait: reason code %v", st.GetStatusReasonCode())
			}
			checkNotRetried(t, h, nrExhausted, "retries exhausted (2 of 2 in round 2)")
			if err := h.env.Tracker.Decide(stubbornv1.Decision_DECISION_FAIL, nil); err != nil {
				t.Fatal(err)
			}
			checkRetryOutcome(t, <-done, failed, endDecisionFail, "decision: FAIL")
			checkRetryCalls(t, h, 5)
			if err := h.env.Tracker.Decide(stubbornv1.Decision_DECISION_RETRY, nil); !errors.Is(err, controls.ErrNotAwaitingDecision) {
				t.Errorf("Decide after the run: %v, want ErrNotAwaitingDecision", err)
			}

			// The backoff restarts from the base after the decision.
			want := []time.Duration{time.Second, 2 * time.Second, time.Second, 2 * time.Second}
			if got := h.bounds(); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("backoff bounds %v, want %v", got, want)
			}
			var tail []string
			for _, ev := range h.events.All() {
				switch k := controlstest.Kind(ev); k {
				case "decision_requested":
					req := ev.GetDecisionRequested()
					tail = append(tail, fmt.Sprintf("%s(%d failures)", k, len(req.GetFailureHistory())))
					if req.GetReasonCode() != endExhausted {
						t.Errorf("decision_requested %q: reason_code %v, want %v", req.GetReason(), req.GetReasonCode(), endExhausted)
					}
				case "decision_received":
					tail = append(tail, fmt.Sprintf("%s(%v)", k, ev.GetDecisionReceived().GetDecision()))
				case "backoff_scheduled":
					tail = append(tail, fmt.Sprintf("%s(%d)", k, ev.GetBackoffScheduled().GetNextAttempt()))
				case "attempt_started":
					tail = append(tail, k)
				}
			}
			wantTail := []string{
				"attempt_started", "backoff_scheduled(2)", "attempt_started", "backoff_scheduled(3)", "attempt_started",
				"decision_requested(3 failures)", "decision_received(DECISION_RETRY)",
				"backoff_scheduled(4)", "attempt_started", "backoff_scheduled(5)", "attempt_started",
				"decision_requested(5 failures)", "decision_received(DECISION_FAIL)",
			}
			if fmt.Sprint(tail) != fmt.Sprint(wantTail) {
				t.Errorf("events\n%v\nwant\n%v", tail, wantTail)
			}
		})
	}
}

// A RETRY decision leads to a call even with attempts 0, and its success
// ends the run.
func TestRetryAskRetryThenSuccess(t *testing.T) {
	t.Parallel()
	h := newRetryHarness(declIdempotent, retryUnavailable, controlstest.OK("finally"))
	done := h.runAsync(t.Context(), retrySpec(0, onExhaustedAsk))
	h.awaitAsk(t)
	if err := h.env.Tracker.Decide(stubbornv1.Decision_DECISION_RETRY, nil); err != nil {
		t.Fatal(err)
	}
	out := <-done
	checkRetryOutcome(t, out, succeeded, endOK, "")
	if out.Result.GetText() != "finally" {
		t.Errorf("result %q", out.Result.GetText())
	}
	checkRetryCalls(t, h, 2)
	if got := h.bounds(); fmt.Sprint(got) != "[1s]" {
		t.Errorf("backoff bounds %v, want [1s]", got)
	}
}

func TestRetryDecisionTimeout(t *testing.T) {
	t.Parallel()
	h := newRetryHarness(declIdempotent, retryUnavailable)
	s := retrySpec(1, onExhaustedAsk)
	s.DecisionTimeout = durationpb.New(5 * time.Minute)
	out := h.run(t.Context(), s) // the fake clock lets the timeout pass at once
	checkRetryOutcome(t, out, failed, endNoDecision, "no decision within 5m0s")
	checkRetryCalls(t, h, 2)
	for _, ev := range h.events.All() {
		if req := ev.GetDecisionRequested(); req != nil {
			if want := ev.GetTime().AsTime().Add(5 * time.Minute); !req.GetDeadline().AsTime().Equal(want) {
				t.Errorf("decision deadline %v, want %v", req.GetDeadline().AsTime(), want)
			}
		}
	}
}

func TestRetryCancelledWhileAwaitingDecision(t *testing.T) {
	t.Parallel()
	h := newRetryHarness(declIdempotent, retryUnavailable)
	ctx, cancel := context.WithCancel(t.Context())
	done := h.runAsync(ctx, retrySpec(0, onExhaustedAsk))
	h.awaitAsk(t)
	cancel()
	checkRetryOutcome(t, <-done, cancelled, endCancelled, "cancelled")
	checkRetryCalls(t, h, 1)
}

// fakeDeadlineCtx reports a deadline on the fake clock's time line without ever
// expiring on its own: a real context's deadline runs on the wall clock.
type fakeDeadlineCtx struct {
	context.Context
	deadline time.Time
}

func (c fakeDeadlineCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// A retry is never scheduled when its wait would end at or after the run's
// deadline.
func TestRetryRunDeadline(t *testing.T) {
	t.Parallel()
	const reason = "retry would end after the run's deadline"
	tests := []struct {
		name   string
		hint   time.Duration
		status stubbornv1.RunStatus
		reason string
	}{
		{"wait ends after the deadline", 30 * time.Second, failed, reason},
		{"wait ends at the deadline", 10 * time.Second, failed, reason},
		{"wait ends before the deadline", 9 * time.Second, succeeded, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newRetryHarness(declIdempotent, hintedFailure(codes.Unavailable, tt.hint), controlstest.OK("ok"))
			ctx := fakeDeadlineCtx{Context: t.Context(), deadline: h.clock.Now().Add(10 * time.Second)}
			out := h.run(ctx, &stubbornv1.RetrySpec{Target: "d"})
			end := endOK
			if tt.reason != "" {
				end = endNotRetried // the failure's own code says why: DEADLINE
			}
			checkRetryOutcome(t, out, tt.status, end, tt.reason)
			if tt.reason != "" {
				checkRetryCalls(t, h, 1)
				checkNotRetried(t, h, nrDeadline, tt.reason)
				if len(h.clock.Sleeps()) != 0 {
					t.Errorf("slept %v", h.clock.Sleeps())
				}
			}
		})
	}
}

// A run whose context already ended calls nobody.
func TestRetryRunAlreadyTimedOut(t *testing.T) {
	t.Parallel()
	h := newRetryHarness(declIdempotent, controlstest.OK("ok"))
	ctx, cancel := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
	defer cancel()
	checkRetryOutcome(t, h.run(ctx, &stubbornv1.RetrySpec{Target: "d"}), failed, endRunTimeout, "run timeout exceeded")
	checkRetryCalls(t, h, 0)
}

// cancelOnBackoff cancels the run as its backoff starts.
type cancelOnBackoff struct {
	*controlstest.Clock
	cancel context.CancelFunc
}

func (c cancelOnBackoff) Sleep(ctx context.Context, d time.Duration) error {
	c.cancel()
	return c.Clock.Sleep(ctx, d)
}

func TestRetryCancelledDuringBackoff(t *testing.T) {
	t.Parallel()
	h := newRetryHarness(declIdempotent, retryUnavailable, controlstest.OK("too late"))
	ctx, cancel := context.WithCancel(t.Context())
	h.env.Clock = cancelOnBackoff{Clock: h.clock, cancel: cancel}
	checkRetryOutcome(t, h.run(ctx, &stubbornv1.RetrySpec{Target: "d"}), cancelled, endCancelled, "cancelled")
	checkRetryCalls(t, h, 1)
	kinds := h.events.Kinds()
	if kinds[len(kinds)-1] != "backoff_scheduled" {
		t.Errorf("events %v, want nothing after the backoff", kinds)
	}
}

// cancelMidCall cancels the run while its call is in flight.
type cancelMidCall struct {
	*controlstest.Delegates
	cancel context.CancelFunc
}

func (d cancelMidCall) Call(ctx context.Context, c controls.Call) (*stubbornv1.Result, error) {
	d.cancel()
	return d.Delegates.Call(ctx, c)
}

func TestRetryCancelledDuringAttempt(t *testing.T) {
	t.Parallel()
	h := newRetryHarness(declIdempotent, controlstest.Reply{Hang: true}, controlstest.OK("too late"))
	ctx, cancel := context.WithCancel(t.Context())
	h.env.Delegates = cancelMidCall{Delegates: h.d, cancel: cancel}
	checkRetryOutcome(t, h.run(ctx, &stubbornv1.RetrySpec{Target: "d"}), cancelled, endCancelled, "cancelled")
	checkRetryCalls(t, h, 1)
	if len(h.failures()) != 0 || len(h.clock.Sleeps()) != 0 {
		t.Error("a cancelled attempt was analysed or waited for")
	}
}

type rejectEverything struct{}

func (rejectEverything) Check(context.Context, int32, string, *stubbornv1.Result) (controls.Verdict, error) {
	return controls.Verdict{Failed: true, Reason: "no invoice number"}, nil
}

// Only raised errors are retried: a result the criteria reject is a
// permanent failure.
func TestRetryRejectedResultIsNotRetried(t *testing.T) {
	t.Parallel()
	h := newRetryHarness(declIdempotent, controlstest.OK("an invoice"))
	h.env.Criteria = rejectEverything{}
	const reason = "not transient: the failure criteria rejected the result (only errors are retried)"
	checkRetryOutcome(t, h.run(t.Context(), &stubbornv1.RetrySpec{Target: "d"}), failed, endNotRetried, reason)
	checkRetryCalls(t, h, 1)
	checkNotRetried(t, h, nrRejected, reason)
	rec := h.failures()[0].GetFailure()
	if rec.GetTransient() || rec.GetReason() != "no invoice number" || rec.GetSummary() != "an invoice" {
		t.Errorf("record %v", rec)
	}
}

// With a retry budget, transient failures drain the delegate's tokens and
// retries stop below half, for this run and the next ones.
func TestRetryBudget(t *testing.T) {
	t.Parallel()
	budgets, err := controls.NewBudgetSet(4, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	const reason = "retry budget exhausted"
	run := func(replies ...controlstest.Reply) (*retryHarness, controls.Outcome) {
		h := newRetryHarness(declIdempotent, replies...)
		h.env.Budgets = budgets
		return h, h.run(t.Context(), &stubbornv1.RetrySpec{Target: "d"})
	}

	// 4 tokens: the first failure leaves 3 (retry), the second 2 (no).
	h, out := run(retryUnavailable)
	checkRetryOutcome(t, out, failed, endNotRetried, reason)
	checkRetryCalls(t, h, 2)
	checkNotRetried(t, h, nrBudget, reason)
	if got := budgets.Budget("d").Tokens(); got != 2 {
		t.Errorf("tokens %v, want 2", got)
	}

	// A non-transient failure spends nothing; an answer refills 0.5.
	_, out = run(controlstest.Fail(codes.InvalidArgument, "bad"))
	checkRetryOutcome(t, out, failed, endNotRetried, "not transient: INVALID_ARGUMENT")
	_, out = run(controlstest.OK("ok"))
	checkRetryOutcome(t, out, succeeded, endOK, "")
	if got := budgets.Budget("d").Tokens(); got != 2.5 {
		t.Errorf("tokens %v, want 2.5", got)
	}

	// 2.5 tokens: a failure leaves 1.5, so not even one retry.
	h, out = run(retryUnavailable, controlstest.OK("ok"))
	checkRetryOutcome(t, out, failed, endNotRetried, reason)
	checkRetryCalls(t, h, 1)
	checkNotRetried(t, h, nrBudget, reason)
	if got := budgets.Budget("d").Suppressed(); got != 2 {
		t.Errorf("suppressed %d retries, want 2", got)
	}
}
