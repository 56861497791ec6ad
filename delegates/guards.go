package delegates

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/stubbornhq/stubborn/controls"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// DefaultMaxQueueWait is how long a call waits for a delegate's bulkhead
// slot or rate limit when its max_queue_wait is unset.
const DefaultMaxQueueWait = time.Second

// Guards are the delegates' circuit breakers, bulkheads (max_concurrent)
// and rate limits (requests_per_minute, tokens_per_minute) on one server:
// shared by every run, and kept across config reloads (a delegate's guard
// is built again only when its settings change, and a removed delegate's
// stays for the runs that still call it). It implements controls.Guards.
type Guards struct {
	clock controls.Clock

	// OnTransition, when set, is told of every change of a circuit
	// breaker's state (metrics, logs). It must not block.
	OnTransition func(delegate string, t Transition)
	// OnRefused, when set, is told of every call a guard refused.
	OnRefused func(delegate string, by stubbornv1.RefusedBy)

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

// guardSettings are what a guard is built from; a guard is kept across a
// reload when they are equal.
type guardSettings struct {
	breaker       *CircuitBreaker
	maxConcurrent int
	rpm, tpm      int64
	maxQueueWait  time.Duration
	retryOn       *stubbornv1.RetryOn
}

// guard is one delegate's.
type guard struct {
	settings guardSettings
	breaker  *breaker      // nil: none
	slots    chan struct{} // nil: no max_concurrent
	rate     *rateWindow   // nil: no rate limit
}

// Configure sets the guards of cfg's delegates, keeping those whose
// settings did not change.
func (g *Guards) Configure(cfg *Config) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, d := range cfg.Delegates {
		s := d.guardSettings()
		if old, ok := g.byName[d.Name]; ok && reflect.DeepEqual(old.settings, s) {
			continue
		}
		if s.breaker == nil && s.maxConcurrent == 0 && s.rpm == 0 && s.tpm == 0 {
			delete(g.byName, d.Name) // nothing to guard
			continue
		}
		gd := &guard{settings: s}
		if s.breaker != nil {
			gd.breaker = newBreaker(*s.breaker, g.clock.Now)
		}
		if s.maxConcurrent > 0 {
			gd.slots = make(chan struct{}, s.maxConcurrent)
		}
		if s.rpm > 0 || s.tpm > 0 {
			gd.rate = &rateWindow{rpm: s.rpm, tpm: s.tpm}
		}
		g.byName[d.Name] = gd
	}
}

