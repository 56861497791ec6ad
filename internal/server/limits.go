package server

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/runs"
)

// Limits apply at two levels: the server's (options.Limits), which bound
// all tenants together, and each tenant's (tenantOptions.Limits), which
// bound that tenant alone. A request must be within both: for the request
// caps (brief size, attempts, chain, waits, watchers per run) the smaller
// of the two counts; for concurrent runs and start rates, the server's and
// the tenant's counts are both checked. A request over a limit is refused
// with RESOURCE_EXHAUSTED, whose message names the limit (and a
// google.rpc.QuotaFailure detail, plus google.rpc.RetryInfo for a rate),
// before anything is created: no run, no event.
//
// Concurrent runs are counted per server process (each replica of a
// cluster counts the runs it drives, resumed ones included), as are start
// rates and watchers.

// tenantOptions are what applies to one tenant besides the server's
// options.
type tenantOptions struct {
	// Limits apply besides options.Limits (see above). Zero fields leave
	// only the server's.
	Limits limits
	// Delegates, when not empty, are the only delegate and preset names
	// the tenant's requests may name; any other is NOT_FOUND, as a name
	// that is not in the registry.
	Delegates []string
}

// limitsFrom returns a config's limits as the server's.
func limitsFrom(l delegates.Limits) limits {
	return limits{
		MaxBriefBytes:      l.MaxBriefBytes,
		MaxAttempts:        l.MaxAttempts,
		MaxChain:           l.MaxChain,
		MaxWait:            l.MaxWait.Std(),
		MaxConcurrentRuns:  l.MaxConcurrentRuns,
		RunStartsPerSecond: l.RunStartsPerSecond,
		RunStartBurst:      l.RunStartBurst,
		MaxWatchersPerRun:  l.MaxWatchersPerRun,
		MaxConcurrentReads: l.MaxConcurrentReads,
	}
}

// tenantsFrom returns a config's tenants as the server's options.
func tenantsFrom(ts []delegates.Tenant) map[string]tenantOptions {
	out := make(map[string]tenantOptions, len(ts))
	for _, t := range ts {
		out[t.Name] = tenantOptions{Limits: limitsFrom(t.Limits), Delegates: t.Delegates}
	}
	return out
}

// tighter returns, field by field, the smaller of the values set (non-zero)
// in a and b.
func tighter(a, b limits) limits {
	minInt := func(x, y int) int {
		if x <= 0 || (y > 0 && y < x) {
			return y
		}
		return x
	}
	a.MaxBriefBytes = minInt(a.MaxBriefBytes, b.MaxBriefBytes)
	a.MaxAttempts = minInt(a.MaxAttempts, b.MaxAttempts)
	a.MaxChain = minInt(a.MaxChain, b.MaxChain)
	a.MaxMetadata = minInt(a.MaxMetadata, b.MaxMetadata)
	a.MaxWatchersPerRun = minInt(a.MaxWatchersPerRun, b.MaxWatchersPerRun)
	a.MaxConcurrentReads = minInt(a.MaxConcurrentReads, b.MaxConcurrentReads)
	if a.MaxWait <= 0 || (b.MaxWait > 0 && b.MaxWait < a.MaxWait) {
		a.MaxWait = b.MaxWait
	}
	// Concurrency and rates are counted at each level, not merged.
	return a
}

// policy is what applies to the requests of one tenant.
type policy struct {
	// who names the tenant in messages.
	who     string
	subject string // google.rpc.QuotaFailure subject
	tenant  string
	val     validator
	// limits are the merged request caps (tighter of tenant and server).
	limits limits
	// maxConcurrent and starts are the tenant's own (0 and nil: none).
	maxConcurrent int
	starts        *rate.Limiter
	startsLimits  limits
	// server is the server's limits, which apply besides.
	server *serverLevel
}

// newPolicy builds the policy of tenant with its own limits own (zero for
// the default tenant) over the server's.
func newPolicy(tenant string, own limits, allowed []string, server *serverLevel, o options) *policy {
	merged := tighter(server.limits, own).withDefaults()
	known := o.Known
	if len(allowed) > 0 {
		set := make(map[string]bool, len(allowed))
		for _, n := range allowed {
			set[n] = true
		}
		known = func(name string) bool { return set[name] && o.Known(name) }
	}
	return &policy{
		who: fmt.Sprintf("tenant %q", tenant), subject: "tenant:" + tenant, tenant: tenant,
		val:           validator{limits: merged, known: known, isDelegate: o.IsDelegate, hasJudge: o.HasJudge, kindOf: o.KindOf, presetOf: o.PresetOf, names: registryNames(o.Describe)},
		limits:        merged,
		maxConcurrent: own.MaxConcurrentRuns,
		starts:        newStartLimiter(own),
		startsLimits:  own,
		server:        server,
	}
}

