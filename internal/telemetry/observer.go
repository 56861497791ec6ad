package telemetry

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
)

// w3c reads and writes ControlState.traceparent, whatever Config.Propagator
// is: the field is W3C by definition.
var w3c = propagation.TraceContext{}

// traceparent returns the W3C traceparent of the span in ctx, or "" when ctx
// has no valid span context.
func traceparent(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	w3c.Inject(ctx, c)
	return c.Get("traceparent")
}

// parseTraceparent returns the span context a W3C traceparent names; it is
// not valid when s is empty or malformed.
func parseTraceparent(s string) trace.SpanContext {
	if s == "" {
		return trace.SpanContext{}
	}
	ctx := w3c.Extract(context.Background(), propagation.MapCarrier{"traceparent": s})
	return trace.SpanContextFromContext(ctx)
}

// ObserveRun implements the runs package's Observer. It starts the run's
// span (named "stubborn.run <control>") as a child of the request's span; a
// resumed run, whose request is gone, gets a span linked to the trace that
// st.traceparent names. A new run's st.traceparent is set from reqCtx. The
// returned context carries the run span (so every delegate call joins the
// trace); the run's state is kept, by run id, for [Telemetry.Delegates]
// until the run ends here; the returned
// function turns each event into metrics, span events and log lines, and
// ends the spans at run_finished.
func (t *Telemetry) ObserveRun(runCtx, reqCtx context.Context, st *stubbornv1.ControlState, resumed bool) (context.Context, func(ev *stubbornv1.RunEvent)) {
	if reqCtx == nil {
		reqCtx = context.Background()
	}
	if t.off && !t.logger.Enabled(reqCtx, slog.LevelInfo) && !t.logger.Enabled(reqCtx, slog.LevelDebug) {
		// Nothing to record and nothing to log: only the trace context
		// goes on, to the run's delegate calls and to st.traceparent.
		return passTrace(runCtx, reqCtx, st, resumed), nil
	}
	control := controlName(st.GetControl())
	if t.off {
		return t.logRun(runCtx, reqCtx, st, resumed, control)
	}
	controlAttr := controlKey.String(control)
	attrs := []attribute.KeyValue{runIDKey.String(st.GetRunId()), controlAttr}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)}
	if resumed {
		attrs = append(attrs, runResumedKey.Bool(true))
		if sc := parseTraceparent(st.GetTraceparent()); sc.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{
				SpanContext: sc,
				Attributes:  []attribute.KeyValue{attribute.String("stubborn.link", "original_request")},
			}))
		}
	} else if st.GetTraceparent() == "" {
		st.Traceparent = traceparent(reqCtx)
	}
	opts = append(opts, trace.WithAttributes(attrs...))
	_, span := t.tracer.Start(reqCtx, "stubborn.run "+control, opts...)

	ctx := trace.ContextWithSpan(runCtx, span)
	if b := baggage.FromContext(reqCtx); b.Len() > 0 {
		ctx = baggage.ContextWithBaggage(ctx, b)
	}
	rs := &runState{
		t:            t,
		id:           st.GetRunId(),
		tenant:       tenantKey.String(st.GetTenant()),
		span:         span,
		start:        time.Now(),
		control:      metric.WithAttributeSet(attribute.NewSet(controlAttr)),
		attempts:     map[int32]*attemptState{},
		lastDelegate: map[string]string{},
	}
	rs.logAttrs = []slog.Attr{slog.String("run_id", rs.id)}
	if sc := span.SpanContext(); sc.HasTraceID() {
		rs.logAttrs = append(rs.logAttrs, slog.String("trace_id", sc.TraceID().String()))
	} else if sc := trace.SpanContextFromContext(reqCtx); sc.HasTraceID() {
		rs.logAttrs = append(rs.logAttrs, slog.String("trace_id", sc.TraceID().String()))
	}
	rs.ctx = ctx
	t.live.Store(rs.id, rs)
	rs.logControl = slog.String("control", control)
	rs.resumed = resumed
	return rs.ctx, rs.observe
}

