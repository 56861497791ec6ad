package jsstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// TestReadingAFinishedJournalRemembersNothing: the JetStream store
// remembers where each run's journal ends so that it may append to it;
// reading a finished run (another server's, a resume that finds it ended)
// must not leave an entry behind for good.
func TestReadingAFinishedJournalRemembersNothing(t *testing.T) {
	e, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	open := func() *JetStream {
		nc, err := nats.Connect("", nats.InProcessServer(e.Server))
		require.NoError(t, err)
		s, err := NewJetStream(ctx, nc, JetStreamConfig{Memory: true})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	writer, reader := open(), open()
	event := func(seq int64, kind *stubbornv1.RunEvent) store.Event {
		kind.RunId, kind.Seq = "run_x", seq
		ev, err := store.EncodeEvent(kind)
		require.NoError(t, err)
		return ev
	}
	started := event(1, &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_RunStarted{RunStarted: &stubbornv1.RunStarted{}}})
	require.NoError(t, writer.Append(ctx, nil, started))

	_, err = reader.Events(ctx, "run_x", 0)
	require.NoError(t, err)
	assert.Contains(t, reader.last, "run_x", "a live run's end is remembered, for appending")

	finished := event(2, &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_RunFinished{RunFinished: &stubbornv1.RunFinished{}}})
	require.NoError(t, writer.Append(ctx, nil, finished))
	assert.NotContains(t, writer.last, "run_x", "the writer forgets a run it finished")
	evs, err := reader.Events(ctx, "run_x", 1)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	assert.NotContains(t, reader.last, "run_x", "nor does a reader of a finished run")
}

// TestNoRunIDReachesASubjectUnbounded: a run id too long for a NATS
// subject (the server closes a connection whose control line passes
// 4 KiB) is never sent: reads answer as for an unknown run, and the
// connection stays up. The API refuses such ids first (server/validate.go);
// this is the store's own guard.
func TestNoRunIDReachesASubjectUnbounded(t *testing.T) {
	s := openMemoryStorage(t)
	ctx := context.Background()
	long := strings.Repeat("a", 5000)
	evs, err := s.Events(ctx, long, 0)
	require.NoError(t, err)
	assert.Empty(t, evs)
	require.ErrorIs(t, s.Follow(ctx, long, 0, func(store.Event) error { return nil }), store.ErrNotFound)
	_, err = s.State(ctx, long)
	require.ErrorIs(t, err, store.ErrNotFound)
	owner, err := s.Driver(ctx, long)
	require.NoError(t, err)
	assert.Empty(t, owner)
	assert.False(t, s.nc.IsClosed(), "the connection is up")
	require.NoError(t, s.nc.FlushTimeout(5*time.Second))
}