// newStartLimiter returns the token bucket of l's start rate, or nil.
func newStartLimiter(l limits) *rate.Limiter {
	if !(l.RunStartsPerSecond > 0) || math.IsInf(l.RunStartsPerSecond, 0) {
		return nil
	}
	return rate.NewLimiter(rate.Limit(l.RunStartsPerSecond), startBurst(l))
}

func startBurst(l limits) int {
	if l.RunStartBurst > 0 {
		return l.RunStartBurst
	}
	return int(math.Min(math.Max(1, math.Ceil(l.RunStartsPerSecond)), 1<<30))
}

// exhausted is RESOURCE_EXHAUSTED with msg, a QuotaFailure naming subject
// and, when retryIn is positive, a RetryInfo.
func exhausted(subject, msg string, retryIn time.Duration) error {
	st := status.New(codes.ResourceExhausted, msg)
	qf := &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: subject, Description: msg}}}
	var (
		withDetails *status.Status
		err         error
	)
	if retryIn > 0 {
		withDetails, err = st.WithDetails(qf, &errdetails.RetryInfo{RetryDelay: durationpb.New(retryIn)})
	} else {
		withDetails, err = st.WithDetails(qf)
	}
	if err == nil {
		st = withDetails
	}
	return st.Err()
}

// takeStart takes a run start from the tenant's rate and the server's.
// Over either, nothing is taken and the error names the limit. undo gives
// the start back, for a request refused later on.
func (s *service) takeStart(p *policy) (undo func(), err error) {
	now := time.Now()
	var taken []*rate.Reservation
	undo = func() {
		for _, r := range taken {
			r.CancelAt(now)
		}
	}
	for _, lv := range []struct {
		lim          *rate.Limiter
		l            limits
		who, subject string
	}{
		{p.starts, p.startsLimits, p.who, p.subject},
		{p.server.starts, p.server.limits, "the server", "server"},
	} {
		if lv.lim == nil {
			continue
		}
		r := lv.lim.ReserveN(now, 1)
		if !r.OK() || r.DelayFrom(now) > 0 {
			wait := r.DelayFrom(now)
			r.CancelAt(now)
			undo()
			return nil, exhausted(lv.subject, fmt.Sprintf(
				"limit run_starts_per_second reached for %s: %g run starts a second, in bursts of at most %d; retry in %s",
				lv.who, lv.l.RunStartsPerSecond, startBurst(lv.l), wait.Round(time.Millisecond)), wait)
		}
		taken = append(taken, r)
	}
	return undo, nil
}

// activeRuns counts the runs in progress on this server, in all and by
// tenant, for the max_concurrent_runs limits. It learns when runs start and
// end as a runs.Observer: pass Observer's result as runs.Config.Observer,
// and the activeRuns as options.ActiveRuns (New does both).
type activeRuns struct {
	mu       sync.Mutex
	total    int
	byTenant map[string]int
	// reserved holds the slots StartRun calls reserved, by reservation
	// number, until released: the run's observer finds its slot by the
	// number in the request's context (a plain value; the slot stays here).
	reserved map[uint64]*runSlot
	last     uint64
}

// newActiveRuns returns a counter with no run in progress.
func newActiveRuns() *activeRuns {
	return &activeRuns{byTenant: map[string]int{}, reserved: map[uint64]*runSlot{}}
}

// InProgress returns how many of tenant's runs are in progress here.
func (a *activeRuns) InProgress(tenant string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.byTenant[tenant]
}

// runSlot is one counted run; release uncounts it, once.
type runSlot struct {
	a           *activeRuns
	tenant      string
	reservation uint64 // its key in reserved; 0 for a slot added whatever the limits
	once        sync.Once
}

func (r *runSlot) release() {
	r.once.Do(func() {
		r.a.mu.Lock()
		defer r.a.mu.Unlock()
		r.a.total--
		if r.a.byTenant[r.tenant]--; r.a.byTenant[r.tenant] <= 0 {
			delete(r.a.byTenant, r.tenant)
		}
		if r.reservation != 0 {
			delete(r.a.reserved, r.reservation)
		}
	})
}

// reservationKey is the context key of a StartRun call's reservation
// number (a uint64), which its run's observer takes the slot of.
type reservationKey struct{}

// withReservation returns ctx naming slot's reservation, for the observer.
func withReservation(ctx context.Context, slot *runSlot) context.Context {
	return context.WithValue(ctx, reservationKey{}, slot.reservation)
}

