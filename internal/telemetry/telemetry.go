// Package telemetry is Stubborn's OpenTelemetry and log glue: a span per run
// and per attempt, joined to the caller's trace and to the delegates'; the
// stubborn.* metrics; a structured log line for each step of a run; gRPC
// stats handlers for the server and the delegate clients; and the OTel SDK
// set up from the standard OTEL_* environment variables, with an optional
// Prometheus scrape handler.
//
// A [Telemetry] implements the runs package's Observer (ObserveRun) and wraps
// the delegates ([Telemetry.Delegates]). Its providers are injected through
// [Config], so tests use in-memory ones and nothing here touches the global
// providers.
package telemetry

import (
	"context"
	"log/slog"
	"net/http"
	"sync"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/stats"
)

// Config says where Stubborn's telemetry goes. The zero value records no
// span and no metric, yet still carries the callers' W3C trace context on
// to the delegates, and logs runs to slog.Default().
type Config struct {
	// TracerProvider makes Stubborn's spans and otelgrpc's. Nil means none
	// are recorded (a no-op provider).
	TracerProvider trace.TracerProvider
	// MeterProvider makes the stubborn.* metrics and otelgrpc's rpc.*
	// metrics. Nil means none are recorded (a no-op provider).
	MeterProvider metric.MeterProvider
	// Propagator reads and writes trace context on gRPC metadata. Nil means
	// W3C trace context and baggage.
	Propagator propagation.TextMapPropagator
	// Logger receives a line for each step of every run. Nil means
	// slog.Default().
	Logger *slog.Logger
}

// Telemetry observes runs and delegate calls. It is safe for concurrent use.
type Telemetry struct {
	tp     trace.TracerProvider
	mp     metric.MeterProvider
	prop   propagation.TextMapPropagator
	tracer trace.Tracer
	logger *slog.Logger
	m      instruments
	// off: no tracer and no meter provider, so nothing is recorded but the
	// run logs; the trace context is still passed on.
	off bool
	// live holds the runs ObserveRun observes, by run id, until they end
	// here: how Delegates finds the run a call belongs to.
	live sync.Map
	// breakers feeds the breaker state gauge.
	breakers breakerStates
}

// New builds a Telemetry from cfg. It fails only when an instrument cannot
// be created.
func New(cfg Config) (*Telemetry, error) {
	t := &Telemetry{
		tp: cfg.TracerProvider, mp: cfg.MeterProvider, prop: cfg.Propagator, logger: cfg.Logger,
		off: cfg.TracerProvider == nil && cfg.MeterProvider == nil,
	}
	if t.tp == nil {
		t.tp = tracenoop.NewTracerProvider()
	}
	if t.mp == nil {
		t.mp = metricnoop.NewMeterProvider()
	}
	if t.prop == nil {
		t.prop = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	if t.logger == nil {
		t.logger = slog.Default()
	}
	t.tracer = t.tp.Tracer(scopeName)
	meter := t.mp.Meter(scopeName)
	m, err := newInstruments(meter)
	if err != nil {
		return nil, err
	}
	t.m = m
	if _, err := meter.Int64ObservableGauge("stubborn.delegate.breaker.state", metric.WithUnit("{breaker}"),
		metric.WithDescription("Delegates' circuit breaker states as this server sees them (the fleet's when fleet-wide): 1 for the current state (closed, open, half-open), 0 for the others; a delegate appears from its first transition."),
		metric.WithInt64Callback(t.breakers.observe)); err != nil {
		return nil, err
	}
	return t, nil
}

// ServerHandler returns the stats handler for Stubborn's gRPC server
// (grpc.StatsHandler): otelgrpc's, which makes a server span per RPC (health
// checks excluded) as a child of the caller's trace context and records the
// rpc.server.* metrics. When nothing is recorded
// (no tracer and no meter provider), it only reads the caller's trace
// context.
func (t *Telemetry) ServerHandler() stats.Handler {
	if t.off {
		return propagatingServer{t.prop}
	}
	return otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(t.tp),
		otelgrpc.WithMeterProvider(t.mp),
		otelgrpc.WithPropagators(t.prop),
		otelgrpc.WithFilter(filters.Not(filters.HealthCheck())),
	)
}

