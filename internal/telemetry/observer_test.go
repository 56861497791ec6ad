package telemetry

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
)

type recorder struct {
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	tel    *Telemetry
}

func newRecorder(t *testing.T) *recorder {
	t.Helper()
	r := &recorder{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	r.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r.spans))
	tel, err := New(Config{TracerProvider: r.tp, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))})
	require.NoError(t, err)
	r.tel = tel
	return r
}

// total is the value of an int64 sum named name, all points added, and
// whether it was recorded at all.
func (r *recorder) total(t *testing.T, name string) (int64, bool) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.reader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				var n int64
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					n += dp.Value
				}
				return n, true
			}
		}
	}
	return 0, false
}

func chain(names ...string) *stubbornv1.ControlSpec {
	return &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: names}}}
}

func started(n int32, delegate, path string) *stubbornv1.RunEvent {
	return &stubbornv1.RunEvent{Path: path, Kind: &stubbornv1.RunEvent_AttemptStarted{AttemptStarted: &stubbornv1.AttemptStarted{
		Attempt: &stubbornv1.Attempt{Number: n, Delegate: delegate, Path: path},
	}}}
}

func finished(n int32, delegate, path string, o stubbornv1.AttemptOutcome, e *stubbornv1.AttemptError) *stubbornv1.RunEvent {
	return &stubbornv1.RunEvent{Path: path, Kind: &stubbornv1.RunEvent_AttemptFinished{AttemptFinished: &stubbornv1.AttemptFinished{
		Attempt: &stubbornv1.Attempt{Number: n, Delegate: delegate, Path: path, Outcome: o, Error: e},
	}}}
}

func runFinished(st *stubbornv1.ControlState) *stubbornv1.RunEvent {
	return &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_RunFinished{RunFinished: &stubbornv1.RunFinished{State: st}}}
}

var runStarted = &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_RunStarted{RunStarted: &stubbornv1.RunStarted{}}}

func TestNewRunRecordsTraceparentAndResumedRunLinksToIt(t *testing.T) {
	r := newRecorder(t)
	reqCtx, req := r.tp.Tracer("test").Start(context.Background(), "request")
	st := &stubbornv1.ControlState{RunId: "run_1", Control: chain("a")}
	_, observe := r.tel.ObserveRun(context.Background(), reqCtx, st, false)
	req.End()
	require.NotEmpty(t, st.GetTraceparent())
	sc := parseTraceparent(st.GetTraceparent())
	assert.Equal(t, req.SpanContext().TraceID(), sc.TraceID())
	assert.Equal(t, req.SpanContext().SpanID(), sc.SpanID())
	observe(runStarted)
	observe(runFinished(&stubbornv1.ControlState{RunId: "run_1", Control: chain("a"), Status: stubbornv1.RunStatus_RUN_STATUS_CANCELLED}))

	// Another server resumes it: no request, but the traceparent.
	resumed := &stubbornv1.ControlState{RunId: "run_1", Control: chain("a"), Traceparent: st.GetTraceparent()}
	ctx, observe := r.tel.ObserveRun(context.Background(), context.Background(), resumed, true)
	assert.Equal(t, st.GetTraceparent(), resumed.GetTraceparent(), "a resumed run keeps its traceparent")
	observe(runFinished(&stubbornv1.ControlState{RunId: "run_1", Control: chain("a"), Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED}))
	assert.True(t, trace.SpanContextFromContext(ctx).IsValid())

	var runs []sdktrace.ReadOnlySpan
	for _, s := range r.spans.Ended() {
		if s.Name() == "stubborn.run fallback_chain" {
			runs = append(runs, s)
		}
	}
	require.Len(t, runs, 2)
	assert.Equal(t, req.SpanContext().SpanID(), runs[0].Parent().SpanID(), "a new run is a child of its request")
	assert.False(t, runs[1].Parent().IsValid(), "a resumed run starts a trace of its own")
	require.Len(t, runs[1].Links(), 1)
	assert.Equal(t, req.SpanContext().TraceID(), runs[1].Links()[0].SpanContext.TraceID(), "linked to the original trace")
	assert.Contains(t, runs[1].Attributes(), runResumedKey.Bool(true))
}