// logRun is ObserveRun when nothing is recorded but the run's log lines
// (no tracer and no meter provider): no spans, attribute sets or
// measurements are made for every run and attempt only to be dropped. The
// run's context carries the request's trace on (passTrace), and its spans
// are that context's, which record nothing.
func (t *Telemetry) logRun(runCtx, reqCtx context.Context, st *stubbornv1.ControlState, resumed bool, control string) (context.Context, func(ev *stubbornv1.RunEvent)) {
	ctx := passTrace(runCtx, reqCtx, st, resumed)
	rs := &runState{
		t:            t,
		id:           st.GetRunId(),
		ctx:          ctx,
		span:         trace.SpanFromContext(ctx),
		start:        time.Now(),
		attempts:     map[int32]*attemptState{},
		lastDelegate: map[string]string{},
		logControl:   slog.String("control", control),
		resumed:      resumed,
	}
	rs.logAttrs = []slog.Attr{slog.String("run_id", rs.id)}
	if sc := trace.SpanContextFromContext(reqCtx); sc.HasTraceID() {
		rs.logAttrs = append(rs.logAttrs, slog.String("trace_id", sc.TraceID().String()))
	}
	t.live.Store(rs.id, rs)
	return rs.ctx, rs.observe
}

// passTrace is ObserveRun when there is nothing to observe: runCtx with the
// request's span context and baggage (none for a resumed run, whose request
// is gone), so that delegate calls carry them on; a new run records the
// request's trace in st.traceparent.
func passTrace(runCtx, reqCtx context.Context, st *stubbornv1.ControlState, resumed bool) context.Context {
	ctx := runCtx
	if !resumed && st.GetTraceparent() == "" {
		st.Traceparent = traceparent(reqCtx)
	}
	if sc := trace.SpanContextFromContext(reqCtx); sc.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, sc)
	}
	if b := baggage.FromContext(reqCtx); b.Len() > 0 {
		ctx = baggage.ContextWithBaggage(ctx, b)
	}
	return ctx
}

// liveRun returns the state of run id while this server observes it, or
// nil.
func (t *Telemetry) liveRun(id string) *runState {
	if id == "" {
		return nil
	}
	rs, _ := t.live.Load(id)
	r, _ := rs.(*runState)
	return r
}

// runState is what Telemetry keeps about a run while it goes on.
type runState struct {
	t        *Telemetry
	id       string
	ctx      context.Context // the run's context with its span
	span     trace.Span
	start    time.Time
	control  metric.MeasurementOption // the control attribute, for run metrics
	logAttrs []slog.Attr              // run_id, trace_id
	resumed  bool
	tenant   attribute.KeyValue // the run's tenant, for stubborn.run.cost

	logControl slog.Attr

	mu           sync.Mutex
	attempts     map[int32]*attemptState
	lastDelegate map[string]string // by path: the delegate of the latest attempt there
	active       bool              // counted in stubborn.runs.active
	awaiting     bool              // counted in stubborn.runs.awaiting_decision
	done         bool              // run_finished seen
}

// attemptState is one attempt's span and what its call returned.
type attemptState struct {
	number   int32
	delegate string
	path     string
	span     trace.Span
	start    time.Time
	called   bool  // the decorator sent the attempt's own call
	err      error // what that call returned
	ended    bool
}

// attemptLocked returns attempt n's state, starting its span when it is
// new: from attempt_started, or from the decorator if the call comes first.
// Callers hold rs.mu.
func (rs *runState) attemptLocked(n int32, delegate, path string) *attemptState {
	if a, ok := rs.attempts[n]; ok {
		if a.path == "" && path != "" {
			a.path = path
			a.span.SetAttributes(pathKey.String(path))
		}
		return a
	}
	a := &attemptState{number: n, delegate: delegate, path: path, span: rs.span, start: time.Now()}
	if !rs.t.off {
		a.span = rs.startAttemptSpan(n, delegate, path)
	}
	rs.attempts[n] = a
	return a
}

