package runs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Forgetting a run (issue 22): briefs and results may hold personal data,
// and retention may be days away. Delete removes a finished run whole —
// its journal, state, owner marker, listing summary and idempotency key —
// from the store, and from the memory of every server that shares it
// (the one that drove it keeps finished runs for Get and Watch).

// ErrNotFinished: the run has not finished (Delete without cancel).
var ErrNotFinished = errors.New("the run has not finished")

// runDeleter is a store that deletes a run whole, and tells every server
// that shares it to forget it.
type runDeleter interface {
	DeleteRun(ctx context.Context, runID string) error
	// OnForget has fn called with the id of every run a server deletes
	// (this one's included).
	OnForget(fn func(runID string))
}

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
	if !isTerminal(st.GetStatus()) {
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
		if ks, ok := m.store.(keyStore); ok {
			if err := ks.ForgetKey(ctx, keyHash(st.GetTenant(), key), id); err != nil {
				return fmt.Errorf("deleting run %s: its idempotency key: %w", id, err)
			}
		}
	}
	d, ok := m.store.(runDeleter)
	if !ok {
		return fmt.Errorf("%w: this store cannot delete runs", ErrUnavailable)
	}
	if err := d.DeleteRun(ctx, id); err != nil {
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
	for {
		if owner, err := m.store.Driver(ctx, id); err == nil && owner == "" {
			return
		}
		if !sleep(ctx, 5*time.Millisecond) {
			return
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

// DeleteRun implements runDeleter.
func (s *Memory) DeleteRun(_ context.Context, runID string) error {
	s.mu.Lock()
	s.tombstoneLocked(runID)
	delete(s.events, runID)
	delete(s.states, runID)
	delete(s.owners, runID)
	s.rememberPrunedLocked(runID)
	fns := s.forget
	s.mu.Unlock()
	for _, fn := range fns {
		fn(runID)
	}
	return nil
}

// OnForget implements runDeleter.
func (s *Memory) OnForget(fn func(string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forget = append(s.forget, fn)
}

// ForgetKey deletes key's entry if it names run runID.
func (s *Memory) ForgetKey(_ context.Context, key, runID string) error {
	k := &s.keys
	k.mu.Lock()
	defer k.mu.Unlock()
	if cur, ok := k.entries[key]; ok && cur.RunID == runID {
		delete(k.entries, key)
	}
	return nil
}

// forgetSubject carries the ids of deleted runs to every server.
const forgetSubject = "stubborn.forget"

// DeleteRun implements runDeleter: the run's tombstone is written, then
// its summary, state, owner entry and whole journal are purged, then every
// server is told (tombstone.go: a crash at any step resumes nothing).
func (s *JetStream) DeleteRun(ctx context.Context, runID string) error {
	if !validKey(runID) {
		return fmt.Errorf("%w: %.64q", ErrNotFound, runID)
	}
	if err := s.tombstone(ctx, runID); err != nil {
		return fmt.Errorf("recording its deletion: %w", err)
	}
	if err := s.crashAt("tombstone"); err != nil {
		return err
	}
	if err := s.purgeRecords(ctx, runID, 0, true, true); err != nil {
		return err
	}
	return s.nc.Publish(forgetSubject, []byte(runID))
}

// OnForget implements runDeleter: fn is called for each run any server
// deletes, as NATS delivers the news.
func (s *JetStream) OnForget(fn func(string)) {
	sub, err := s.nc.Subscribe(forgetSubject, func(msg *nats.Msg) { fn(string(msg.Data)) })
	if err != nil {
		return // the connection is closed: there is no one to forget for
	}
	s.mu.Lock()
	s.forgetSubs = append(s.forgetSubs, sub)
	s.mu.Unlock()
}

// ForgetKey deletes key's entry if it names run runID.
func (s *JetStream) ForgetKey(ctx context.Context, key, runID string) error {
	e, err := s.keys.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	cur, ok := parseKeyEntry(e)
	if !ok || cur.RunID != runID {
		return nil
	}
	return s.DropKey(ctx, key, cur)
}
