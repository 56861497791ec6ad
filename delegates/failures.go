package delegates

import (
	"context"
	"errors"
	"slices"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/stubbornhq/stubborn/controls"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// MaxRecentFailures is how many failed calls Failures keeps per delegate.
const MaxRecentFailures = 10

// FailureMessageBytes is how much of a failure's message Failures keeps
// (controls.Cut).
const FailureMessageBytes = 300

// Failures keeps each delegate's latest failed calls on this server, at
// most MaxRecentFailures each, in memory, for ListDelegates
// (DelegateDescription.recent_failures): shared by every run and kept
// across config reloads, like Guards. A failure is a call that ended in
// an error while its run went on: a call whose run ended (cancelled, past
// its deadline, a race's loser) and a call Stubborn refused are not the
// delegate's failures.
type Failures struct {
	clock controls.Clock

	mu     sync.Mutex
	byName map[string]*failureRing
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
	return &Failures{clock: clock, byName: map[string]*failureRing{}}
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
	if err != nil && ctx.Err() == nil {
		r.f.add(r.tenantOf(ctx), c, err)
	}
	return res, err
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
	rec := &stubbornv1.DelegateFailure{
		Time:    timestamppb.New(f.clock.Now()),
		Code:    int32(code),
		Message: controls.Cut(controls.Message(err), FailureMessageBytes),
		RunId:   c.RunID,
		Attempt: c.Attempt,
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ring := f.byName[c.Delegate]
	if ring == nil {
		ring = &failureRing{}
		f.byName[c.Delegate] = ring
	}
	tf := tenantFailure{tenant: tenant, f: rec}
	if len(ring.items) < MaxRecentFailures {
		ring.items = append(ring.items, tf)
		return
	}
	ring.items[ring.next] = tf
	ring.next = (ring.next + 1) % MaxRecentFailures
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
