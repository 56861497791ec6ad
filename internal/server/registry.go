package server

import (
	"context"
	"errors"
	"sync"

	"golang.org/x/time/rate"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/runs"
)

// registry is what one version of the config sets: each tenant's policy
// (its limits and the names it may use, over the server's limits), who
// the tenants are, and, on a server built by New, the delegates' pool and
// what runs reach through it. A config reload (Stubborn.Reload) builds a
// new one and swaps it in whole, so that a request is judged by one
// version, never by parts of two; the runs started under a version keep
// it, and its connections, until they end here.
type registry struct {
	def     *policy
	tenants map[string]*policy
	// server is the server's own limits and start rate.
	server *serverLevel
	// authn authenticates callers when the config names tenants; nil
	// means every caller is the default tenant (dynamicAuth).
	authn    *authenticator
	describe func() ([]*stubbornv1.DelegateDescription, []*stubbornv1.PresetDescription)

	// Set by New: the delegates' connections, closed once nothing holds
	// the registry, and what a run bound to it reaches.
	pool *delegates.Pool
	deps runs.Deps
	// cfg is the config it was built from (nil for newService's).
	cfg *delegates.Config
	// refs counts its holders: the server while it is current, each run
	// bound to it, each StartRun judging by it (registries.mu).
	refs int
}

// serverLevel is the server's own limits and its start rate (nil: none).
type serverLevel struct {
	limits limits
	starts *rate.Limiter
}

// policy returns what applies to ctx's tenant.
func (r *registry) policy(ctx context.Context) *policy {
	if p, ok := r.tenants[runs.TenantFrom(ctx)]; ok {
		return p
	}
	return r.def
}

// newRegistry builds the registry of o. prev, when set, is the registry
// it replaces: the start rates whose limits did not change keep their
// buckets, so that a reload neither refills nor empties them.
func newRegistry(o options, prev *registry) *registry {
	srv := &serverLevel{limits: o.Limits, starts: newStartLimiter(o.Limits)}
	if prev != nil && sameRate(prev.server.limits, o.Limits) {
		srv.starts = prev.server.starts
	}
	r := &registry{server: srv, describe: o.Describe, tenants: make(map[string]*policy, len(o.Tenants))}
	r.def = newPolicy("", limits{}, nil, srv, o)
	for name, t := range o.Tenants {
		p := newPolicy(name, t.Limits, t.Delegates, srv, o)
		if prev != nil {
			if old, ok := prev.tenants[name]; ok && sameRate(old.startsLimits, t.Limits) {
				p.starts = old.starts
			}
		}
		r.tenants[name] = p
	}
	return r
}

// sameRate reports whether a and b set the same start rate.
func sameRate(a, b limits) bool {
	return a.RunStartsPerSecond == b.RunStartsPerSecond && startBurstOf(a) == startBurstOf(b)
}

func startBurstOf(l limits) int {
	if !(l.RunStartsPerSecond > 0) {
		return 0
	}
	return startBurst(l)
}

// registries holds the current registry and counts who holds each.
type registries struct {
	mu      sync.Mutex
	cur     *registry
	retired bool
	// closed counts the registries let go (tests).
	closed int
	// idle is called, outside mu, with a registry nothing holds any
	// more: it closes its pool.
	idle func(*registry)
}

// current returns the current registry, to read (not to hold: its pool
// may close once it is replaced).
func (rs *registries) current() *registry {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.cur
}

// acquire returns the current registry, held until release.
func (rs *registries) acquire() *registry {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.cur.refs++
	return rs.cur
}

// hold holds r, which the caller holds already, once more.
func (rs *registries) hold(r *registry) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r.refs++
}

// release lets go of a hold on r.
func (rs *registries) release(r *registry) {
	rs.mu.Lock()
	r.refs--
	idle := r.refs == 0
	if idle {
		rs.closed++
	}
	rs.mu.Unlock()
	if idle && rs.idle != nil {
		rs.idle(r)
	}
}

// errStopped is Reload's error after Stop.
var errStopped = errors.New("the server is stopped")

// swap makes r current (held by the server) and lets go of the server's
// hold on the one before. After retire it changes nothing and lets r go.
func (rs *registries) swap(r *registry) error {
	rs.mu.Lock()
	if rs.retired {
		rs.mu.Unlock()
		if rs.idle != nil {
			rs.idle(r)
		}
		return errStopped
	}
	old := rs.cur
	r.refs++
	rs.cur = r
	rs.mu.Unlock()
	if old != nil {
		rs.release(old)
	}
	return nil
}

// registryKey is the context key of the registry a StartRun judged its
// request by, which its run is bound to (bind).
type registryKey struct{}

// bind is the runs layer's Config.Bind: a new run keeps the registry its
// request was judged by; a resumed one takes the current one.
func (rs *registries) bind(ctx context.Context) (runs.Deps, func()) {
	r, ok := ctx.Value(registryKey{}).(*registry)
	if ok {
		rs.hold(r)
	} else {
		r = rs.acquire()
	}
	return r.deps, func() { rs.release(r) }
}

// retire lets go of the server's hold on the current registry (Stop): its
// pool closes once the runs bound to it have let go too.
func (rs *registries) retire() {
	rs.mu.Lock()
	cur, done := rs.cur, rs.retired
	rs.retired = true
	rs.mu.Unlock()
	if !done {
		rs.release(cur)
	}
}
