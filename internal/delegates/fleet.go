package delegates

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/fleetguard"
)

// Fleet-wide guards: with UseFleet, while the replica reaches the fleet's
// store, a delegate's circuit breaker and rate limits are the fleet's.
//
//   - Breaker: each replica counts its own calls' failures (its local
//     breaker, kept closed); when they would open it, it opens the fleet's
//     record instead (compare-and-set), which every replica watches and
//     obeys. After the cooldown a replica takes a probe from the record by
//     compare-and-set, so that the fleet lets probes calls through in all;
//     their answers close it, a failure opens it again.
//   - Rate limits: a replica leases a share of the minute's budget from the
//     delegate's ledger (leaseSize calls, by compare-and-set) and admits
//     calls from it with no store round trip for fleetguard.LeaseLife; the
//     next lease gives back what the last left unused.
//   - Cut off (fleetguard's Scope says local), everything is as without a
//     fleet: the replica's own breaker and counts, which it kept counting
//     meanwhile.
//
// max_concurrent is always the replica's (a bulkhead protects this
// process); so is retry_budget (a control's, in the run engine).

// UseFleet makes the guards' breakers and rate limits the fleet's (f's)
// while f reaches its store. Call it before the first Admit.
func (g *Guards) UseFleet(f *fleetguard.Fleet) {
	g.fleet = f
	f.SetOnBreaker(func(name string, old, next fleetguard.Breaker) {
		if tr := fleetTransition(old, next); tr != nil {
			g.transition(name, tr)
		}
	})
}

// fleetUp returns the fleet when its state guards calls now, else nil.
func (g *Guards) fleetUp() *fleetguard.Fleet {
	if g.fleet == nil {
		return nil
	}
	if up, _ := g.fleet.Scope(); !up {
		return nil
	}
	return g.fleet
}

// fleetTransition is the transition another replica's write of a breaker
// record made, or nil.
func fleetTransition(old, next fleetguard.Breaker) *Transition {
	from, to := stateOf(old), stateOf(next)
	if from == to && old.Epoch == next.Epoch {
		return nil
	}
	why := "by replica " + next.By
	if to == breakerOpen {
		why = fmt.Sprintf("%s (opened by replica %s)", next.Reason, next.OpenedBy)
	}
	return &Transition{From: from, To: to, Why: why, Fleet: true, OpenedBy: next.OpenedBy}
}

func stateOf(b fleetguard.Breaker) BreakerState {
	switch b.StateOf() {
	case fleetguard.StateOpen:
		return breakerOpen
	case fleetguard.StateHalfOpen:
		return breakerHalfOpen
	}
	return breakerClosed
}

// fleetOpenWhy says why the fleet's breaker refuses a call at now, or ""
// when it does not (closed, or past its cooldown).
func fleetOpenWhy(rec fleetguard.Breaker, now time.Time) string {
	if rec.StateOf() != fleetguard.StateOpen || !now.Before(rec.Until) {
		return ""
	}
	return fmt.Sprintf("circuit breaker open (%s; opened by replica %s) until %s",
		rec.Reason, rec.OpenedBy, rec.Until.UTC().Format("2006-01-02T15:04:05.000Z07:00"))
}

// outcomeTimeout bounds each store call that writes what a call's end
// did to the fleet's breaker (after the call: not on its path).
const outcomeTimeout = 5 * time.Second

// fleetProbe is a probe call the fleet's half-open breaker let through.
type fleetProbe struct {
	epoch uint64
}

// fleetAllow asks the fleet's breaker to let one call through: a closed one
// does (probe nil); an open one past its cooldown, or a half-open one with
// probes left, does as a probe, taken by compare-and-set; else it refuses
// (why). err is the store's failing: the caller guards on its own then.
func (g *Guards) fleetAllow(ctx context.Context, fl *fleetguard.Fleet, name string, cfg CircuitBreaker) (probe *fleetProbe, why string, tr *Transition, err error) {
	rec, _ := fl.Breaker(name)
	if rec.StateOf() == fleetguard.StateClosed {
		return nil, "", nil, nil
	}
	now := g.clock.Now()
	var from BreakerState
	cur, took, err := fl.ChangeBreaker(ctx, name, func(cur fleetguard.Breaker) (fleetguard.Breaker, bool) {
		from = stateOf(cur)
		switch cur.StateOf() {
		case fleetguard.StateOpen:
			if now.Before(cur.Until) {
				return cur, false
			}
			cur.State, cur.ProbesLeft, cur.Answered = fleetguard.StateHalfOpen, cfg.Probes, 0
		case fleetguard.StateHalfOpen:
			// Probes taken by a replica that never said how they went
			// (it crashed, or was cut off) are offered again a cooldown
			// later.
			if cur.ProbesLeft <= 0 && now.Sub(cur.At) >= cfg.Cooldown.Std() {
				cur.ProbesLeft, cur.Answered = cfg.Probes, 0
			}
			if cur.ProbesLeft <= 0 {
				return cur, false
			}
		default:
			return cur, false
		}
		cur.ProbesLeft--
		return cur, true
	})
	if err != nil {
		return nil, "", nil, err
	}
	if took {
		if from == breakerOpen {
			tr = &Transition{From: breakerOpen, To: breakerHalfOpen, Why: "cooldown of " + cfg.Cooldown.String() + " over", Fleet: true, OpenedBy: cur.OpenedBy}
		}
		return &fleetProbe{epoch: cur.Epoch}, "", tr, nil
	}
	switch cur.StateOf() {
	case fleetguard.StateClosed:
		return nil, "", nil, nil
	case fleetguard.StateOpen:
		if w := fleetOpenWhy(cur, now); w != "" {
			return nil, w, nil, nil
		}
	}
	return nil, "circuit breaker half-open: the fleet's probe call(s) are in flight", nil, nil
}

