package delegates

import (
	"fmt"
	"sync"
	"time"
)

// CircuitBreaker configures a delegate's circuit breaker (the registry's
// circuit_breaker). It counts the delegate's transient failures (what the
// retry rules call transient: timeouts, UNAVAILABLE, 5xx, 429 …; not
// permanent answers, cancellations or calls Stubborn refused) against its
// answers, across every run on the server. It opens after
// ConsecutiveFailures transient failures in a row, or when FailureRatio of
// at least MinCalls calls within Window failed; open, it refuses every call
// for Cooldown; then it lets Probes calls through (half-open): as many
// answers close it, a transient failure opens it again.
type CircuitBreaker struct {
	// ConsecutiveFailures opens the breaker after that many transient
	// failures in a row; 0 means not by count. When both this and
	// FailureRatio are 0, it is defaultBreakerFailures.
	ConsecutiveFailures int `yaml:"consecutive_failures,omitempty"`
	// FailureRatio (0 to 1] opens it when at least that share of the
	// calls within Window failed, once there were MinCalls; 0 means not
	// by ratio.
	FailureRatio float64 `yaml:"failure_ratio,omitempty"`
	// MinCalls is how many calls within Window FailureRatio needs to
	// judge; 0 means defaultBreakerMinCalls.
	MinCalls int `yaml:"min_calls,omitempty"`
	// Window is how far back FailureRatio looks; 0 means
	// defaultBreakerWindow.
	Window Duration `yaml:"window,omitempty"`
	// Cooldown is how long it stays open; 0 means defaultBreakerCooldown.
	Cooldown Duration `yaml:"cooldown,omitempty"`
	// Probes is how many calls it lets through half-open, at once, and
	// how many answers close it; 0 means 1.
	Probes int `yaml:"probes,omitempty"`
}

// Circuit breaker defaults.
const (
	defaultBreakerFailures = 5
	defaultBreakerMinCalls = 10
	defaultBreakerWindow   = time.Minute
	defaultBreakerCooldown = 30 * time.Second
)

// withDefaults fills in the zero fields.
func (c CircuitBreaker) withDefaults() CircuitBreaker {
	if c.ConsecutiveFailures == 0 && c.FailureRatio == 0 {
		c.ConsecutiveFailures = defaultBreakerFailures
	}
	if c.MinCalls == 0 {
		c.MinCalls = defaultBreakerMinCalls
	}
	if c.Window == 0 {
		c.Window = Duration(defaultBreakerWindow)
	}
	if c.Cooldown == 0 {
		c.Cooldown = Duration(defaultBreakerCooldown)
	}
	if c.Probes == 0 {
		c.Probes = 1
	}
	return c
}

// check returns what is wrong with c.
func (c CircuitBreaker) check() []string {
	var msgs []string
	if c.ConsecutiveFailures < 0 {
		msgs = append(msgs, fmt.Sprintf("circuit_breaker.consecutive_failures: must not be negative, got %d", c.ConsecutiveFailures))
	}
	if !(c.FailureRatio >= 0 && c.FailureRatio <= 1) {
		msgs = append(msgs, fmt.Sprintf("circuit_breaker.failure_ratio: must be between 0 and 1, got %g", c.FailureRatio))
	}
	if c.MinCalls < 0 || c.MinCalls > 1_000_000 {
		msgs = append(msgs, fmt.Sprintf("circuit_breaker.min_calls: must be between 0 and 1000000, got %d", c.MinCalls))
	}
	if c.Window < 0 || c.Window.Std() > 24*time.Hour {
		msgs = append(msgs, fmt.Sprintf("circuit_breaker.window: must be between 0 and 24h, got %s", c.Window))
	}
	if c.Cooldown < 0 || c.Cooldown.Std() > 24*time.Hour {
		msgs = append(msgs, fmt.Sprintf("circuit_breaker.cooldown: must be between 0 and 24h, got %s", c.Cooldown))
	}
	if c.Probes < 0 || c.Probes > 1000 {
		msgs = append(msgs, fmt.Sprintf("circuit_breaker.probes: must be between 0 and 1000, got %d", c.Probes))
	}
	return msgs
}

// BreakerState is a circuit breaker's state.
type BreakerState int

// The states of a circuit breaker.
const (
	breakerClosed BreakerState = iota
	breakerOpen
	breakerHalfOpen
)

