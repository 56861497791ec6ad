package delegatekit

import (
	"context"
	"errors"
	"log/slog"
	"runtime/debug"
	"strings"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Func is a delegate: it performs one attempt of the task req describes and
// returns what it produced, or an error that tells Stubborn whether to try
// again (see the package documentation and [Transient], [RetryAfter],
// [Upstream], [Permanent]). ctx ends when the caller gives up on the attempt
// (its timeout, the run cancelled) or the server stops.
type Func func(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.Result, error)

// Register registers fn as the stubborn.v1.DelegateService of s, a
// *grpc.Server of your own, with the same handling as [Serve]: errors mapped
// to statuses, a nil Result answered as an empty one, panics recovered into
// INTERNAL and logged to slog.Default(). Health and reflection are yours to
// register. It panics if fn is nil.
func Register(s grpc.ServiceRegistrar, fn Func) {
	stubbornv1.RegisterDelegateServiceServer(s, newService(fn, slog.Default()))
}

// service is the DelegateServiceServer that calls a Func.
type service struct {
	stubbornv1.UnimplementedDelegateServiceServer
	fn Func
	// recover is go-grpc-middleware's recovery interceptor, called around
	// every call of fn; being here rather than on the server, it also
	// guards fn on a server of the user's (Register).
	recover grpc.UnaryServerInterceptor
}

var executeInfo = &grpc.UnaryServerInfo{FullMethod: stubbornv1.DelegateService_Execute_FullMethodName}

func newService(fn Func, logger *slog.Logger) *service {
	if fn == nil {
		panic("delegatekit: nil Func")
	}
	onPanic := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		logger.ErrorContext(ctx, "delegatekit: panic in delegate", "panic", p, "stack", string(debug.Stack()))
		return status.Error(codes.Internal, "delegate panicked")
	})
	return &service{fn: fn, recover: recovery.UnaryServerInterceptor(onPanic)}
}

// Execute calls fn, recovering a panic, and turns its error into a status.
func (s *service) Execute(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
	out := &output{}
	ctx = context.WithValue(ctx, outputKey{}, out)
	resp, err := s.recover(ctx, req, executeInfo, s.call)
	out.close()
	if err != nil {
		return nil, statusError(err)
	}
	return resp.(*stubbornv1.ExecuteResponse), nil
}

// call is the grpc.UnaryHandler the recovery interceptor wraps: fn's
// answer, with the pieces it sent (Send) as its text when it has none.
func (s *service) call(ctx context.Context, req any) (any, error) {
	res, err := s.fn(ctx, req.(*stubbornv1.ExecuteRequest))
	if err != nil {
		return nil, err
	}
	if out, ok := ctx.Value(outputKey{}).(*output); ok {
		res = out.answer(res)
	}
	if res == nil {
		res = &stubbornv1.Result{}
	}
	return &stubbornv1.ExecuteResponse{Result: res}, nil
}

// statusError is the status a Func's error reaches the caller as: a status
// error as it is; an error wrapping one as that status with the whole text
// as its message, where the status error's own text ("rpc error: code = …
// desc = busy") reads as its message only ("busy"); a context error as
// DEADLINE_EXCEEDED or CANCELLED; anything else as UNKNOWN with its text.
func statusError(err error) error {
	if _, ok := err.(grpcStatuser); ok {
		return err // grpc-go reads its status
	}
	var se interface {
		error
		grpcStatuser
	}
	if !errors.As(err, &se) || se.GRPCStatus().Code() == codes.OK {
		return status.FromContextError(err).Err()
	}
	st := se.GRPCStatus().Proto()
	st.Message = strings.Replace(err.Error(), se.Error(), st.GetMessage(), 1)
	return status.ErrorProto(st)
}

// grpcStatuser is an error that is a gRPC status, as grpc-go tells them.
type grpcStatuser interface {
	GRPCStatus() *status.Status
}
