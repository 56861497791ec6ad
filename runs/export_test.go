package runs

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// PauseHeartbeats freezes the manager's heartbeats and takeover scans, as a
// stopped process would: its runs go on, but others will take them over.
func (m *Manager) PauseHeartbeats() { m.paused.Store(true) }

// ResumeHeartbeats ends PauseHeartbeats, as a process let go on would
// (SIGCONT): it beats and scans again.
func (m *Manager) ResumeHeartbeats() { m.paused.Store(false) }

// Owns reports whether this manager drives the run now.
func (m *Manager) Owns(id string) bool {
	r := m.local(id)
	return r != nil && !r.isLost()
}

// AppendForTest tries to write an event to a run through this manager's
// store, as the run's next event in the manager's own view.
func (m *Manager) AppendForTest(ctx context.Context, id string) error {
	r := m.local(id)
	r.mu.Lock()
	seq := int64(len(r.events)) + 1
	r.mu.Unlock()
	ev, err := EncodeEvent(&stubbornv1.RunEvent{RunId: id, Seq: seq, Kind: &stubbornv1.RunEvent_RunResumed{RunResumed: &stubbornv1.RunResumed{Owner: "stale"}}})
	if err != nil {
		return err
	}
	return m.store.Append(ctx, ev)
}

// Kill stops driving every run at once, writing nothing and telling no one,
// as a crash would (Manager.kill). The runs are taken over once the lease
// has passed.
func (m *Manager) Kill() { m.kill() }

// Parked returns how many runs wait in backoff without a goroutine (parked
// on park's timer or for a decision).
func (m *Manager) Parked() int { return int(m.parked.Load()) }

// IsClosedForTest reports whether Close or Kill has begun.
func (m *Manager) IsClosedForTest() bool { return m.isClosed() }

// JournalFinal wraps a Store that reads finished runs' states from their
// journals, so that a test can override some of its methods and the
// Manager still treats it as one (the wrapper says so).
type JournalFinal struct{ Store }

func (JournalFinal) finalInJournal() bool { return true }

// ReadsFinalFromJournal reports whether the Manager leaves a run's final
// state to s's journal (when the run saved none before).
func ReadsFinalFromJournal(s Store) bool {
	fj, ok := s.(finalInJournal)
	return ok && fj.finalInJournal()
}

// PurgeForTest makes one pass of the store's janitor as if it were now,
// and returns how many runs and leftovers it purged.
func (s *JetStream) PurgeForTest(ctx context.Context, now time.Time) (int, error) {
	return s.purge(ctx, now)
}

// IndexReady reports whether the store has reconciled its listing index.
func (s *JetStream) IndexReady() bool { return s.index.ready.Load() }

// KeyHash is keyHash, for tests that write a key's entry themselves.
func KeyHash(tenant, key string) string { return keyHash(tenant, key) }

// RawJournalSeqs returns the seq of every event stored on run id's
// subject, in stream order, as stored: a message stored twice counts
// twice (readers drop the second).
func RawJournalSeqs(ctx context.Context, s *JetStream, id string) ([]int64, error) {
	last, err := s.events.GetLastMsgForSubject(ctx, eventsSubject+id)
	if err != nil {
		return nil, err
	}
	var seqs []int64
	err = s.read(ctx, id, func(evs []Event, seq uint64) (bool, error) {
		for _, ev := range evs {
			seqs = append(seqs, ev.Seq)
		}
		return seq < last.Sequence, nil
	})
	return seqs, err
}

// DeleteCrashAt has the store's DeleteRun stop with err right after step
// ("tombstone", "summary", "state", "owner's entry", "journal"), as a
// crash there would; "" stops nothing.
func (s *JetStream) DeleteCrashAt(step string, err error) {
	s.deleteHook = func(at string) error {
		if at == step {
			return err
		}
		return nil
	}
}

// StateDecodes returns how many run states this process has decoded whole.
func StateDecodes() int64 { return stateDecodes.Load() }

// OwnersEntryForTest returns the server the owners entry of s (a
// *JetStream) names for the run, "" when it has none.
func OwnersEntryForTest(ctx context.Context, s Store, runID string) (string, error) {
	e, err := s.(*JetStream).owners.Get(ctx, runID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	owner, _ := parseOwnerEntry(e.Value())
	return owner, nil
}

// HasMarkForTest reports whether s (a *JetStream) keeps owner's mark.
func HasMarkForTest(ctx context.Context, s Store, owner string) (bool, error) {
	_, err := s.(*JetStream).marks.Get(ctx, owner)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	return err == nil, err
}

// DriverForTest is s.Driver.
func DriverForTest(ctx context.Context, s Store, runID string) (string, error) {
	return s.Driver(ctx, runID)
}