func (s BreakerState) String() string {
	switch s {
	case breakerOpen:
		return "open"
	case breakerHalfOpen:
		return "half-open"
	}
	return "closed"
}

// breakerBuckets is how many slices Window is counted in.
const breakerBuckets = 10

// breaker is one delegate's circuit breaker, on a clock of its own (now),
// so that tests drive it with a fake one. Calls admitted in one state
// count only in that state (a generation, as in sony/gobreaker): a call
// sent while closed that fails after the breaker opened changes nothing.
type breaker struct {
	cfg CircuitBreaker
	now func() time.Time

	mu          sync.Mutex
	state       BreakerState
	generation  uint64
	consecutive int
	buckets     [breakerBuckets]bucketCount
	openedAt    time.Time
	probes      int // half-open: probes in flight
	answered    int // half-open: probes answered
	// lastTrip says why it last opened.
	lastTrip string
	// Fleet-wide guards, cut off from the fleet's store: the fleet's
	// opening this breaker follows (follow), by epoch and by whom it was
	// opened; openedBy is "" for an opening on this breaker's own counts.
	followed uint64
	openedBy string
}

type bucketCount struct {
	start           time.Time
	calls, failures int
}

func newBreaker(cfg CircuitBreaker, now func() time.Time) *breaker {
	return &breaker{cfg: cfg.withDefaults(), now: now}
}

// Transition is a change of a breaker's state.
type Transition struct {
	From, To BreakerState
	// Why says what made it change.
	Why string
	// Fleet says the change is the fleet's breaker's (fleet-wide guards);
	// OpenedBy then names the replica that last opened it.
	Fleet    bool
	OpenedBy string
}

// allow asks to send one call. It returns the call's generation, to pass
// to done, or ok false when the breaker refuses it (why says so), and the
// transition the asking made (open → half-open), if any.
func (b *breaker) allow() (gen uint64, ok bool, why string, tr *Transition) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	if b.state == breakerOpen {
		until := b.openedAt.Add(b.cfg.Cooldown.Std())
		if now.Before(until) {
			return 0, false, b.openWhy(until), nil
		}
		tr = b.set(breakerHalfOpen, "cooldown of "+b.cfg.Cooldown.String()+" over")
	}
	if b.state == breakerHalfOpen {
		if b.probes >= b.cfg.Probes {
			return 0, false, fmt.Sprintf("circuit breaker half-open: %d probe call(s) in flight", b.probes), tr
		}
		b.probes++
	}
	return b.generation, true, "", tr
}

// done reports how the call of generation gen went: failed says a
// transient failure, counted says it counts at all (not a permanent
// answer, a cancellation, a refusal). It returns the transition the
// outcome made, if any.
func (b *breaker) done(gen uint64, counted, failed bool) *Transition {
	b.mu.Lock()
	defer b.mu.Unlock()
	if gen != b.generation {
		return nil
	}
	now := b.now()
	switch b.state {
	case breakerHalfOpen:
		b.probes--
		switch {
		case !counted:
		case failed:
			b.lastTrip = "a probe call failed"
			return b.set(breakerOpen, b.lastTrip)
		default:
			if b.answered++; b.answered >= b.cfg.Probes {
				return b.set(breakerClosed, fmt.Sprintf("%d probe call(s) answered", b.answered))
			}
		}
	case breakerClosed:
		if !counted {
			return nil
		}
		bk := b.bucket(now)
		bk.calls++
		if !failed {
			b.consecutive = 0
			return nil
		}
		bk.failures++
		b.consecutive++
		if c := b.cfg.ConsecutiveFailures; c > 0 && b.consecutive >= c {
			b.lastTrip = fmt.Sprintf("%d transient failures in a row", b.consecutive)
			return b.set(breakerOpen, b.lastTrip)
		}
		if r := b.cfg.FailureRatio; r > 0 {
			calls, failures := b.window(now)
			if calls >= b.cfg.MinCalls && float64(failures) >= r*float64(calls) {
				b.lastTrip = fmt.Sprintf("%d of %d calls failed within %s", failures, calls, b.cfg.Window)
				return b.set(breakerOpen, b.lastTrip)
			}
		}
	}
	return nil
}

