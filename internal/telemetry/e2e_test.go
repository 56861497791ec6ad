package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
	"github.com/stubbornhq/stubborn/internal/server"
	"github.com/stubbornhq/stubborn/internal/telemetry"
)

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// providers are in-memory trace and metric providers.
type providers struct {
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
}

func newProviders() *providers {
	p := &providers{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	p.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(p.spans))
	p.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(p.reader))
	return p
}

func (p *providers) config(logger *slog.Logger) telemetry.Config {
	return telemetry.Config{TracerProvider: p.tp, MeterProvider: p.mp, Logger: logger}
}

// metrics collects every metric by name.
func (p *providers) metrics(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, p.reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// matches reports whether set has exactly the attributes kvs.
func matches(set attribute.Set, kvs []attribute.KeyValue) bool {
	if set.Len() != len(kvs) {
		return false
	}
	for _, kv := range kvs {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// sum is the value of an int64 sum's data point with exactly kvs (0 when
// there is none).
func sum(t *testing.T, ms map[string]metricdata.Metrics, name string, kvs ...attribute.KeyValue) int64 {
	t.Helper()
	m, ok := ms[name]
	if !ok {
		return 0
	}
	s, ok := m.Data.(metricdata.Sum[int64])
	require.True(t, ok, "%s is a %T", name, m.Data)
	for _, dp := range s.DataPoints {
		if matches(dp.Attributes, kvs) {
			return dp.Value
		}
	}
	return 0
}

// count is the number of values a float64 histogram's data point with
// exactly kvs holds.
func count(t *testing.T, ms map[string]metricdata.Metrics, name string, kvs ...attribute.KeyValue) uint64 {
	t.Helper()
	m, ok := ms[name]
	if !ok {
		return 0
	}
	h, ok := m.Data.(metricdata.Histogram[float64])
	require.True(t, ok, "%s is a %T", name, m.Data)
	for _, dp := range h.DataPoints {
		if matches(dp.Attributes, kvs) {
			return dp.Count
		}
	}
	return 0
}

// stubborn is a Stubborn server on loopback and a client of it.
type stubborn struct {
	client stubbornv1.ControlServiceClient
	stop   func()
}

// serveDelegate serves svc on loopback and returns its address.
func serveDelegate(t testing.TB, svc stubbornv1.DelegateServiceServer, opts ...grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := demo.Serve(lis, svc, opts...)
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

// startStubborn builds the server with server.New and serves it. stop (also
// run at cleanup) stops it, after which every run has been observed.
func startStubborn(t testing.TB, reg *delegates.Config, tc telemetry.Config, clientOpts ...grpc.DialOption) *stubborn {
	t.Helper()
	logger := tc.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	st, err := server.New(server.Config{Registry: reg, Logger: logger, Telemetry: tc})
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = st.Serve(lis) }()
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, clientOpts...)
	conn, err := grpc.NewClient(lis.Addr().String(), opts...)
	require.NoError(t, err)
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = conn.Close()
			st.Stop(5 * time.Second)
		})
	}
	t.Cleanup(stop)
	return &stubborn{client: stubbornv1.NewControlServiceClient(conn), stop: stop}
}

func failWith(c codes.Code, msg string) *demo.Scripted {
	return demo.NewScripted(func(context.Context, *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		return nil, status.Error(c, msg)
	})
}

// runToEnd runs req and returns its events.
func runToEnd(t *testing.T, ctx context.Context, c stubbornv1.ControlServiceClient, req *stubbornv1.RunRequest) []*stubbornv1.RunEvent {
	t.Helper()
	stream, err := c.Run(ctx, req)
	require.NoError(t, err)
	var evs []*stubbornv1.RunEvent
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		evs = append(evs, m.GetEvent())
	}
	require.NotEmpty(t, evs)
	require.NotNil(t, evs[len(evs)-1].GetRunFinished(), "the last event is run_finished")
	return evs
}

func attr(s sdktrace.ReadOnlySpan, key attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

func spansNamed(spans []sdktrace.ReadOnlySpan, prefix string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if strings.HasPrefix(s.Name(), prefix) {
			out = append(out, s)
		}
	}
	return out
}

