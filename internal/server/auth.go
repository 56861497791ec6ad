package server

import (
	"context"
	"sort"
	"strings"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/runs"
)

// authenticator tells which tenant a call comes from, by its bearer token
// or its verified TLS client certificate (see delegates.Tenant). The
// server's auth interceptor calls the current registry's Authenticate.
//
// Tokens are looked up by their SHA-256 digest: the config holds digests
// only. A plain hash is enough because tokens are random and long (32
// random bytes from `stubborn token`): there is no dictionary to try, and
// no digest can be turned back into a token, so there is nothing for a slow
// password hash (bcrypt, argon2) to protect and its cost would be paid on
// every call. For the same reason a map lookup by digest is safe: its timing
// could at most hint at a digest's first bytes, which do not help to find a
// token.
type authenticator struct {
	tokens map[string]string // hex SHA-256 → tenant
	cns    map[string]string // certificate subject CN → tenant
	uris   map[string]string // certificate URI SAN → tenant
	// defaultRuns is the tenant that owns the default tenant's runs
	// (delegates.Tenant.DefaultRuns); "" none.
	defaultRuns string
}

// newAuthenticator returns the authenticator of a config's tenants (which
// Parse has validated: no credential names two tenants).
func newAuthenticator(tenants []delegates.Tenant) *authenticator {
	a := &authenticator{tokens: map[string]string{}, cns: map[string]string{}, uris: map[string]string{}}
	for _, t := range tenants {
		for _, h := range t.TokenSHA256 {
			a.tokens[strings.ToLower(h)] = t.Name
		}
		for _, cn := range t.CertCommonNames {
			a.cns[cn] = t.Name
		}
		for _, u := range t.CertURIs {
			a.uris[u] = t.Name
		}
		if t.DefaultRuns {
			a.defaultRuns = t.Name
		}
	}
	return a
}

// Authenticate returns ctx on behalf of the caller's tenant (runs.WithTenant)
// or UNAUTHENTICATED. A call that sends an authorization header is judged
// by it alone: it must be `Bearer <token>` with a token of a tenant. A call
// without one is judged by its client certificate, which the TLS handshake
// verified against the client CA: its URI SANs and its subject CN must name
// exactly one tenant. Error messages never quote a token.
func (a *authenticator) Authenticate(ctx context.Context) (context.Context, error) {
	tenant, err := a.tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	return a.runsOf(withTenant(ctx, tenant), tenant), nil
}

// ownersOf returns the tenants whose runs ctx's credentials see
// (runs.Owners of the context Authenticate makes); a nil a (no tenants)
// sees the default tenant's.
func (a *authenticator) ownersOf(ctx context.Context) ([]string, error) {
	if a == nil {
		return []string{""}, nil
	}
	tenant, err := a.tenantOf(ctx)
	if err != nil {
		return nil, err
	}
	return runs.Owners(a.runsOf(runs.WithTenant(context.Background(), tenant), tenant)), nil
}

// runsOf is ctx, on behalf of tenant, with the default tenant's runs when
// tenant has them.
func (a *authenticator) runsOf(ctx context.Context, tenant string) context.Context {
	if tenant != "" && tenant == a.defaultRuns {
		return runs.WithDefaultRuns(ctx)
	}
	return ctx
}

// tenantOf returns the tenant ctx's credentials authenticate as
// (Authenticate), or the UNAUTHENTICATED error.
func (a *authenticator) tenantOf(ctx context.Context) (string, error) {
	if vals := metadata.ValueFromIncomingContext(ctx, "authorization"); len(vals) > 0 {
		if len(vals) > 1 {
			return "", status.Error(codes.Unauthenticated, "authorization: send one header, not several")
		}
		token, err := auth.AuthFromMD(ctx, "bearer")
		if err != nil || token == "" {
			return "", status.Error(codes.Unauthenticated, `authorization: want "Bearer <token>"`)
		}
		tenant, ok := a.tokens[delegates.HashToken(token)]
		if !ok {
			return "", status.Error(codes.Unauthenticated, "the bearer token is not valid")
		}
		return tenant, nil
	}
	cert, ok := verifiedClientCert(ctx)
	if !ok {
		return "", status.Error(codes.Unauthenticated, "no credentials: send authorization: Bearer <token>, or a client certificate of a tenant")
	}
	found := map[string]bool{}
	for _, u := range cert.uris {
		if t, ok := a.uris[u]; ok {
			found[t] = true
		}
	}
	if t, ok := a.cns[cert.cn]; ok {
		found[t] = true
	}
	switch len(found) {
	case 0:
		return "", status.Errorf(codes.Unauthenticated, "the client certificate (CN %q, URIs %q) is no tenant's: send authorization: Bearer <token>", cert.cn, cert.uris)
	case 1:
		for t := range found {
			return t, nil
		}
	}
	names := make([]string, 0, len(found))
	for t := range found {
		names = append(names, t)
	}
	sort.Strings(names)
	return "", status.Errorf(codes.Unauthenticated, "the client certificate names several tenants (%s): send authorization: Bearer <token>", strings.Join(names, ", "))
}

// clientCert is the identity in a verified client certificate.
type clientCert struct {
	cn   string
	uris []string
}

// verifiedClientCert returns the identity of the leaf certificate of the
// connection's verified client chain. A certificate that was not verified
// against the client CA (none is configured) does not count.
func verifiedClientCert(ctx context.Context) (clientCert, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return clientCert{}, false
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return clientCert{}, false
	}
	leaf := info.State.VerifiedChains[0][0]
	c := clientCert{cn: leaf.Subject.CommonName}
	for _, u := range leaf.URIs {
		c.uris = append(c.uris, u.String())
	}
	return c, true
}

// withTenant puts the tenant in ctx for the runs layer, and in the call's
// log line (go-grpc-middleware's logging.AddFields: the logging interceptor,
// which runs before authentication, writes the line when the call ends).
func withTenant(ctx context.Context, tenant string) context.Context {
	logging.AddFields(ctx, logging.Fields{"tenant", tenant})
	return runs.WithTenant(ctx, tenant)
}

// authInterceptors run authenticate (go-grpc-middleware's auth interceptor)
// on every call except health checks, which load balancers and
// orchestrators make without credentials.
func authInterceptors(authenticate auth.AuthFunc) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	needsAuth := selector.MatchFunc(func(_ context.Context, c interceptors.CallMeta) bool {
		return c.Service != healthpb.Health_ServiceDesc.ServiceName
	})
	return selector.UnaryServerInterceptor(auth.UnaryServerInterceptor(authenticate), needsAuth),
		selector.StreamServerInterceptor(auth.StreamServerInterceptor(authenticate), needsAuth)
}
