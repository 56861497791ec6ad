package server

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/spend"
)

// A tenant's spend limit (tenants[].spend_limit, and the config's
// spend_limit for the default tenant) is checked when a run starts: a
// tenant whose spend in the current UTC day (or month) has reached its
// max_cost gets RESOURCE_EXHAUSTED naming the limit and its reset, with a
// RetryInfo of the time until then. Runs in flight go on: a run's own
// spend_limit is what stops a run.
//
// The spend is a ledger in the store (package spend), which every replica
// adds to: each priced call's cost, as this server records it live
// (attempt_finished: the attempt's and its judges' costs;
// failure_analyzed: the analyst's), goes to its run's tenant's entries
// for that day and that month. Every tenant's spend is counted, with a
// limit or not, so that a limit a reload sets counts the period's spend so
// far.
//
// The events are seen with a run's lock held (runs.Observer), so the adds
// are handed to a goroutine: they are summed per tenant and period in
// memory (a map as large as the tenants spending in the current periods),
// then written, each sum one compare-and-set, at most every
// spendFlushInterval. A crash loses the sums not yet written: an
// under-count of at most that interval's spend (or longer while the store
// refuses writes), which a tenant's limit — a cap on starts, read through a
// cache, never exact to the call — can bear; a run's own spend_limit,
// journaled, stays exact. An event is never counted twice: a resumed run's
// past events are replayed, not observed.

const (
	// spendCacheTTL is how long a ledger read serves a tenant's starts.
	spendCacheTTL = time.Second
	// spendFlushInterval is the least time between two writes of the
	// sums: a busy tenant's calls cost one store write an interval.
	spendFlushInterval = 100 * time.Millisecond
	// spendRetryMax is the longest wait before writing again sums the
	// store refused.
	spendRetryMax = 30 * time.Second
	// spendOpTimeout bounds a ledger call.
	spendOpTimeout = 5 * time.Second
	// spendCloseTimeout bounds the last write at Stop.
	spendCloseTimeout = 5 * time.Second
	// maxSpendEntries bounds the sums waiting and the cached reads: far
	// more tenants than a config holds; past it a new tenant's add is
	// dropped (and logged) rather than grow the map.
	maxSpendEntries = 1 << 16
)

// spendKey is a tenant's entry for a period (spend.PeriodKey).
type spendKey struct{ tenant, period string }

// tenantSpend counts the tenants' spend in a ledger and admits their runs.
type tenantSpend struct {
	ledger spend.Ledger
	now    func() time.Time // the periods' clock (the server's)
	log    *slog.Logger

	mu sync.Mutex
	// pending are the sums not yet written; writing the ones the writer
	// took (all guarded by mu).
	pending, writing map[spendKey]float64
	cache            map[spendKey]cachedSpend
	dropped          int
	wake             chan struct{} // cap 1: a write is due

	stop context.CancelFunc
	done chan struct{}
}

// cachedSpend is a ledger read: the total and when it was read (the wall
// clock's monotonic time, not the server's clock).
type cachedSpend struct {
	total      float64
	read       time.Time
	refreshing bool
}

// newTenantSpend starts the writer of ledger's adds (nil: a ledger in
// memory, this process's only). close ends it.
func newTenantSpend(ledger spend.Ledger, now func() time.Time, log *slog.Logger) *tenantSpend {
	if ledger == nil {
		ledger = spend.NewMemory(now)
	}
	ctx, stop := context.WithCancel(context.Background())
	t := &tenantSpend{
		ledger: ledger, now: now, log: log,
		pending: map[spendKey]float64{}, writing: map[spendKey]float64{}, cache: map[spendKey]cachedSpend{},
		wake: make(chan struct{}, 1), stop: stop, done: make(chan struct{}),
	}
	go t.writer(ctx)
	return t
}

// close writes the sums left, within spendCloseTimeout, and ends the
// writer. Call it once the runs have ended (their last events seen).
func (t *tenantSpend) close() {
	if t == nil {
		return
	}
	t.stop()
	<-t.done
	ctx, cancel := context.WithTimeout(context.Background(), spendCloseTimeout)
	defer cancel()
	if err := t.flush(ctx); err != nil {
		t.log.Warn("tenants' spend not written at shutdown: it is not counted", "err", err)
	}
}

// observer returns inner (nil: none) that also counts each run's spend.
func (t *tenantSpend) observer(inner runs.Observer) runs.Observer {
	return spendObserver{t: t, inner: inner}
}

type spendObserver struct {
	t     *tenantSpend
	inner runs.Observer
}

func (o spendObserver) ObserveRun(runCtx, reqCtx context.Context, st *stubbornv1.ControlState, resumed bool) (context.Context, func(*stubbornv1.RunEvent)) {
	ctx, see := runCtx, func(*stubbornv1.RunEvent) {}
	if o.inner != nil {
		ctx, see = o.inner.ObserveRun(runCtx, reqCtx, st, resumed)
	}
	tenant := st.GetTenant()
	return ctx, func(ev *stubbornv1.RunEvent) {
		if see != nil {
			see(ev)
		}
		if c := eventCost(ev); c > 0 {
			o.t.charge(tenant, c)
		}
	}
}

