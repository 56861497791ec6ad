package fleetguard

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Breaker states as a record holds them.
const (
	StateClosed   = "closed"
	StateOpen     = "open"
	StateHalfOpen = "half-open"
)

// Breaker is a delegate's circuit breaker as the fleet shares it. The zero
// value (no record) is closed.
type Breaker struct {
	State string `json:"state,omitempty"`
	// Until is when an open breaker's cooldown ends.
	Until time.Time `json:"until,omitzero"`
	// ProbesLeft is how many probe calls a half-open breaker still lets
	// through, fleet-wide; Answered how many of its probes answered.
	ProbesLeft int `json:"probes_left,omitempty"`
	Answered   int `json:"answered,omitempty"`
	// Reason says why it last opened; OpenedBy is the replica that opened
	// it; Epoch counts its openings (a probe of an earlier one counts for
	// nothing).
	Reason   string `json:"reason,omitempty"`
	OpenedBy string `json:"opened_by,omitempty"`
	Epoch    uint64 `json:"epoch,omitempty"`
	// By is the replica that wrote the record, At when.
	By string    `json:"by,omitempty"`
	At time.Time `json:"at,omitzero"`
}

// StateOf returns the record's state, closed for the zero record.
func (b Breaker) StateOf() string {
	if b.State == "" {
		return StateClosed
	}
	return b.State
}

// Breaker returns the delegate's breaker record as the watch last brought
// it, and its revision (0: none).
func (f *Fleet) Breaker(name string) (Breaker, uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.cache[name]
	return c.rec, c.rev
}

// ChangeBreaker changes the delegate's breaker record by compare-and-set:
// change is given the latest record and returns the new one, or ok false
// to leave it as it is. It is called again, with the record read anew,
// while the write loses to another replica's. It returns the record as it
// stands and whether change's was written.
//
// Each store call is bounded by a second: ChangeBreaker is made on a
// call's path. ChangeBreakerWithin gives each up to timeout instead.
func (f *Fleet) ChangeBreaker(ctx context.Context, name string, change func(cur Breaker) (next Breaker, ok bool)) (Breaker, bool, error) {
	return f.ChangeBreakerWithin(ctx, name, opTimeout, change)
}

// ChangeBreakerWithin is ChangeBreaker with each store call bounded by
// timeout: for a change made after a call, such as a probe's outcome, which
// a slow store should not lose.
func (f *Fleet) ChangeBreakerWithin(ctx context.Context, name string, timeout time.Duration, change func(cur Breaker) (next Breaker, ok bool)) (Breaker, bool, error) {
	cur, rev := f.Breaker(name)
	for range casTries {
		next, ok := change(cur)
		if !ok {
			return cur, false, nil
		}
		next.By, next.At = f.cfg.Replica, f.cfg.Now()
		data, err := json.Marshal(next)
		if err != nil {
			return cur, false, err
		}
		octx, cancel := context.WithTimeout(ctx, timeout)
		var nrev uint64
		if rev == 0 {
			nrev, err = f.breakers.Create(octx, key(name), data)
		} else {
			nrev, err = f.breakers.Update(octx, key(name), data, rev)
		}
		cancel()
		if err == nil {
			f.put(name, next, nrev, false)
			return next, true, nil
		}
		if !conflict(err) {
			if storeErr(err) {
				f.fail(err)
			}
			return cur, false, err
		}
		if cur, rev, err = f.readBreaker(ctx, name, timeout); err != nil {
			return cur, false, err
		}
	}
	return cur, false, ErrConflict
}

// readBreaker reads the delegate's record from the store (not the cache).
func (f *Fleet) readBreaker(ctx context.Context, name string, timeout time.Duration) (Breaker, uint64, error) {
	octx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	e, err := f.breakers.Get(octx, key(name))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Breaker{}, 0, nil
	}
	if err != nil {
		if storeErr(err) {
			f.fail(err)
		}
		return Breaker{}, 0, err
	}
	var rec Breaker
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return Breaker{}, e.Revision(), nil // unreadable: taken for closed, overwritten at its next change
	}
	f.put(name, rec, e.Revision(), false)
	return rec, e.Revision(), nil
}
