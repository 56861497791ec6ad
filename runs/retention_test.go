package runs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/controls/controlstest"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/runs"
)

// embeddedJetStream opens a JetStream store of cfg on a new embedded
// server, and returns it with its connection.
func embeddedJetStream(t *testing.T, cfg runs.JetStreamConfig) (*runs.JetStream, *nats.Conn) {
	t.Helper()
	e, err := runs.StartEmbedded(runs.EmbeddedConfig{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	nc, err := nats.Connect("", nats.InProcessServer(e.Server))
	require.NoError(t, err)
	store, err := runs.NewJetStream(ctxFor(t), nc, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	return store, nc
}

// TestExpiredRunsAreGoneWhole: past the retention a run's events, state
// and owner entry all expire, and the run is not found anywhere.
func TestExpiredRunsAreGoneWhole(t *testing.T) {
	store, _ := embeddedJetStream(t, runs.JetStreamConfig{Retention: time.Second, Lease: time.Second})

	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {controlstest.OK("x")}})
	m := newManager(t, d, runs.Config{Store: store, Lease: time.Second, MaxFinished: 1})
	st, err := m.Start(context.Background(), "brief", chain("a"), nil)
	require.NoError(t, err)
	final(t, watchAll(t, m, st.GetRunId(), 0))
	// Later runs push the first out of the server's memory (it keeps the
	// last one retired: the first may retire after the second).
	for i := 0; m.Owns(st.GetRunId()); i++ {
		require.Less(t, i, 10, "the first run is still in memory")
		next, err := m.Start(context.Background(), "brief", chain("a"), nil)
		require.NoError(t, err)
		final(t, watchAll(t, m, next.GetRunId(), 0))
	}

	require.Eventually(t, func() bool {
		_, err := store.State(ctxFor(t), st.GetRunId())
		evs, eerr := store.Events(ctxFor(t), st.GetRunId(), 0)
		return errors.Is(err, runs.ErrNotFound) && eerr == nil && len(evs) == 0
	}, 20*time.Second, 100*time.Millisecond, "state and events expire")
	_, err = m.Get(ctxFor(t), st.GetRunId())
	assert.ErrorIs(t, err, runs.ErrNotFound)
	list, _, err := m.List(ctxFor(t), stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED, 10, "")
	require.NoError(t, err)
	for _, r := range list {
		assert.NotEqual(t, st.GetRunId(), r.GetRunId())
	}
}