func (d Delegate) guardSettings() guardSettings {
	s := guardSettings{
		breaker: d.CircuitBreaker, maxConcurrent: d.MaxConcurrent,
		rpm: int64(d.RequestsPerMinute), tpm: d.TokensPerMinute, maxQueueWait: DefaultMaxQueueWait,
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

// refuse is the error of a call gd's guard by refused.
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

// Admit asks to send one call to the named delegate (controls.Guards): an
// open circuit breaker refuses it at once; a rate limit or a full bulkhead
// makes it wait, up to the delegate's max_queue_wait, then refuses it; a
// half-open breaker lets its probes through and refuses the others.
func (g *Guards) Admit(ctx context.Context, name string) (func(*stubbornv1.Result, error) string, error) {
	gd := g.get(name)
	if gd == nil {
		return func(*stubbornv1.Result, error) string { return "" }, nil
	}
	// An open breaker refuses before the call queues for anything.
	if gd.breaker != nil && gd.breaker.State() == BreakerOpen {
		if _, ok, why, _ := gd.breaker.allow(); !ok {
			return nil, g.refuse(name, stubbornv1.RefusedBy_REFUSED_BY_CIRCUIT_BREAKER, "%s", why)
		}
	}
	start := g.clock.Now()
	if gd.rate != nil {
		for {
			now := g.clock.Now()
			ok, wait := gd.rate.take(now)
			if ok {
				break
			}
			left := gd.settings.maxQueueWait - now.Sub(start)
			if wait <= 0 || wait > left {
				return nil, g.refuse(name, stubbornv1.RefusedBy_REFUSED_BY_RATE_LIMIT,
					"rate limit reached (requests_per_minute %d, tokens_per_minute %d): no call could go within max_queue_wait %s",
					gd.settings.rpm, gd.settings.tpm, gd.settings.maxQueueWait)
			}
			if err := g.clock.Sleep(ctx, wait); err != nil {
				return nil, err
			}
		}
	}
	if gd.slots != nil {
		if err := g.slot(ctx, gd, gd.settings.maxQueueWait-g.clock.Now().Sub(start)); err != nil {
			if errors.Is(err, errQueueFull) {
				return nil, g.refuse(name, stubbornv1.RefusedBy_REFUSED_BY_BULKHEAD,
					"bulkhead full: %d calls in flight (max_concurrent), none ended within max_queue_wait %s", gd.settings.maxConcurrent, gd.settings.maxQueueWait)
			}
			return nil, err
		}
	}
	release := func() {
		if gd.slots != nil {
			<-gd.slots
		}
	}
	var (
		gen     uint64
		allowTr *Transition
	)
	if gd.breaker != nil {
		var (
			ok  bool
			why string
		)
		gen, ok, why, allowTr = gd.breaker.allow()
		g.transition(name, allowTr)
		if !ok {
			release()
			return nil, g.refuse(name, stubbornv1.RefusedBy_REFUSED_BY_CIRCUIT_BREAKER, "%s", why)
		}
	}
	return func(res *stubbornv1.Result, err error) string {
		release()
		if gd.rate != nil && gd.settings.tpm > 0 {
			gd.rate.used(g.clock.Now(), TokensUsed(res))
		}
		if gd.breaker == nil {
			return ""
		}
		counted, failed := breakerCounts(err, gd.settings.retryOn)
		tr := gd.breaker.done(gen, counted, failed)
		g.transition(name, tr)
		var note string
		if allowTr != nil {
			note = fmt.Sprintf("circuit breaker %s → %s (%s): this call was a probe", allowTr.From, allowTr.To, allowTr.Why)
		}
		if tr != nil {
			if note != "" {
				note += "; "
			}
			note += fmt.Sprintf("circuit breaker %s → %s: %s", tr.From, tr.To, tr.Why)
		}
		return note
	}, nil
}

// errQueueFull is slot's error when no slot freed within the wait.
var errQueueFull = errors.New("queue wait over")

// slot takes one of gd's slots, waiting up to wait (on the guards' clock).
func (g *Guards) slot(ctx context.Context, gd *guard, wait time.Duration) error {
	select {
	case gd.slots <- struct{}{}:
		return nil
	default:
	}
	if wait <= 0 {
		return errQueueFull
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	over := make(chan error, 1)
	go func() { over <- g.clock.Sleep(wctx, wait) }()
	select {
	case gd.slots <- struct{}{}:
		return nil
	case err := <-over:
		if err == nil {
			return errQueueFull
		}
		return err // ctx ended
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
	if gd.breaker != nil {
		switch gd.breaker.State() {
		case BreakerOpen:
			d.CircuitBreaker = stubbornv1.BreakerState_BREAKER_STATE_OPEN
		case BreakerHalfOpen:
			d.CircuitBreaker = stubbornv1.BreakerState_BREAKER_STATE_HALF_OPEN
		default:
			d.CircuitBreaker = stubbornv1.BreakerState_BREAKER_STATE_CLOSED
		}
		d.CircuitBreakerReason = gd.breaker.reason()
	}
	if gd.slots != nil {
		d.InFlight = int32(len(gd.slots))
	}
}

// TokensUsed returns the tokens a model delegate's answer reports using,
// from its data's usage: total_tokens, else input_tokens + output_tokens
// (Anthropic), else prompt_tokens + completion_tokens (OpenAI); 0 when it
// reports none.
func TokensUsed(res *stubbornv1.Result) int64 {
	usage := res.GetData().GetStructValue().GetFields()["usage"].GetStructValue().GetFields()
	if usage == nil {
		return 0
	}
	num := func(k string) int64 { return int64(usage[k].GetNumberValue()) }
	if t := num("total_tokens"); t > 0 {
		return t
	}
	if t := num("input_tokens") + num("output_tokens"); t > 0 {
		return t
	}
	return num("prompt_tokens") + num("completion_tokens")
}
