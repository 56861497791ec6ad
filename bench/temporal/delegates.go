package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// delegatesCmd serves two DelegateService delegates on loopback, so that
// this module tests itself: echo (answers the brief) and flaky (fails
// attempts 1 and 2 with UNAVAILABLE, answers the brief on attempt 3 and
// after; keyed on ExecuteRequest.attempt, so it keeps no state).
func delegatesCmd(ctx context.Context, fs *flag.FlagSet, args []string, stdout io.Writer) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	echo, err := serveDelegate(echoExecute)
	if err != nil {
		return err
	}
	defer echo.stop()
	flaky, err := serveDelegate(flakyExecute)
	if err != nil {
		return err
	}
	defer flaky.stop()
	fmt.Fprintf(stdout, "READY %s %s\n", echo.addr, flaky.addr)
	<-ctx.Done()
	return nil
}

func echoExecute(_ context.Context, req *executeRequest) (*executeResponse, error) {
	return &executeResponse{Text: req.Brief}, nil
}

func flakyExecute(_ context.Context, req *executeRequest) (*executeResponse, error) {
	if req.Attempt < 3 {
		return nil, status.Errorf(codes.Unavailable, "fail-first-2 delegate: attempt %d fails", req.Attempt)
	}
	return &executeResponse{Text: req.Brief}, nil
}

type delegate struct {
	addr string
	stop func()
}

// serveDelegate serves one Execute handler as stubborn.v1.DelegateService
// on a free loopback port.
func serveDelegate(execute func(context.Context, *executeRequest) (*executeResponse, error)) (*delegate, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(loopback, "0"))
	if err != nil {
		return nil, err
	}
	s := grpc.NewServer(grpc.ForceServerCodec(wireCodec{}))
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: "stubborn.v1.DelegateService",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Execute",
			Handler: func(_ any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
				req := new(executeRequest)
				if err := dec(req); err != nil {
					return nil, err
				}
				return execute(ctx, req)
			},
		}},
		Metadata: "stubborn/v1/delegate.proto",
	}, nil)
	go func() { _ = s.Serve(l) }()
	return &delegate{addr: l.Addr().String(), stop: s.Stop}, nil
}