func TestNoTraceparentWithoutTraceContext(t *testing.T) {
	r := newRecorder(t)
	st := &stubbornv1.ControlState{RunId: "run_1", Control: chain("a")}
	_, observe := r.tel.ObserveRun(context.Background(), context.Background(), st, false)
	observe(runFinished(st))
	assert.Empty(t, st.GetTraceparent())
	assert.False(t, parseTraceparent("not-a-traceparent").IsValid())
	assert.False(t, parseTraceparent("").IsValid())
}

func TestAbandonedRunLeavesTheGauges(t *testing.T) {
	r := newRecorder(t)
	st := &stubbornv1.ControlState{RunId: "run_1", Control: chain("a")}
	_, observe := r.tel.ObserveRun(context.Background(), context.Background(), st, false)
	observe(runStarted)
	observe(started(1, "a", ""))
	observe(&stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_DecisionRequested{DecisionRequested: &stubbornv1.DecisionRequested{Reason: "retries exhausted (0 of 0)"}}})
	active, _ := r.total(t, "stubborn.runs.active")
	awaiting, _ := r.total(t, "stubborn.runs.awaiting_decision")
	assert.EqualValues(t, 1, active)
	assert.EqualValues(t, 1, awaiting)

	observe(nil) // this server stopped driving it
	observe(runFinished(st))
	active, _ = r.total(t, "stubborn.runs.active")
	awaiting, _ = r.total(t, "stubborn.runs.awaiting_decision")
	assert.EqualValues(t, 0, active)
	assert.EqualValues(t, 0, awaiting)
	_, counted := r.total(t, "stubborn.runs.finished")
	assert.False(t, counted, "an abandoned run is not finished")
	ended := r.spans.Ended()
	require.Len(t, ended, 2, "the run span and its open attempt span end")
	for _, s := range ended {
		if s.Name() == "stubborn.attempt a" {
			assert.Contains(t, s.Attributes(), attemptOutcomeKey.String("unfinished"))
		}
	}
}

// fakeDelegates records the span each call ran under.
type fakeDelegates struct {
	err   error
	spans []trace.SpanContext
}

func (f *fakeDelegates) Call(ctx context.Context, _ controls.Call) (*stubbornv1.Result, error) {
	f.spans = append(f.spans, trace.SpanContextFromContext(ctx))
	return &stubbornv1.Result{}, f.err
}
func (f *fakeDelegates) Info(string) controls.DelegateInfo    { return controls.DelegateInfo{} }
func (f *fakeDelegates) Serving(context.Context, string) bool { return true }
func (f *fakeDelegates) last() trace.SpanContext              { return f.spans[len(f.spans)-1] }