// startAttemptSpan starts attempt n's span. Callers hold rs.mu.
func (rs *runState) startAttemptSpan(n int32, delegate, path string) trace.Span {
	attrs := make([]attribute.KeyValue, 0, 4)
	attrs = append(attrs, runIDKey.String(rs.id), delegateKey.String(delegate), attemptNumberKey.Int(int(n)))
	if path != "" {
		attrs = append(attrs, pathKey.String(path))
	}
	parent := rs.ctx
	if p := rs.presetAttemptLocked(path); p != nil {
		parent = trace.ContextWithSpan(rs.ctx, p.span)
	}
	_, span := rs.t.tracer.Start(parent, "stubborn.attempt "+delegate,
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	return span
}

// presetAttemptLocked returns the attempt that a nested preset's attempt at
// path belongs to: the one attempt still open one level up (path
// "chain[0]/target" belongs under an open attempt at "chain[0]"). With none,
// or several (a race of presets), it returns nil and the attempt goes under
// the run span. Callers hold rs.mu.
func (rs *runState) presetAttemptLocked(path string) *attemptState {
	if path == "" {
		return nil
	}
	up := ""
	if i := strings.LastIndexByte(path, '/'); i >= 0 {
		up = path[:i]
	}
	var found *attemptState
	for _, a := range rs.attempts {
		if a.path == up && !a.ended {
			if found != nil {
				return nil
			}
			found = a
		}
	}
	return found
}

// beginCall is the decorator's view of a call: the span to make the call's
// parent (nil: leave ctx as it is) and whether the call is the attempt's own
// (rather than a judge's or an analyst's call about it).
func (rs *runState) beginCall(c controls.Call) (trace.Span, bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.done || c.Attempt <= 0 {
		return nil, false
	}
	a, seen := rs.attempts[c.Attempt]
	if !seen {
		a = rs.attemptLocked(c.Attempt, c.Delegate, "")
	}
	if a.called || a.ended || a.delegate != c.Delegate {
		return a.span, false
	}
	a.called = true
	return a.span, true
}

// endCall records what the attempt's own call returned.
func (rs *runState) endCall(n int32, err error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if a, ok := rs.attempts[n]; ok && !rs.done {
		a.err = err
	}
}

// observe sees each event of the run, in order. A nil event says this
// server stopped driving the run without finishing it (it shut down, or
// another server took the run over): the spans end and the run leaves the
// gauges, but it is not counted as finished.
func (rs *runState) observe(ev *stubbornv1.RunEvent) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.done {
		return
	}
	m := &rs.t.m
	if ev == nil {
		rs.abandonLocked()
		return
	}
	rec := !rs.t.off // metrics and spans: none when nothing records them
	if !rs.active {
		rs.active = true
		if rec {
			m.runsActive.Add(rs.ctx, 1, rs.control)
		}
	}
	switch k := ev.GetKind().(type) {
	case *stubbornv1.RunEvent_RunStarted:
		if rec {
			m.runsStarted.Add(rs.ctx, 1, rs.control)
		}
		// A run's end is its line at info (run finished); its start is
		// one more line for every run, at thousands a second.
		rs.log(slog.LevelDebug, "run started", rs.logControl, slog.Bool("resumed", rs.resumed))
	case *stubbornv1.RunEvent_RunResumed:
		if rec {
			m.runsResumed.Add(rs.ctx, 1, rs.control)
		}
		rs.span.AddEvent("stubborn.run_resumed", trace.WithAttributes(attribute.String("stubborn.owner", k.RunResumed.GetOwner())))
		rs.log(slog.LevelInfo, "run resumed", rs.logControl, slog.String("owner", k.RunResumed.GetOwner()))
	case *stubbornv1.RunEvent_AttemptStarted:
		a := k.AttemptStarted.GetAttempt()
		rs.attemptLocked(a.GetNumber(), a.GetDelegate(), a.GetPath())
		rs.lastDelegate[a.GetPath()] = a.GetDelegate()
		if rs.t.logger.Enabled(rs.ctx, slog.LevelDebug) { // its attributes are made for a line only
			rs.log(slog.LevelDebug, "attempt started", attemptAttrs(a)...)
		}
	case *stubbornv1.RunEvent_AttemptFinished:
		rs.finishAttemptLocked(k.AttemptFinished.GetAttempt())
		if rec {
			for _, c := range k.AttemptFinished.GetCalls() { // its judges'
				rs.addCost(c.GetDelegate(), c.GetCost())
			}
		}
	case *stubbornv1.RunEvent_FailureAnalyzed:
		rs.failureLocked(k.FailureAnalyzed)
	case *stubbornv1.RunEvent_BackoffScheduled:
		rs.backoffLocked(ev.GetPath(), k.BackoffScheduled)
	case *stubbornv1.RunEvent_DecisionRequested:
		if !rs.awaiting {
			rs.awaiting = true
			if rec {
				m.runsAwaiting.Add(rs.ctx, 1, rs.control)
			}
		}
		reason := k.DecisionRequested.GetReason()
		rs.span.AddEvent("stubborn.decision_requested", trace.WithAttributes(
			attribute.String("stubborn.decision.reason", reason),
			reasonKey.String(decisionReason(k.DecisionRequested.GetReasonCode(), reason))))
		rs.log(slog.LevelInfo, "run awaits a decision", slog.String("reason", reason))
	case *stubbornv1.RunEvent_DecisionReceived:
		if rs.awaiting {
			rs.awaiting = false
			if rec {
				m.runsAwaiting.Add(rs.ctx, -1, rs.control)
			}
		}
		d := decisionName(k.DecisionReceived.GetDecision())
		rs.span.AddEvent("stubborn.decision_received", trace.WithAttributes(attribute.String("stubborn.decision", d)))
		rs.log(slog.LevelInfo, "decision received", slog.String("decision", d))
	case *stubbornv1.RunEvent_RunFinished:
		rs.finishLocked(k.RunFinished.GetState())
	}
}

