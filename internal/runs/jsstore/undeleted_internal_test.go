package jsstore

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// TestABatchReadsTombstonesOnlyWhenThereAreAny: the summaries a batch
// wrote are checked against the runs' tombstones once the batch is
// written. With no tombstone in the store, that is one read of the
// bucket's state and no read a run; with one, each run's tombstone is
// read, and the deleted run's summary is taken back while the others
// stay.
func TestABatchReadsTombstonesOnlyWhenThereAreAny(t *testing.T) {
	e, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	s := openOn(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var reads atomic.Int64
	s.index.deleted = func(ctx context.Context, runID string) (bool, error) {
		reads.Add(1)
		return s.DeletedRun(ctx, runID)
	}
	writeAll := func(ids ...string) []indexed {
		var done []indexed
		for _, id := range ids {
			key, err := s.index.write(ctx, "", &stubbornv1.RunSummary{RunId: id, Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, UpdateTime: timestamppb.Now()})
			require.NoError(t, err)
			done = append(done, indexed{key: key, runID: id})
		}
		return done
	}
	listed := func(id string) bool {
		_, err := s.index.kv.Get(ctx, indexKey("", id))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return false
		}
		require.NoError(t, err)
		return true
	}

	require.True(t, s.index.undeletedAll(ctx, writeAll("run_a", "run_b", "run_c")))
	assert.Zero(t, reads.Load(), "no tombstone in the store: no run's is read")
	for _, id := range []string{"run_a", "run_b", "run_c"} {
		assert.True(t, listed(id), id)
	}

	require.NoError(t, s.tombstone(ctx, "run_e"))
	require.True(t, s.index.undeletedAll(ctx, writeAll("run_d", "run_e", "run_f")))
	assert.Equal(t, int64(3), reads.Load(), "a tombstone in the store: each run's is read")
	assert.True(t, listed("run_d"))
	assert.False(t, listed("run_e"), "the deleted run's summary is taken back")
	assert.True(t, listed("run_f"))
}
