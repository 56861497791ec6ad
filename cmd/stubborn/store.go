package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stubbornhq/stubborn/internal/fleetguard"
	"github.com/stubbornhq/stubborn/internal/notify"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/jsstore"
	"github.com/stubbornhq/stubborn/internal/runs/memstore"
	"github.com/stubbornhq/stubborn/internal/runs/store"
	"github.com/stubbornhq/stubborn/internal/spend"
)

// storeFlags choose where runs are kept.
type storeFlags struct {
	natsURL    string
	memory     bool
	dataDir    string
	durability string
	syncPeriod time.Duration
	replicas   int
	lease      time.Duration
	retention  time.Duration
	keyWindow  time.Duration
	maxBytes   int64
	maxRuns    int
	saveFinal  bool
	writeRetry time.Duration
	// claimInOwners is jsstore.JetStreamConfig.ClaimInOwners.
	claimInOwners bool
	// outputFlush and outputFlushBytes are runs.Config's
	// OutputFlushInterval and OutputFlushBytes.
	outputFlush      time.Duration
	outputFlushBytes int
}

func (f *storeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.natsURL, "nats-url", "", "keep runs in this NATS cluster's JetStream (several replicas share them) instead of the embedded server")
	fs.BoolVar(&f.memory, "memory", false, "keep runs in memory only: lost when the process ends (tests, demos)")
	fs.StringVar(&f.dataDir, "data-dir", ".stubborn/data", "embedded JetStream's directory")
	fs.StringVar(&f.durability, "durability", "interval", "embedded: fsync on every write (always) or every -sync-period (interval)")
	fs.DurationVar(&f.syncPeriod, "sync-period", time.Second, "embedded, -durability interval: how often to fsync")
	fs.IntVar(&f.replicas, "replicas", 0, "copies of every stream and bucket (default 1 embedded, 3 with -nats-url)")
	fs.DurationVar(&f.lease, "lease", runs.DefaultLease, "how long a replica may go silent before others take its runs over")
	fs.DurationVar(&f.retention, "retention", 7*24*time.Hour, "how long a finished run is kept after it finished; a run not finished is never removed, however old")
	fs.DurationVar(&f.keyWindow, "idempotency-window", store.DefaultKeyWindow, "how long a run request's options.idempotency_key names the run it started: a request with the key within it gets that run instead of a new one")
	fs.Int64Var(&f.maxBytes, "max-bytes", 0, "bound on the events stream's size in bytes: from 80% full the oldest finished runs are purged (down to 60%), and new runs are refused RESOURCE_EXHAUSTED when the runs in flight may need the rest; a run not finished is never removed (0: none)")
	fs.IntVar(&f.maxRuns, "max-runs", memstore.DefaultMemoryRuns, "with -memory: how many finished runs are kept; the oldest go first (runs in flight are never removed)")
	fs.DurationVar(&f.writeRetry, "write-retry", 0, "how long a run's store write that failed for a reason that may pass (a timeout, a NATS leader election or restart) is made again before the run is given up on this replica; 0 means the lease, negative no retry")
	fs.BoolVar(&f.saveFinal, "save-final-states", false, "save every run's final state in the states bucket too (while replicas older than 2026-11-30 share the store: they read a finished run there only)")
	fs.DurationVar(&f.outputFlush, "output-flush-interval", runs.DefaultOutputFlushInterval, "a streamed attempt's text that came within this interval goes out as one attempt_output event, one store write at most (its first piece at once): at most 1/interval writes a second per streaming attempt, plus one per -output-flush-bytes; 1ms to 10s")
	fs.IntVar(&f.outputFlushBytes, "output-flush-bytes", runs.DefaultOutputFlushBytes, "the most text one attempt_output event carries; more goes out at once in events of this size; 64 to 65536")
	fs.BoolVar(&f.claimInOwners, "claim-in-owners", false, "claim every run with an entry in the owners bucket and release it at the run's end, two writes a run more (while replicas older than 2026-12-02 share the store: they find a dead replica's runs there only)")
}

