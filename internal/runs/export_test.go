package runs

import (
	"context"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// AppendForTest tries to write an event to a run through this manager's
// store, as the run's next event in the manager's own view.
func (m *Manager) AppendForTest(ctx context.Context, id string) error {
	r := m.local(id)
	r.mu.Lock()
	seq := int64(len(r.events)) + 1
	r.mu.Unlock()
	ev, err := store.EncodeEvent(&stubbornv1.RunEvent{RunId: id, Seq: seq, Kind: &stubbornv1.RunEvent_RunResumed{RunResumed: &stubbornv1.RunResumed{Owner: "stale"}}})
	if err != nil {
		return err
	}
	return m.store.Append(ctx, nil, ev)
}

// IsClosedForTest reports whether Close or Kill has begun.
func (m *Manager) IsClosedForTest() bool { return m.isClosed() }

// JournalFinal wraps a Store that reads finished runs' states from their
// journals, so that a test can override some of its methods and the
// Manager still treats it as one (the wrapper says so).
type JournalFinal struct{ store.Store }

func (JournalFinal) FinalInJournal() bool { return true }

// ReadsFinalFromJournal reports whether the Manager leaves a run's final
// state to s's journal (when the run saved none before).
func ReadsFinalFromJournal(s store.Store) bool {
	return s.FinalInJournal()
}

// KeyHash is keyHash, for tests that write a key's entry themselves.
func KeyHash(tenant, key string) string { return keyHash(tenant, key) }

// DriverForTest is s.Driver.
func DriverForTest(ctx context.Context, s store.Store, runID string) (string, error) {
	return s.Driver(ctx, runID)
}
