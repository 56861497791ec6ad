package memstore

import (
	"context"
)

// DeleteRun implements runDeleter.
func (s *Memory) DeleteRun(_ context.Context, runID string) error {
	s.mu.Lock()
	s.feed.deleted(runID, s.states[runID])
	s.tombstoneLocked(runID)
	delete(s.events, runID)
	delete(s.journals, runID)
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