func TestDecoratorParentsCallsOnTheAttemptSpan(t *testing.T) {
	r := newRecorder(t)
	fake := &fakeDelegates{err: &controls.CallError{Code: codes.Unavailable, Message: "busy"}}
	d := r.tel.Delegates(fake)

	// Calls are matched to their run by RunID. Without a run, or before
	// ObserveRun, calls pass through.
	_, _ = d.Call(context.Background(), controls.Call{Delegate: "a", Attempt: 1})
	assert.False(t, fake.last().IsValid())
	_, _ = d.Call(context.Background(), controls.Call{RunID: "run_1", Delegate: "a", Attempt: 1})
	assert.False(t, fake.last().IsValid())

	st := &stubbornv1.ControlState{RunId: "run_1", Control: chain("a", "b")}
	ctx, observe := r.tel.ObserveRun(context.Background(), context.Background(), st, false)
	observe(runStarted)
	observe(started(1, "a", ""))
	_, _ = d.Call(ctx, controls.Call{RunID: "run_1", Delegate: "a", Attempt: 1})
	attemptSC := fake.last()
	// A judge's call about attempt 1 runs under it but is not the attempt.
	fake.err = nil
	_, _ = d.Call(ctx, controls.Call{RunID: "run_1", Delegate: "judge", Attempt: 1})
	assert.Equal(t, attemptSC, fake.last())
	observe(finished(1, "a", "", stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_ERROR, &stubbornv1.AttemptError{Code: int32(codes.Unavailable)}))

	// A call that comes before its attempt_started event gets the span the
	// event then finds: one span per attempt either way.
	_, _ = d.Call(ctx, controls.Call{RunID: "run_1", Delegate: "b", Attempt: 2})
	second := fake.last()
	observe(started(2, "b", "chain[1]"))
	observe(finished(2, "b", "chain[1]", stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED, nil))
	observe(runFinished(&stubbornv1.ControlState{RunId: "run_1", Control: chain("a", "b"), Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, Winner: "b", Attempts: 2}))
	// After the run, calls (a race loser returning late) pass through.
	_, _ = d.Call(ctx, controls.Call{RunID: "run_1", Delegate: "b", Attempt: 3})

	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range r.spans.Ended() {
		byName[s.Name()] = s
	}
	require.Len(t, byName, 3, "run span and two attempt spans")
	a, b := byName["stubborn.attempt a"], byName["stubborn.attempt b"]
	require.NotNil(t, a)
	require.NotNil(t, b)
	assert.Equal(t, attemptSC.SpanID(), a.SpanContext().SpanID())
	assert.Equal(t, second.SpanID(), b.SpanContext().SpanID())
	assert.Contains(t, a.Attributes(), attemptTransientKey.Bool(true), "from the call's own error")
	assert.Contains(t, a.Attributes(), attribute.String("error.type", "UNAVAILABLE"))
	assert.Contains(t, b.Attributes(), pathKey.String("chain[1]"))
	assert.Contains(t, b.Attributes(), attemptOutcomeKey.String("succeeded"))
}

// A record without a code (made before not_retried_code) is classified by
// its words.
func TestSuppressedReasonIsAFixedSet(t *testing.T) {
	for in, want := range map[string]string{
		"":                       "",
		"retry budget exhausted": reasonBudget,
		`delegate "x" is neither idempotent nor read_only`:                                  reasonNotIdempotent,
		"retry hint 2m0s exceeds max_wait 1m0s":                                             reasonHintOverCap,
		"retry hint -1ns asks not to retry":                                                 reasonHintNoRetry,
		"not transient: INVALID_ARGUMENT":                                                   reasonNotTransient,
		"not transient: HTTP 404":                                                           reasonNotTransient,
		"not transient: the failure criteria rejected the result (only errors are retried)": reasonRejected,
		"retries exhausted (3 of 3)":                                                        reasonExhausted,
		"retries exhausted (1 of 1 in round 2)":                                             reasonExhausted,
		"retry would end after the run's deadline":                                          reasonDeadline,
		"something new": reasonOther,
	} {
		assert.Equal(t, want, suppressedReason(stubbornv1.NotRetried_NOT_RETRIED_UNSPECIFIED, in), in)
	}
}

// A record with a code is classified by it, whatever its words say.
func TestSuppressedReasonSwitchesOnTheCode(t *testing.T) {
	want := map[stubbornv1.NotRetried]string{
		stubbornv1.NotRetried_NOT_RETRIED_NOT_TRANSIENT:              reasonNotTransient,
		stubbornv1.NotRetried_NOT_RETRIED_REFUSED:                    reasonNotTransient,
		stubbornv1.NotRetried_NOT_RETRIED_REJECTED:                   reasonRejected,
		stubbornv1.NotRetried_NOT_RETRIED_NOT_IDEMPOTENT:             reasonNotIdempotent,
		stubbornv1.NotRetried_NOT_RETRIED_HINT_NO_RETRY:              reasonHintNoRetry,
		stubbornv1.NotRetried_NOT_RETRIED_HINT_OVER_CAP:              reasonHintOverCap,
		stubbornv1.NotRetried_NOT_RETRIED_EXHAUSTED:                  reasonExhausted,
		stubbornv1.NotRetried_NOT_RETRIED_DEADLINE:                   reasonDeadline,
		stubbornv1.NotRetried_NOT_RETRIED_BUDGET:                     reasonBudget,
		stubbornv1.NotRetried_NOT_RETRIED_INTERRUPTED_NOT_IDEMPOTENT: reasonNotIdempotent,
		stubbornv1.NotRetried_NOT_RETRIED_OTHER:                      reasonOther,
		stubbornv1.NotRetried(99):                                    reasonOther, // newer than this server
	}
	for v := range stubbornv1.NotRetried_name {
		if code := stubbornv1.NotRetried(v); code != stubbornv1.NotRetried_NOT_RETRIED_UNSPECIFIED {
			assert.Contains(t, want, code, "every value is classified")
		}
	}
	for code, reason := range want {
		assert.Equal(t, reason, suppressedReason(code, ""), code.String())
		// Words that would say otherwise do not count.
		assert.Equal(t, reason, suppressedReason(code, "retry budget exhausted (words of another reason)"), code.String())
	}
}