// ClientHandler returns the stats handler for the delegate connections
// (grpc.WithStatsHandler): otelgrpc's, which makes a client span per call as
// a child of the attempt's span, sends the trace context to the delegate and
// records the rpc.client.* metrics. When nothing is recorded, it only passes
// the trace context on.
func (t *Telemetry) ClientHandler() stats.Handler {
	if t.off {
		return propagatingClient{t.prop}
	}
	return otelgrpc.NewClientHandler(
		otelgrpc.WithTracerProvider(t.tp),
		otelgrpc.WithMeterProvider(t.mp),
		otelgrpc.WithPropagators(t.prop),
	)
}

// HTTPTransport wraps the transport of the HTTP delegates (http, openai,
// anthropic) as ClientHandler does the gRPC ones: otelhttp's, which makes a
// client span per request (a child of the attempt span) and records the
// http.client.* metrics, and sends the trace context in the request's
// headers. When nothing is recorded it only sends the trace context.
func (t *Telemetry) HTTPTransport(rt http.RoundTripper) http.RoundTripper {
	if t.off {
		return propagatingTransport{prop: t.prop, next: rt}
	}
	return otelhttp.NewTransport(rt,
		otelhttp.WithTracerProvider(t.tp),
		otelhttp.WithMeterProvider(t.mp),
		otelhttp.WithPropagators(t.prop),
	)
}

// Durations are in seconds (the semantic conventions' unit); the buckets
// reach minutes, as delegates may be slow models and waits long.
var (
	attemptBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 30, 60, 120, 300}
	backoffBuckets = []float64{0, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}
	runBuckets     = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}
)

// instruments are the stubborn.* metrics (docs/observability.md) and the
// GenAI conventions' gen_ai.client.* ones.
type instruments struct {
	runsStarted     metric.Int64Counter
	runsResumed     metric.Int64Counter
	runsFinished    metric.Int64Counter
	runDuration     metric.Float64Histogram
	runsActive      metric.Int64UpDownCounter
	runsAwaiting    metric.Int64UpDownCounter
	attempts        metric.Int64Counter
	attemptDuration metric.Float64Histogram
	backoff         metric.Float64Histogram
	suppressed      metric.Int64Counter
	breaker         metric.Int64Counter
	refused         metric.Int64Counter
	firstOutput     metric.Float64Histogram
	cost            metric.Float64Counter
	genai           genaiInstruments
}

func newInstruments(m metric.Meter) (instruments, error) {
	var (
		in   instruments
		errs []error
	)
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	updown := func(name, unit, desc string) metric.Int64UpDownCounter {
		c, err := m.Int64UpDownCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	histogram := func(name, desc string, buckets []float64) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(buckets...))
		errs = append(errs, err)
		return h
	}
	in.runsStarted = counter("stubborn.runs.started", "{run}", "Runs started, by control.")
	in.runsResumed = counter("stubborn.runs.resumed", "{run}", "Runs taken over after their previous owner stopped, by control.")
	in.runsFinished = counter("stubborn.runs.finished", "{run}", "Runs ended, by control and final status.")
	in.runDuration = histogram("stubborn.run.duration", "How long runs took, from when this server began driving them to their end, by control and final status.", runBuckets)
	in.runsActive = updown("stubborn.runs.active", "{run}", "Runs this server is driving now (in flight), by control.")
	in.runsAwaiting = updown("stubborn.runs.awaiting_decision", "{run}", "Runs waiting for DecideRun now, by control.")
	in.attempts = counter("stubborn.attempts", "{attempt}", "Attempts ended, by delegate and outcome.")
	in.attemptDuration = histogram("stubborn.attempt.duration", "How long attempts took, judging included, by delegate and outcome.", attemptBuckets)
	in.backoff = histogram("stubborn.backoff.duration", "Backoff waits scheduled before retries, by delegate and whether the delegate's hint set them.", backoffBuckets)
	in.suppressed = counter("stubborn.retries.suppressed", "{retry}", "Failures the retry control did not retry, by delegate and reason.")
	in.breaker = counter("stubborn.delegate.breaker.transitions", "{transition}", "Changes of delegates' circuit breakers on this server, by delegate and new state (closed, open, half-open).")
	in.refused = counter("stubborn.delegate.refused", "{call}", "Calls a delegate's guard refused (not sent), by delegate and guard (circuit_breaker, bulkhead, rate_limit).")
	in.firstOutput = histogram("stubborn.attempt.first_output", "Time to first output of streamed attempts (from the call to the delegate's first piece of text), by delegate.", attemptBuckets)
	cost, err := m.Float64Counter("stubborn.run.cost", metric.WithUnit("{cost}"),
		metric.WithDescription("What runs' delegate calls cost (attempts, judges, analysts), in the unit of the delegates' prices, by tenant and delegate."))
	in.cost = cost
	errs = append(errs, err)
	in.genai, err = newGenAIInstruments(m)
	errs = append(errs, err)
	for _, err := range errs {
		if err != nil {
			return instruments{}, err
		}
	}
	return in, nil
}

