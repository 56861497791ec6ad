package memstore

import (
	"context"
)

// forgetKeysOf implements keysOfRun.
func (s *Memory) ForgetKeysOf(_ context.Context, runID string) error {
	k := &s.keys
	k.mu.Lock()
	defer k.mu.Unlock()
	for key, e := range k.entries {
		if e.RunID == runID {
			delete(k.entries, key)
		}
	}
	return nil
}

// rawState implements rawStater.
func (s *Memory) RawState(_ context.Context, runID string) ([]byte, string, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.states[runID], "", false, nil // nil when it has none
}