// eventCost is what the calls an event records cost: an attempt's and its
// judges', or an analyst's.
func eventCost(ev *stubbornv1.RunEvent) float64 {
	var c float64
	if af := ev.GetAttemptFinished(); af != nil {
		c += af.GetAttempt().GetCost()
		for _, call := range af.GetCalls() {
			c += call.GetCost()
		}
	}
	if fa := ev.GetFailureAnalyzed(); fa != nil {
		c += fa.GetAnalysisCost().GetCost()
	}
	if math.IsNaN(c) || c < 0 {
		return 0
	}
	return min(c, spend.MaxCost)
}

// charge adds cost to tenant's current day and month, for the writer.
// Called with a run's lock held: it takes t.mu only, and never waits.
func (t *tenantSpend) charge(tenant string, cost float64) {
	now := t.now()
	t.mu.Lock()
	for _, p := range []spend.Period{spend.Day, spend.Month} {
		k := spendKey{tenant, spend.PeriodKey(p, now)}
		if _, ok := t.pending[k]; !ok && len(t.pending) >= maxSpendEntries {
			t.dropped++
			continue
		}
		t.pending[k] = min(t.pending[k]+cost, spend.MaxCost)
	}
	t.mu.Unlock()
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// writer writes the sums when charged, spendFlushInterval apart at least;
// sums the store refused wait, longer each time, and go with the next.
func (t *tenantSpend) writer(ctx context.Context) {
	defer close(t.done)
	backoff := spendFlushInterval
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.wake:
		}
		wait := spendFlushInterval
		if err := t.flush(ctx); err != nil && ctx.Err() == nil {
			t.log.Warn("writing tenants' spend; trying again", "err", err, "in", backoff)
			wait, backoff = backoff, min(2*backoff, spendRetryMax)
			select {
			case t.wake <- struct{}{}: // what was refused is still due
			default:
			}
		} else {
			backoff = spendFlushInterval
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// flush writes the pending sums; one the ledger refused goes back to
// pending. It returns the first error.
func (t *tenantSpend) flush(ctx context.Context) error {
	t.mu.Lock()
	t.pending, t.writing = map[spendKey]float64{}, t.pending
	dropped := t.dropped
	t.dropped = 0
	t.mu.Unlock()
	if dropped > 0 {
		t.log.Warn("tenants' spend: too many tenants and periods at once; some adds not counted", "dropped", dropped)
	}
	var first error
	for k, c := range t.writing {
		octx, cancel := context.WithTimeout(ctx, spendOpTimeout)
		err := t.ledger.Add(octx, k.tenant, k.period, c)
		cancel()
		t.mu.Lock()
		delete(t.writing, k)
		if err != nil {
			t.pending[k] = min(t.pending[k]+c, spend.MaxCost)
		} else if e, ok := t.cache[k]; ok {
			// Written: the next start reads the ledger, which has it.
			e.read = time.Time{}
			t.cache[k] = e
		}
		t.mu.Unlock()
		if err != nil && first == nil {
			first = err
		}
	}
	return first
}

// spent returns tenant's spend in period: the ledger's total (read at
// most every spendCacheTTL) plus this server's sums not yet written.
// A ledger that cannot be read counts as its last total read (0 for none):
// a store down refuses no start for spend's sake alone.
func (t *tenantSpend) spent(ctx context.Context, tenant, period string) float64 {
	k := spendKey{tenant, period}
	t.mu.Lock()
	e, ok := t.cache[k]
	fresh := ok && (e.refreshing || time.Since(e.read) < spendCacheTTL)
	if !fresh {
		if !ok && len(t.cache) >= maxSpendEntries {
			clear(t.cache) // old periods' entries: read again when asked
		}
		e.refreshing = true // one start reads; the others take the last total
		t.cache[k] = e
	}
	t.mu.Unlock()
	if !fresh {
		octx, cancel := context.WithTimeout(ctx, spendOpTimeout)
		total, err := t.ledger.Spent(octx, tenant, period)
		cancel()
		if err != nil {
			t.log.Warn("reading a tenant's spend", "tenant", tenant, "period", period, "err", err)
			total = e.total
		}
		e = cachedSpend{total: total, read: time.Now()}
		t.mu.Lock()
		t.cache[k] = e
		t.mu.Unlock()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return e.total + t.pending[k] + t.writing[k]
}

// admit refuses a new run of tenant when its spend for the current
// period has reached its spend limit under cfg (the request's registry).
func (t *tenantSpend) admit(ctx context.Context, cfg *delegates.Config, tenant string) error {
	l := cfg.TenantSpend(tenant)
	if t == nil || l == nil {
		return nil
	}
	now := t.now()
	period := spend.Period(l.Period)
	spent := t.spent(ctx, tenant, spend.PeriodKey(period, now))
	if spent < l.MaxCost {
		return nil
	}
	who := fmt.Sprintf("tenant %q", tenant)
	if tenant == "" {
		who = "the default tenant"
	}
	resets := spend.Resets(period, now)
	return exhausted("tenant:"+tenant, fmt.Sprintf("%s reached its %s spend limit: spent %.6g of spend_limit.max_cost %g; it resets at %s",
		who, period.Noun(), spent, l.MaxCost, resets.Format(time.RFC3339)), resets.Sub(now))
}

// clockNow returns clock's Now; the wall clock's for nil.
func clockNow(clock controls.Clock) func() time.Time {
	if clock == nil {
		return time.Now
	}
	return clock.Now
}
