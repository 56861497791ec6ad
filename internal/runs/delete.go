package runs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// Forgetting a run (issue 22): briefs and results may hold personal data,
// and retention may be days away. Delete removes a finished run whole —
// its journal, state, owner marker, listing summary and idempotency key —
// from the store, and from the memory of every server that shares it
// (the one that drove it keeps finished runs for Get and Watch).

// ErrNotFinished: the run has not finished (Delete without cancel).
var ErrNotFinished = errors.New("the run has not finished")

// Delete forgets run id of ctx's tenant: a finished run at once; one in
// flight is ErrNotFinished, unless cancel: then it is cancelled first. A
// run whose stored records cannot be read is deleted as a finished one,
// without decoding them (deleteUnreadable).
func (m *Manager) Delete(ctx context.Context, id string, cancel bool) error {
	st, err := m.Get(ctx, id)
	if errors.Is(err, ErrUnreadable) {
		return m.deleteUnreadable(ctx, id, err)
	}
	if err != nil {
		return err
	}
	if !store.IsTerminal(st.GetStatus()) {
		if !cancel {
			return fmt.Errorf("%w: run %s is %s; cancel it first (or ask to cancel and delete)", ErrNotFinished, id, st.GetStatus())
		}
		if st, err = m.Cancel(ctx, id); err != nil {
			return err
		}
		// Its driver saves its final state and lets go of its claim after
		// run_finished: purged before, they would come back.
		m.awaitRelease(ctx, id)
	}
	if key := st.GetOptions().GetIdempotencyKey(); key != "" && key != id {
		if err := m.store.ForgetKey(ctx, keyHash(st.GetTenant(), key), id); err != nil {
			return fmt.Errorf("deleting run %s: its idempotency key: %w", id, err)
		}
	}
	if err := m.store.DeleteRun(ctx, id); err != nil {
		return fmt.Errorf("deleting run %s: %w", id, err)
	}
	m.forgetFinished(id)
	return nil
}

// releaseWait bounds Delete's wait for a cancelled run's driver to let go
// of it: one that keeps its claim (its final state not saved) is purged
// all the same, and its tombstone keeps it from being resumed.
const releaseWait = 5 * time.Second

// awaitRelease waits until run id has no driver, for up to releaseWait.
func (m *Manager) awaitRelease(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(ctx, releaseWait)
	defer cancel()
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		if owner, err := m.store.Driver(ctx, id); err == nil && owner == "" {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// forgetFinished drops finished run id from this server's memory.
func (m *Manager) forgetFinished(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r := m.runs[id]; r != nil {
		r.mu.Lock()
		done := r.done
		r.mu.Unlock()
		if done {
			delete(m.runs, id)
		}
	}
}