func TestDecisionReason(t *testing.T) {
	assert.Equal(t, reasonExhausted, decisionReason(stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED, "retries exhausted (3 of 3)"))
	assert.Equal(t, reasonExhausted, decisionReason(stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED, ""), "the code decides")
	assert.Equal(t, reasonExhausted, decisionReason(stubbornv1.StatusReason_STATUS_REASON_UNSPECIFIED, "retries exhausted (1 of 1 in round 2)"), "an older event's words")
	assert.Equal(t, reasonOther, decisionReason(stubbornv1.StatusReason_STATUS_REASON_OTHER, "retries exhausted (3 of 3)"))
}

// nopHandler is a stats.Handler that does nothing.
type nopHandler struct{}

func (nopHandler) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context   { return ctx }
func (nopHandler) HandleRPC(context.Context, stats.RPCStats)                         {}
func (nopHandler) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (nopHandler) HandleConn(context.Context, stats.ConnStats)                       {}

func TestLogFields(t *testing.T) {
	r := newRecorder(t)
	ctx, span := r.tp.Tracer("test").Start(context.Background(), "rpc")
	defer span.End()
	assert.Equal(t, []any{"trace_id", span.SpanContext().TraceID().String()}, LogFields(ctx, nil))
	assert.Equal(t, []any{"trace_id", span.SpanContext().TraceID().String(), "run_id", "run_1"},
		LogFields(ctx, &stubbornv1.DecideRunRequest{RunId: "run_1"}))
	// A unary request names its run.
	assert.Equal(t, []any{"run_id", "run_2"}, LogFields(context.Background(), &stubbornv1.GetRunRequest{RunId: "run_2"}))
	assert.Empty(t, LogFields(context.Background(), &stubbornv1.ListRunsRequest{}))
}

func TestNestedPresetAttemptsGoUnderThePresetsAttempt(t *testing.T) {
	r := newRecorder(t)
	st := &stubbornv1.ControlState{RunId: "run_1", Control: chain("search", "backup")}
	_, observe := r.tel.ObserveRun(context.Background(), context.Background(), st, false)
	observe(runStarted)
	observe(started(1, "search", ""))          // a preset: a retry of primary
	observe(started(2, "primary", "chain[0]")) // its own attempts
	observe(finished(2, "primary", "chain[0]", stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_ERROR, &stubbornv1.AttemptError{Code: int32(codes.Unavailable)}))
	observe(started(3, "primary", "chain[0]"))
	observe(finished(3, "primary", "chain[0]", stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED, nil))
	observe(finished(1, "search", "", stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED, nil))
	observe(runFinished(&stubbornv1.ControlState{RunId: "run_1", Control: chain("search", "backup"), Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED}))

	spans := map[int64]sdktrace.ReadOnlySpan{}
	var run sdktrace.ReadOnlySpan
	for _, s := range r.spans.Ended() {
		for _, kv := range s.Attributes() {
			if kv.Key == attemptNumberKey {
				spans[kv.Value.AsInt64()] = s
			}
		}
		if s.Name() == "stubborn.run fallback_chain" {
			run = s
		}
	}
	require.NotNil(t, run)
	require.Len(t, spans, 3)
	assert.Equal(t, run.SpanContext().SpanID(), spans[1].Parent().SpanID())
	assert.Equal(t, spans[1].SpanContext().SpanID(), spans[2].Parent().SpanID(), "under the preset's attempt")
	assert.Equal(t, spans[1].SpanContext().SpanID(), spans[3].Parent().SpanID())
}
