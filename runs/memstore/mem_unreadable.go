package memstore

import (
	"context"
	"fmt"

	"github.com/stubbornhq/stubborn/runs/store"
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
	data, ok := s.states[runID]
	if !ok {
		return nil, "", false, fmt.Errorf("%w: %q", store.ErrNotFound, runID)
	}
	return data, "", false, nil
}
