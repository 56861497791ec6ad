package delegatekit

import (
	"context"
	"errors"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Server is a gRPC server with a delegate, grpc.health.v1 and (unless
// [WithoutReflection]) reflection registered. Make one with [NewServer] when
// you need it before serving (to register more services, to report health);
// [Serve] does it all in one call.
type Server struct {
	grpc   *grpc.Server
	health *health.Server
	grace  time.Duration
	// stopping is cancelled when the shutdown begins, after the health
	// service went NOT_SERVING; it ends the health watches.
	stopping context.Context
	stop     context.CancelFunc
}

// NewServer returns a server for fn, its health SERVING. Serve it with
// [Server.Serve]. It panics if fn is nil.
func NewServer(fn Func, opts ...Option) *Server {
	c := newConfig(opts)
	s := &Server{
		grpc:   grpc.NewServer(c.serverOptions...),
		health: health.NewServer(),
		grace:  c.grace,
	}
	s.stopping, s.stop = context.WithCancel(context.Background())
	stubbornv1.RegisterDelegateServiceServer(s.grpc, newService(fn, c.logger))
	healthpb.RegisterHealthServer(s.grpc, &healthService{Server: s.health, stopping: s.stopping})
	if !c.noReflection {
		reflection.Register(s.grpc)
	}
	s.SetServing(true)
	return s
}

// GRPC returns the gRPC server, for services of your own (register them
// before Serve) or to stop it at once without Serve's context.
func (s *Server) GRPC() *grpc.Server { return s.grpc }

// SetServing reports the delegate in health as SERVING or NOT_SERVING, as a
// whole (service "", which Stubborn asks before a fallback-chain calls the
// delegate) and as stubborn.v1.DelegateService. Once the shutdown has begun
// it changes nothing: a stopping server stays NOT_SERVING.
func (s *Server) SetServing(serving bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(stubbornv1.DelegateService_ServiceDesc.ServiceName, st)
}

// Serve serves lis until ctx ends, then shuts down gracefully: health goes
// NOT_SERVING (health watches get that, then end), the listener closes, the
// calls in flight get up to the grace of [WithGrace] to finish, and then
// every connection is closed. It returns once all that is done: nil after a
// shutdown, else the error that ended serving (lis failing, say). Call it
// once per Server.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	served := make(chan struct{})
	shutDown := make(chan struct{})
	go func() {
		defer close(shutDown)
		select {
		case <-ctx.Done():
			s.shutdown()
		case <-served:
		}
	}()
	err := s.grpc.Serve(lis)
	close(served)
	<-shutDown
	if errors.Is(err, grpc.ErrServerStopped) && ctx.Err() != nil {
		return nil // ctx ended before grpc-go's Serve began
	}
	return err
}

// shutdown is Serve's ending: NOT_SERVING, then a graceful stop bounded by
// the grace.
func (s *Server) shutdown() {
	s.health.Shutdown()
	s.stop()
	if s.grace <= 0 {
		s.grpc.Stop()
		return
	}
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	t := time.NewTimer(s.grace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.grpc.Stop()
		<-done
	}
}

// Serve serves fn on lis until ctx ends, then shuts down gracefully: see
// [NewServer] and [Server.Serve].
func Serve(ctx context.Context, lis net.Listener, fn Func, opts ...Option) error {
	return NewServer(fn, opts...).Serve(ctx, lis)
}

// ListenAndServe listens on the TCP address addr ("127.0.0.1:7500",
// ":8080"…) and serves fn there like [Serve].
func ListenAndServe(ctx context.Context, addr string, fn Func, opts ...Option) error {
	var lc net.ListenConfig
	lis, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return Serve(ctx, lis, fn, opts...)
}

// healthService is grpc-go's health server whose Watch streams end when the
// shutdown begins: an open watch (a client doing client-side health checks)
// would otherwise hold a graceful stop up for the whole grace.
type healthService struct {
	*health.Server
	stopping context.Context
}

// Watch is health.Server's, until the shutdown, when it sends NOT_SERVING
// last (health.Server does not repeat a status it sent already, nor send one
// for a service it does not know) and ends with UNAVAILABLE.
func (h *healthService) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	defer context.AfterFunc(h.stopping, cancel)()
	err := h.Server.Watch(req, watchStream{Health_WatchServer: stream, ctx: ctx})
	if h.stopping.Err() == nil || stream.Context().Err() != nil {
		return err
	}
	_ = stream.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING})
	return status.Error(codes.Unavailable, "delegatekit: server is shutting down")
}

// watchStream is a Watch stream whose context ends with the shutdown.
type watchStream struct {
	healthpb.Health_WatchServer
	ctx context.Context
}

func (w watchStream) Context() context.Context { return w.ctx }