func (rs *runState) finishAttemptLocked(at *stubbornv1.Attempt) {
	a := rs.attemptLocked(at.GetNumber(), at.GetDelegate(), at.GetPath())
	if a.ended {
		return
	}
	a.ended = true
	outcome := at.GetOutcome()
	outcomeName := outcomeName(outcome)
	transient := false
	var code codes.Code
	if e := at.GetError(); e != nil {
		code = codes.Code(e.GetCode())
	}
	if outcome == stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_ERROR {
		transient = isTransient(a.err, at.GetError())
	}
	d := time.Since(a.start)
	if !rs.t.off {
		rs.recordAttempt(a, at, outcomeName, code, transient, d)
	}

	// An attempt that failed is worth a line at info; one that succeeded
	// is told by its run's end (run finished), and at debug.
	level := slog.LevelInfo
	if outcome == stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED {
		level = slog.LevelDebug
	}
	if rs.t.logger.Enabled(rs.ctx, level) {
		la := attemptAttrs(at)
		la = append(la, slog.String("outcome", outcomeName), slog.Duration("duration", d))
		if outcome == stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_ERROR {
			la = append(la, slog.String("code", codeName(code)), slog.Bool("transient", transient))
		}
		if rs.t.logger.Enabled(rs.ctx, slog.LevelDebug) {
			// Messages may quote the brief or the answer: debug only.
			if msg := at.GetError().GetMessage(); msg != "" {
				la = append(la, slog.String("error", msg))
			}
		}
		rs.log(level, "attempt finished", la...)
	}
}

// recordAttempt ends attempt a's span and records its metrics: at, its
// end, had outcomeName (code and transient for an error) after d.
func (rs *runState) recordAttempt(a *attemptState, at *stubbornv1.Attempt, outcomeName string, code codes.Code, transient bool, d time.Duration) {
	outcome := at.GetOutcome()
	attrs := make([]attribute.KeyValue, 0, 5)
	attrs = append(attrs, attemptOutcomeKey.String(outcomeName))
	if s := at.GetError().GetHttpStatus(); s != 0 {
		attrs = append(attrs, upstreamHTTPStatusKey.Int(int(s)))
	}
	switch outcome {
	case stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED:
	case stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_ERROR:
		attrs = append(attrs, errorAttrs(code)...)
		a.span.SetStatus(otelcodes.Error, codeName(code))
	case stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_REJECTED:
		attrs = append(attrs, attribute.String("error.type", "rejected"))
		a.span.SetStatus(otelcodes.Error, "rejected by the failure criteria")
	}
	if outcome != stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED {
		attrs = append(attrs, attemptTransientKey.Bool(transient))
	}
	if c := at.GetCost(); c > 0 {
		attrs = append(attrs, attemptCostKey.Float64(c))
	}
	a.span.SetAttributes(attrs...)
	a.span.End()
	rs.addCost(at.GetDelegate(), at.GetCost())
	set := metric.WithAttributeSet(attribute.NewSet(delegateKey.String(a.delegate), attemptOutcomeKey.String(outcomeName)))
	rs.t.m.attempts.Add(rs.ctx, 1, set)
	rs.t.m.attemptDuration.Record(rs.ctx, d.Seconds(), set)
}

// addCost counts what a call of the run to delegate cost in
// stubborn.run.cost. The events the run records from now on are the ones
// observed (a resumed run's earlier ones are not), so a cost is counted
// once. Callers record metrics (!rs.t.off).
func (rs *runState) addCost(delegate string, cost float64) {
	if !(cost > 0) || math.IsInf(cost, 1) { // no price, a preset's attempt; never NaN
		return
	}
	rs.t.m.cost.Add(rs.ctx, cost, metric.WithAttributeSet(attribute.NewSet(rs.tenant, delegateKey.String(delegate))))
}

