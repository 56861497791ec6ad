package runs

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// Errors returned by Manager. The server maps them to gRPC codes.
var (
	// ErrNotAwaitingDecision: DecideRun on a run that does not wait for one.
	ErrNotAwaitingDecision = controls.ErrNotAwaitingDecision
	// ErrClosed: the manager is shutting down and accepts no new run.
	ErrClosed = errors.New("server is shutting down")
	// ErrBadPageToken: a ListRuns page token this server did not issue.
	ErrBadPageToken = errors.New("page_token is not valid")
	// ErrUnavailable: the server that drives the run cannot be reached.
	ErrUnavailable = errors.New("the server driving the run is not reachable")
)

// Causes a run's context carries when it ends early.
var (
	errCancelled = errors.New("cancelled by CancelRun")
	errShutdown  = errors.New("server shut down")
	errLost      = errors.New("another server took the run over")
	errRefused   = errors.New("the store refused the run's events")
)

// DefaultParkAfter is the shortest backoff a run waits without a
// goroutine: resuming it from its journal costs about what its goroutine
// costs to keep for a few milliseconds, and a second is far more.
const DefaultParkAfter = time.Second

// heartbeat is the Manager's part that says it is alive (beat) and keeps
// track of its lease, lock-free.
type heartbeat struct {
	// stopBeats ends the heartbeat loop, beating its wait group.
	stopBeats context.CancelFunc
	beating   sync.WaitGroup
	paused    atomic.Bool // heartbeats paused (tests simulate a frozen server)
	// beatLanded is when the last heartbeat that landed was sent (Unix
	// nanoseconds); after a lapse the scan checks this server's runs'
	// claims (reclaim.go); rescan wakes it.
	beatLanded atomic.Int64
	lapses     atomic.Int64 // how many times this server's lease lapsed
	verified   atomic.Int64 // lapses when the claims were checked last
	rescan     chan struct{}
}

