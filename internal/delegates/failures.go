package delegates

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
)

// maxRecentFailures is how many failed calls Failures keeps per delegate.
const maxRecentFailures = 10

// maxCallTenants is how many tenants' latest call Failures keeps per
// delegate: tenants come from the config, but reloads may bring new ones
// while the record lives on; past it, the tenant whose call is oldest is
// forgotten.
const maxCallTenants = 256

// failureMessageBytes is how much of a failure's message Failures keeps
// (controls.Cut).
const failureMessageBytes = 300

// Failures keeps each delegate's latest failed calls on this server, at
// most maxRecentFailures each, in memory, for ListDelegates
// (DelegateDescription.recent_failures): shared by every run and kept
// across config reloads, like Guards. A failure is a call that ended in
// an error while its run went on: a call whose run ended (cancelled, past
// its deadline, a race's loser) and a call Stubborn refused are not the
// delegate's failures. It also keeps, per delegate and tenant, what the
// latest such call did and since when calls have been failing
// (DelegateDescription.last_call_time, failing_since): what stands in
// for health for a delegate nobody health-checks.
type Failures struct {
	clock controls.Clock

	mu     sync.Mutex
	byName map[string]*failureRing
	// calls is each delegate's latest call per tenant, guarded by mu.
	calls map[string]map[string]*callState
}

// callState is what a tenant's runs' latest call to a delegate did.
type callState struct {
	at   time.Time  // when it ended
	code codes.Code // codes.OK when it succeeded
	// okAt is when the latest successful call ended (zero: none yet);
	// failingSince when the first failed call after it ended (zero unless
	// the latest call failed).
	okAt, failingSince time.Time
}

// LastCall is what the latest call to a delegate did, of the runs of the
// tenants asked about.
type LastCall struct {
	// At is when it ended; zero when there was none.
	At time.Time
	// Code is codes.OK when it succeeded.
	Code codes.Code
	// FailingSince is when the first failed call after the latest
	// successful one ended, when the latest call failed; else zero.
	FailingSince time.Time
}

// failureRing holds a delegate's latest failures; next is where the next
// one goes once it is full.
type failureRing struct {
	items []tenantFailure
	next  int
}

// tenantFailure is a failure and the tenant of the run whose call it was:
// a tenant is shown its own runs' failures only (their run ids and
// messages are its business).
type tenantFailure struct {
	tenant string
	f      *stubbornv1.DelegateFailure
}

// NewFailures returns an empty record on clock (nil: the wall clock).
func NewFailures(clock controls.Clock) *Failures {
	if clock == nil {
		clock = controls.RealClock{}
	}
	return &Failures{clock: clock, byName: map[string]*failureRing{}, calls: map[string]map[string]*callState{}}
}

// Record returns d, keeping the failures of the calls made through it,
// each with the tenant tenantOf reads from the call's context (the run's).
func (f *Failures) Record(d controls.Delegates, tenantOf func(context.Context) string) controls.Delegates {
	return recordFailures{Delegates: d, f: f, tenantOf: tenantOf}
}

type recordFailures struct {
	controls.Delegates
	f        *Failures
	tenantOf func(context.Context) string
}

func (r recordFailures) Call(ctx context.Context, c controls.Call) (*stubbornv1.Result, error) {
	res, err := r.Delegates.Call(ctx, c)
	if ctx.Err() != nil {
		return res, err
	}
	if err != nil {
		r.f.add(r.tenantOf(ctx), c, err)
	} else {
		r.f.succeeded(r.tenantOf(ctx), c.Delegate)
	}
	return res, err
}

// succeeded keeps that a call of a run of tenant to delegate succeeded.
func (f *Failures) succeeded(tenant, delegate string) {
	now := f.clock.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.callState(tenant, delegate)
	*s = callState{at: now, code: codes.OK, okAt: now}
}

// callState returns tenant's state of delegate's calls, making room for
// it (f.mu held).
func (f *Failures) callState(tenant, delegate string) *callState {
	byTenant := f.calls[delegate]
	if byTenant == nil {
		byTenant = map[string]*callState{}
		f.calls[delegate] = byTenant
	}
	s := byTenant[tenant]
	if s != nil {
		return s
	}
	if len(byTenant) >= maxCallTenants {
		var oldest string
		var at time.Time
		for t, st := range byTenant {
			if at.IsZero() || st.at.Before(at) {
				oldest, at = t, st.at
			}
		}
		delete(byTenant, oldest)
	}
	s = &callState{}
	byTenant[tenant] = s
	return s
}

// add keeps call c's failure err, of a run of tenant, unless Stubborn
// refused the call or it was cancelled.
func (f *Failures) add(tenant string, c controls.Call, err error) {
	code := codes.Unknown
	var ce *controls.CallError
	if errors.As(err, &ce) {
		if ce.Refused || ce.Code == codes.Canceled {
			return
		}
		code = ce.Code
	}
	now := f.clock.Now()
	rec := &stubbornv1.DelegateFailure{
		Time:    timestamppb.New(now),
		Code:    int32(code),
		Message: controls.Cut(controls.Message(err), failureMessageBytes),
		RunId:   c.RunID,
		Attempt: c.Attempt,
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.callState(tenant, c.Delegate)
	if s.at.IsZero() || s.code == codes.OK {
		s.failingSince = now
	}
	s.at, s.code = now, code
	ring := f.byName[c.Delegate]
	if ring == nil {
		ring = &failureRing{}
		f.byName[c.Delegate] = ring
	}
	tf := tenantFailure{tenant: tenant, f: rec}
	if len(ring.items) < maxRecentFailures {
		ring.items = append(ring.items, tf)
		return
	}
	ring.items[ring.next] = tf
	ring.next = (ring.next + 1) % maxRecentFailures
}

// Recent returns the delegate's latest failures of runs of tenants,
// newest first.
func (f *Failures) Recent(name string, tenants []string) []*stubbornv1.DelegateFailure {
	f.mu.Lock()
	defer f.mu.Unlock()
	ring := f.byName[name]
	if ring == nil {
		return nil
	}
	n := len(ring.items)
	out := make([]*stubbornv1.DelegateFailure, 0, n)
	// The newest is just before next (which wraps to the oldest once full).
	for i := 1; i <= n; i++ {
		if it := ring.items[(ring.next-i+n)%n]; slices.Contains(tenants, it.tenant) {
			out = append(out, it.f)
		}
	}
	return out
}

// Last returns what the latest call to the delegate of runs of tenants
// did. Over several tenants, the latest call is the latest of any, and
// calls are failing since the first failure after the latest success of
// any: when their calls interleave, that is no earlier than the others'
// latest success (which falls between two of the failing tenant's calls).
func (f *Failures) Last(name string, tenants []string) LastCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	var latest *callState
	var okAt time.Time
	for _, t := range tenants {
		s := f.calls[name][t]
		if s == nil {
			continue
		}
		if latest == nil || s.at.After(latest.at) {
			latest = s
		}
		if s.okAt.After(okAt) {
			okAt = s.okAt
		}
	}
	if latest == nil {
		return LastCall{}
	}
	l := LastCall{At: latest.at, Code: latest.code}
	if latest.code != codes.OK {
		l.FailingSince = latest.failingSince
		if okAt.After(l.FailingSince) {
			l.FailingSince = okAt
		}
	}
	return l
}
