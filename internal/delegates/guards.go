package delegates

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/fleetguard"
)

// defaultMaxQueueWait is how long a call waits for a delegate's bulkhead
// slot or rate limit when its max_queue_wait is unset.
const defaultMaxQueueWait = time.Second

// Guards are the delegates' circuit breakers, bulkheads (max_concurrent)
// and rate limits (requests_per_minute, tokens_per_minute) on one server:
// shared by every run, and kept across config reloads (a delegate's guard
// is built again only when its settings change, and a removed delegate's
// stays for the runs that still call it). With UseFleet, the breakers and
// rate limits are the fleet's (fleet.go). It implements controls.Guards.
type Guards struct {
	clock controls.Clock

	// OnTransition, when set, is told of every change of a circuit
	// breaker's state (metrics, logs). It must not block.
	OnTransition func(delegate string, t Transition)
	// OnRefused, when set, is told of every call a guard refused.
	OnRefused func(delegate string, by stubbornv1.RefusedBy)

	// fleet, when set (UseFleet), shares the breakers and rate limits
	// with the other replicas on its store (fleet.go).
	fleet *fleetguard.Fleet

	mu     sync.Mutex
	byName map[string]*guard
}

var _ controls.Guards = (*Guards)(nil)

// NewGuards returns guards on clock (nil: the wall clock) with none
// configured.
func NewGuards(clock controls.Clock) *Guards {
	if clock == nil {
		clock = controls.RealClock{}
	}
	return &Guards{clock: clock, byName: map[string]*guard{}}
}

// guardSettings are a delegate's guard settings.
type guardSettings struct {
	breaker       *CircuitBreaker
	maxConcurrent int
	rpm, tpm      int64
	maxQueueWait  time.Duration
	retryOn       *stubbornv1.RetryOn
}

// guard is one delegate's. A Configure changes it in place, part by part:
// a breaker whose settings did not change keeps its state, a bulkhead its
// calls in flight under the new max_concurrent, the rate window its counts
// under the new limits.
type guard struct {
	mu       sync.Mutex
	settings guardSettings
	breaker  *breaker    // nil: none
	bulk     *bulkhead   // nil: no max_concurrent
	rate     *rateWindow // nil: no rate limit
	// lease is this replica's share of the fleet's rate budget (fleet.go).
	lease fleetLease
}

// parts returns what Admit works with, as of now.
func (gd *guard) parts() (guardSettings, *breaker, *bulkhead, *rateWindow) {
	gd.mu.Lock()
	defer gd.mu.Unlock()
	return gd.settings, gd.breaker, gd.bulk, gd.rate
}

// Configure sets the guards of cfg's delegates.
func (g *Guards) Configure(cfg *Config) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, d := range cfg.Delegates {
		s := d.guardSettings()
		gd, ok := g.byName[d.Name]
		if !ok {
			if s.breaker == nil && s.maxConcurrent == 0 && s.rpm == 0 && s.tpm == 0 {
				continue // nothing to guard
			}
			gd = &guard{}
			g.byName[d.Name] = gd
		}
		gd.mu.Lock()
		if s.breaker == nil {
			gd.breaker = nil
		} else if gd.breaker == nil || !reflect.DeepEqual(gd.settings.breaker, s.breaker) {
			gd.breaker = newBreaker(*s.breaker, g.clock.Now)
		}
		switch {
		case s.maxConcurrent == 0:
			gd.bulk = nil // calls in flight give their slots back to the old one
		case gd.bulk == nil:
			gd.bulk = &bulkhead{max: s.maxConcurrent}
		default:
			gd.bulk.setMax(s.maxConcurrent)
		}
		switch {
		case s.rpm == 0 && s.tpm == 0:
			gd.rate = nil
		case gd.rate == nil:
			gd.rate = &rateWindow{rpm: s.rpm, tpm: s.tpm}
		default:
			gd.rate.setLimits(s.rpm, s.tpm)
		}
		gd.settings = s
		gd.mu.Unlock()
	}
}

func (d Delegate) guardSettings() guardSettings {
	s := guardSettings{
		breaker: d.CircuitBreaker, maxConcurrent: d.MaxConcurrent,
		rpm: int64(d.RequestsPerMinute), tpm: d.TokensPerMinute, maxQueueWait: defaultMaxQueueWait,
	}
	if d.MaxQueueWait != nil {
		s.maxQueueWait = d.MaxQueueWait.Std()
	}
	if d.RetryOn != nil {
		s.retryOn = d.RetryOn.Proto()
	}
	return s
}

func (g *Guards) get(name string) *guard {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.byName[name]
}

