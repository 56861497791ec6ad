package runs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Deletion that a crash cannot undo (issue 29). DeleteRun writes a
// tombstone first, and acknowledges it only once it is stored (on every
// replica the store has), then purges the run's records. A crash anywhere
// after the tombstone cannot bring the run back to life:
//
//   - a server that takes a run over asks first whether it was deleted
//     (Manager.deleted, called at the top of resume): a deleted run is never
//     resumed, what is left of it is purged again, and its claim goes;
//   - a JetStream store that opens purges again what is left of every run
//     its tombstones name (redoDeletes): a purge cut short by the crash, or
//     one that the NATS server's recovery undid. (nats-server 2.15.2 brings
//     back, after a SIGKILL, the owner entries that a rollup and a purge had
//     removed from the owners bucket — the bucket whose release markers
//     carry a per-message TTL — while one of those markers is pending: the
//     runs came back claimed, with neither journal nor state, and were
//     resumed from their claims.)
//
// A crash before the tombstone is stored leaves the run whole: DeleteRun
// did not answer OK, and the run was cancelled first if it was in flight,
// so nothing resumes it either.
//
// Tombstones are bounded: the JetStream bucket's TTL is the retention
// (every record of a deleted run is gone long before), and a Memory store
// keeps the last memoryTombstones.

// deletedBucket holds a tombstone per deleted run, for the retention.
const deletedBucket = "stubborn_deleted"

// tombstones is a store that records the runs deleted.
type tombstones interface {
	// deletedRun reports whether run runID was deleted.
	deletedRun(ctx context.Context, runID string) (bool, error)
}

// deleted reports whether run id was deleted, and if so purges what is
// left of it (its claim included), so that resume leaves it alone: called
// first thing in resume. An error (the tombstone could not be read) leaves
// the run claimed, not resumed, for the next scan.
func (m *Manager) deleted(id string) (bool, error) {
	ts, ok := m.store.(tombstones)
	if !ok {
		return false, nil
	}
	gone, err := ts.deletedRun(m.ctx, id)
	if err != nil {
		return true, fmt.Errorf("run %s: reading whether it was deleted: %w", id, err)
	}
	if !gone {
		return false, nil
	}
	m.log.Info("not resuming a deleted run: what was left of it is purged", "run_id", id)
	if d, ok := m.store.(runDeleter); ok {
		if err := d.DeleteRun(m.ctx, id); err != nil {
			return true, fmt.Errorf("run %s was deleted: purging what is left of it: %w", id, err)
		}
	}
	return true, nil
}

// deletedRun implements tombstones.
func (s *JetStream) deletedRun(ctx context.Context, runID string) (bool, error) {
	if !validKey(runID) {
		return false, nil
	}
	_, err := s.deleted.Get(ctx, runID)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	default:
		return false, err
	}
}

// tombstone records that run runID is deleted, before anything of it is
// purged; it returns once the store has it.
func (s *JetStream) tombstone(ctx context.Context, runID string) error {
	stamp := []byte(strconv.FormatInt(time.Now().UnixNano(), 10))
	return s.write(ctx, func(ctx context.Context) error {
		_, err := s.deleted.Put(ctx, runID, stamp)
		return err
	}, nil)
}

// crashAt is a test's hook (DeleteCrashAt): an error from it stops
// DeleteRun at that step, as a crash there would.
func (s *JetStream) crashAt(step string) error {
	if s.deleteHook == nil {
		return nil
	}
	return s.deleteHook(step)
}

// redoDeletesWorkers purge the runs of the tombstones at start.
const redoDeletesWorkers = 8

// redoDeletes purges again what is left of every run a tombstone names,
// and returns how many runs it purged. It costs a purge per stream and
// tombstone: tombstones last for the retention, deletions are rare.
func (s *JetStream) redoDeletes(ctx context.Context, log *slog.Logger) int {
	lister, err := s.deleted.ListKeys(ctx)
	if err != nil {
		if !errors.Is(err, jetstream.ErrNoKeysFound) {
			log.Warn("reading the deleted runs' tombstones", "err", err)
		}
		return 0
	}
	ids := make(chan string)
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		n      int
		failed error
	)
	for range redoDeletesWorkers {
		wg.Go(func() {
			for id := range ids {
				if err := s.purgeRecords(ctx, id, 0, true, true); err != nil {
					mu.Lock()
					failed = err
					mu.Unlock()
					continue
				}
				mu.Lock()
				n++
				mu.Unlock()
			}
		})
	}
	for id := range lister.Keys() {
		ids <- id
	}
	close(ids)
	wg.Wait()
	if failed != nil {
		// The runs are not resumed all the same (Manager.deleted), and the
		// next start purges them again.
		log.Warn("purging what is left of deleted runs", "err", failed)
	}
	return n
}

// memoryTombstones is how many deleted runs a Memory store remembers.
const memoryTombstones = 1 << 16

// deletedRun implements tombstones.
func (s *Memory) deletedRun(_ context.Context, runID string) (bool, error) {
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