// isTransient says whether a failed call's error is one a retry may fix:
// from the error the decorator saw, else from the recorded AttemptError.
func isTransient(err error, ae *stubbornv1.AttemptError) bool {
	var ce *controls.CallError
	if err != nil {
		if !errors.As(err, &ce) {
			return false
		}
	} else if ae != nil {
		ce = &controls.CallError{Code: codes.Code(ae.GetCode()), HTTPStatus: int(ae.GetHttpStatus())}
	}
	ok, _ := controls.Transient(ce)
	return ok
}

func (rs *runState) failureLocked(fa *stubbornv1.FailureAnalyzed) {
	f := fa.GetFailure()
	reason := suppressedReason(f.GetNotRetriedCode(), f.GetNotRetriedReason())
	if !rs.t.off {
		rs.recordFailure(fa, reason)
	}
	if !rs.t.logger.Enabled(rs.ctx, slog.LevelDebug) {
		return // its attributes are made for a line only
	}
	la := []slog.Attr{
		slog.Int("attempt", int(f.GetAttempt())), slog.String("delegate", f.GetDelegate()),
		slog.Bool("will_retry", fa.GetWillRetry()),
	}
	if f.GetPath() != "" {
		la = append(la, slog.String("path", f.GetPath()))
	}
	if reason != "" {
		la = append(la, slog.String("not_retried", reason), slog.String("not_retried_reason", f.GetNotRetriedReason()))
	}
	// The reason may be a judge's words about the answer: debug only, as
	// the line.
	la = append(la, slog.String("reason", f.GetReason()))
	rs.log(slog.LevelDebug, "failure analyzed", la...)
}

// recordFailure adds a failure's span event and counts it if a retry was
// suppressed (reason).
func (rs *runState) recordFailure(fa *stubbornv1.FailureAnalyzed, reason string) {
	f := fa.GetFailure()
	attrs := []attribute.KeyValue{
		attemptNumberKey.Int(int(f.GetAttempt())),
		delegateKey.String(f.GetDelegate()),
		attemptTransientKey.Bool(f.GetTransient()),
		attribute.Bool("stubborn.will_retry", fa.GetWillRetry()),
	}
	if f.GetPath() != "" {
		attrs = append(attrs, pathKey.String(f.GetPath()))
	}
	if reason != "" {
		attrs = append(attrs, reasonKey.String(reason), attribute.String("stubborn.not_retried_reason", f.GetNotRetriedReason()))
		rs.t.m.suppressed.Add(rs.ctx, 1, metric.WithAttributeSet(attribute.NewSet(delegateKey.String(f.GetDelegate()), reasonKey.String(reason))))
	}
	if ac := fa.GetAnalysisCost(); ac != nil {
		rs.addCost(ac.GetDelegate(), ac.GetCost())
	}
	rs.span.AddEvent("stubborn.failure", trace.WithAttributes(attrs...))
}

func (rs *runState) backoffLocked(path string, b *stubbornv1.BackoffScheduled) {
	wait := b.GetWait().AsDuration()
	delegate := rs.lastDelegate[path]
	if !rs.t.off {
		rs.recordBackoff(path, delegate, wait, b)
	}
	rs.log(slog.LevelDebug, "backoff scheduled",
		slog.Int("attempt", int(b.GetNextAttempt())), slog.String("delegate", delegate),
		slog.Duration("wait", wait), slog.Bool("from_hint", b.GetFromHint()))
}

// recordBackoff records a backoff's wait and adds its span event.
func (rs *runState) recordBackoff(path, delegate string, wait time.Duration, b *stubbornv1.BackoffScheduled) {
	rs.t.m.backoff.Record(rs.ctx, wait.Seconds(), metric.WithAttributeSet(attribute.NewSet(
		delegateKey.String(delegate), backoffFromHintKey.Bool(b.GetFromHint()))))
	attrs := []attribute.KeyValue{
		attribute.Int("stubborn.attempt.next", int(b.GetNextAttempt())),
		delegateKey.String(delegate),
		attribute.Float64("stubborn.backoff.wait_s", wait.Seconds()),
		attribute.Float64("stubborn.backoff.bound_s", b.GetBound().AsDuration().Seconds()),
		backoffFromHintKey.Bool(b.GetFromHint()),
	}
	if path != "" {
		attrs = append(attrs, pathKey.String(path))
	}
	rs.span.AddEvent("stubborn.backoff", trace.WithAttributes(attrs...))
}

