package jsstore

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Durability says when the embedded server fsyncs what it writes.
type Durability string

// Durability settings. Either way a write is in the operating system's
// hands before it is acknowledged, so a crash of the Stubborn process loses
// nothing that was acknowledged; they differ on a power loss or a kernel
// crash.
const (
	// SyncAlways fsyncs every write before acknowledging it: a power loss
	// loses nothing that was acknowledged.
	SyncAlways Durability = "always"
	// SyncInterval fsyncs every SyncPeriod: a power loss may lose the
	// writes of the last period.
	SyncInterval Durability = "interval"
)

// embeddedMaxPayload is the embedded NATS server's largest message: room
// for an event of MaxEventBytes and its headers.
const embeddedMaxPayload = 4 << 20

// EmbeddedConfig configures the in-process NATS server.
type EmbeddedConfig struct {
	// DataDir holds the JetStream files. Required.
	DataDir string
	// Durability is SyncAlways or SyncInterval. Empty means SyncInterval.
	Durability Durability
	// SyncPeriod is the fsync period of SyncInterval. 0 means 1s.
	SyncPeriod time.Duration
	// Logger gets the server's warnings and errors (a damaged block file
	// found at start, JetStream out of resources, …), each with
	// component=nats; its notices at Debug; never its debug or trace lines.
	// nil means slog.Default().
	Logger *slog.Logger
}

// Embedded is an in-process NATS server with JetStream, listening on no
// port, and a connection to it.
//
// The connection reconnects at once when the server dropped it while
// still running (a client it judged slow or stale), as often as that
// happens; one the server closed for a protocol error, or that found no
// server to reconnect to for embeddedReconnects attempts (about 3 s), is
// closed for good: see WatchConn.
type Embedded struct {
	Server *server.Server
	Conn   *nats.Conn
	log    *natsLogger
	lock   *dirLock
}

// Damaged reports whether the server said a block file of a stream was
// damaged or missing (logged as an ERROR "store damaged: …").
func (e *Embedded) Damaged() bool { return e.log.damage.Load() }

// StartEmbedded starts the in-process server and connects to it. It first
// locks the data directory, until Close or the process's end: while another
// holds it, it fails at once with a *DirInUseError and touches nothing
// there.
func StartEmbedded(cfg EmbeddedConfig) (_ *Embedded, err error) {
	if cfg.DataDir == "" {
		return nil, errors.New("embedded NATS: a data directory is required")
	}
	lock, err := lockDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			lock.release()
		}
	}()
	opts := &server.Options{
		ServerName: "stubborn-embedded",
		JetStream:  true,
		StoreDir:   cfg.DataDir,
		DontListen: true,
		NoSigs:     true,
		// NoLog keeps nats-server from making a logger of its own (to
		// stderr) should its options be reloaded; ours is set below.
		NoLog: true,
		// A journal message holds an event of up to MaxEventBytes: NATS's
		// default 1 MiB would cut a run's largest events (an answer of
		// max_result_bytes with its brief).
		MaxPayload: embeddedMaxPayload,
	}
	switch cfg.Durability {
	case SyncAlways:
		opts.SyncAlways = true
	case SyncInterval, "":
		opts.SyncInterval = cfg.SyncPeriod
		if opts.SyncInterval <= 0 {
			opts.SyncInterval = time.Second
		}
	default:
		return nil, fmt.Errorf("durability must be %q or %q, got %q", SyncAlways, SyncInterval, cfg.Durability)
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	log := newNATSLogger(cfg.Logger)
	// Whether it starts or not, the start says what it rebuilt.
	defer log.reportRecovery()
	ns.SetLoggerV2(log, false, false, false)
	ns.Start()
	// A server that met a fatal error (nats-server goes on after one)
	// never gets ready: no need to wait the whole time for it.
	for deadline := time.Now().Add(30 * time.Second); !ns.ReadyForConnections(100 * time.Millisecond); {
		if f := log.firstFatal(); f != "" {
			ns.Shutdown()
			return nil, fmt.Errorf("embedded NATS: %s", f)
		}
		if time.Now().After(deadline) {
			ns.Shutdown()
			return nil, errors.New("embedded NATS did not start within 30s")
		}
	}
	if !ns.JetStreamEnabled() {
		// nats-server reports this with Fatalf and goes on without it.
		ns.Shutdown()
		reason := log.firstFatal()
		if reason == "" {
			reason = "JetStream is not enabled"
		}
		return nil, fmt.Errorf("embedded NATS: %s", reason)
	}
	nc, err := nats.Connect(nats.DefaultURL, nats.InProcessServer(ns), nats.Name("stubborn"),
		nats.ReconnectWait(embeddedReconnectWait), nats.MaxReconnects(embeddedReconnects))
	if err != nil {
		ns.Shutdown()
		return nil, fmt.Errorf("connecting to embedded NATS: %w", err)
	}
	return &Embedded{Server: ns, Conn: nc, log: log, lock: lock}, nil
}

// The in-process connection's reconnects: the server is in the process, so
// an attempt succeeds at once unless the server stopped, and then none
// ever will.
const (
	embeddedReconnectWait = 250 * time.Millisecond
	embeddedReconnects    = 10
)

// Close closes the connection and shuts the server down.
func (e *Embedded) Close() {
	e.Conn.Close()
	e.Server.Shutdown()
	e.Server.WaitForShutdown()
	e.lock.release()
}
