package runs

import (
	"context"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// Get returns a run's current state. A run of another tenant than ctx's
// is ErrNotFound, as every method of the Manager reports it.
func (m *Manager) Get(ctx context.Context, id string) (*stubbornv1.ControlState, error) {
	if r := m.local(id); r != nil && !r.isLost() {
		if err := visible(ctx, id, r.tenant); err != nil {
			return nil, err
		}
		// A copy of a run that was taken over while this server's lease
		// had lapsed is not the run: read the store then.
		cur, err := m.current(ctx, r)
		if err != nil {
			return nil, err
		}
		if cur != nil {
			if err := r.caughtUp(ctx); err != nil {
				return nil, err
			}
			return r.snapshot()
		}
	}
	return m.state(ctx, id)
}

// state returns the run's stored state if ctx's tenant may see it.
func (m *Manager) state(ctx context.Context, id string) (*stubbornv1.ControlState, error) {
	st, err := m.store.State(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := visible(ctx, id, st.GetTenant()); err != nil {
		return nil, err
	}
	return st, nil
}

// Watch sends the run's events with seq > afterSeq, then live ones as they
// happen, and returns nil after the run_finished event. It returns early
// with ctx's error or the first error of send. No lock is held while send
// runs.
func (m *Manager) Watch(ctx context.Context, id string, afterSeq int64, send func(store.Event) error) error {
	return m.WatchBatches(ctx, id, afterSeq, 1, func(evs []store.Event) error { return send(evs[0]) })
}

// WatchBatches is Watch sending the events that are ready together, up to
// max (at least 1) at a time: a watcher that falls behind catches up in
// fewer sends. send must not keep the slice.
func (m *Manager) WatchBatches(ctx context.Context, id string, afterSeq int64, max int, send func([]store.Event) error) error {
	if max < 1 {
		max = 1
	}
	next := afterSeq
	if r := m.local(id); r != nil {
		if err := visible(ctx, id, r.tenant); err != nil {
			return err
		}
		// A copy that is no longer the run (current) is lost by now:
		// since says so, and the store is followed.
		if _, err := m.current(ctx, r); err != nil {
			return err
		}
		for {
			evs, changed, done, lost := r.since(next)
			if len(evs) > 0 {
				for len(evs) > 0 {
					n := batchLen(evs, max)
					if err := send(evs[:n:n]); err != nil {
						return err
					}
					next = evs[n-1].Seq
					evs = evs[n:]
				}
				continue // more may have arrived while sending
			}
			if done {
				return nil
			}
			if lost {
				if m.isClosed() {
					return ErrClosed // this server stops: the client reattaches elsewhere
				}
				break // another server drives it now: follow the store
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	} else if _, err := m.state(ctx, id); err != nil {
		return err
	}
	// Following the store ends when this server closes: the client
	// reattaches to another server.
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(m.ctx, cancel)
	defer stop()
	one := make([]store.Event, 1)
	err := m.store.Follow(fctx, id, next, func(ev store.Event) error {
		one[0] = ev
		return send(one)
	})
	if err != nil && ctx.Err() == nil && m.ctx.Err() != nil {
		return ErrClosed
	}
	return err
}

// maxBatchBytes bounds the encoded events WatchBatches sends at once, below
// gRPC's default 4 MiB for a message a client receives; a batch has at
// least one event whatever its size.
const maxBatchBytes = 1 << 20

// batchLen is how many of evs, at most max and at least one, go in the next
// batch.
func batchLen(evs []store.Event, max int) int {
	n, size := 1, len(evs[0].Data)
	for n < len(evs) && n < max && size+len(evs[n].Data) <= maxBatchBytes {
		size += len(evs[n].Data)
		n++
	}
	return n
}

// since returns the events after seq, whether the run has finished, and
// whether it was lost. When there are no such events and the run goes on
// here, it also returns a channel closed on the next change.
func (r *run) since(seq int64) (evs []store.Event, changed <-chan struct{}, done, lost bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	seq = max(seq, 0)
	if seq < int64(len(r.events)) {
		return r.events[seq:], nil, r.done, r.lost
	}
	if !r.done && !r.lost {
		if r.changed == nil {
			r.changed = make(chan struct{})
		}
		changed = r.changed
	}
	return nil, changed, r.done, r.lost
}
