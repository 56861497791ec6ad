package memstore

import (
	"context"
)

// memoryTombstones is how many deleted runs a Memory store remembers.
const memoryTombstones = 1 << 16

// DeletedRun implements store.Deletion.
func (s *Memory) DeletedRun(_ context.Context, runID string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, gone := s.deleted[runID]
	return gone, nil
}

// tombstoneLocked records that run runID is deleted, forgetting the
// oldest tombstone beyond memoryTombstones.
func (s *Memory) tombstoneLocked(runID string) {
	if s.deleted == nil {
		s.deleted = map[string]struct{}{}
	}
	if _, ok := s.deleted[runID]; ok {
		return
	}
	if len(s.deletedOrder) == memoryTombstones {
		delete(s.deleted, s.deletedOrder[0])
		s.deletedOrder = s.deletedOrder[1:]
	}
	s.deleted[runID] = struct{}{}
	s.deletedOrder = append(s.deletedOrder, runID)
}