// refuse is the error of a call a guard of delegate name refused.
func (g *Guards) refuse(name string, by stubbornv1.RefusedBy, format string, args ...any) error {
	if g.OnRefused != nil {
		g.OnRefused(name, by)
	}
	return &controls.CallError{
		Code:    codes.Unavailable,
		Message: fmt.Sprintf("delegate %q: ", name) + fmt.Sprintf(format, args...),
		NotSent: true, Refused: true, RefusedBy: by,
	}
}

// Admit asks to send one call to the named delegate (controls.Guards), in
// this order: an open circuit breaker refuses it at once; a full bulkhead,
// then the rate limits, make it wait, together up to the delegate's
// max_queue_wait, then refuse it; last, a half-open breaker lets its
// probes through and refuses the others. A call refused after it was
// counted by the rate limits is uncounted, and gives its bulkhead slot
// back.
func (g *Guards) Admit(ctx context.Context, name string) (func(*stubbornv1.Result, error) string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	gd := g.get(name)
	if gd == nil {
		return func(*stubbornv1.Result, error) string { return "" }, nil
	}
	set, br, bulk, rate := gd.parts()
	// The fleet's state, while this replica reaches it; else its own.
	fl := g.fleetUp()
	// An open breaker refuses before the call queues for anything.
	if why := g.openWhy(fl, name, br); why != "" {
		return nil, g.refuse(name, stubbornv1.RefusedBy_REFUSED_BY_CIRCUIT_BREAKER, "%s", why)
	}
	start := g.clock.Now()
	left := func() time.Duration { return set.maxQueueWait - g.clock.Now().Sub(start) }
	if bulk != nil {
		if err := g.wait(ctx, bulk, left()); err != nil {
			if errors.Is(err, errQueueFull) {
				return nil, g.refuse(name, stubbornv1.RefusedBy_REFUSED_BY_BULKHEAD,
					"bulkhead full: %d calls in flight (max_concurrent), none ended within max_queue_wait %s", set.maxConcurrent, set.maxQueueWait)
			}
			return nil, err
		}
	}
	release := func() {
		if bulk != nil {
			bulk.release()
		}
	}
	taken, fleetTaken, err := g.takeRate(ctx, fl, name, gd, set, rate, left)
	if err != nil {
		release()
		return nil, err
	}
	adm := admitted{g: g, name: name, set: set, br: br, rate: rate, fl: fl}
	if br != nil {
		why := adm.allow(ctx)
		if why != "" {
			release()
			if taken >= 0 {
				rate.giveBack(taken)
				if fleetTaken {
					gd.lease.giveBack(g.clock.Now())
				}
			}
			return nil, g.refuse(name, stubbornv1.RefusedBy_REFUSED_BY_CIRCUIT_BREAKER, "%s", why)
		}
	}
	var once sync.Once
	return func(res *stubbornv1.Result, err error) (note string) {
		once.Do(func() {
			release()
			note = adm.done(res, err)
		})
		return note
	}, nil
}

// openWhy says why an open breaker (the fleet's when fl is set) refuses a
// call now, or "".
func (g *Guards) openWhy(fl *fleetguard.Fleet, name string, br *breaker) string {
	if br == nil {
		return ""
	}
	if g.fleet != nil {
		// Cut off from the fleet, its breaker's last known opening
		// still stands, besides this replica's own.
		rec, _ := g.fleet.Breaker(name)
		if why := fleetOpenWhy(rec, g.clock.Now()); why != "" || fl != nil {
			return why
		}
	}
	why, _ := br.openNow()
	return why
}

// takeRate counts the call in under the rate limits (the fleet's when fl is
// set), waiting up to left() for room. It returns the second the local
// window counted it in (-1: no limits), whether a fleet lease did, or the
// refusal.
func (g *Guards) takeRate(ctx context.Context, fl *fleetguard.Fleet, name string, gd *guard, set guardSettings, rate *rateWindow, left func() time.Duration) (taken int64, fleetTaken bool, err error) {
	if rate == nil {
		return -1, false, nil
	}
	refused := func() error {
		return g.refuse(name, stubbornv1.RefusedBy_REFUSED_BY_RATE_LIMIT,
			"rate limit reached (%s): no call could go within max_queue_wait %s", rateLimits(set), set.maxQueueWait)
	}
	if fl != nil {
		ok, fleetErr, err := g.fleetTake(ctx, fl, name, gd, set, left)
		switch {
		case ok:
			now := g.clock.Now()
			rate.count(now) // this replica's own counts, should it fall back
			return now.Unix(), true, nil
		case !fleetErr && err != nil:
			return -1, false, err
		case !fleetErr:
			return -1, false, refused()
		}
		// Cut off from the fleet's store: this replica's own counts.
	}
	share := int64(1)
	if g.fleet != nil {
		// Its share of the limits: the replicas still in the fleet go on
		// leasing the whole of them.
		share = int64(g.fleet.Peers(name))
	}
	for {
		now := g.clock.Now()
		ok, wait := rate.takeShare(now, share)
		if ok {
			return now.Unix(), false, nil
		}
		if wait <= 0 || wait > left() {
			return -1, false, refused()
		}
		if err := g.clock.Sleep(ctx, wait); err != nil {
			return -1, false, err
		}
	}
}

