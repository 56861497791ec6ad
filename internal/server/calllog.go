package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/stubbornhq/stubborn/internal/telemetry"
)

// callLog returns the interceptors that log each call when it finishes:
// the line of go-grpc-middleware's logging interceptor ("finished call",
// with its fields: protocol, grpc.component, grpc.service, grpc.method,
// grpc.method_type, peer.address, grpc.start_time,
// grpc.request.deadline, grpc.code, grpc.error, grpc.time_ms), the
// fields handlers add (logging.AddFields: run_id, tenant) and trace_id,
// at callLevel.
//
// They are that library's interceptors (interceptors.UnaryServerInterceptor
// and StreamServerInterceptor) with a reporter of this server's: the
// logging package's own builds every call's fields when the call starts
// and again when it ends, some sixty allocations a call, before it knows
// whether its logger writes the line — and a call that succeeded is
// logged at debug, which a server at info drops (docs/PERFORMANCE.md,
// "Calls logged only when written"). This reporter builds the line only
// when the logger writes its level.
func callLog(logger *slog.Logger) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	report := interceptors.CommonReportableFunc(func(ctx context.Context, c interceptors.CallMeta) (interceptors.Reporter, context.Context) {
		// An empty set in the context for the handlers' AddFields.
		ctx = logging.InjectFields(ctx, logging.Fields{})
		return &callReporter{meta: c, ctx: ctx, logger: logger}, ctx
	})
	return interceptors.UnaryServerInterceptor(report), interceptors.StreamServerInterceptor(report)
}

// callReporter logs one call's end.
type callReporter struct {
	meta   interceptors.CallMeta
	ctx    context.Context
	logger *slog.Logger
}

// PostMsgSend and PostMsgReceive log nothing: payloads are never logged
// (requests, responses: briefs, results), nor does a call's start.
func (*callReporter) PostMsgSend(any, error, time.Duration)    {}
func (*callReporter) PostMsgReceive(any, error, time.Duration) {}

// PostCall writes the call's line, if its logger writes the line's level.
func (r *callReporter) PostCall(err error, took time.Duration) {
	if errors.Is(err, io.EOF) {
		err = nil
	}
	code := status.Code(err)
	level := slog.Level(callLevel(code))
	if !r.logger.Enabled(r.ctx, level) {
		return
	}
	// The request's own fields first (trace_id, run_id), then what the
	// handlers added, then the call's; a key once only, the first kept.
	fields := logging.Fields(telemetry.LogFields(r.ctx, loggable(r.meta.ReqOrNil)))
	fields = fields.AppendUnique(logging.ExtractFields(r.ctx))
	fields = fields.AppendUnique(logging.Fields{
		"protocol", "grpc",
		logging.ComponentFieldKey, logging.KindServerFieldValue,
		logging.ServiceFieldKey, r.meta.Service,
		logging.MethodFieldKey, r.meta.Method,
		logging.MethodTypeFieldKey, string(r.meta.Typ),
	})
	if p, ok := peer.FromContext(r.ctx); ok && p.Addr != nil {
		fields = fields.AppendUnique(logging.Fields{"peer.address", p.Addr.String()})
	}
	fields = fields.AppendUnique(logging.Fields{"grpc.start_time", time.Now().Add(-took).Format(time.RFC3339)})
	if d, ok := r.ctx.Deadline(); ok {
		fields = fields.AppendUnique(logging.Fields{"grpc.request.deadline", d.Format(time.RFC3339)})
	}
	fields = fields.AppendUnique(logging.Fields{"grpc.code", code.String()})
	if err != nil {
		fields = fields.AppendUnique(logging.Fields{"grpc.error", fmt.Sprintf("%v", err)})
	}
	fields = fields.AppendUnique(logging.DurationToTimeMillisFields(took))
	r.logger.Log(r.ctx, level, "finished call", fields...)
}
