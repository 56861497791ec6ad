package jsstore

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// refusal reports whether a failed write (made again while it may pass)
// was refused for good: larger than the server takes, a stream still full,
// or a JetStream error that is neither a conflict nor one that may pass
// (transient).
func refusal(err error) bool {
	if errors.Is(err, nats.ErrMaxPayload) {
		return true
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant:
		return false
	case errCodeStoreFailed:
		// Still full after WriteRetry.
		return true
	}
	return !transient(err) && apiErr.Code >= 400 && apiErr.Code < 600
}

// Waits between the tries of a write (write): full jitter over an
// exponential backoff from retryBase, capped at retryCap.
const (
	retryBase = 50 * time.Millisecond
	retryCap  = 2 * time.Second
)

// write makes a store write with try, and again while it fails for a
// reason that may pass (transient), for up to writeRetry, unless ctx ends
// first or the channel it carries under stopWritesKey is closed; it
// returns the last try's error. A try after one whose answer was lost may
// be refused because that one took effect (a journal's expected sequence,
// a key created): landed, when not nil, is then asked whether the store
// holds this write, which makes it a success.
//
// Once this server has beaten, every try is fenced by its lease: a lease
// after the last heartbeat written, other servers may take its runs over
// and read their journals, so no try may still be under way then. A try
// gets a deadline no later than the fence (less margin, for a request
// already on the wire), and none starts after it. The fence is read again
// before every try: beats that land during an outage move it on.
func (s *JetStream) write(ctx context.Context, try func(context.Context) error, landed func(context.Context) (bool, error)) error {
	err := s.fenced(ctx, try)
	s.roomFor(err)
	if err == nil || !transient(err) || s.writeRetry <= 0 {
		return err
	}
	stop, _ := ctx.Value(store.StopWritesKey{}).(<-chan struct{})
	until := time.Now().Add(s.writeRetry)
	for n := 0; ; n++ {
		wait := time.Duration(mrand.Int64N(int64(min(retryCap, retryBase<<min(n, 16))) + 1))
		if time.Now().Add(wait).After(until) {
			return err
		}
		if fence, ok := s.fence(); ok {
			// Tried before the fence, or not at all: a beat landing
			// meanwhile moves the fence on for the next wait.
			room := time.Until(fence) - minTry
			if room <= 0 {
				return err
			}
			wait = min(wait, room)
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return err
		case <-stop:
			timer.Stop()
			return err
		case <-timer.C:
		}
		err = s.fenced(ctx, try)
		if err == nil {
			return nil
		}
		s.roomFor(err)
		if errors.Is(err, errFenced) {
			return err
		}
		if !transient(err) {
			if landed != nil {
				if ok, lerr := landed(ctx); lerr == nil && ok {
					return nil
				}
			}
			return err
		}
	}
}

// roomFor asks the janitor for a pass now when err says the stream is
// over its -max-bytes (a write admission let in, or one of a run in
// flight, that meets a store grown meanwhile): the write is made again
// while the pass purges finished runs, and nothing else would purge them
// before the janitor's next pass (PurgeEvery) if no new run asks for
// room. The pass starts at once: the write is made again for WriteRetry
// only.
func (s *JetStream) roomFor(err error) {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != errCodeStoreFailed || s.janitor.kick == nil {
		return
	}
	s.janitor.urgent.Store(true)
	select {
	case s.janitor.kick <- struct{}{}:
	default:
	}
}

// minTry is the shortest time a try is given.
const minTry = 50 * time.Millisecond

// margin is store.FenceMargin for this store's lease.
func (s *JetStream) margin() time.Duration { return min(store.FenceMargin, s.lease/4) }

// errFenced is why a write was not tried: the lease of this server's last
// heartbeat is (nearly) over, and another server may drive its runs: a
// conflict, as if that server had written first.
var errFenced = fmt.Errorf("%w: not written: this server's lease is over (its heartbeats are not landing)", store.ErrConflict)

// fence returns when this server's writes must have ended: a lease after
// its last heartbeat written, less margin. ok is false before the
// first heartbeat.
func (s *JetStream) fence() (time.Time, bool) {
	at := s.beatAt.Load()
	if at == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, at).Add(s.lease - s.margin()), true
}

// fenced makes one try, with a deadline no later than the fence. A try
// with more than the client's own timeout left before the fence gets ctx
// as it is (no deadline, no timer to make).
func (s *JetStream) fenced(ctx context.Context, try func(context.Context) error) error {
	fence, ok := s.fence()
	if !ok {
		return try(ctx)
	}
	left := time.Until(fence)
	if left < minTry {
		return errFenced
	}
	if d, has := ctx.Deadline(); !has && left > s.apiTimeout+minTry || has && d.Before(fence) {
		return try(ctx)
	}
	tctx, cancel := context.WithDeadline(ctx, fence)
	defer cancel()
	return try(tctx)
}

// transient reports whether a failed NATS call may succeed if made again:
// no answer in time, or no server to take it (a stream's leader being
// elected, a NATS server restarting, the connection being restored).
func transient(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected) {
		return true
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.Code != http.StatusServiceUnavailable {
		return false
	}
	switch apiErr.ErrorCode {
	case errCodeInsufficientResources, errCodeClusteringRequired, errCodeNotSupportedClustered:
		// The server refuses the write for good: made again it would be
		// refused again, a lease later. (A stream over its -max-bytes,
		// errCodeStoreFailed, is made again: the janitor makes room.)
		return false
	}
	return true
}

// JetStream API error codes (nats-server's jetstream_errors_generated.go)
// that nats.go does not name: a write the stream refuses to store (its
// limits with DiscardNew: "maximum bytes exceeded"), a feature that needs
// or is not supported in clustered mode.
const (
	errCodeInsufficientResources jetstream.ErrorCode = 10023
	errCodeStoreFailed           jetstream.ErrorCode = 10077
	errCodeClusteringRequired    jetstream.ErrorCode = 10010
	errCodeNotSupportedClustered jetstream.ErrorCode = 10036
)

// Transient reports whether err, from a call of a JetStream store (or of
// a Manager on one), is the store not answering for a moment (no answer in
// time, no server to take a call, a reconnect): the same call may succeed
// if made again, so a client is told UNAVAILABLE, not INTERNAL.
func Transient(err error) bool { return transient(err) }

// Transient implements store.Store.
func (s *JetStream) Transient(err error) bool { return transient(err) }
