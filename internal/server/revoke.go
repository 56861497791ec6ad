package server

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"

	middleware "github.com/grpc-ecosystem/go-grpc-middleware/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/stubbornhq/stubborn/internal/runs"
)

// authenticate is the server's AuthFunc; its registry may change
// (Reload): the current registry's tenants authenticate
// callers; with none, every caller is the default tenant.
func (s *service) authenticate(ctx context.Context) (context.Context, error) {
	reg := s.regs.current()
	if reg.authn != nil {
		var err error
		if ctx, err = reg.authn.Authenticate(ctx); err != nil {
			return nil, err
		}
	}
	return context.WithValue(ctx, authRegistryKey{}, reg), nil
}

// authRegistryKey is the context key of the registry a call was
// authenticated by.
type authRegistryKey struct{}

// reauthenticate checks ctx's credentials against reg when a reload put
// reg in place after the call was authenticated: a call does not go on
// under credentials the reload took away (or under another tenant).
func reauthenticate(ctx context.Context, reg *registry) error {
	by, ok := ctx.Value(authRegistryKey{}).(*registry)
	if !ok || by == reg {
		return nil
	}
	owners, err := reg.authn.ownersOf(ctx)
	if err != nil {
		return err
	}
	if !stillOwns(owners, runs.Owners(ctx)) {
		return status.Error(codes.Unauthenticated, errRevoked.Error())
	}
	return nil
}

// stillOwns reports whether owners, what credentials see after a reload,
// keep every tenant of had, what they saw before: a stream goes on when
// its caller gained the default tenant's runs, and ends when it lost them
// or is another tenant now.
func stillOwns(owners, had []string) bool {
	for _, t := range had {
		if !slices.Contains(owners, t) {
			return false
		}
	}
	return true
}

// errRevoked ends a stream whose credentials a reload took away.
var errRevoked = errors.New("the credentials this stream was authenticated with were taken away by a config reload")

// liveStreams are the authenticated streams in flight.
type liveStreams struct {
	mu  sync.Mutex
	set map[*liveStream]struct{}
}

// liveStream is one: the context it was authenticated by (its metadata and
// peer), the tenants whose runs it was authenticated to see (runs.Owners:
// its tenant's, and the default tenant's if its tenant has them), and how
// to end it.
type liveStream struct {
	ctx    context.Context
	owners []string
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
// caller the default tenant) no longer authenticates as the same tenant,
// or whose tenant lost the default tenant's runs (a reload that moved
// default_runs away).
func (l *liveStreams) revoke(authn *authenticator) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for ls := range l.set {
		owners, err := authn.ownersOf(ls.ctx)
		if err != nil || !stillOwns(owners, ls.owners) {
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
func (s *service) revocable(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if strings.HasPrefix(info.FullMethod, "/"+healthpb.Health_ServiceDesc.ServiceName+"/") {
		return handler(srv, ss) // not authenticated (authInterceptors)
	}
	ctx, cancel := context.WithCancelCause(ss.Context())
	defer cancel(nil)
	ls := &liveStream{ctx: ss.Context(), owners: runs.Owners(ss.Context()), cancel: cancel}
	s.streams.add(ls)
	defer s.streams.remove(ls)
	// A reload between the authentication and add is not in revoke's
	// view: the stream is checked against what is current now.
	if err := reauthenticate(ss.Context(), s.regs.current()); err != nil {
		return err
	}
	wrapped := middleware.WrapServerStream(ss)
	wrapped.WrappedContext = ctx
	err := handler(srv, wrapped)
	if errors.Is(context.Cause(ctx), errRevoked) {
		return status.Error(codes.Unauthenticated, errRevoked.Error())
	}
	return err
}
