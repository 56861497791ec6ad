package jsstore

import (
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
)

// connReports collects what WatchConn reports.
type connReports struct {
	mu   sync.Mutex
	seen []ConnState
	errs []error
	ch   chan ConnState
}

func newConnReports() *connReports { return &connReports{ch: make(chan ConnState, 16)} }

func (c *connReports) report(st ConnState, err error) {
	c.mu.Lock()
	c.seen = append(c.seen, st)
	c.errs = append(c.errs, err)
	c.mu.Unlock()
	c.ch <- st
}

func (c *connReports) next(t *testing.T, within time.Duration) ConnState {
	t.Helper()
	select {
	case st := <-c.ch:
		return st
	case <-time.After(within):
		t.Fatalf("no state reported within %v", within)
		return 0
	}
}

func (c *connReports) none(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case st := <-c.ch:
		t.Fatalf("reported %v", st)
	case <-time.After(within):
	}
}

// TestWatchConnReportsAConnectionClosedForGood: a publish whose control
// line passes the server's 4 KiB limit (the subject a 4,000-character run
// id made, in issue 17) makes the server close the connection, which
// nats.go never reconnects after. WatchConn reports it closed, with the
// server's reason, and logs it as an ERROR. Before, nothing noticed: every
// later store call failed "nats: connection closed".
func TestWatchConnReportsAConnectionClosedForGood(t *testing.T) {
	t.Parallel()
	e, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer e.Close()
	h, logger := runstest.NewCapturedLogs()
	r := newConnReports()
	stop := WatchConn(e.Conn, logger, r.report)
	defer stop()

	require.NoError(t, e.Conn.Publish("stubborn.events."+strings.Repeat("x", 5000), nil))
	assert.Equal(t, ConnClosed, r.next(t, 5*time.Second))
	r.none(t, 200*time.Millisecond)
	r.mu.Lock()
	require.Error(t, r.errs[0])
	assert.Contains(t, strings.ToLower(r.errs[0].Error()), "maximum control line exceeded")
	r.mu.Unlock()
	_, ok := h.Find(slog.LevelError, "NATS connection closed for good")
	assert.True(t, ok, "logged: %v", h.Lines(slog.LevelDebug))
}

// TestWatchConnReportsDownThenUp: the NATS server of a -nats-url
// connection stops, and WatchConn reports the connection down; a server
// comes back on the same address, nats.go reconnects, and WatchConn
// reports it up. After stop, closing the connection reports nothing.
func TestWatchConnReportsDownThenUp(t *testing.T) {
	t.Parallel()
	start := func(port int) *server.Server {
		ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, NoSigs: true, NoLog: true})
		require.NoError(t, err)
		ns.Start()
		require.True(t, ns.ReadyForConnections(10*time.Second))
		t.Cleanup(ns.Shutdown)
		return ns
	}
	ns := start(-1)
	port := ns.Addr().(*net.TCPAddr).Port
	nc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	defer nc.Close()
	h, logger := runstest.NewCapturedLogs()
	r := newConnReports()
	stop := WatchConn(nc, logger, r.report)

	ns.Shutdown()
	assert.Equal(t, ConnDown, r.next(t, 5*time.Second))
	_, ok := h.Find(slog.LevelWarn, "NATS connection lost, reconnecting")
	assert.True(t, ok, "logged: %v", h.Lines(slog.LevelDebug))
	r.none(t, 300*time.Millisecond) // still down: no server to go back to

	start(port)
	assert.Equal(t, ConnUp, r.next(t, 5*time.Second))
	_, ok = h.Find(slog.LevelInfo, "NATS connection restored")
	assert.True(t, ok, "logged: %v", h.Lines(slog.LevelDebug))

	stop()
	nc.Close()
	r.none(t, 300*time.Millisecond)
}

// TestWatchConnEmbeddedServerGone: the embedded server shuts down under
// its in-process connection, which has nowhere to reconnect to: WatchConn
// reports it down, then, once the connection's reconnects are spent (about
// 3 s), closed for good.
func TestWatchConnEmbeddedServerGone(t *testing.T) {
	t.Parallel()
	e, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer e.Close()
	r := newConnReports()
	stop := WatchConn(e.Conn, slog.New(slog.DiscardHandler), r.report)
	defer stop()

	e.Server.Shutdown()
	assert.Equal(t, ConnDown, r.next(t, 5*time.Second))
	assert.Equal(t, ConnClosed, r.next(t, 10*time.Second))
}

// TestWatchConnReportsAConnectionAlreadyDown: a connection that is not
// up when WatchConn is called is reported before WatchConn returns.
func TestWatchConnReportsAConnectionAlreadyDown(t *testing.T) {
	t.Parallel()
	e, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer e.Close()
	e.Conn.Close()
	r := newConnReports()
	stop := WatchConn(e.Conn, slog.New(slog.DiscardHandler), r.report)
	defer stop()
	select {
	case st := <-r.ch:
		assert.Equal(t, ConnClosed, st)
	default:
		t.Fatal("nothing reported")
	}
}