// BreakerChanged records a change of a delegate's circuit breaker (this
// server's own) to state to (closed, open, half-open), and logs it: from,
// to and why.
func (t *Telemetry) BreakerChanged(delegate, from, to, why string) {
	t.BreakerTransition(BreakerChange{Delegate: delegate, From: from, To: to, Why: why})
}

// BreakerChange is a change of a delegate's circuit breaker.
type BreakerChange struct {
	Delegate string
	// From and To are the states: closed, open, half-open.
	From, To string
	// Why says what made it change.
	Why string
	// Fleet says the breaker is the fleet's (fleet-wide guards on a
	// shared store), as this server sees it, not this server's own.
	Fleet bool
	// OpenedBy names the replica that opened the fleet's breaker; empty
	// when unknown or when the breaker is this server's own.
	OpenedBy string
}

// maxReplicaName bounds the replica name a metric attribute carries (it
// comes from the shared store).
const maxReplicaName = 64

// maxBreakers bounds the delegates whose breaker state the state gauge
// keeps (a registry holds far fewer).
const maxBreakers = 10000

// BreakerTransition records c: the transitions counter by delegate and new
// state, plus, for the fleet's breaker, scope fleet and the replica that
// opened it; the breaker's state for the state gauge; and a log line (WARN
// when it opens).
func (t *Telemetry) BreakerTransition(c BreakerChange) {
	attrs := []attribute.KeyValue{delegateKey.String(c.Delegate), breakerStateKey.String(c.To)}
	openedBy := c.OpenedBy
	if len(openedBy) > maxReplicaName {
		openedBy = openedBy[:maxReplicaName]
	}
	if c.Fleet {
		attrs = append(attrs, breakerScopeKey.String("fleet"))
		if openedBy != "" {
			attrs = append(attrs, breakerOpenedByKey.String(openedBy))
		}
	}
	t.m.breaker.Add(context.Background(), 1, metric.WithAttributeSet(attribute.NewSet(attrs...)))
	t.breakers.set(c.Delegate, c.To)
	level := slog.LevelInfo
	if c.To == "open" {
		level = slog.LevelWarn
	}
	args := []any{"delegate", c.Delegate, "from", c.From, "to", c.To, "why", c.Why}
	if c.Fleet {
		args = append(args, "scope", "fleet")
		if openedBy != "" {
			args = append(args, "opened_by", openedBy)
		}
	}
	t.logger.Log(context.Background(), level, "circuit breaker changed", args...)
}

// breakerStates is each delegate's breaker state as the last transition
// this server saw left it (the fleet's, for a fleet-wide breaker), for the
// state gauge. A delegate with no transition yet is not listed: closed.
type breakerStates struct {
	mu sync.Mutex
	by map[string]string
}

func (b *breakerStates) set(delegate, state string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.by == nil {
		b.by = map[string]string{}
	}
	if _, known := b.by[delegate]; !known && len(b.by) >= maxBreakers {
		return
	}
	b.by[delegate] = state
}

// breakerStateNames are the states the gauge reports, one point each.
var breakerStateNames = []string{"closed", "open", "half-open"}

// observe reports, for every delegate listed, 1 for its state and 0 for
// the others, so that a query on state="open" finds the open ones.
func (b *breakerStates) observe(_ context.Context, o metric.Int64Observer) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for d, st := range b.by {
		for _, name := range breakerStateNames {
			var v int64
			if name == st {
				v = 1
			}
			o.Observe(v, metric.WithAttributeSet(attribute.NewSet(delegateKey.String(d), breakerStateKey.String(name))))
		}
	}
	return nil
}

// Refused records a call a delegate's guard (circuit_breaker, bulkhead,
// rate_limit) refused.
func (t *Telemetry) Refused(delegate, guard string) {
	t.m.refused.Add(context.Background(), 1, metric.WithAttributeSet(attribute.NewSet(delegateKey.String(delegate), guardKey.String(guard))))
}
