package telemetry

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
)

// When nothing is recorded (no tracer and no meter provider), otelgrpc's
// handlers would still make a no-op span and build metric attributes for
// every RPC, only to pass the trace context along. These handlers do just
// that passing along, with the configured propagator: the server's reads the
// caller's trace context and baggage from the request metadata; the
// client's writes the run's into each delegate call's.

// mdCarrier is gRPC metadata as a propagation.TextMapCarrier.
type mdCarrier metadata.MD

var _ propagation.TextMapCarrier = mdCarrier(nil)

func (c mdCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c mdCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c mdCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// propagatingServer extracts the caller's trace context on the server.
type propagatingServer struct{ prop propagation.TextMapPropagator }

func (h propagatingServer) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return h.prop.Extract(ctx, incomingCarrier{ctx})
}

// incomingCarrier reads a server call's request metadata as a
// propagation.TextMapCarrier, each key as it is asked for: the whole
// metadata is not copied for every call (metadata.FromIncomingContext).
type incomingCarrier struct{ ctx context.Context }

var _ propagation.TextMapCarrier = incomingCarrier{}

func (c incomingCarrier) Get(key string) string {
	if v := metadata.ValueFromIncomingContext(c.ctx, key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (incomingCarrier) Set(string, string) {} // the request's metadata is read only

func (c incomingCarrier) Keys() []string {
	md, _ := metadata.FromIncomingContext(c.ctx)
	return mdCarrier(md).Keys()
}

func (propagatingServer) HandleRPC(context.Context, stats.RPCStats) {}

func (propagatingServer) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}

func (propagatingServer) HandleConn(context.Context, stats.ConnStats) {}

// propagatingClient injects the call's trace context into its metadata.
type propagatingClient struct{ prop propagation.TextMapPropagator }

func (h propagatingClient) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	if !trace.SpanContextFromContext(ctx).IsValid() && baggage.FromContext(ctx).Len() == 0 {
		return ctx // nothing to pass on
	}
	md, ok := metadata.FromOutgoingContext(ctx) // a copy
	if !ok {
		md = metadata.MD{}
	}
	h.prop.Inject(ctx, mdCarrier(md))
	return metadata.NewOutgoingContext(ctx, md)
}

func (propagatingClient) HandleRPC(context.Context, stats.RPCStats) {}

func (propagatingClient) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}

func (propagatingClient) HandleConn(context.Context, stats.ConnStats) {}

// propagatingTransport injects the request's trace context into its
// headers.
type propagatingTransport struct {
	prop propagation.TextMapPropagator
	next http.RoundTripper
}

func (p propagatingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx := r.Context()
	if !trace.SpanContextFromContext(ctx).IsValid() && baggage.FromContext(ctx).Len() == 0 {
		return p.next.RoundTrip(r)
	}
	r = r.Clone(ctx) // a RoundTripper must not change its request
	p.prop.Inject(ctx, propagation.HeaderCarrier(r.Header))
	return p.next.RoundTrip(r)
}
