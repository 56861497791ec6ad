package jsstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// TestTheIndexEndsWithTheRunsEnd (issue 29, finding 5): a server that
// lost a run writes a summary it had queued (RUNNING) after the server
// that took the run over wrote its end (SUCCEEDED); the index keeps the
// end. Of two non-final summaries the later update stays. Before, the
// last write won, and the listing said RUNNING for good.
func TestTheIndexEndsWithTheRunsEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := openMemoryStorage(t)
	now := time.Now()
	sum := func(status stubbornv1.RunStatus, at time.Time) *stubbornv1.RunSummary {
		return &stubbornv1.RunSummary{RunId: "run_x", Status: status, UpdateTime: timestamppb.New(at)}
	}
	indexed := func() stubbornv1.RunStatus {
		e, err := s.index.kv.Get(ctx, indexKey("", "run_x"))
		require.NoError(t, err)
		got, ok := parseIndexEntry(e.Value(), "")
		require.True(t, ok)
		return got.GetStatus()
	}
	write := func(sum *stubbornv1.RunSummary) {
		_, err := s.index.write(ctx, "", sum)
		require.NoError(t, err)
	}
	write(sum(stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF, now))
	write(sum(stubbornv1.RunStatus_RUN_STATUS_RUNNING, now.Add(-time.Second)))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF, indexed(), "an older update does not replace a newer one")
	write(sum(stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, now.Add(time.Second)))
	write(sum(stubbornv1.RunStatus_RUN_STATUS_RUNNING, now.Add(time.Hour)))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, indexed(), "nothing replaces the run's end")
}

// A run the indexer indexed at its start is indexed at its end without a
// read of its key first (the indexer remembers the revision it wrote);
// another server's write between the two is still read and weighed. The
// revisions remembered are bounded.
func TestTheIndexerWritesARunsEndAtTheRevisionItWrote(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := openMemoryStorage(t)
	kv := &countingKV{KeyValue: s.index.kv}
	s.index.kv = kv
	now := time.Now()
	sum := func(id string, status stubbornv1.RunStatus, at time.Time) *stubbornv1.RunSummary {
		return &stubbornv1.RunSummary{RunId: id, Status: status, UpdateTime: timestamppb.New(at)}
	}
	write := func(sum *stubbornv1.RunSummary) {
		_, err := s.index.write(ctx, "", sum)
		require.NoError(t, err)
	}
	indexed := func(id string) stubbornv1.RunStatus {
		e, err := kv.KeyValue.Get(ctx, indexKey("", id))
		require.NoError(t, err)
		got, ok := parseIndexEntry(e.Value(), "")
		require.True(t, ok)
		return got.GetStatus()
	}

	write(sum("run_a", stubbornv1.RunStatus_RUN_STATUS_RUNNING, now))
	write(sum("run_a", stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, now.Add(time.Second)))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, indexed("run_a"))
	assert.Zero(t, kv.gets.Load(), "the end written at the start's revision, unread")

	write(sum("run_b", stubbornv1.RunStatus_RUN_STATUS_RUNNING, now))
	// Another server takes run_b over and writes its end.
	v, err := indexEntry("", sum("run_b", stubbornv1.RunStatus_RUN_STATUS_FAILED, now.Add(2*time.Second)))
	require.NoError(t, err)
	_, err = kv.KeyValue.Put(ctx, indexKey("", "run_b"), v)
	require.NoError(t, err)
	write(sum("run_b", stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF, now.Add(time.Second)))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, indexed("run_b"), "the other server's end stands")
	assert.Positive(t, kv.gets.Load(), "the key, written by another, read and weighed")

	for i := range maxRevs + 10 {
		write(sum(fmt.Sprintf("run_%d", i), stubbornv1.RunStatus_RUN_STATUS_RUNNING, now))
	}
	s.index.mu.Lock()
	held := len(s.index.revs)
	s.index.mu.Unlock()
	assert.LessOrEqual(t, held, maxRevs, "revisions remembered")
}

// A batch's summaries go out at once (sendAll), not one write and its
// acknowledgement after another; a key another server wrote meanwhile is
// written one at a time, read and weighed: its newer summary stands. A
// run that changed status twice within the batch has both written, in
// order.
func TestTheIndexersBatchGoesOutAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := openMemoryStorage(t)
	kv := &countingKV{KeyValue: s.index.kv}
	s.index.kv = kv
	now := time.Now()
	state := func(id string, status stubbornv1.RunStatus, at time.Time) []byte {
		b, err := proto.Marshal(&stubbornv1.ControlState{RunId: id, Status: status, CreateTime: timestamppb.New(now), UpdateTime: timestamppb.New(at)})
		require.NoError(t, err)
		return b
	}
	indexedAs := func(id string) stubbornv1.RunStatus {
		e, err := kv.KeyValue.Get(ctx, indexKey("", id))
		require.NoError(t, err)
		got, ok := parseIndexEntry(e.Value(), "")
		require.True(t, ok)
		return got.GetStatus()
	}
	// Another server wrote run_taken's end already.
	v, err := indexEntry("", &stubbornv1.RunSummary{RunId: "run_taken", Status: stubbornv1.RunStatus_RUN_STATUS_FAILED, UpdateTime: timestamppb.New(now.Add(time.Hour))})
	require.NoError(t, err)
	_, err = kv.KeyValue.Put(ctx, indexKey("", "run_taken"), v)
	require.NoError(t, err)

	batch := map[string][][]byte{
		"run_taken": {state("run_taken", stubbornv1.RunStatus_RUN_STATUS_RUNNING, now)},
		"run_twice": {
			state("run_twice", stubbornv1.RunStatus_RUN_STATUS_RUNNING, now),
			state("run_twice", stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF, now.Add(time.Second)),
		},
	}
	for i := range 40 {
		id := fmt.Sprintf("run_%02d", i)
		batch[id] = [][]byte{state(id, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, now)}
	}
	var done []indexed
	require.True(t, s.index.writeBatch(ctx, batch, &done))
	for i := range 40 {
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, indexedAs(fmt.Sprintf("run_%02d", i)))
	}
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, indexedAs("run_taken"), "the other server's newer summary stands")
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF, indexedAs("run_twice"), "the later status last")
	// One at a time: run_taken's first try and its write after the read,
	// and run_twice's second summary; the 40 runs and run_twice's first
	// went out together.
	assert.LessOrEqual(t, kv.updates.Load(), int32(3), "writes one at a time")
	assert.Equal(t, int32(1), kv.gets.Load(), "the key another server wrote, read")
	assert.Equal(t, 43, len(done), "every summary written or weighed (the 40, run_taken, run_twice's two) is checked against the tombstones")
}

// openMemoryStorage opens a JetStream store on memory storage of an
// embedded server of its own, both closed when the test ends.
func openMemoryStorage(t *testing.T) *JetStream {
	t.Helper()
	e, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	s, err := NewJetStream(context.Background(), e.Conn, JetStreamConfig{Memory: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// countingKV is a key-value bucket that counts its Updates and Gets.
type countingKV struct {
	jetstream.KeyValue
	updates, gets atomic.Int32
}

func (c *countingKV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	c.updates.Add(1)
	return c.KeyValue.Update(ctx, key, value, rev)
}

func (c *countingKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	c.gets.Add(1)
	return c.KeyValue.Get(ctx, key)
}
