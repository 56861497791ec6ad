package telemetry

import (
	"context"
	"sync/atomic"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/stats"
)

// runSlotHandler is a server stats handler that adds a run-id slot to each
// RPC's context before the interceptors and the handler see it.
type runSlotHandler struct {
	stats.Handler
}

type slotKey struct{}

func (h runSlotHandler) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	return context.WithValue(h.Handler.TagRPC(ctx, info), slotKey{}, new(atomic.Pointer[string]))
}

// SetRunID records which run an RPC is about, once the handler knows it (a
// run it started, or the one it watches), for the RPC's log line. It does
// nothing unless ctx went through [Telemetry.ServerHandler].
func SetRunID(ctx context.Context, id string) {
	if slot, ok := ctx.Value(slotKey{}).(*atomic.Pointer[string]); ok && id != "" {
		slot.Store(&id)
	}
}

// LogFields are the fields for the log lines of a server RPC (for
// go-grpc-middleware's logging.WithFieldsFromContextAndCallMeta): trace_id
// when ctx has a span context, and run_id when the RPC is about a run — set
// with [SetRunID], or the run_id field of req (nil for a stream).
func LogFields(ctx context.Context, req any) []any {
	var f []any
	if sc := trace.SpanContextFromContext(ctx); sc.HasTraceID() {
		f = append(f, "trace_id", sc.TraceID().String())
	}
	id := ""
	if slot, ok := ctx.Value(slotKey{}).(*atomic.Pointer[string]); ok {
		if p := slot.Load(); p != nil {
			id = *p
		}
	}
	if r, ok := req.(interface{ GetRunId() string }); ok && id == "" {
		id = r.GetRunId()
	}
	if id != "" {
		f = append(f, "run_id", id)
	}
	return f
}