// Config configures a Manager.
type Config struct {
	// Delegates reaches delegates by name. Required unless Bind is set.
	Delegates controls.Delegates
	// Presets resolves preset names (controls named in the config). Nil
	// means none.
	Presets controls.Presets
	// Budgets limits the retry control's retries per delegate. Nil means no
	// budget.
	Budgets controls.Budgets
	// Observer, when set, sees every run. Nil means none.
	Observer Observer
	// Criteria builds the failure criteria of a run. Nil means only errors
	// are failures.
	Criteria func(run *stubbornv1.ControlState) controls.Criteria
	// Bind, when set, gives each run what its control reaches in place of
	// Delegates, Presets, Budgets and Criteria: it is called once when
	// this server starts driving a run (ctx is Start's for a new run,
	// context.Background() for a resumed one), and the run keeps what it
	// returned for as long as this server drives it, parked waits
	// included; release is called once when that ends (the run finished,
	// was let go or was lost). So a registry that changes while runs are
	// in flight (a config reload) changes only the runs that start after.
	Bind func(ctx context.Context) (deps Deps, release func())
	// Clock defaults to controls.RealClock.
	Clock controls.Clock
	// ParkAfter: a run whose own retry waits at least this long in backoff,
	// or for a person's decision (unless its timeout is nearer), waits
	// without a goroutine: its tracker is parked, and a timer, DecideRun or
	// the end of the run's context resumes it from its journal. 0 means
	// DefaultParkAfter; a negative value never parks. Runs are parked only
	// on the real clock.
	ParkAfter time.Duration
	// OutputFlushInterval and OutputFlushBytes coalesce a streamed
	// attempt's text into attempt_output events: after the first piece
	// (sent at once), what came within the interval goes out as one event,
	// and no event carries more than OutputFlushBytes. Each event is one
	// store write at most (several may share one), so a streaming attempt
	// costs at most 1/OutputFlushInterval writes a second, plus one per
	// OutputFlushBytes of text. 0 means DefaultOutputFlushInterval and
	// DefaultOutputFlushBytes.
	OutputFlushInterval time.Duration
	OutputFlushBytes    int
	// Seed, when non-zero, seeds every run's jitter deterministically (tests).
	Seed uint64
	// MaxFinished is how many finished runs this server keeps in memory for
	// fast GetRun and WatchRun; older ones are read from the store. 0 means
	// 1,000 (defaultMaxFinished).
	MaxFinished int

	// Store keeps the runs (required): jsstore.JetStream, or
	// memstore.Memory for runs that last as long as the process.
	Store store.Store
	// Owner names this server among those sharing the store. Empty means a
	// random name.
	Owner string
	// Lease is how long this server may go without beating before others
	// take its runs over. 0 means DefaultLease.
	Lease time.Duration
	// SoleOwner says no other live server shares the store (the embedded
	// default): runs left by an earlier process are taken over at once
	// instead of after the lease.
	SoleOwner bool
	// CancelOnClose makes Close cancel every run (they end CANCELLED). When
	// false, Close leaves them to be taken over by another server or by the
	// next start on the same store.
	CancelOnClose bool
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Deps are what a run's control reaches (Config.Bind).
type Deps struct {
	Delegates controls.Delegates
	Presets   controls.Presets
	Budgets   controls.Budgets
	Criteria  func(run *stubbornv1.ControlState) controls.Criteria
	// Guards admit each call (circuit breakers, bulkheads, rate limits);
	// nil means none.
	Guards controls.Guards
}

// Observer sees every run this server drives, for tracing, metrics and
// logs. It must not block.
type Observer interface {
	// ObserveRun is called when this server starts driving a run, new or
	// resumed, before its first event is recorded. runCtx is the run's own
	// context (it ends with the run); reqCtx is the context of the request
	// that started the run (it carries the caller's trace) for a new run,
	// and context.Background() for a resumed one. ObserveRun may set
	// st.Traceparent, which is persisted with the run. It returns the
	// context the run's control runs in (runCtx with, say, a span) and a
	// function that sees each event of the run as it is recorded, the last
	// one being run_finished (once it is written: its state then has the
	// run's constant fields and its end, status, reason, attempts, winner
	// and times, not its result, attempt log or failure history); it gets
	// nil once instead if this server stops driving the run without
	// run_finished (shutdown, crash, takeover).
	ObserveRun(runCtx, reqCtx context.Context, st *stubbornv1.ControlState, resumed bool) (context.Context, func(ev *stubbornv1.RunEvent))
}

// Manager starts, drives, resumes and serves runs over a Store. Every run
// is driven by one server at a time: the one that claimed it, until that
// server stops beating for a lease and another takes it over by replaying
// its journal.
type Manager struct {
	cfg    Config
	store  store.Store
	owner  string
	log    *slog.Logger
	ctx    context.Context // parent of every run and loop; cancelled by Close
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup // runs
	writes sync.WaitGroup // the runs' writers (run.kick)
	loops  sync.WaitGroup // takeover scan
	heartbeat
	// stopServing ends the answering of commands (Store.Serve).
	stopServing func()
	// workers run the runs' drive (workers.go).
	workers *workers
	parked  atomic.Int64 // runs waiting on park's timer

	// letGo is the context of the writes that let go of a run (its claim
	// released, unstart's state): closing, closed when Close starts, stops
	// a store that makes them again through an outage, so that Close does
	// not wait for them.
	letGo   context.Context
	closing chan struct{}

	mu       sync.Mutex
	runs     map[string]*run
	finished []string // ids of finished local runs, oldest first
	counter  uint64
	closed   bool
	// relost are the runs whose copy here a failed write lost, to drive
	// again while the store names this server their driver (reclaim.go).
	relost map[string]*relost
}

// defaultMaxFinished is how many finished runs a Manager keeps in memory
// unless told otherwise: the runs that just ended, whose callers may still
// ask for them (a fraction of a second's worth at full load, minutes' at a
// light one). Each one kept is about 2.4 KB of small objects that every
// garbage collection marks: with 10,000 kept, a one-attempt run cost the
// shipped server about 5 to 7 % more CPU (docs/PERFORMANCE.md, "The engine
// in rooms: a cheaper durable run").
const defaultMaxFinished = 1_000

// New returns a Manager that beats as a live owner, serves commands for
// its runs and takes over runs whose owner died. Close it when done.
func New(cfg Config) (*Manager, error) {
	if cfg.Clock == nil {
		cfg.Clock = controls.RealClock{}
	}
	if cfg.MaxFinished <= 0 {
		cfg.MaxFinished = defaultMaxFinished
	}
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Store == nil {
		return nil, errors.New("runs: Config.Store is required")
	}
	if cfg.Owner == "" {
		cfg.Owner = "stubborn-" + strings.ToLower(rand.Text()[:10])
	}
	if cfg.ParkAfter == 0 {
		cfg.ParkAfter = DefaultParkAfter
	}
	if _, real := cfg.Clock.(controls.RealClock); !real {
		cfg.ParkAfter = -1 // park's timers run on the real clock
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	m := &Manager{
		cfg: cfg, store: cfg.Store, owner: cfg.Owner, log: cfg.Logger.With("owner", cfg.Owner),
		ctx: ctx, cancel: cancel, runs: map[string]*run{}, workers: newWorkers(),
		closing: make(chan struct{}), heartbeat: heartbeat{rescan: make(chan struct{}, 1)},
	}
	m.letGo = context.WithValue(context.Background(), store.StopWritesKey{}, (<-chan struct{})(m.closing))
	sent := time.Now()
	if err := m.store.Beat(ctx, m.owner); err != nil {
		cancel(err)
		return nil, fmt.Errorf("runs store: %w", err)
	}
	m.landed(sent)
	// Commands reach this server from the moment it may start a run.
	stop, err := m.store.Serve(ctx, m.owner, m.handle)
	if err != nil {
		cancel(err)
		return nil, fmt.Errorf("runs store: serving commands: %w", err)
	}
	m.stopServing = stop
	m.store.OnForget(m.forgetFinished) // a run another server deleted
	beatCtx, stopBeats := context.WithCancel(ctx)
	m.stopBeats = stopBeats
	m.beating.Add(1)
	go m.beat(beatCtx)
	// The sole owner of its store (one that holds the embedded store's
	// lock) knows that no other server drives the runs an earlier holder
	// claimed: it drives them again before it answers a command or starts
	// a run, so a decision sent the moment a restarted server answers is
	// carried out, not refused while a dead process's lease runs out.
	// What it could not take over now, the scan tries again at once.
	soleLeft := cfg.SoleOwner && !m.takeOverOrphans(true, nil)
	m.loops.Add(1)
	go m.scan(soleLeft || !cfg.SoleOwner)
	return m, nil
}

// isClosed reports whether Close or kill has been called.
func (m *Manager) isClosed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.closed
}

// Owner returns this server's name among those sharing the store.
func (m *Manager) Owner() string { return m.owner }

// Now returns the time on the clock the runs' events and states are
// stamped with (Config.Clock).
func (m *Manager) Now() time.Time { return m.cfg.Clock.Now() }

// Close stops the manager. With CancelOnClose every run is cancelled and
// ends CANCELLED; otherwise runs are left where they are, to be taken over
// by another server, or by the next start on the same store.
func (m *Manager) Close() {
	m.stopRuns(!m.cfg.CancelOnClose)
	m.writes.Wait()
	// No beat after Leave's: it would make this server look alive for
	// another lease.
	m.stopBeats()
	m.beating.Wait()
	if !m.cfg.CancelOnClose {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := m.store.Leave(ctx, m.owner); err != nil {
			m.log.Warn("leaving the store", "err", err)
		}
		cancel()
	}
	m.stopServing()
	m.cancel(errShutdown)
	m.loops.Wait()
	m.workers.stop()
}

// stopRuns refuses new runs and ends the local ones, waiting for them:
// abandoned (they write nothing more, to be taken over later) or cancelled
// (they end CANCELLED).
func (m *Manager) stopRuns(abandon bool) {
	m.mu.Lock()
	if !m.closed {
		close(m.closing)
	}
	m.closed = true
	local := make([]*run, 0, len(m.runs))
	for _, r := range m.runs {
		local = append(local, r)
	}
	m.mu.Unlock()
	for _, r := range local {
		if abandon {
			r.abandon()
		}
		r.stop(errShutdown)
	}
	m.wg.Wait()
}

// kill stops driving every run at once, writing nothing and telling no one,
// as a crash would. The runs are taken over once the lease has passed.
// For tests of recovery (Kill in export_test.go). It takes Close's steps,
// but abandons every run and does not leave the store (Leave).
func (m *Manager) kill() {
	m.paused.Store(true)
	m.stopRuns(true)
	m.writes.Wait()
	m.stopBeats()
	m.beating.Wait()
	m.stopServing()
	m.cancel(errShutdown)
	m.loops.Wait()
	m.workers.stop()
}

// local returns the run if this server drives (or drove) it and still
// holds it in memory.
func (m *Manager) local(id string) *run {
	m.mu.Lock()
	r := m.runs[id]
	m.mu.Unlock()
	if r != nil {
		<-r.ready // its tracker is set a moment after it is admitted
	}
	return r
}