// set changes the state, starting a new generation with fresh counts.
func (b *breaker) set(to BreakerState, why string) *Transition {
	tr := &Transition{From: b.state, To: to, Why: why}
	b.state = to
	b.generation++
	b.consecutive, b.probes, b.answered = 0, 0, 0
	b.buckets = [breakerBuckets]bucketCount{}
	if to != breakerHalfOpen { // a half-open one keeps the opening's
		b.openedBy = ""
	}
	if to == breakerOpen {
		b.openedAt = b.now()
	}
	return tr
}

// bucket returns the bucket counting now's calls.
func (b *breaker) bucket(now time.Time) *bucketCount {
	width := b.cfg.Window.Std() / breakerBuckets
	if width <= 0 {
		width = 1
	}
	start := now.Truncate(width)
	i := int(start.UnixNano()/int64(width)) % breakerBuckets
	if i < 0 {
		i += breakerBuckets
	}
	if !b.buckets[i].start.Equal(start) {
		b.buckets[i] = bucketCount{start: start}
	}
	return &b.buckets[i]
}

// window counts the calls and failures within Window of now.
func (b *breaker) window(now time.Time) (calls, failures int) {
	from := now.Add(-b.cfg.Window.Std())
	for _, bk := range b.buckets {
		if bk.start.After(from) {
			calls += bk.calls
			failures += bk.failures
		}
	}
	return calls, failures
}

// State returns the breaker's state as of now (open past its cooldown
// reads half-open: the next call is a probe).
func (b *breaker) State() BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == breakerOpen && !b.now().Before(b.openedAt.Add(b.cfg.Cooldown.Std())) {
		return breakerHalfOpen
	}
	return b.state
}

// openUntil returns when the open breaker's cooldown ends, or ok false
// when it is not open within its cooldown.
func (b *breaker) openUntil() (until time.Time, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.openUntilLocked()
}

func (b *breaker) openUntilLocked() (until time.Time, ok bool) {
	if b.state != breakerOpen {
		return time.Time{}, false
	}
	until = b.openedAt.Add(b.cfg.Cooldown.Std())
	return until, b.now().Before(until)
}

// reason says why it last opened; "" if it never did.
func (b *breaker) reason() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lastTrip
}

// openNow reports whether the breaker is open and within its cooldown
// (why says so), without changing its state: a call it would refuse need
// not queue for anything first.
func (b *breaker) openNow() (why string, open bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	until, open := b.openUntilLocked()
	if !open {
		return "", false
	}
	return b.openWhy(until), true
}

func (b *breaker) openWhy(until time.Time) string {
	return fmt.Sprintf("circuit breaker open (%s) until %s", b.lastTrip, until.UTC().Format("2006-01-02T15:04:05.000Z07:00"))
}

// follow puts a closed breaker in the state of the fleet's opening of
// epoch (open until until, for why, by whom), as this replica last saw it
// before it was cut off from the fleet's store: once that cooldown ends,
// its own probes go first, not every call it sends. Each opening is
// followed once: a breaker its probes closed stays closed.
func (b *breaker) follow(epoch uint64, until time.Time, why, by string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state != breakerClosed || epoch == b.followed {
		return
	}
	b.followed = epoch
	b.set(breakerOpen, why)
	b.openedAt, b.lastTrip, b.openedBy = until.Add(-b.cfg.Cooldown.Std()), why, by
}

// ownOpenUntil is openUntil for an opening on this breaker's own counts
// (not one it follows of the fleet's).
func (b *breaker) ownOpenUntil() (until time.Time, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.openedBy != "" {
		return time.Time{}, false
	}
	return b.openUntilLocked()
}

// follower returns the replica that opened the fleet's breaker this one
// follows in its state, "" when it is in a state of its own.
func (b *breaker) follower() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == breakerClosed {
		return ""
	}
	return b.openedBy
}

// countOnly returns the generation of a call to count while the fleet's
// breaker (fleet.go) decides what is let through: the local breaker is
// closed then, its counts only finding when the delegate fails enough to
// open the fleet's. One left open or half-open from a time on its own
// counts is closed again, without a transition (the fleet's state is
// the one reported).
func (b *breaker) countOnly() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state != breakerClosed {
		b.set(breakerClosed, "")
	}
	return b.generation
}

// settings returns the breaker's settings, defaults filled in.
func (b *breaker) settings() CircuitBreaker { return b.cfg }
