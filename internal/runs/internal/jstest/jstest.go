// Package jstest opens embedded JetStream stores for the engine's tests.
package jstest

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
	"github.com/stubbornhq/stubborn/internal/runs/jsstore"
)

// Open opens a jsstore.JetStream store of cfg on a new embedded
// server, and returns it with its connection.
func Open(t *testing.T, cfg jsstore.JetStreamConfig) (*jsstore.JetStream, *nats.Conn) {
	t.Helper()
	return OpenOn(t, Start(t), cfg)
}

// Start starts an embedded NATS server for the test.
func Start(t *testing.T) *jsstore.Embedded {
	t.Helper()
	e, err := jsstore.StartEmbedded(jsstore.EmbeddedConfig{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	return e
}

// OpenOn opens a jsstore.JetStream store of cfg on e, on a connection of its
// own (a server's view), and returns it with its connection.
func OpenOn(t *testing.T, e *jsstore.Embedded, cfg jsstore.JetStreamConfig) (*jsstore.JetStream, *nats.Conn) {
	t.Helper()
	nc, err := nats.Connect("", nats.InProcessServer(e.Server))
	require.NoError(t, err)
	store, err := jsstore.NewJetStream(runstest.Ctx(t), nc, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	return store, nc
}