// fleetProbeDone tells the fleet's breaker how a probe went: an answer
// counts toward closing it (probes answers close it), a transient failure
// opens it again, a call that counts for nothing gives its probe back.
func (g *Guards) fleetProbeDone(fl *fleetguard.Fleet, name string, cfg CircuitBreaker, p *fleetProbe, counted, failed bool) *Transition {
	now := g.clock.Now()
	var tr *Transition
	// A probe's outcome is written even when its run ended, and waits
	// for a slow store: lost, the record would wait a cooldown for it.
	_, _, err := fl.ChangeBreakerWithin(context.Background(), name, outcomeTimeout, func(cur fleetguard.Breaker) (fleetguard.Breaker, bool) {
		tr = nil
		if cur.StateOf() != fleetguard.StateHalfOpen || cur.Epoch != p.epoch {
			return cur, false // a later opening, or closed by other probes
		}
		switch {
		case !counted:
			cur.ProbesLeft++
		case failed:
			cur = fleetguard.Breaker{State: fleetguard.StateOpen, Until: now.Add(cfg.Cooldown.Std()),
				Reason: "a probe call failed", OpenedBy: fl.Replica(), Epoch: cur.Epoch + 1}
			tr = &Transition{From: breakerHalfOpen, To: breakerOpen, Why: cur.Reason, Fleet: true, OpenedBy: cur.OpenedBy}
		default:
			if cur.Answered++; cur.Answered >= cfg.Probes {
				tr = &Transition{From: breakerHalfOpen, To: breakerClosed, Why: fmt.Sprintf("%d probe call(s) answered", cur.Answered), Fleet: true, OpenedBy: cur.OpenedBy}
				cur = fleetguard.Breaker{State: fleetguard.StateClosed, Reason: cur.Reason, OpenedBy: cur.OpenedBy, Epoch: cur.Epoch}
			}
		}
		return cur, true
	})
	if err != nil {
		return nil
	}
	return tr
}

// fleetOpen opens the fleet's breaker, which this replica's counts found
// failing (why), unless it is open or half-open already. It returns
// whether the fleet's record now stands open or half-open: the local
// breaker can go back to counting.
func (g *Guards) fleetOpen(fl *fleetguard.Fleet, name string, cfg CircuitBreaker, why string) bool {
	return g.fleetOpenUntil(fl, name, why, g.clock.Now().Add(cfg.Cooldown.Std()))
}

// fleetOpenUntil is fleetOpen with the cooldown's end.
func (g *Guards) fleetOpenUntil(fl *fleetguard.Fleet, name, why string, until time.Time) bool {
	cur, _, err := fl.ChangeBreakerWithin(context.Background(), name, outcomeTimeout, func(cur fleetguard.Breaker) (fleetguard.Breaker, bool) {
		if cur.StateOf() != fleetguard.StateClosed {
			return cur, false
		}
		return fleetguard.Breaker{State: fleetguard.StateOpen, Until: until,
			Reason: why, OpenedBy: fl.Replica(), Epoch: cur.Epoch + 1}, true
	})
	return err == nil && cur.StateOf() != fleetguard.StateClosed
}

// fleetLease is the share of a delegate's rate budget this replica leased
// from the fleet.
type fleetLease struct {
	// asking makes one lease asked for at a time: the calls that find
	// the lease spent wait for it rather than each ask.
	asking sync.Mutex

	mu    sync.Mutex
	sec   int64     // second it was granted in
	left  int64     // calls left in it
	until time.Time // end of its life
}

// take takes a call from the lease, if it has one left and is alive.
func (l *fleetLease) take(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.left > 0 && now.Before(l.until) {
		l.left--
		return true
	}
	return false
}

// giveBack gives a taken call back (refused after it was counted).
func (l *fleetLease) giveBack(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Before(l.until) {
		l.left++
	}
}

// spent empties the lease and returns what it left unused.
func (l *fleetLease) spent() fleetguard.Unused {
	l.mu.Lock()
	defer l.mu.Unlock()
	u := fleetguard.Unused{Sec: l.sec, N: l.left}
	l.left = 0
	return u
}

func (l *fleetLease) set(now time.Time, n int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sec, l.left, l.until = now.Unix(), n, now.Add(fleetguard.LeaseLife)
}