// admitted is a call the guards let through, for its end to report to.
type admitted struct {
	g    *Guards
	name string
	set  guardSettings
	br   *breaker
	rate *rateWindow
	fl   *fleetguard.Fleet // the fleet's breaker let it through
	// gen is its local breaker generation; probe the fleet's probe it is
	// (nil: none); allowTr the transition letting it through made.
	gen     uint64
	probe   *fleetProbe
	allowTr *Transition
}

// allow asks the breaker (the fleet's when a.fl is set) to let the call
// through: "" if it does, else why not.
func (a *admitted) allow(ctx context.Context) string {
	g := a.g
	if a.fl != nil {
		if why, ok := a.allowByFleet(ctx); ok {
			return why
		}
		a.fl = nil // cut off from the fleet's store: this replica's own breaker
	}
	if g.fleet != nil {
		// Cut off, the fleet's breaker as last seen open or half-open
		// stands in this replica's own: past its cooldown, this replica's
		// probes go first, not every call (openWhy refused within it).
		if rec, _ := g.fleet.Breaker(a.name); rec.StateOf() != fleetguard.StateClosed {
			a.br.follow(rec.Epoch, rec.Until, rec.Reason, rec.OpenedBy)
		}
	}
	gen, ok, why, tr := a.br.allow()
	g.transition(a.name, tr)
	a.gen, a.allowTr = gen, tr
	if !ok {
		return why
	}
	return ""
}

// allowByFleet asks the fleet's breaker to let the call through: "" if it
// does, else why not; ok is false when this replica is cut off from the
// fleet's store (its own breaker judges then).
func (a *admitted) allowByFleet(ctx context.Context) (why string, ok bool) {
	g := a.g
	// Opened on this replica's own counts while it was cut off from the
	// fleet's store: the fleet's breaker opens with it (else the fleet's,
	// closed, would let through the calls this replica found failing, one
	// replica after another). Until the fleet's record stands open, its
	// own opening stands: an Admit that found the fleet up a moment
	// before the store stopped answering does not close it.
	if until, open := a.br.ownOpenUntil(); open && !g.fleetOpenUntil(a.fl, a.name, a.br.reason(), until) {
		return "", false
	}
	probe, why, tr, err := g.fleetAllow(ctx, a.fl, a.name, a.br.settings())
	if err != nil {
		return "", false
	}
	g.transition(a.name, tr)
	a.probe, a.allowTr = probe, tr
	if why == "" && probe == nil {
		a.gen = a.br.countOnly()
	}
	return why, true
}

// done reports the call's end to the guards, and returns the note the
// breaker's transitions make, if any.
func (a *admitted) done(res *stubbornv1.Result, err error) (note string) {
	g := a.g
	if a.rate != nil && a.set.tpm > 0 {
		now := g.clock.Now()
		a.rate.used(now, tokensUsed(res))
		if g.fleet != nil {
			g.fleet.CountTokens(a.name, now.Unix(), tokensUsed(res))
		}
	}
	if a.br == nil {
		return ""
	}
	counted, failed := breakerCounts(err, a.set.retryOn)
	var tr *Transition
	switch {
	case a.probe != nil:
		tr = g.fleetProbeDone(a.fl, a.name, a.br.settings(), a.probe, counted, failed)
	default:
		tr = a.br.done(a.gen, counted, failed)
		if tr != nil && tr.To == breakerOpen && a.fl != nil {
			// This replica's counts open the fleet's breaker; its own
			// goes back to counting once the fleet's stands open.
			if g.fleetOpen(a.fl, a.name, a.br.settings(), tr.Why) {
				tr.Why += fmt.Sprintf(" (opened for the fleet by replica %s)", a.fl.Replica())
				a.br.countOnly()
			}
		}
	}
	g.transition(a.name, tr)
	if a.allowTr != nil {
		note = fmt.Sprintf("circuit breaker %s → %s (%s): this call was a probe", a.allowTr.From, a.allowTr.To, a.allowTr.Why)
	}
	if tr != nil {
		if note != "" {
			note += "; "
		}
		note += fmt.Sprintf("circuit breaker %s → %s: %s", tr.From, tr.To, tr.Why)
	}
	return note
}

// rateLimits says which rate limits a delegate has.
func rateLimits(s guardSettings) string {
	var parts []string
	if s.rpm > 0 {
		parts = append(parts, fmt.Sprintf("requests_per_minute %d", s.rpm))
	}
	if s.tpm > 0 {
		parts = append(parts, fmt.Sprintf("tokens_per_minute %d", s.tpm))
	}
	return strings.Join(parts, ", ")
}