// open connects the store. The storeWatch carries the state of its NATS
// connection to health and says when it is closed for good. close must be
// called after the server stopped.
func (f *storeFlags) open(ctx context.Context, logger *slog.Logger) (runs.Config, *storeWatch, func(), error) {
	rc := runs.Config{Lease: f.lease, Logger: logger, OutputFlushInterval: f.outputFlush, OutputFlushBytes: f.outputFlushBytes}
	w := newStoreWatch()
	if f.outputFlush < time.Millisecond || f.outputFlush > 10*time.Second {
		return rc, nil, nil, fmt.Errorf("-output-flush-interval must be between 1ms and 10s, got %v", f.outputFlush)
	}
	if f.outputFlushBytes < 64 || f.outputFlushBytes > 64<<10 {
		return rc, nil, nil, fmt.Errorf("-output-flush-bytes must be between 64 and 65536, got %d", f.outputFlushBytes)
	}
	if f.keyWindow < 0 {
		return rc, nil, nil, fmt.Errorf("-idempotency-window must not be negative, got %v", f.keyWindow)
	}
	if f.memory {
		if f.maxRuns < 1 {
			return rc, nil, nil, fmt.Errorf("-max-runs must be at least 1, got %d", f.maxRuns)
		}
		m := memstore.NewMemory(f.lease)
		m.SetLimits(f.maxRuns, f.retention)
		m.SetKeyWindow(f.keyWindow)
		rc.Store, rc.CancelOnClose = m, true
		return rc, w, func() {}, nil
	}
	js := jsstore.JetStreamConfig{Replicas: f.replicas, Retention: f.retention, MaxBytes: f.maxBytes, Lease: f.lease, SaveFinalStates: f.saveFinal, ClaimInOwners: f.claimInOwners, WriteRetry: f.writeRetry, KeyWindow: f.keyWindow, Logger: logger}
	var (
		nc      *nats.Conn
		closeNS = func() {}
		damaged = func() bool { return false }
		err     error
	)
	if f.natsURL != "" {
		if js.Replicas == 0 {
			js.Replicas = 3
		}
		// A silent link (a blackhole, a stopped node) is noticed through
		// the pings only: within about lease/2, not nats.go's default
		// 2 minutes × 2.
		nc, err = nats.Connect(f.natsURL, nats.Name("stubborn"), nats.MaxReconnects(-1),
			nats.PingInterval(pingInterval(f.lease)), nats.MaxPingsOutstanding(maxPingsOut))
		if err != nil {
			return rc, nil, nil, fmt.Errorf("-nats-url: %w", err)
		}
		// The URL may hold a password: the connected one is logged, redacted.
		logger.Info("runs kept in NATS JetStream", "url", nc.ConnectedUrlRedacted(), "replicas", js.Replicas)
	} else {
		e, err := jsstore.StartEmbedded(jsstore.EmbeddedConfig{
			DataDir: f.dataDir, Durability: jsstore.Durability(f.durability), SyncPeriod: f.syncPeriod,
			Logger: logger,
		})
		if inUse := (*jsstore.DirInUseError)(nil); errors.As(err, &inUse) {
			return rc, nil, nil, fmt.Errorf("%w; nothing in it was touched. Give this server another -data-dir, or run several servers on the same runs through a NATS cluster with -nats-url", err)
		}
		if err != nil {
			return rc, nil, nil, err
		}
		nc, closeNS, damaged = e.Conn, e.Close, e.Damaged
		rc.SoleOwner = true
		logger.Info("runs kept in embedded JetStream", "data_dir", f.dataDir, "durability", f.durability)
	}
	stopWatch := jsstore.WatchConn(nc, logger, w.report)
	store, err := jsstore.NewJetStream(ctx, nc, js)
	if err != nil {
		stopWatch()
		nc.Close()
		closeNS()
		return rc, nil, nil, err
	}
	// The notices to notify targets, and the decision links' key, live
	// beside the runs: durable as they are, shared by the replicas.
	notices, err := notify.OpenKV(ctx, nc, max(js.Replicas, 1), logger)
	if err != nil {
		_ = store.Close()
		stopWatch()
		return rc, nil, nil, fmt.Errorf("the notices' bucket: %w", err)
	}
	w.notices = notices
	closeFleet := notices.Close
	if f.natsURL != "" {
		// Replicas sharing a NATS cluster share their delegates' breakers
		// and rate limits (docs/fleet-guards.md), under the name the
		// replica's runs go by.
		rc.Owner = "stubborn-" + strings.ToLower(rand.Text()[:10])
		fl, err := fleetguard.Open(ctx, nc, fleetguard.Config{Replica: rc.Owner, Replicas: js.Replicas, Logger: logger})
		if err != nil {
			_ = store.Close()
			stopWatch()
			return rc, nil, nil, fmt.Errorf("the fleet's guards: %w", err)
		}
		w.fleet, closeFleet = fl, func() { fl.Close(); notices.Close() }
		logger.Info("delegate guards are the fleet's", "replica", rc.Owner)
	}
	// What the server found damaged when it read its files: logged, and
	// runs whose journal may be lost are not resumed from their claims.
	store.Damage(ctx, logger)
	if damaged() {
		store.MarkDamaged()
	}
	// The tenants' spend is kept beside the runs, shared by the replicas.
	if w.spend, err = spend.OpenKV(ctx, nc, spend.KVConfig{Replicas: js.Replicas}); err != nil {
		closeFleet()
		stopWatch()
		_ = store.Close()
		closeNS()
		return rc, nil, nil, fmt.Errorf("the tenants' spend: %w", err)
	}
	rc.Store = store
	w.conn = nc
	stopBeats := watchBeats(w, store.LastBeat, f.lease, logger)
	return rc, w, func() { stopBeats(); closeFleet(); stopWatch(); _ = store.Close(); closeNS() }, nil
}