func (rs *runState) finishLocked(st *stubbornv1.ControlState) {
	rs.done = true
	status := statusName(st.GetStatus())
	d := time.Since(rs.start)
	if !rs.t.off {
		rs.recordEnd(st, status, d)
	}
	la := []slog.Attr{
		rs.logControl, slog.String("status", status), slog.Int("attempts", int(st.GetAttempts())),
		slog.Duration("duration", d),
	}
	if w := st.GetWinner(); w != "" {
		la = append(la, slog.String("winner", w))
	}
	if rs.t.logger.Enabled(rs.ctx, slog.LevelDebug) {
		// The reason may quote a delegate's error or a judge: debug only.
		la = append(la, slog.String("reason", st.GetStatusReason()))
	}
	rs.log(slog.LevelInfo, "run finished", la...)
	rs.releaseLocked()
}

// recordEnd ends the run's spans and records its metrics: it ended as st
// (status) after d.
func (rs *runState) recordEnd(st *stubbornv1.ControlState, status string, d time.Duration) {
	attrs := []attribute.KeyValue{runStatusKey.String(status), runAttemptsKey.Int(int(st.GetAttempts()))}
	if w := st.GetWinner(); w != "" {
		attrs = append(attrs, runWinnerKey.String(w))
	}
	rs.span.SetAttributes(attrs...)
	switch st.GetStatus() {
	case stubbornv1.RunStatus_RUN_STATUS_FAILED, stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED:
		rs.span.SetStatus(otelcodes.Error, status)
	}
	rs.endAttemptsLocked()
	rs.span.End()
	m := &rs.t.m
	set := metric.WithAttributeSet(attribute.NewSet(controlKey.String(controlName(st.GetControl())), runStatusKey.String(status)))
	m.runsFinished.Add(rs.ctx, 1, set)
	m.runDuration.Record(rs.ctx, d.Seconds(), set)
	if rs.awaiting {
		m.runsAwaiting.Add(rs.ctx, -1, rs.control)
	}
	if rs.active {
		m.runsActive.Add(rs.ctx, -1, rs.control)
	}
}

func (rs *runState) abandonLocked() {
	rs.done = true
	rs.span.SetAttributes(attribute.Bool("stubborn.run.abandoned", true))
	rs.endAttemptsLocked()
	rs.span.End()
	if !rs.t.off && rs.awaiting {
		rs.t.m.runsAwaiting.Add(rs.ctx, -1, rs.control)
	}
	if !rs.t.off && rs.active {
		rs.t.m.runsActive.Add(rs.ctx, -1, rs.control)
	}
	rs.log(slog.LevelInfo, "run no longer driven by this server", rs.logControl)
	rs.releaseLocked()
}

// releaseLocked lets go of the spans and contexts once the run has ended
// here: the manager keeps finished runs (and so this state) for a while.
func (rs *runState) releaseLocked() {
	rs.t.live.CompareAndDelete(rs.id, rs)
	rs.attempts, rs.lastDelegate = nil, nil
	rs.span = trace.SpanFromContext(context.Background())
	rs.ctx = context.Background()
}

// endAttemptsLocked ends the spans of attempts the run left unfinished (a
// panic, a loser nobody recorded, a run abandoned).
func (rs *runState) endAttemptsLocked() {
	for _, a := range rs.attempts {
		if !a.ended {
			a.ended = true
			a.span.SetAttributes(attemptOutcomeKey.String(outcomeName(stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_UNSPECIFIED)))
			a.span.End()
		}
	}
}

// attemptAttrs are the log attributes naming an attempt.
func attemptAttrs(a *stubbornv1.Attempt) []slog.Attr {
	la := make([]slog.Attr, 0, 8)
	la = append(la, slog.Int("attempt", int(a.GetNumber())), slog.String("delegate", a.GetDelegate()))
	if a.GetPath() != "" {
		la = append(la, slog.String("path", a.GetPath()))
	}
	return la
}

// log writes a line about the run: run_id and trace_id first.
func (rs *runState) log(level slog.Level, msg string, attrs ...slog.Attr) {
	l := rs.t.logger
	if !l.Enabled(rs.ctx, level) {
		return
	}
	all := make([]slog.Attr, 0, len(rs.logAttrs)+len(attrs))
	all = append(all, rs.logAttrs...)
	all = append(all, attrs...)
	l.LogAttrs(rs.ctx, level, msg, all...)
}
