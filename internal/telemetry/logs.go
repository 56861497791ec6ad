package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/trace"
)

// LogFields are the fields for the log lines of a server RPC (for
// go-grpc-middleware's logging.WithFieldsFromContextAndCallMeta): trace_id
// when ctx has a span context, and the run_id field of req (nil for a
// stream). A handler that learns its run id later (StartRun, WatchRun) adds
// it with go-grpc-middleware's logging.AddFields.
func LogFields(ctx context.Context, req any) []any {
	var f []any
	if sc := trace.SpanContextFromContext(ctx); sc.HasTraceID() {
		f = append(f, "trace_id", sc.TraceID().String())
	}
	if r, ok := req.(interface{ GetRunId() string }); ok && r.GetRunId() != "" {
		f = append(f, "run_id", r.GetRunId())
	}
	return f
}
