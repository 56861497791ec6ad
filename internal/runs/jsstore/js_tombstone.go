package jsstore

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// deletedBucket holds a tombstone per deleted run, for the retention.
const deletedBucket = "stubborn_deleted"

// DeletedRun implements store.Deletion.
func (s *JetStream) DeletedRun(ctx context.Context, runID string) (bool, error) {
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

// anyTombstones reports whether the store holds any tombstone, or any
// other record in their bucket: with none, no run has been deleted (within
// the retention). One read of the bucket's stream state.
func (s *JetStream) anyTombstones(ctx context.Context) (bool, error) {
	st, err := s.deleted.Status(ctx)
	if err != nil {
		return false, err
	}
	return st.Values() > 0, nil
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
				if err := s.purgeRecords(ctx, id, 0, true, true, nil); err != nil {
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
