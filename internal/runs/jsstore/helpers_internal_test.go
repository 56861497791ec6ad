package jsstore

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
	"github.com/stubbornhq/stubborn/internal/runs/memstore"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// stores are the Store implementations every test here runs against. Each
// returns a function that opens a new view of one shared store, as each
// server has its own connection.
var stores = map[string]func(t *testing.T, lease time.Duration) func() store.Store{
	"memory": func(_ *testing.T, lease time.Duration) func() store.Store {
		m := memstore.NewMemory(lease)
		return func() store.Store { return m }
	},
	"jetstream": func(t *testing.T, lease time.Duration) func() store.Store {
		e, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir()})
		require.NoError(t, err)
		t.Cleanup(e.Close)
		return func() store.Store {
			nc, err := nats.Connect("", nats.InProcessServer(e.Server))
			require.NoError(t, err)
			s, err := NewJetStream(runstest.Ctx(t), nc, JetStreamConfig{Lease: lease})
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			return s
		}
	},
}

// openOn opens a JetStream store on e's server, closed when the test ends.
func openOn(t *testing.T, e *Embedded) *JetStream {
	t.Helper()
	nc, err := nats.Connect("", nats.InProcessServer(e.Server))
	require.NoError(t, err)
	s, err := NewJetStream(context.Background(), nc, JetStreamConfig{Lease: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// stateDecodes is how many run states this process has decoded whole.
func stateDecodes() int64 { return store.StateDecodes.Load() }