// leaseSize is how many calls a replica leases at once: a twentieth of
// requests_per_minute, 1 to 100; 10 under tokens_per_minute alone.
func leaseSize(s guardSettings) int64 {
	if s.rpm == 0 {
		return 10
	}
	return min(max(s.rpm/20, 1), 100)
}

// fleetTake admits one call under the fleet's rate limits, from the lease
// or a new one, waiting up to left() for room. ok false with err nil means
// the limits refused it; a store error (fleetErr true) sends the caller to
// its own counts.
func (g *Guards) fleetTake(ctx context.Context, fl *fleetguard.Fleet, name string, gd *guard, set guardSettings, left func() time.Duration) (ok bool, fleetErr bool, err error) {
	for {
		now := g.clock.Now()
		if gd.lease.take(now) {
			return true, false, nil
		}
		gd.lease.asking.Lock()
		if gd.lease.take(now) {
			gd.lease.asking.Unlock()
			return true, false, nil
		}
		n, wait, lerr := fl.Lease(ctx, name, now, leaseSize(set), set.rpm, set.tpm, gd.lease.spent())
		if lerr == nil && n > 0 {
			gd.lease.set(now, n-1)
		}
		gd.lease.asking.Unlock()
		switch {
		case lerr != nil && ctx.Err() != nil:
			return false, false, ctx.Err()
		case lerr != nil:
			return false, true, lerr
		case n > 0:
			return true, false, nil
		}
		// Leases other replicas give back may make room before the
		// oldest grant ages out: ask again within a lease's life.
		if wait <= 0 || wait > left() {
			return false, false, nil
		}
		if err := g.clock.Sleep(ctx, min(wait, fleetguard.LeaseLife)); err != nil {
			return false, false, err
		}
	}
}

// describeFleet sets what ListDelegates shows of the fleet's guards of a
// delegate, over what describe set from the local ones.
func (g *Guards) describeFleet(name string, d *stubbornv1.DelegateDescription, br *breaker, rate *rateWindow) {
	if g.fleet == nil {
		return
	}
	up, why := g.fleet.Scope()
	if !up {
		d.GuardScope = stubbornv1.GuardScope_GUARD_SCOPE_LOCAL
		d.GuardScopeReason = why
		if br != nil && br.State() != breakerClosed {
			// Cut off, this replica guards on its own breaker: it
			// opened it, or follows the fleet's opening it last saw.
			d.CircuitBreakerOpenedBy = cmp.Or(br.follower(), g.fleet.Replica())
		}
		return
	}
	d.GuardScope = stubbornv1.GuardScope_GUARD_SCOPE_FLEET
	now := g.clock.Now()
	if br != nil {
		rec, _ := g.fleet.Breaker(name)
		st := stateOf(rec)
		if st == breakerOpen && !now.Before(rec.Until) {
			st = breakerHalfOpen // the next call is a probe
		}
		switch st {
		case breakerOpen:
			d.CircuitBreaker = stubbornv1.BreakerState_BREAKER_STATE_OPEN
			d.CircuitBreakerOpenUntil = timestamppb.New(rec.Until)
		case breakerHalfOpen:
			d.CircuitBreaker = stubbornv1.BreakerState_BREAKER_STATE_HALF_OPEN
			d.CircuitBreakerOpenUntil = nil
		default:
			d.CircuitBreaker = stubbornv1.BreakerState_BREAKER_STATE_CLOSED
			d.CircuitBreakerOpenUntil = nil
		}
		d.CircuitBreakerReason = rec.Reason
		d.CircuitBreakerOpenedBy = rec.OpenedBy
	}
	if rate != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if reqs, tokens, err := g.fleet.Usage(ctx, name, now); err == nil {
			d.RequestsLastMinute, d.TokensLastMinute = reqs, tokens
		}
	}
}

// BreakerOpen reports whether the delegate's breaker refuses calls now,
// within its cooldown (a half-open one is for Admit to judge): the
// fleet's as this replica last saw it, else this server's own. It changes
// nothing and makes no store round trip (for a balance weighing
// deployments).
func (g *Guards) BreakerOpen(name string) bool {
	gd := g.get(name)
	if gd == nil {
		return false
	}
	_, br, _, _ := gd.parts()
	return g.openWhy(g.fleetUp(), name, br) != ""
}

// RateUsage returns the requests and tokens counted against the
// delegate's rate limits within the last minute, and its limits: the
// fleet's as its ledger was last read (no store round trip), else this
// server's own counts. ok is false when it has no rate limit.
func (g *Guards) RateUsage(name string) (reqs, tokens, rpm, tpm int64, ok bool) {
	gd := g.get(name)
	if gd == nil {
		return 0, 0, 0, 0, false
	}
	set, _, _, rate := gd.parts()
	if rate == nil {
		return 0, 0, 0, 0, false
	}
	now := g.clock.Now()
	if fl := g.fleetUp(); fl != nil {
		if reqs, tokens, read := fl.LastUsage(name, now); read {
			return reqs, tokens, set.rpm, set.tpm, true
		}
	}
	reqs, tokens = rate.usage(now)
	return reqs, tokens, set.rpm, set.tpm, true
}