func childrenOf(spans []sdktrace.ReadOnlySpan, parent sdktrace.ReadOnlySpan) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Parent().SpanID() == parent.SpanContext().SpanID() {
			out = append(out, s)
		}
	}
	return out
}

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(b.b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		out = append(out, m)
	}
	return out
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestFallbackChainSpansMetricsAndLogs: a three-attempt fallback chain makes
// one run span with three attempt children carrying the right attributes,
// each the parent of its delegate call's client span; the metrics count the
// run and each attempt; every log line about the run names it and its
// trace, and none carries the brief or the result.
func TestFallbackChainSpansMetricsAndLogs(t *testing.T) {
	p := newProviders()
	logs := &syncBuffer{}
	// At debug, to see every line; what the default level (info) writes
	// is checked below by each line's level.
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	reg := &delegates.Config{Delegates: []delegates.Delegate{
		{Name: "unavailable", Target: serveDelegate(t, failWith(codes.Unavailable, "try later")), Idempotent: true},
		{Name: "broken", Target: serveDelegate(t, failWith(codes.Internal, "broken")), Idempotent: true},
		{Name: "echo", Target: serveDelegate(t, demo.Echo{}), Idempotent: true},
	}}
	s := startStubborn(t, reg, p.config(logger))
	const brief = "the secret brief"
	evs := runToEnd(t, testCtx(t), s.client, &stubbornv1.RunRequest{
		TaskBrief:     brief,
		FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"unavailable", "broken", "echo"}},
	})
	final := evs[len(evs)-1].GetRunFinished().GetState()
	require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, final.GetStatus())
	s.stop()

	spans := p.spans.Ended()
	runs := spansNamed(spans, "stubborn.run ")
	require.Len(t, runs, 1)
	run := runs[0]
	assert.Equal(t, "stubborn.run fallback_chain", run.Name())
	for key, want := range map[attribute.Key]attribute.Value{
		telemetry.RunIDKey:       attribute.StringValue(final.GetRunId()),
		telemetry.ControlKey:     attribute.StringValue("fallback_chain"),
		telemetry.RunStatusKey:   attribute.StringValue("succeeded"),
		telemetry.RunAttemptsKey: attribute.IntValue(3),
		telemetry.RunWinnerKey:   attribute.StringValue("echo"),
	} {
		got, ok := attr(run, key)
		assert.True(t, ok, "run span has %s", key)
		assert.Equal(t, want, got, "run span %s", key)
	}
	// The run span is a child of the Run RPC's server span.
	rpcs := spansNamed(spans, "stubborn.v1.ControlService/Run")
	require.Len(t, rpcs, 1)
	assert.Equal(t, trace.SpanKindServer, rpcs[0].SpanKind())
	assert.Equal(t, rpcs[0].SpanContext().SpanID(), run.Parent().SpanID())
	assert.Equal(t, rpcs[0].SpanContext().TraceID(), run.SpanContext().TraceID())
	assert.Contains(t, final.GetTraceparent(), rpcs[0].SpanContext().TraceID().String(), "traceparent names the request's trace")

	attempts := spansNamed(childrenOf(spans, run), "stubborn.attempt ")
	require.Len(t, attempts, 3, "three attempt spans under the run span")
	require.Len(t, spansNamed(spans, "stubborn.attempt "), 3, "and no other attempt span")
	want := []struct {
		delegate, outcome, errType string
		transient                  *bool
	}{
		{"unavailable", "error", "UNAVAILABLE", new(true)},
		{"broken", "error", "INTERNAL", new(false)},
		{"echo", "succeeded", "", nil},
	}
	byNumber := map[int64]sdktrace.ReadOnlySpan{}
	for _, a := range attempts {
		n, ok := attr(a, telemetry.AttemptNumberKey)
		require.True(t, ok)
		byNumber[n.AsInt64()] = a
	}
	for i, w := range want {
		a := byNumber[int64(i+1)]
		require.NotNil(t, a, "attempt %d", i+1)
		assert.Equal(t, "stubborn.attempt "+w.delegate, a.Name())
		d, _ := attr(a, telemetry.DelegateKey)
		assert.Equal(t, w.delegate, d.AsString())
		o, _ := attr(a, telemetry.AttemptOutcomeKey)
		assert.Equal(t, w.outcome, o.AsString(), "attempt %d outcome", i+1)
		tr, ok := attr(a, telemetry.AttemptTransientKey)
		if w.transient == nil {
			assert.False(t, ok, "a success has no transient attribute")
		} else {
			assert.Equal(t, *w.transient, tr.AsBool(), "attempt %d transient", i+1)
		}
		et, ok := attr(a, "error.type")
		if w.errType == "" {
			assert.False(t, ok)
		} else {
			assert.Equal(t, w.errType, et.AsString())
			sc, _ := attr(a, "rpc.response.status_code")
			assert.Equal(t, w.errType, sc.AsString())
		}
		// The delegate call's otelgrpc client span is the attempt's child.
		calls := childrenOf(spans, a)
		require.Len(t, calls, 1, "attempt %d has one delegate call", i+1)
		// A delegatekit delegate serves ExecuteStream, which Stubborn
		// asks first (registry stream: auto).
		assert.Equal(t, "stubborn.v1.DelegateService/ExecuteStream", calls[0].Name())
		assert.Equal(t, trace.SpanKindClient, calls[0].SpanKind())
	}

	ms := p.metrics(t)
	control := telemetry.ControlKey.String("fallback_chain")
	assert.EqualValues(t, 1, sum(t, ms, "stubborn.runs.started", control))
	assert.EqualValues(t, 1, sum(t, ms, "stubborn.runs.finished", control, telemetry.RunStatusKey.String("succeeded")))
	assert.EqualValues(t, 1, count(t, ms, "stubborn.run.duration", control, telemetry.RunStatusKey.String("succeeded")))
	assert.EqualValues(t, 0, sum(t, ms, "stubborn.runs.active", control))
	assert.Contains(t, ms, "stubborn.runs.active")
	for _, w := range want {
		kvs := []attribute.KeyValue{telemetry.DelegateKey.String(w.delegate), telemetry.AttemptOutcomeKey.String(w.outcome)}
		assert.EqualValues(t, 1, sum(t, ms, "stubborn.attempts", kvs...), "attempts %v", kvs)
		assert.EqualValues(t, 1, count(t, ms, "stubborn.attempt.duration", kvs...), "attempt.duration %v", kvs)
	}
	assert.NotContains(t, ms, "stubborn.retries.suppressed", "a chain suppresses no retry")
	assert.NotContains(t, ms, "stubborn.backoff.duration")
	assert.Contains(t, ms, "rpc.server.call.duration", "otelgrpc's server metrics")
	assert.Contains(t, ms, "rpc.client.call.duration", "otelgrpc's client metrics")

	// Logs: every line about the run names it and its trace; attempt lines
	// name the attempt and delegate; no line at the default level (info)
	// carries the brief or a result. At info, a run writes its end and
	// its failed attempts; the call that succeeded, the attempt that
	// succeeded and the run's start are at debug.
	traceID := run.SpanContext().TraceID().String()
	var attemptLines, finishedCall int
	info := map[string]int{}
	for _, l := range logs.lines(t) {
		msg, _ := l["msg"].(string)
		if l["level"] != "DEBUG" {
			info[msg]++
			line, err := json.Marshal(l)
			require.NoError(t, err)
			assert.NotContains(t, string(line), "secret", "no brief at the default level")
			assert.NotContains(t, string(line), "echo: ", "no result at the default level")
		}
		switch {
		case msg == "finished call" && l["grpc.method"] == "Run":
			finishedCall++
			assert.Equal(t, "DEBUG", l["level"], "a call that succeeded")
			assert.Equal(t, final.GetRunId(), l["run_id"], "the Run RPC's log line names its run")
			assert.Equal(t, traceID, l["trace_id"])
		case strings.Contains(msg, "run") || strings.Contains(msg, "attempt"):
			assert.Equal(t, final.GetRunId(), l["run_id"], "%s", msg)
			assert.Equal(t, traceID, l["trace_id"], "%s", msg)
			if msg == "attempt finished" {
				attemptLines++
				assert.NotEmpty(t, l["delegate"])
				assert.NotZero(t, l["attempt"])
				assert.Equal(t, l["outcome"] == "succeeded", l["level"] == "DEBUG", "%v", l)
			}
		}
	}
	assert.Equal(t, 3, attemptLines)
	assert.Equal(t, 1, finishedCall)
	assert.Equal(t, map[string]int{"attempt finished": 2, "run finished": 1}, info, "what info writes of a run")
}