// reservedFor returns the slot the request of ctx reserved, or nil.
func (a *activeRuns) reservedFor(ctx context.Context) *runSlot {
	n, ok := ctx.Value(reservationKey{}).(uint64)
	if !ok {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reserved[n]
}

// reserve counts a new run of p's tenant unless the tenant's or the
// server's max_concurrent_runs is reached.
func (a *activeRuns) reserve(p *policy, serverMax int) (*runSlot, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if n := a.byTenant[p.tenant]; p.maxConcurrent > 0 && n >= p.maxConcurrent {
		return nil, exhausted(p.subject, fmt.Sprintf(
			"limit max_concurrent_runs reached for %s: %d runs in progress, the limit is %d; retry once one has ended", p.who, n, p.maxConcurrent), 0)
	}
	if serverMax > 0 && a.total >= serverMax {
		return nil, exhausted("server", fmt.Sprintf(
			"limit max_concurrent_runs reached for the server: the limit is %d runs in progress; retry once one has ended", serverMax), 0)
	}
	slot := a.addLocked(p.tenant)
	a.last++
	slot.reservation = a.last
	a.reserved[slot.reservation] = slot
	return slot, nil
}

// add counts a run whatever the limits (a run resumed here).
func (a *activeRuns) add(tenant string) *runSlot {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.addLocked(tenant)
}

func (a *activeRuns) addLocked(tenant string) *runSlot {
	a.total++
	a.byTenant[tenant]++
	return &runSlot{a: a, tenant: tenant}
}

// Observer returns a runs.Observer that counts every run this server
// drives until it ends (or this server stops driving it), then passes it
// on to inner (which may be nil). A new run uses the slot that Start's
// request reserved.
func (a *activeRuns) Observer(inner runs.Observer) runs.Observer {
	return countingObserver{a: a, inner: inner}
}

type countingObserver struct {
	a     *activeRuns
	inner runs.Observer
}

func (o countingObserver) ObserveRun(runCtx, reqCtx context.Context, st *stubbornv1.ControlState, resumed bool) (context.Context, func(*stubbornv1.RunEvent)) {
	var slot *runSlot
	if !resumed {
		slot = o.a.reservedFor(reqCtx)
	}
	if slot == nil {
		slot = o.a.add(st.GetTenant())
	}
	ctx, see := runCtx, func(*stubbornv1.RunEvent) {}
	if o.inner != nil {
		ctx, see = o.inner.ObserveRun(runCtx, reqCtx, st, resumed)
	}
	return ctx, func(ev *stubbornv1.RunEvent) {
		if see != nil {
			see(ev)
		}
		if ev == nil || ev.GetRunFinished() != nil {
			slot.release()
		}
	}
}

// watchers counts the streams following each run.
type watchers struct {
	mu sync.Mutex
	n  map[string]int
}

// acquire counts a watcher of run id unless max (> 0) are watching it
// already; force counts it whatever the limit. release uncounts it.
func (w *watchers) acquire(id string, max int, force bool) (release func(), ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n == nil {
		w.n = map[string]int{}
	}
	if !force && max > 0 && w.n[id] >= max {
		return nil, false
	}
	w.n[id]++
	var once sync.Once
	return func() {
		once.Do(func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.n[id]--; w.n[id] <= 0 {
				delete(w.n, id)
			}
		})
	}, true
}

// readers counts each tenant's reads in progress (ListRuns, GetRun,
// WatchRun), for max_concurrent_reads.
type readers struct {
	mu sync.Mutex
	n  map[string]int
}

// readRetry is the RetryInfo of a read refused for max_concurrent_reads:
// reads are short.
const readRetry = time.Second

// acquire counts a read of p's tenant unless its max_concurrent_reads is
// reached (RESOURCE_EXHAUSTED, with RetryInfo). release uncounts it.
func (r *readers) acquire(p *policy) (release func(), err error) {
	max := p.limits.MaxConcurrentReads
	if max <= 0 {
		return func() {}, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	if n := r.n[p.tenant]; n >= max {
		return nil, exhausted(p.subject, fmt.Sprintf(
			"limit max_concurrent_reads reached for %s: %d reads in progress (ListRuns, GetRun, WatchRun), the limit is %d; retry in %s", p.who, n, max, readRetry), readRetry)
	}
	r.n[p.tenant]++
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.n[p.tenant]--; r.n[p.tenant] <= 0 {
				delete(r.n, p.tenant)
			}
		})
	}, nil
}

// registryNames returns the names describe lists (delegates and presets),
// for "did you mean"; nil without describe.
func registryNames(describe func() ([]*stubbornv1.DelegateDescription, []*stubbornv1.PresetDescription)) func() []string {
	if describe == nil {
		return nil
	}
	return func() []string {
		ds, ps := describe()
		names := make([]string, 0, len(ds)+len(ps))
		for _, d := range ds {
			names = append(names, d.GetName())
		}
		for _, p := range ps {
			names = append(names, p.GetName())
		}
		return names
	}
}
