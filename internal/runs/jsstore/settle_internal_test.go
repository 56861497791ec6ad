package jsstore

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// TestSettleDropsARunsSummariesAndWaitsForItsBatch: DeleteRun's settle
// drops the run's states waiting to be indexed (others stay) and returns
// only once the batch in flight that holds the run is written and checked
// (so no summary of it is written after the purge); with no batch holding
// the run, and when the indexer stops halfway, it does not wait.
func TestSettleDropsARunsSummariesAndWaitsForItsBatch(t *testing.T) {
	x := &indexer{pending: map[string][][]byte{"gone": {[]byte("s1"), []byte("s2")}, "kept": {[]byte("s")}}}
	assert.Equal(t, "s2", string(x.settle(context.Background(), "gone")), "no batch in flight: the last state dropped")
	assert.NotContains(t, x.pending, "gone")
	assert.Contains(t, x.pending, "kept")

	x.mu.Lock()
	x.writing, x.written = map[string][][]byte{"gone": {[]byte("in flight")}}, make(chan struct{})
	x.mu.Unlock()
	settled := make(chan struct{})
	var last []byte
	go func() {
		defer close(settled)
		last = x.settle(context.Background(), "gone")
	}()
	// A state noted while the batch is written is dropped as well.
	x.note("gone", []byte("later"))
	select {
	case <-settled:
		t.Fatal("settle returned with the run's batch in flight")
	case <-time.After(50 * time.Millisecond):
	}
	x.wroteBatch()
	select {
	case <-settled:
	case <-time.After(10 * time.Second):
		t.Fatal("settle still waits after the batch was written")
	}
	x.mu.Lock()
	assert.NotContains(t, x.pending, "gone")
	x.mu.Unlock()
	assert.Contains(t, []string{"in flight", "later"}, string(last), "a state of the run seen")

	// A batch that holds other runs only is not waited for.
	x.mu.Lock()
	x.writing, x.written = map[string][][]byte{"kept": {[]byte("s")}}, make(chan struct{})
	x.mu.Unlock()
	assert.Nil(t, x.settle(context.Background(), "gone"))

	// An indexer stopped halfway ends its batch: settle returns.
	x.mu.Lock()
	x.writing["gone"] = [][]byte{[]byte("s")}
	x.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	x.wake = make(chan struct{}, 1)
	x.loop(ctx)
	x.settle(context.Background(), "gone")
	require.Nil(t, x.writing)
}

// TestARunDeletedBeforeItIsIndexedIsToldGone: a run whose summary this
// server has yet to write to the index (its indexer holds it: stopped
// here, as when the run is deleted within the indexer's delay) is listed
// all the same (ListRuns adds the runs driven here); when it is deleted,
// the index's followers are told so, and never get a summary of it.
func TestARunDeletedBeforeItIsIndexedIsToldGone(t *testing.T) {
	e, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	s := openOn(t, e)
	<-s.IndexReconciled()
	s.index.stop() // what is noted from now on stays pending

	const id = "run_notyetindexed"
	st, err := proto.Marshal(&stubbornv1.ControlState{
		RunId: id, Tenant: "acme", CreateTime: timestamppb.Now(),
		Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED,
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type told struct {
		sum     *stubbornv1.RunSummary
		deleted string
	}
	follows := make(chan told, 16)
	followed := make(chan error, 1)
	go func() {
		followed <- s.FollowSummaries(ctx, []string{"acme"}, func(sum *stubbornv1.RunSummary, deleted string) error {
			follows <- told{sum, deleted}
			return nil
		})
	}()
	require.Equal(t, told{}, <-follows, "the follower follows")
	require.NoError(t, s.PutState(ctx, id, st))
	s.index.mu.Lock()
	require.Contains(t, s.index.pending, id, "not indexed yet")
	s.index.mu.Unlock()

	require.NoError(t, s.DeleteRun(ctx, id))
	select {
	case got := <-follows:
		assert.Nil(t, got.sum, "no summary of the run")
		assert.Equal(t, id, got.deleted, "its deletion is told")
	case err := <-followed:
		t.Fatalf("following ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the deletion was never told")
	}
	s.index.mu.Lock()
	assert.NotContains(t, s.index.pending, id, "nothing of it left to index")
	s.index.mu.Unlock()
}