// TestRetryMetricsAndSpanEvents: backoff waits and decisions are events on
// the run span; the backoff histogram, suppressed retries by reason and the
// runs awaiting a decision are measured.
func TestRetryMetricsAndSpanEvents(t *testing.T) {
	p := newProviders()
	flaky := demo.NewScripted(func(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		if req.GetAttempt() <= 2 {
			return nil, status.Error(codes.Unavailable, "not yet")
		}
		return demo.Echo{}.Execute(ctx, req)
	})
	reg := &delegates.Config{Delegates: []delegates.Delegate{
		{Name: "flaky", Target: serveDelegate(t, flaky), Idempotent: true},
		{Name: "broken", Target: serveDelegate(t, failWith(codes.Internal, "broken")), Idempotent: true},
		{Name: "busy", Target: serveDelegate(t, failWith(codes.Unavailable, "busy")), Idempotent: true},
		{Name: "unsafe", Target: serveDelegate(t, failWith(codes.Unavailable, "busy")), Idempotent: false},
	}}
	s := startStubborn(t, reg, p.config(nil))
	ctx := testCtx(t)
	retry := func(target string, attempts int32) *stubbornv1.RunRequest {
		return &stubbornv1.RunRequest{TaskBrief: "do it", Retry: &stubbornv1.RetrySpec{
			Target: target, Attempts: &attempts,
			BaseWait: durationpb.New(time.Millisecond), MaxWait: durationpb.New(2 * time.Millisecond),
			OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_ASK,
		}}
	}

	evs := runToEnd(t, ctx, s.client, retry("flaky", 3))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, evs[len(evs)-1].GetRunFinished().GetState().GetStatus())
	evs = runToEnd(t, ctx, s.client, retry("broken", 3))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, evs[len(evs)-1].GetRunFinished().GetState().GetStatus())
	evs = runToEnd(t, ctx, s.client, retry("unsafe", 3))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, evs[len(evs)-1].GetRunFinished().GetState().GetStatus())

	// A run that runs out of retries waits for a decision.
	started, err := s.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "do it", Retry: retry("busy", 0).GetRetry()})
	require.NoError(t, err)
	id := started.GetRunId()
	require.Eventually(t, func() bool {
		got, err := s.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
		return err == nil && got.GetState().GetStatus() == stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION
	}, 10*time.Second, 5*time.Millisecond)
	control := telemetry.ControlKey.String("retry")
	ms := p.metrics(t)
	assert.EqualValues(t, 1, sum(t, ms, "stubborn.runs.awaiting_decision", control))
	assert.EqualValues(t, 1, sum(t, ms, "stubborn.runs.active", control))
	_, err = s.client.DecideRun(ctx, &stubbornv1.DecideRunRequest{RunId: id, Decision: stubbornv1.Decision_DECISION_FAIL})
	require.NoError(t, err)
	s.stop()

	ms = p.metrics(t)
	assert.EqualValues(t, 0, sum(t, ms, "stubborn.runs.awaiting_decision", control))
	assert.EqualValues(t, 0, sum(t, ms, "stubborn.runs.active", control))
	assert.EqualValues(t, 4, sum(t, ms, "stubborn.runs.started", control))
	assert.EqualValues(t, 1, sum(t, ms, "stubborn.runs.finished", control, telemetry.RunStatusKey.String("succeeded")))
	assert.EqualValues(t, 3, sum(t, ms, "stubborn.runs.finished", control, telemetry.RunStatusKey.String("failed")))
	assert.EqualValues(t, 2, count(t, ms, "stubborn.backoff.duration",
		telemetry.DelegateKey.String("flaky"), telemetry.BackoffFromHintKey.Bool(false)))
	assert.EqualValues(t, 2, sum(t, ms, "stubborn.attempts",
		telemetry.DelegateKey.String("flaky"), telemetry.AttemptOutcomeKey.String("error")))
	for _, c := range []struct{ delegate, reason string }{
		{"broken", telemetry.ReasonNotTransient},
		{"unsafe", telemetry.ReasonNotIdempotent},
		{"busy", telemetry.ReasonExhausted},
	} {
		assert.EqualValues(t, 1, sum(t, ms, "stubborn.retries.suppressed",
			telemetry.DelegateKey.String(c.delegate), telemetry.ReasonKey.String(c.reason)), "%+v", c)
	}

	spans := spansNamed(p.spans.Ended(), "stubborn.run retry")
	require.Len(t, spans, 4)
	events := map[string]int{}
	for _, sp := range spans {
		for _, ev := range sp.Events() {
			events[ev.Name]++
		}
	}
	assert.Equal(t, 2, events["stubborn.backoff"])
	assert.Equal(t, 1, events["stubborn.decision_requested"])
	assert.Equal(t, 1, events["stubborn.decision_received"])
	assert.Equal(t, 5, events["stubborn.failure"], "two flaky failures, broken, unsafe, busy")
}

