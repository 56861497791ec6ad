package server

import (
	"context"
	"errors"
	"strings"
	"sync"

	middleware "github.com/grpc-ecosystem/go-grpc-middleware/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/stubbornhq/stubborn/runs"
)

// authenticate is the AuthFunc of a server whose registry may change
// (Options.reloadable): the current registry's tenants authenticate
// callers; with none, every caller is the default tenant.
func (s *Service) authenticate(ctx context.Context) (context.Context, error) {
	a := s.regs.current().authn
	if a == nil {
		return ctx, nil
	}
	return a.Authenticate(ctx)
}

// errRevoked ends a stream whose credentials a reload took away.
var errRevoked = errors.New("the credentials this stream was authenticated with were taken away by a config reload")

// liveStreams are the authenticated streams in flight.
type liveStreams struct {
	mu  sync.Mutex
	set map[*liveStream]struct{}
}

// liveStream is one: the context it was authenticated by (its metadata and
// peer), the tenant it was authenticated as, and how to end it.
type liveStream struct {
	ctx    context.Context
	tenant string
	cancel context.CancelCauseFunc
}

func (l *liveStreams) add(ls *liveStream) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.set == nil {
		l.set = map[*liveStream]struct{}{}
	}
	l.set[ls] = struct{}{}
}

func (l *liveStreams) remove(ls *liveStream) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.set, ls)
}

// revoke ends every stream whose credentials authn (nil: no tenants, every
// caller the default tenant) no longer authenticates as the same tenant.
func (l *liveStreams) revoke(authn *Authenticator) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for ls := range l.set {
		tenant, err := "", error(nil)
		if authn != nil {
			tenant, err = authn.tenantOf(ls.ctx)
		}
		if err != nil || tenant != ls.tenant {
			ls.cancel(errRevoked)
			delete(l.set, ls)
			n++
		}
	}
	return n
}

// revocable is the stream interceptor, after authentication, of a server
// whose registry may change: a reload that takes a stream's credentials
// away (its tenant or its token removed) ends it with UNAUTHENTICATED.
// Unary calls are short, and are judged by the registry of their start.
func (s *Service) revocable(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if strings.HasPrefix(info.FullMethod, "/"+healthpb.Health_ServiceDesc.ServiceName+"/") {
		return handler(srv, ss) // not authenticated (authInterceptors)
	}
	ctx, cancel := context.WithCancelCause(ss.Context())
	defer cancel(nil)
	ls := &liveStream{ctx: ss.Context(), tenant: runs.TenantFrom(ss.Context()), cancel: cancel}
	s.streams.add(ls)
	defer s.streams.remove(ls)
	wrapped := middleware.WrapServerStream(ss)
	wrapped.WrappedContext = ctx
	err := handler(srv, wrapped)
	if errors.Is(context.Cause(ctx), errRevoked) {
		return status.Error(codes.Unauthenticated, errRevoked.Error())
	}
	return err
}