// maxPingsOut is how many pings may go unanswered before nats.go takes the
// connection for dead and reconnects.
const maxPingsOut = 2

// pingInterval pings the NATS server often enough that a silent link is
// noticed (maxPingsOut+1 intervals) within half the lease.
func pingInterval(lease time.Duration) time.Duration {
	return max(lease/(2*(maxPingsOut+1)), 100*time.Millisecond)
}

// storeWatch carries the state of the store's NATS connection to health:
// NOT_SERVING while it is down (nats.go reconnecting), SERVING once it is
// up again. A connection closed for good — the server closed it for a
// protocol error, or the in-process connection found no server to go back
// to — cannot come back, and each of this server's runs would fail its
// next write: fatal then gets the reason, once, and `serve` exits 1 so
// that a supervisor starts it again.
type storeWatch struct {
	fatal chan error // buffered: the first close for good
	conn  *nats.Conn // nil with -memory; for tests
	// spend is the tenants' spend; nil with -memory (the server keeps it).
	spend spend.Ledger
	// fleet shares the delegates' guards with the other replicas; nil
	// unless the store is a NATS cluster's (-nats-url).
	fleet *fleetguard.Fleet
	// notices keeps the notify targets' notices in the store's JetStream,
	// shared by the replicas; nil with -memory (kept in process).
	notices notify.Queue

	mu      sync.Mutex
	down    bool       // the last state reported was not up; guarded by mu
	stale   bool       // the store's heartbeats stopped landing (beatwatch.go); guarded by mu
	serving func(bool) // set by attach; guarded by mu
}

func newStoreWatch() *storeWatch { return &storeWatch{fatal: make(chan error, 1)} }

// attach sends the connection's state to serving from now on, starting
// with the state it is in.
func (w *storeWatch) attach(serving func(bool)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.serving = serving
	serving(w.up())
}

func (w *storeWatch) report(st jsstore.ConnState, err error) {
	w.mu.Lock()
	w.down = st != jsstore.ConnUp
	if w.serving != nil {
		w.serving(w.up())
	}
	w.mu.Unlock()
	if st == jsstore.ConnClosed {
		if err == nil {
			err = nats.ErrConnectionClosed
		}
		select {
		case w.fatal <- fmt.Errorf("the store's NATS connection is closed for good: %w", err):
		default:
		}
	}
}