// TestTraceReachesTheDelegate: the caller's trace id reaches a delegate
// instrumented with otelgrpc, through the run and the attempt, whether or
// not Stubborn records spans itself; when it only logs, the run's line
// carries the trace id.
func TestTraceReachesTheDelegate(t *testing.T) {
	for _, mode := range []string{"stubborn records spans", "stubborn records nothing", "stubborn only logs"} {
		recording := mode == "stubborn records spans"
		t.Run(mode, func(t *testing.T) {
			w3c := propagation.TraceContext{}
			// The delegate's own tracing.
			delegateSpans := tracetest.NewSpanRecorder()
			delegateTP := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(delegateSpans))
			var (
				mu       sync.Mutex
				received []trace.SpanContext
			)
			svc := demo.NewScripted(func(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
				mu.Lock()
				received = append(received, trace.SpanContextFromContext(ctx))
				mu.Unlock()
				return demo.Echo{}.Execute(ctx, req)
			})
			addr := serveDelegate(t, svc, grpc.StatsHandler(otelgrpc.NewServerHandler(
				otelgrpc.WithTracerProvider(delegateTP), otelgrpc.WithPropagators(w3c))))
			reg := &delegates.Config{Delegates: []delegates.Delegate{{Name: "traced", Target: addr, Idempotent: true}}}

			p := newProviders()
			lines := &syncBuffer{}
			tc := telemetry.Config{Logger: slog.New(slog.DiscardHandler)}
			if mode == "stubborn only logs" {
				tc.Logger = slog.New(slog.NewJSONHandler(lines, nil))
			}
			if recording {
				tc = p.config(tc.Logger)
			}
			// The caller's tracing.
			callerSpans := tracetest.NewSpanRecorder()
			callerTP := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(callerSpans))
			s := startStubborn(t, reg, tc, grpc.WithStatsHandler(otelgrpc.NewClientHandler(
				otelgrpc.WithTracerProvider(callerTP), otelgrpc.WithPropagators(w3c))))

			ctx, caller := callerTP.Tracer("test").Start(testCtx(t), "caller")
			evs := runToEnd(t, ctx, s.client, &stubbornv1.RunRequest{
				TaskBrief: "hello", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"traced"}},
			})
			caller.End()
			s.stop()
			want := caller.SpanContext().TraceID()

			mu.Lock()
			defer mu.Unlock()
			require.Len(t, received, 1)
			assert.Equal(t, want, received[0].TraceID(), "the delegate's incoming span is in the caller's trace")
			// The delegate's server span ends just after its answer is sent,
			// which may be a moment after the caller has it.
			var ds []sdktrace.ReadOnlySpan
			require.Eventually(t, func() bool {
				ds = spansNamed(delegateSpans.Ended(), "stubborn.v1.DelegateService/Execute")
				return len(ds) == 1
			}, 10*time.Second, time.Millisecond)
			assert.Equal(t, want, ds[0].SpanContext().TraceID())
			assert.True(t, ds[0].Parent().IsRemote())

			st := evs[0].GetRunStarted().GetState()
			assert.Contains(t, st.GetTraceparent(), want.String(), "the run records the caller's trace")
			if mode == "stubborn only logs" {
				var finished map[string]any
				for _, m := range lines.lines(t) {
					if m["msg"] == "run finished" {
						finished = m
					}
				}
				require.NotNil(t, finished, "the run's line")
				assert.Equal(t, want.String(), finished["trace_id"])
				assert.Equal(t, st.GetRunId(), finished["run_id"])
				assert.Equal(t, "succeeded", finished["status"])
				assert.Equal(t, "fallback_chain", finished["control"])
			}
			if !recording {
				return
			}
			// Stubborn's spans: the delegate's parent is the client span of
			// the attempt, under the run, under the Run RPC, under the caller.
			spans := p.spans.Ended()
			byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
			for _, sp := range spans {
				assert.Equal(t, want, sp.SpanContext().TraceID(), "%s is in the caller's trace", sp.Name())
				byID[sp.SpanContext().SpanID()] = sp
			}
			var chain []string
			for id := ds[0].Parent().SpanID(); ; {
				sp, ok := byID[id]
				if !ok {
					break
				}
				chain = append(chain, sp.Name())
				id = sp.Parent().SpanID()
			}
			assert.Equal(t, []string{
				"stubborn.v1.DelegateService/ExecuteStream", "stubborn.attempt traced",
				"stubborn.run fallback_chain", "stubborn.v1.ControlService/Run",
			}, chain)
			require.Len(t, callerSpans.Ended(), 2, "the caller's span and its client span")
		})
	}
}