// errQueueFull is wait's error when no slot freed within the wait.
var errQueueFull = errors.New("queue wait over")

// bulkhead counts the calls in flight to a delegate against max.
type bulkhead struct {
	mu            sync.Mutex
	max, inFlight int
	// freed, when not nil, is closed (and cleared) when a slot frees or
	// max grows: a waiter tries again.
	freed chan struct{}
}

// tryTake takes a slot, or returns a channel closed when one may free.
func (b *bulkhead) tryTake() (bool, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inFlight < b.max {
		b.inFlight++
		return true, nil
	}
	if b.freed == nil {
		b.freed = make(chan struct{})
	}
	return false, b.freed
}

func (b *bulkhead) notifyLocked() {
	if b.freed != nil {
		close(b.freed)
		b.freed = nil
	}
}

func (b *bulkhead) release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inFlight--
	b.notifyLocked()
}

func (b *bulkhead) setMax(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.max = n
	b.notifyLocked()
}

func (b *bulkhead) load() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inFlight
}

// wait takes one of b's slots, waiting up to wait (on the guards' clock).
func (g *Guards) wait(ctx context.Context, b *bulkhead, wait time.Duration) error {
	ok, freed := b.tryTake()
	if ok {
		return nil
	}
	if wait <= 0 {
		return errQueueFull
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	over := make(chan error, 1)
	go func() { over <- g.clock.Sleep(wctx, wait) }()
	for {
		select {
		case <-freed:
			if ok, freed = b.tryTake(); ok {
				if err := ctx.Err(); err != nil {
					// Both were ready: a call whose run ended is not
					// let through.
					b.release()
					return err
				}
				return nil
			}
		case err := <-over:
			if err == nil {
				return errQueueFull
			}
			return err // ctx ended
		}
	}
}

func (g *Guards) transition(name string, tr *Transition) {
	if tr != nil && g.OnTransition != nil {
		g.OnTransition(name, *tr)
	}
}

// breakerCounts says how a call's end counts for a circuit breaker: a
// transient failure (by on, else the retry rules) as a failure; an answer,
// a permanent error (a 4xx, INVALID_ARGUMENT: the delegate answered) as a
// success; the run's end (cancelled) and a refusal not at all.
func breakerCounts(err error, on *stubbornv1.RetryOn) (counted, failed bool) {
	if err == nil {
		return true, false
	}
	var ce *controls.CallError
	if !errors.As(err, &ce) || ce.Refused || ce.Code == codes.Canceled {
		return false, false // the run ended, or Stubborn refused it
	}
	transient, _ := controls.TransientOn(ce, on)
	return true, transient
}

// describe sets what ListDelegates shows of a delegate's guard.
func (g *Guards) describe(name string, d *stubbornv1.DelegateDescription) {
	gd := g.get(name)
	if gd == nil {
		return
	}
	_, br, bulk, rate := gd.parts()
	if br != nil {
		switch br.State() {
		case breakerOpen:
			d.CircuitBreaker = stubbornv1.BreakerState_BREAKER_STATE_OPEN
		case breakerHalfOpen:
			d.CircuitBreaker = stubbornv1.BreakerState_BREAKER_STATE_HALF_OPEN
		default:
			d.CircuitBreaker = stubbornv1.BreakerState_BREAKER_STATE_CLOSED
		}
		d.CircuitBreakerReason = br.reason()
		if until, open := br.openUntil(); open {
			d.CircuitBreakerOpenUntil = timestamppb.New(until)
		}
	}
	if bulk != nil {
		d.InFlight = int32(bulk.load())
	}
	if rate != nil {
		d.RequestsLastMinute, d.TokensLastMinute = rate.usage(g.clock.Now())
	}
	g.describeFleet(name, d, br, rate)
}

// tokensUsed returns the tokens a model delegate's answer reports using,
// from its data's usage: total_tokens, else input_tokens + output_tokens
// (Anthropic), else prompt_tokens + completion_tokens (OpenAI); 0 when it
// reports none.
func tokensUsed(res *stubbornv1.Result) int64 {
	usage := res.GetData().GetStructValue().GetFields()["usage"].GetStructValue().GetFields()
	if usage == nil {
		return 0
	}
	// The numbers are the delegate's: each is clamped, so that no sum
	// overflows.
	num := func(k string) int64 {
		v := usage[k].GetNumberValue()
		if !(v > 0) {
			return 0
		}
		return int64(min(v, 1<<40))
	}
	if t := num("total_tokens"); t > 0 {
		return t
	}
	if t := num("input_tokens") + num("output_tokens"); t > 0 {
		return t
	}
	return num("prompt_tokens") + num("completion_tokens")
}
