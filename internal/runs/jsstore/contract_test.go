package jsstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/internal/runs/jsstore"
	"github.com/stubbornhq/stubborn/internal/runs/store"
	"github.com/stubbornhq/stubborn/internal/runs/store/storetest"
)

// TestContract holds the JetStream store to the Store contract: one
// embedded server, and a connection of its own for each view, as each
// server has.
func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T, lease time.Duration) func() store.Store {
		e, err := jsstore.StartEmbedded(jsstore.EmbeddedConfig{DataDir: t.TempDir()})
		require.NoError(t, err)
		t.Cleanup(e.Close)
		return func() store.Store {
			nc, err := nats.Connect("", nats.InProcessServer(e.Server))
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s, err := jsstore.NewJetStream(ctx, nc, jsstore.JetStreamConfig{Lease: lease})
			if err != nil {
				nc.Close()
			}
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			return s
		}
	})
}
