package runs

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/stubbornhq/stubborn/controls"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Errors returned by Manager. The server maps them to gRPC codes.
var (
	// ErrNotFound: no run has that id.
	ErrNotFound = errors.New("run not found")
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

// DefaultLease is how long a server that stops beating keeps its runs
// before other servers take them over.
const DefaultLease = 10 * time.Second

// Config configures a Manager.
type Config struct {
	// Delegates reaches delegates by name. Required.
	Delegates controls.Delegates
	// Presets resolves preset names (controls named in the config). Nil
	// means none.
	Presets controls.Presets
	// Budgets limits the retry control's retries per delegate. Nil means no
	// budget.
	Budgets controls.Budgets
	// CallContext, when set, decorates the context of a run's delegate calls
	// with what the delegates layer needs (run id, idempotency key,
	// metadata, attempt timeout).
	CallContext func(ctx context.Context, run *stubbornv1.ControlState) context.Context
	// Observer, when set, sees every run. Nil means none.
	Observer Observer
	// Criteria builds the failure criteria of a run. Nil means only errors
	// are failures.
	Criteria func(run *stubbornv1.ControlState) controls.Criteria
	// Clock defaults to controls.RealClock.
	Clock controls.Clock
	// ParkAfter: a run whose own retry waits at least this long in backoff,
	// or for a person's decision (unless its timeout is nearer), waits
	// without a goroutine: its tracker is parked, and a timer, DecideRun or
	// the end of the run's context resumes it from its journal. 0 means
	// DefaultParkAfter; a negative value never parks. Runs are parked only
	// on the real clock.
	ParkAfter time.Duration
	// Seed, when non-zero, seeds every run's jitter deterministically (tests).
	Seed uint64
	// MaxFinished is how many finished runs this server keeps in memory for
	// fast GetRun and WatchRun; older ones are read from the store. 0 means
	// 10,000.
	MaxFinished int

	// Store keeps the runs. Nil means a new Memory store: runs then last as
	// long as the process.
	Store Store
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
	// one being run_finished (once it is written); it gets nil once instead
	// if this server stops driving the run without run_finished (shutdown,
	// crash, takeover, a refused write).
	ObserveRun(runCtx, reqCtx context.Context, st *stubbornv1.ControlState, resumed bool) (context.Context, func(ev *stubbornv1.RunEvent))
}

// Manager starts, drives, resumes and serves runs over a Store. Every run
// is driven by one server at a time: the one that claimed it, until that
// server stops beating for a lease and another takes it over by replaying
// its journal.
type Manager struct {
	cfg    Config
	store  Store
	owner  string
	log    *slog.Logger
	ctx    context.Context // parent of every run and loop; cancelled by Close
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup // runs
	loops  sync.WaitGroup // takeover scan
	// stopBeats ends the heartbeat loop, beating its wait group.
	stopBeats context.CancelFunc
	beating   sync.WaitGroup
	// stopServing ends the answering of commands (Store.Serve).
	stopServing func()
	// workers run the runs' drive (workers.go).
	workers *workers
	paused  atomic.Bool  // heartbeats paused (tests simulate a frozen server)
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
}

// New returns a Manager that beats as a live owner, serves commands for
// its runs and takes over runs whose owner died. Close it when done.
func New(cfg Config) (*Manager, error) {
	if cfg.Clock == nil {
		cfg.Clock = controls.RealClock{}
	}
	if cfg.MaxFinished <= 0 {
		cfg.MaxFinished = 10_000
	}
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Store == nil {
		cfg.Store = NewMemory(cfg.Lease)
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
		closing: make(chan struct{}),
	}
	m.letGo = context.WithValue(context.Background(), stopWritesKey{}, (<-chan struct{})(m.closing))
	if err := m.store.Beat(ctx, m.owner); err != nil {
		cancel(err)
		return nil, fmt.Errorf("runs store: %w", err)
	}
	// Commands reach this server from the moment it may start a run.
	stop, err := m.store.Serve(ctx, m.owner, m.handle)
	if err != nil {
		cancel(err)
		return nil, fmt.Errorf("runs store: serving commands: %w", err)
	}
	m.stopServing = stop
	beatCtx, stopBeats := context.WithCancel(ctx)
	m.stopBeats = stopBeats
	m.beating.Add(1)
	go m.beat(beatCtx)
	m.loops.Add(1)
	go m.scan()
	return m, nil
}

// isClosed reports whether Close or Kill has been called.
func (m *Manager) isClosed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.closed
}

// Owner returns this server's name among those sharing the store.
func (m *Manager) Owner() string { return m.owner }

// Close stops the manager. With CancelOnClose every run is cancelled and
// ends CANCELLED; otherwise runs are left where they are, to be taken over
// by another server, or by the next start on the same store.
func (m *Manager) Close() {
	m.stopRuns(!m.cfg.CancelOnClose)
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
		r.cancel(errShutdown)
	}
	m.wg.Wait()
}

// Kill stops driving every run at once, writing nothing and telling no one,
// as a crash would. The runs are taken over once the lease has passed.
// For tests of recovery.
func (m *Manager) Kill() {
	m.paused.Store(true)
	m.stopRuns(true)
	m.stopBeats()
	m.beating.Wait()
	m.stopServing()
	m.cancel(errShutdown)
	m.loops.Wait()
	m.workers.stop()
}

// beat tells the store this server is alive, three times a lease, until
// ctx ends.
func (m *Manager) beat(ctx context.Context) {
	defer m.beating.Done()
	t := time.NewTicker(m.cfg.Lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if m.paused.Load() {
			continue
		}
		if err := m.store.Beat(ctx, m.owner); err != nil && ctx.Err() == nil {
			m.log.Warn("heartbeat failed", "err", err)
		}
	}
}

// scan takes over runs whose owner is dead: at once, then twice a lease
// when a server it saw alive has stopped beating or another one left, or
// when the last scan left orphans behind, and every fullScanEvery ticks
// whatever happened. Listing every run's driver costs in proportion to
// the runs (10,000 waiting runs on JetStream: ~2 % of a core at every
// lease/2); the servers' heartbeats are few.
func (m *Manager) scan() {
	defer m.loops.Done()
	t := time.NewTicker(m.cfg.Lease / 2)
	defer t.Stop()
	first, dirty := true, true
	var seen map[string]bool
	sinceFull := 0
	for {
		if !m.paused.Load() {
			live, left, err := m.liveOwners()
			if err != nil {
				live = nil
			}
			sinceFull++
			if err != nil || first || dirty || left || gone(seen, live) || sinceFull >= fullScanEvery {
				dirty = !m.takeOverOrphans(first && m.cfg.SoleOwner, live)
				first, sinceFull = false, 0
			}
			if err == nil {
				seen = live
			}
		} else {
			dirty = true // servers may have come and gone meanwhile, unseen
		}
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// fullScanEvery bounds the scans between two listings of every run's
// driver: a server that came and went unseen (it stopped within lease/2 of
// starting without leaving, or this server's scan took longer than a
// lease) is never seen to stop, and its runs wait for this. A server that
// closes leaves (Store.Leave), which the next scan sees.
const fullScanEvery = 10

// liveOwners returns the other servers that beat within the lease, and
// whether another one left within it.
func (m *Manager) liveOwners() (live map[string]bool, left bool, err error) {
	live = map[string]bool{}
	err = m.store.Live(m.ctx, func(owner string, gone bool) {
		switch {
		case owner == m.owner:
		case gone:
			left = true
		default:
			live[owner] = true
		}
	})
	return live, left, err
}

// gone reports whether a server in seen is not in live.
func gone(seen, live map[string]bool) bool {
	for owner := range seen {
		if !live[owner] {
			return true
		}
	}
	return false
}

// takeOverOrphans resumes every run whose owner is dead (all other owners'
// runs when sole). It reports whether it left none behind: none it could
// not list, take over or resume, and no owner whose liveness it could not
// tell or that it found alive although live (the heartbeats just listed,
// nil when that failed) has it no more: the two reads may disagree for a
// moment (a replica that has not expired the heartbeat yet), and the scan
// after next would not look again.
func (m *Manager) takeOverOrphans(sole bool, live map[string]bool) (clean bool) {
	clean = true
	type orphan struct{ run, owner string }
	var orphans []orphan
	alive := map[string]bool{m.owner: true}
	err := m.store.Owners(m.ctx, func(runID, owner string) bool {
		if owner == m.owner {
			return true
		}
		isLive, seen := alive[owner]
		if !seen && !sole {
			ok, err := m.store.Alive(m.ctx, owner)
			isLive = err != nil || ok // when in doubt, leave it
			if err != nil || (ok && live != nil && !live[owner]) {
				clean = false
			}
			alive[owner] = isLive
		}
		if sole || !isLive {
			orphans = append(orphans, orphan{runID, owner})
		}
		return m.ctx.Err() == nil
	})
	if err != nil {
		clean = false
		if m.ctx.Err() == nil {
			m.log.Warn("listing run owners", "err", err)
		}
	}
	for _, o := range orphans {
		if m.ctx.Err() != nil {
			return false
		}
		if err := m.store.TakeOver(m.ctx, o.run, o.owner, m.owner); err != nil {
			if !errors.Is(err, ErrConflict) {
				clean = false
			}
			continue // another server was faster
		}
		if err := m.resume(o.run, o.owner); err != nil {
			clean = false
			m.log.Error("resuming a run", "run_id", o.run, "err", err)
		}
	}
	return clean
}

// Start accepts a run and starts its control in the background. The request
// must already be valid; the run keeps spec (it is not copied: the caller
// must not change it). It returns the run's state when accepted.
//
// ctx is the request's context: it is used for tracing, and for the tenant
// the run belongs to (TenantFrom), since the run outlives the request.
func (m *Manager) Start(ctx context.Context, brief string, spec *stubbornv1.ControlSpec, opts *stubbornv1.RunOptions) (*stubbornv1.ControlState, error) {
	id := newID()
	if opts == nil {
		opts = &stubbornv1.RunOptions{}
	}
	if opts.GetIdempotencyKey() == "" {
		opts = proto.CloneOf(opts) // the request's own stays as it came
		opts.IdempotencyKey = id
	}
	now := m.cfg.Clock.Now()
	// Saved as RUNNING (an attempt is about to start) from the first: the
	// state run_started saves a moment later would differ only in its
	// update time, and saving it again is one store write per run.
	state := &stubbornv1.ControlState{
		RunId:      id,
		Status:     stubbornv1.RunStatus_RUN_STATUS_RUNNING,
		TaskBrief:  brief,
		Control:    spec,
		Options:    opts,
		CreateTime: timestamppb.New(now),
		UpdateTime: timestamppb.New(now),
		Tenant:     TenantFrom(ctx),
	}
	if a, ok := m.store.(admission); ok {
		if err := a.admit(ctx, proto.Size(state)); err != nil {
			return nil, err
		}
	}
	r, err := m.admit(id, state.GetTenant())
	if err != nil {
		return nil, err
	}
	runCtx := m.runContext(r, now, opts)
	if m.cfg.Observer != nil {
		runCtx, r.observe = m.cfg.Observer.ObserveRun(runCtx, ctx, state, false)
	}
	// The run is accepted once it has a driver and its state is saved, in
	// one write (the claim carries the state): a server that takes it over
	// then (this one stalled past its lease, or stopped) resumes it from
	// that state, and its first write fences this one out. run_started is
	// recorded before Start returns, and written with the events that
	// follow it, before the run's first call (record).
	data, err := proto.Marshal(state)
	if err == nil {
		err = m.store.Claim(ctx, id, m.owner, data)
	}
	if err != nil {
		m.forget(r)
		return nil, fmt.Errorf("recording the run: %w", err)
	}
	r.lastStatus, r.savedStatus = state.GetStatus(), state.GetStatus()
	tr := m.track(r, state, nil)
	tr.Start()
	if err := r.lostBecause(); err != nil && !errors.Is(err, ErrConflict) {
		// run_started could not be encoded (its writing comes later, in
		// drive): the caller is told, and the run is marked
		// failed and let go of, as far as the store still answers.
		m.unstart(r, state, err)
		return nil, fmt.Errorf("recording the run: %w", err)
	}
	// Abandoned meanwhile (this server is closing), or taken over already
	// (ErrConflict: this server stalled past its lease) is still accepted:
	// another server drives it from its saved state. This one's drive ends
	// at once, writing nothing. Nothing changes the state until drive runs:
	// read it here.
	accepted := constantPart(state)
	accepted.Status = state.GetStatus()
	accepted.UpdateTime = state.GetUpdateTime()
	m.workers.run(func() { m.drive(runCtx, r, tr, state, false, "") })
	return accepted, nil
}

// track gives run r its tracker, of state replaying journal.
func (m *Manager) track(r *run, state *stubbornv1.ControlState, journal []*stubbornv1.RunEvent) *controls.Tracker {
	tr := m.tracker(r, state, journal)
	r.mu.Lock()
	r.base = constantPart(state)
	r.mu.Unlock()
	r.setTracker(tr)
	close(r.ready)
	return tr
}

// tracker returns a new tracker for run r, of state replaying journal;
// drive lets it park.
func (m *Manager) tracker(r *run, state *stubbornv1.ControlState, journal []*stubbornv1.RunEvent) *controls.Tracker {
	return controls.NewReplayTracker(state, m.cfg.Clock, r.record, journal)
}

// unstart drops a run whose run_started the store failed to record: it is
// lost already (record said so to the observer). Its saved state becomes
// FAILED, so that no list shows it pending, and its claim goes.
func (m *Manager) unstart(r *run, state *stubbornv1.ControlState, cause error) {
	m.mu.Lock()
	delete(m.runs, r.id)
	m.mu.Unlock()
	if r.stopTimer != nil {
		r.stopTimer()
	}
	failed := proto.CloneOf(state)
	failed.Status = stubbornv1.RunStatus_RUN_STATUS_FAILED
	failed.StatusReason = "the run could not be recorded: " + cause.Error()
	failed.StatusReasonCode = stubbornv1.StatusReason_STATUS_REASON_NOT_RECORDED
	failed.EndTime = timestamppb.New(m.cfg.Clock.Now())
	data, err := proto.Marshal(failed)
	if err == nil {
		err = m.store.PutState(m.letGo, r.id, data)
	}
	if err == nil {
		err = m.store.Release(m.letGo, r.id)
	}
	if err != nil {
		m.log.Warn("letting go of a run that could not start", "run_id", r.id, "err", err)
	}
	m.wg.Done()
}

// unrecoverable ends a run that cannot be resumed without risk of calling
// its delegates again for work they may have done: its journal is damaged
// or gone (a store that lost data). It is not driven: the run ends FAILED
// with why, in a run_finished after the events its journal still has, its
// final state is saved and its claim released, and an ERROR names it. It
// returns an error only when the store could not be written: the run stays
// claimed, for the next scan.
func (m *Manager) unrecoverable(id string, recorded []Event, why string) error {
	var state *stubbornv1.ControlState
	if len(recorded) > 0 {
		if ev, err := recorded[0].Decode(); err == nil {
			state = ev.GetRunStarted().GetState()
		}
	}
	if state == nil {
		if st, err := m.store.State(m.ctx, id); err == nil {
			state = st
		}
	}
	end := &stubbornv1.ControlState{RunId: id}
	if state != nil {
		end = constantPart(state)
	}
	now := timestamppb.New(m.cfg.Clock.Now())
	end.Status = stubbornv1.RunStatus_RUN_STATUS_FAILED
	end.StatusReason = "the run could not be recovered: " + why + "; it was not resumed, so that no delegate is called again for work it may have done"
	end.StatusReasonCode = stubbornv1.StatusReason_STATUS_REASON_UNRECOVERABLE
	end.UpdateTime, end.EndTime = now, now
	seq := int64(1)
	if n := len(recorded); n > 0 {
		seq = recorded[n-1].Seq + 1
	}
	m.log.Error("run cannot be recovered: its journal is damaged or lost; it ends FAILED", "run_id", id, "why", why, "events", len(recorded))
	enc, err := EncodeEvent(controls.BoundEvent(&stubbornv1.RunEvent{
		RunId: id, Seq: seq, Time: now,
		Kind: &stubbornv1.RunEvent_RunFinished{RunFinished: &stubbornv1.RunFinished{State: end}},
	}, refusedEventBytes))
	if err != nil {
		return err
	}
	if err := m.store.Append(m.ctx, enc); err != nil {
		return fmt.Errorf("ending unrecoverable run %s: %w", id, err)
	}
	if err := m.store.PutState(m.ctx, id, enc.state()); err != nil {
		return fmt.Errorf("ending unrecoverable run %s: %w", id, err)
	}
	return m.store.Release(m.ctx, id)
}

// admit registers a local run of tenant, unless the manager is closed.
func (m *Manager) admit(id, tenant string) (*run, error) {
	fj, inJournal := m.store.(finalInJournal)
	inJournal = inJournal && fj.finalInJournal()
	r := &run{
		id: id, tenant: tenant, store: m.store, log: m.log, lastStatus: -1, savedStatus: -1,
		ready: make(chan struct{}), ended: make(chan struct{}),
		saveEnd: !inJournal, maxEvent: MaxEventBytes, clock: m.cfg.Clock,
	}
	if l, ok := m.store.(eventLimit); ok {
		r.maxEvent = min(r.maxEvent, l.eventLimit())
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	m.counter++
	r.order = m.counter
	m.runs[id] = r
	m.wg.Add(1)
	return r, nil
}

// forget drops a run that could not start.
func (m *Manager) forget(r *run) {
	m.mu.Lock()
	delete(m.runs, r.id)
	m.mu.Unlock()
	r.cancel(ErrClosed)
	if r.stopTimer != nil {
		r.stopTimer()
	}
	if r.observe != nil {
		r.observe(nil)
	}
	close(r.ready)
	m.wg.Done()
}

// runContext is the run's own context: ended by CancelRun, by the run's
// timeout (counted from its creation), or by the manager's end.
func (m *Manager) runContext(r *run, created time.Time, opts *stubbornv1.RunOptions) context.Context {
	ctx, cancel := context.WithCancelCause(m.ctx)
	r.cancel = cancel
	if d := opts.GetRunTimeout().AsDuration(); d > 0 {
		var stop context.CancelFunc
		ctx, stop = context.WithDeadline(ctx, created.Add(d))
		r.stopTimer = stop
	}
	return ctx
}

// resume drives a run taken over from a dead owner, replaying its journal.
func (m *Manager) resume(id, from string) error {
	recorded, err := m.store.Events(m.ctx, id, 0)
	if err != nil {
		return err
	}
	journal, err := decodeAll(recorded)
	if err != nil {
		return m.unrecoverable(id, recorded, fmt.Sprintf("an event of its journal cannot be read (%v)", err))
	}
	for i, ev := range journal {
		if ev.GetSeq() != int64(i)+1 {
			return m.unrecoverable(id, recorded, fmt.Sprintf("its journal has event %d where event %d belongs: events are missing", ev.GetSeq(), i+1))
		}
	}
	if len(journal) > 0 && journal[0].GetRunStarted().GetState() == nil {
		return m.unrecoverable(id, recorded, "its journal does not start with run_started")
	}
	if len(journal) == 0 {
		if jl, ok := m.store.(journalLoss); ok {
			if lost, why, err := jl.journalLost(m.ctx, id); err != nil {
				return err
			} else if lost {
				return m.unrecoverable(id, recorded, why)
			}
		}
	}
	if n := len(journal); n > 0 && journal[n-1].GetRunFinished() != nil {
		// It finished but its owner died before letting go of it.
		if err := m.store.PutState(m.ctx, id, recorded[n-1].state()); err != nil {
			return err
		}
		return m.store.Release(m.ctx, id)
	}
	var state *stubbornv1.ControlState
	if len(journal) > 0 {
		state = proto.CloneOf(journal[0].GetRunStarted().GetState())
	} else if state, err = m.store.State(m.ctx, id); errors.Is(err, ErrNotFound) {
		// A claim with neither journal nor state (Start saves the state
		// before it claims: they expired, or were written by an older
		// version): nothing to resume from.
		return m.store.Release(m.ctx, id)
	} else if err != nil {
		return err
	}
	if state == nil {
		return fmt.Errorf("run %s: journal does not start with run_started", id)
	}
	r, err := m.admit(id, state.GetTenant())
	if err != nil {
		return err
	}
	r.events = recorded
	r.saveEnd = true // its driver before may have saved a state
	runCtx := m.runContext(r, state.GetCreateTime().AsTime(), state.GetOptions())
	if m.cfg.Observer != nil {
		runCtx, r.observe = m.cfg.Observer.ObserveRun(runCtx, context.Background(), state, true)
	}
	m.log.Info("resuming run", "run_id", id, "from", from, "events", len(journal))
	because := fmt.Sprintf("its owner %s stopped", from)
	r.replaying()
	tr := m.track(r, state, journal)
	m.workers.run(func() { m.drive(runCtx, r, tr, state, true, because) })
	return nil
}

// drive runs the control to its end with tr, state's tracker. A new run's
// run_started is recorded already (Start). With replay, tr replays the
// run's journal from run_started on (a run taken over, resumedBecause
// saying why, or a parked run woken), and the run's cancellation is held
// back until the replay has caught up (controls.Tracker.OnLive), so that
// a run cancelled meanwhile ends with its whole history. A run whose
// control parks (controls.Tracker.ParkWaits) leaves drive waiting on
// park's timer, holding no goroutine.
func (m *Manager) drive(ctx context.Context, r *run, tr *controls.Tracker, state *stubbornv1.ControlState, replay bool, resumedBecause string) {
	runCtx := ctx
	parked := false
	defer func() {
		if !parked {
			m.endDrive(r)
		}
	}()
	if m.cfg.ParkAfter > 0 {
		// Parked under the tracker's lock: by the time anyone sees the run
		// waiting, its parking is set, and may be woken before this drive
		// has returned (it writes nothing more).
		tr.ParkWaits(m.cfg.ParkAfter, func(until time.Time, decision bool) {
			// Woken, the run replays its journal in memory: it must
			// have every event recorded so far.
			r.flush()
			m.park(r, &parking{ctx: runCtx, tracker: tr, decision: decision}, until)
		})
	}
	defer func() {
		// A bug in a control must end its run, not the server.
		if p := recover(); p != nil {
			m.log.Error("panic in run", "run_id", r.id, "panic", p, "stack", string(debug.Stack()))
			tr.Finish(stubbornv1.RunStatus_RUN_STATUS_FAILED, nil, "", "internal error", stubbornv1.StatusReason_STATUS_REASON_INTERNAL_ERROR)
			m.retire(r)
		}
	}()
	if replay {
		held, release, stop := holdCancel(ctx)
		defer stop()
		ctx = held
		tr.OnLive(release)
		tr.OnLive(r.wentLive)
		tr.Start()
		if resumedBecause != "" {
			tr.Resumed(m.owner, resumedBecause)
		}
	}
	// What the criteria, the call context and the control read of the run
	// never changes once it is accepted: no need for a copy of the state.
	snapshot := constantPart(state)
	env := &controls.Env{
		Delegates: flushing{m.cfg.Delegates, r},
		Presets:   m.cfg.Presets,
		Budgets:   m.cfg.Budgets,
		Tracker:   tr,
		Clock:     m.cfg.Clock,
		Rand:      m.rand(r),
	}
	if m.cfg.Criteria != nil {
		env.Criteria = m.cfg.Criteria(snapshot)
	}
	callCtx := ctx
	if m.cfg.CallContext != nil {
		callCtx = m.cfg.CallContext(ctx, snapshot)
	}
	out := controls.Execute(callCtx, env, snapshot.GetTaskBrief(), snapshot.GetControl())
	if _, ok := tr.Parked(); ok {
		parked = true // park has its wake-up
		return
	}
	tr.Finish(out.Status, out.Result, out.Winner, out.Reason, out.Code)
	m.retire(r)
}

// endDrive ends run r's drive here: finished, abandoned or lost.
func (m *Manager) endDrive(r *run) {
	if r.stopTimer != nil {
		r.stopTimer()
	}
	r.cancel(nil)
	m.wg.Done()
}

// parking is a parked run's wait: a timer (none when the run awaits a
// decision without timeout) and a hook on the run's context, either of
// which wakes it, once.
type parking struct {
	ctx      context.Context   // the run's own
	tracker  *controls.Tracker // the parked one
	decision bool              // it awaits a decision
	mu       sync.Mutex
	woken    bool
	timer    *time.Timer
	stop     func() bool
}

// claim marks the wait over, and reports whether this caller is the one to
// wake the run.
func (p *parking) claim() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.woken {
		return false
	}
	p.woken = true
	if p.timer != nil {
		p.timer.Stop()
	}
	if p.stop != nil {
		p.stop()
	}
	return true
}

// park keeps a parked run waiting without a goroutine: a timer wakes it
// when its backoff, or its decision's timeout, is over; the end of its
// context (CancelRun, its deadline, shutdown) wakes it at once; and
// DecideRun wakes it with the decision (decide). Woken, it is driven again
// from its journal, which replays up to the wait and goes on from there
// (or stops, when its context ended); abandoned meanwhile (Close, Kill),
// it is only let go. Until woken, GetRun reads the parked tracker, whose
// state is the run's.
func (m *Manager) park(r *run, p *parking, until time.Time) {
	m.parked.Add(1)
	r.mu.Lock()
	r.parking = p
	r.mu.Unlock()
	wake := func() {
		if p.claim() {
			m.wake(p.ctx, r, nil)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !until.IsZero() {
		p.timer = time.AfterFunc(time.Until(until), wake)
	}
	p.stop = context.AfterFunc(p.ctx, wake)
}

// wake ends run r's parking: it is driven again from its journal, with
// answer, when set, for the decision it awaits.
func (m *Manager) wake(ctx context.Context, r *run, answer *decision) {
	m.parked.Add(-1)
	r.mu.Lock()
	r.parking = nil
	r.mu.Unlock()
	if r.isLost() {
		answer.give(ErrClosed)
		m.endDrive(r)
		return
	}
	if r.isDone() {
		// Ended as it parked: the store refused its events (endRefused).
		answer.give(ErrNotAwaitingDecision)
		m.retire(r)
		m.endDrive(r)
		return
	}
	m.workers.run(func() { m.unpark(ctx, r, answer) })
}

// decision is a DecideRun for a parked run: the decision, and where to
// say whether the run took it.
type decision struct {
	d     stubbornv1.Decision
	taken chan error // buffered: one answer
}

// give reports the decision taken (nil) or not; only the first report
// counts.
func (a *decision) give(err error) {
	if a == nil {
		return
	}
	select {
	case a.taken <- err:
	default:
	}
}

// decide wakes run r, parked by tr for a decision (tr said so:
// controls.ErrParked), with d, and waits until the replayed run has taken
// it. It reports false when that parking is over (another call woke it
// first). Once the run is woken with d, d is taken whatever the caller's
// context: the replay, which calls no delegate, is waited for.
func (m *Manager) decide(r *run, tr *controls.Tracker, d stubbornv1.Decision) (ok bool, err error) {
	r.mu.Lock()
	p := r.parking
	r.mu.Unlock()
	if p == nil || p.tracker != tr || !p.decision || !p.claim() {
		return false, nil
	}
	answer := &decision{d: d, taken: make(chan error, 1)}
	m.wake(p.ctx, r, answer)
	return true, <-answer.taken
}

// unpark drives a parked run again: a new tracker replays its journal.
func (m *Manager) unpark(ctx context.Context, r *run, answer *decision) {
	r.mu.Lock()
	recorded := r.events[:len(r.events):len(r.events)]
	r.mu.Unlock()
	journal, err := decodeAll(recorded)
	if err == nil && (len(journal) == 0 || journal[0].GetRunStarted().GetState() == nil) {
		err = errors.New("its journal does not start with run_started")
	}
	if err != nil {
		// Not expected: the run recorded these events itself.
		m.log.Error("run stopped: it cannot be resumed after its wait", "run_id", r.id, "err", err)
		answer.give(err)
		r.lose(err, err)
		m.endDrive(r)
		return
	}
	state := proto.CloneOf(journal[0].GetRunStarted().GetState())
	tr := m.tracker(r, state, journal)
	// GetRun reads the parked tracker, whose state is whole, until the new
	// one has replayed the journal.
	tr.OnLive(func() { r.setTracker(tr) })
	r.replaying()
	if answer != nil {
		tr.Answer(answer.d, func() { answer.give(nil) })
	}
	m.drive(ctx, r, tr, state, true, "")
	// The run ended or parked again without reaching its decision (it
	// cannot: its journal ends awaiting it).
	answer.give(ErrNotAwaitingDecision)
}

// Parked returns how many runs wait in backoff without a goroutine.
func (m *Manager) Parked() int { return int(m.parked.Load()) }

// heldContext is a run's context while its journal is replayed: done only
// once released (holdCancel), then as the run's context is, with its error
// and cause; its deadline is the run's all along.
type heldContext struct {
	context.Context // cancelled by release once the run's context has ended
	run             context.Context
}

func (c heldContext) Deadline() (time.Time, bool) { return c.run.Deadline() }

func (c heldContext) Err() error {
	if c.Context.Err() == nil {
		return nil
	}
	if err := c.run.Err(); err != nil {
		return err
	}
	return c.Context.Err()
}

// holdCancel returns a context with run's values and deadline that ends
// with run only once release has been called; stop ends it, and must be
// called when done.
func holdCancel(run context.Context) (ctx context.Context, release, stop func()) {
	inner, cancel := context.WithCancelCause(context.WithoutCancel(run))
	var (
		mu        sync.Mutex
		stopAfter func() bool
	)
	release = func() {
		mu.Lock()
		defer mu.Unlock()
		if stopAfter != nil {
			return
		}
		stopAfter = context.AfterFunc(run, func() { cancel(context.Cause(run)) })
		if run.Err() != nil {
			cancel(context.Cause(run)) // at once: the next step must see it
		}
	}
	stop = func() {
		mu.Lock()
		defer mu.Unlock()
		if stopAfter != nil {
			stopAfter()
		}
		cancel(nil)
	}
	return heldContext{Context: inner, run: run}, release, stop
}

// constantPart returns a new state with the fields of st that never change
// once the run is accepted (id, brief, control, options, tenant, creation,
// trace), sharing their messages, which nobody changes either.
func constantPart(st *stubbornv1.ControlState) *stubbornv1.ControlState {
	return &stubbornv1.ControlState{
		RunId:       st.GetRunId(),
		TaskBrief:   st.GetTaskBrief(),
		Control:     st.GetControl(),
		Options:     st.GetOptions(),
		CreateTime:  st.GetCreateTime(),
		Tenant:      st.GetTenant(),
		Traceparent: st.GetTraceparent(),
	}
}

func (m *Manager) rand(r *run) *mrand.Rand {
	if m.cfg.Seed != 0 {
		return mrand.New(mrand.NewPCG(m.cfg.Seed, r.order))
	}
	return nil
}

// retire lets go of a finished run: the store forgets its driver, and this
// server forgets the oldest finished runs beyond its limit.
func (m *Manager) retire(r *run) {
	r.mu.Lock()
	lost, unsaved := r.lost, r.endUnsaved
	r.mu.Unlock()
	switch {
	case lost:
	case unsaved:
		// Without its claim the run's state would be gone until its
		// journal expires: the server that takes it over next (this one
		// leaving or restarting) saves the final state from the journal,
		// then releases it.
		m.log.Warn("keeping the claim of a finished run whose final state is not saved", "run_id", r.id)
	default:
		// The store bounds its own call, as for record.
		if err := m.store.Release(m.letGo, r.id); err != nil {
			m.log.Warn("releasing a finished run", "run_id", r.id, "err", err)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.finished = append(m.finished, r.id)
	for len(m.finished) > m.cfg.MaxFinished {
		delete(m.runs, m.finished[0])
		m.finished = m.finished[1:]
	}
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

// Get returns a run's current state. A run of another tenant than ctx's
// is ErrNotFound, as every method of the Manager reports it.
func (m *Manager) Get(ctx context.Context, id string) (*stubbornv1.ControlState, error) {
	if r := m.local(id); r != nil && !r.isLost() {
		if err := visible(ctx, id, r.tenant); err != nil {
			return nil, err
		}
		if err := r.caughtUp(ctx); err != nil {
			return nil, err
		}
		return r.snapshot()
	}
	return m.state(ctx, id)
}

// state returns the run's stored state if ctx's tenant may see it.
func (m *Manager) state(ctx context.Context, id string) (*stubbornv1.ControlState, error) {
	st, err := m.store.State(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := visible(ctx, id, st.GetTenant()); err != nil {
		return nil, err
	}
	return st, nil
}

// Watch sends the run's events with seq > afterSeq, then live ones as they
// happen, and returns nil after the run_finished event. It returns early
// with ctx's error or the first error of send. No lock is held while send
// runs.
func (m *Manager) Watch(ctx context.Context, id string, afterSeq int64, send func(Event) error) error {
	return m.WatchBatches(ctx, id, afterSeq, 1, func(evs []Event) error { return send(evs[0]) })
}

// WatchBatches is Watch sending the events that are ready together, up to
// max (at least 1) at a time: a watcher that falls behind catches up in
// fewer sends. send must not keep the slice.
func (m *Manager) WatchBatches(ctx context.Context, id string, afterSeq int64, max int, send func([]Event) error) error {
	if max < 1 {
		max = 1
	}
	next := afterSeq
	if r := m.local(id); r != nil {
		if err := visible(ctx, id, r.tenant); err != nil {
			return err
		}
		for {
			evs, changed, done, lost := r.since(next)
			if len(evs) > 0 {
				for len(evs) > 0 {
					n := batchLen(evs, max)
					if err := send(evs[:n:n]); err != nil {
						return err
					}
					next = evs[n-1].Seq
					evs = evs[n:]
				}
				continue // more may have arrived while sending
			}
			if done {
				return nil
			}
			if lost {
				if m.isClosed() {
					return ErrClosed // this server stops: the client reattaches elsewhere
				}
				break // another server drives it now: follow the store
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	} else if _, err := m.state(ctx, id); err != nil {
		return err
	}
	// Following the store ends when this server closes: the client
	// reattaches to another server.
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(m.ctx, cancel)
	defer stop()
	one := make([]Event, 1)
	err := m.store.Follow(fctx, id, next, func(ev Event) error {
		one[0] = ev
		return send(one)
	})
	if err != nil && ctx.Err() == nil && m.ctx.Err() != nil {
		return ErrClosed
	}
	return err
}

// MaxBatchBytes bounds the encoded events WatchBatches sends at once, below
// gRPC's default 4 MiB for a message a client receives; a batch has at
// least one event whatever its size.
const MaxBatchBytes = 1 << 20

// batchLen is how many of evs, at most max and at least one, go in the next
// batch.
func batchLen(evs []Event, max int) int {
	n, size := 1, len(evs[0].Data)
	for n < len(evs) && n < max && size+len(evs[n].Data) <= MaxBatchBytes {
		size += len(evs[n].Data)
		n++
	}
	return n
}

// Cancel cancels a run and waits (bounded by ctx) until it has ended. A
// finished run is returned as it is.
func (m *Manager) Cancel(ctx context.Context, id string) (*stubbornv1.ControlState, error) {
	return m.command(ctx, &Command{RunID: id, Cancel: true})
}

// Decide answers a run awaiting a decision.
func (m *Manager) Decide(ctx context.Context, id string, d stubbornv1.Decision) (*stubbornv1.ControlState, error) {
	return m.command(ctx, &Command{RunID: id, Decision: d})
}

// command carries out cmd here if this server drives the run, or sends it
// to the server that does.
//
// Only ctx's tenant may command its runs: that is checked here, on the
// server the command arrives at, before it is carried out or sent on.
func (m *Manager) command(ctx context.Context, cmd *Command) (*stubbornv1.ControlState, error) {
	if r := m.local(cmd.RunID); r != nil && !r.isLost() {
		if err := visible(ctx, cmd.RunID, r.tenant); err != nil {
			return nil, err
		}
		return m.handle(ctx, cmd)
	}
	st, err := m.state(ctx, cmd.RunID)
	if err != nil {
		return nil, err
	}
	if isTerminal(st.GetStatus()) {
		return m.handle(ctx, cmd)
	}
	owner, err := m.store.Driver(ctx, cmd.RunID)
	if err != nil {
		return nil, err
	}
	if owner == "" || owner == m.owner {
		return m.handle(ctx, cmd)
	}
	st, err = m.store.Send(ctx, owner, cmd)
	if err != nil && !errors.Is(err, ErrNotAwaitingDecision) && !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return st, err
}

// handle carries out a command on a run this server drives, or on a
// finished run.
func (m *Manager) handle(ctx context.Context, cmd *Command) (*stubbornv1.ControlState, error) {
	r := m.local(cmd.RunID)
	if r == nil || r.isLost() {
		st, err := m.store.State(ctx, cmd.RunID)
		if err != nil {
			return nil, err
		}
		if !isTerminal(st.GetStatus()) {
			return nil, fmt.Errorf("%w: run %s is driven by another server", ErrUnavailable, cmd.RunID)
		}
		if cmd.Cancel {
			return st, nil
		}
		return nil, fmt.Errorf("%w (status %s)", ErrNotAwaitingDecision, st.GetStatus())
	}
	if cmd.Cancel {
		r.cancel(errCancelled)
		select {
		case <-r.ended:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return r.snapshot()
	}
	// A run being resumed from its journal is decided once the replay has
	// reached where the run waits.
	if err := r.caughtUp(ctx); err != nil {
		return nil, err
	}
	tr := r.live()
	if tr == nil {
		return nil, fmt.Errorf("%w (the run has ended)", ErrNotAwaitingDecision)
	}
	err := tr.Decide(cmd.Decision)
	if errors.Is(err, controls.ErrParked) {
		ok, err := m.decide(r, tr, cmd.Decision)
		if !ok {
			// Another call woke it first (a decision, its timeout, a
			// cancellation): the first one wins, as when it is not parked.
			return nil, fmt.Errorf("%w (another decision, its timeout or a cancellation came first)", ErrNotAwaitingDecision)
		}
		if err != nil {
			return nil, err
		}
		return r.snapshot()
	}
	if err != nil {
		return nil, fmt.Errorf("%w (status %s)", err, tr.Status())
	}
	return tr.Snapshot(), nil
}

func isTerminal(s stubbornv1.RunStatus) bool {
	switch s {
	case stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED,
		stubbornv1.RunStatus_RUN_STATUS_FAILED, stubbornv1.RunStatus_RUN_STATUS_CANCELLED:
		return true
	}
	return false
}

// List returns ctx's tenant's runs newest first, filtered by status when it
// is not UNSPECIFIED, pageSize at most, and the token of the next page (""
// when this is the last).
func (m *Manager) List(ctx context.Context, status stubbornv1.RunStatus, pageSize int, pageToken string) ([]*stubbornv1.ControlState, string, error) {
	var after *listKey
	if pageToken != "" {
		k, err := parseListKey(pageToken)
		if err != nil {
			return nil, "", ErrBadPageToken
		}
		after = &k
	}
	tenant := TenantFrom(ctx)
	var all []*stubbornv1.ControlState
	if err := m.store.States(ctx, func(st *stubbornv1.ControlState) bool {
		if st.GetTenant() != tenant {
			return true // another tenant's: not there, as far as ctx can tell
		}
		if r := m.local(st.GetRunId()); r != nil && !r.isLost() {
			if cur, err := r.snapshot(); err == nil {
				st = cur // fresher than the stored one
			}
		}
		if status != stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED && st.GetStatus() != status {
			return true
		}
		if after != nil && !after.before(keyOf(st)) {
			return true
		}
		all = append(all, st)
		return true
	}); err != nil {
		return nil, "", err
	}
	slices.SortFunc(all, func(a, b *stubbornv1.ControlState) int { return keyOf(b).compare(keyOf(a)) })
	// A page ends at pageSize runs, or before the run that would take it
	// past MaxListBytes (never before its first): a response a client
	// with gRPC's default 4 MiB limit can read.
	n, size := 0, 0
	for n < len(all) && n < pageSize {
		all[n] = controls.BoundState(all[n], controls.MaxStateBytes)
		size += proto.Size(all[n])
		if n > 0 && size > MaxListBytes {
			break
		}
		n++
	}
	if n == len(all) {
		return all, "", nil
	}
	page := all[:n]
	return page, keyOf(page[len(page)-1]).String(), nil
}

// MaxListBytes bounds the states of one page of List: below gRPC's
// default 4 MiB message limit, with room for one run of the largest state
// (controls.MaxStateBytes and an accepted result of max_result_bytes).
const MaxListBytes = 3 << 20

// listKey orders runs for ListRuns: by creation time, then id.
type listKey struct {
	nanos int64
	id    string
}

func keyOf(st *stubbornv1.ControlState) listKey {
	return listKey{st.GetCreateTime().AsTime().UnixNano(), st.GetRunId()}
}

func (k listKey) compare(o listKey) int {
	if c := cmp.Compare(k.nanos, o.nanos); c != 0 {
		return c
	}
	return strings.Compare(k.id, o.id)
}

// before reports whether o comes after k in newest-first order.
func (k listKey) before(o listKey) bool { return o.compare(k) < 0 }

func (k listKey) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(k.nanos, 10) + "/" + k.id))
}

func parseListKey(s string) (listKey, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return listKey{}, err
	}
	nanos, id, ok := strings.Cut(string(b), "/")
	if !ok || id == "" {
		return listKey{}, ErrBadPageToken
	}
	n, err := strconv.ParseInt(nanos, 10, 64)
	return listKey{n, id}, err
}

// idCounter orders the ids made in the same nanosecond.
var idCounter atomic.Uint32

// newID returns a run id that sorts by creation (wall time, then a process
// counter) and ends with 80 random bits, so ids from several servers never
// collide.
func newID() string {
	var b [18]byte
	binary.BigEndian.PutUint64(b[0:8], uint64(time.Now().UnixNano()))
	binary.BigEndian.PutUint16(b[8:10], uint16(idCounter.Add(1)))
	_, _ = rand.Read(b[10:])
	return "run_" + strings.ToLower(base32.HexEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

// run is a run this server drives: its tracker and, in memory, the journal
// of its events for fast watching.
type run struct {
	id        string
	tenant    string // ControlState.tenant: who may see the run
	order     uint64
	store     Store
	log       *slog.Logger
	ready     chan struct{} // closed once tracker is set
	cancel    context.CancelCauseFunc
	stopTimer context.CancelFunc
	observe   func(*stubbornv1.RunEvent) // the Observer's, or nil

	mu      sync.Mutex
	parking *parking      // set while the run is parked
	replay  chan struct{} // set while its tracker replays its journal
	// tracker drives the run until it ends here; then it is dropped, and
	// with it the state's many small messages, which the garbage collector
	// would scan for as long as the finished run is kept: the
	// run_finished event has the final state.
	tracker *controls.Tracker
	events  []Event // encoded once, sent as they are to every watcher
	// changed is closed, and cleared, by the next event or loss; since
	// makes one only for a watcher that has to wait, so that an event
	// nobody waits for costs no channel.
	changed    chan struct{}
	done       bool
	lost       bool  // another server drives the run: write nothing more
	lostErr    error // why, when a write failed
	lastStatus stubbornv1.RunStatus
	ended      chan struct{} // closed once the run has ended here
	// pending are the events recorded and not yet written (record), with
	// the state to save after them when their status changed; writing
	// counts those a flush is writing.
	pending      []Event
	pendingState []byte
	// pendingStatus is pendingState's status; savedStatus the status of
	// the state saved last (or claimed), -1 when unknown. A state is saved
	// only when its status differs: a retry whose wait is zero goes from
	// RUNNING to BACKING_OFF and back between two writes, and saving
	// RUNNING again would change only the snapshot's details. savedStatus
	// is read and set by flush.
	pendingStatus stubbornv1.RunStatus
	savedStatus   stubbornv1.RunStatus
	writing       int
	flushMu       sync.Mutex   // one flush at a time
	calls         atomic.Int32 // delegate calls in flight (flushing)
	endUnsaved    bool         // the final state could not be saved
	// base is the part of the run's state that never changes
	// (constantPart), for the run_finished of a run whose events the
	// store refused (endRefused). maxEvent bounds an event's encoding
	// (eventLimit).
	base     *stubbornv1.ControlState
	maxEvent int
	clock    controls.Clock
	// saveEnd says the run's final state must be saved: the store does
	// not read it from the journal (finalInJournal), or the run saved
	// a state before (the saved one would hide the journal's), or this
	// server cannot tell (a run taken over). Read and set by flush.
	saveEnd bool
}

// record is the tracker's recorder: it numbers the event and encodes it,
// once, for the store, the journal in memory and every watcher, and keeps
// it pending, with the state when the status changed, until flush writes
// what is pending in one store write. An event that makes the run wait for
// time (more than zero) or for a person, the run's last, and any event recorded while a
// delegate call is in flight (a race's candidates) are flushed at once;
// the others go with the next of those, or before the run's next delegate
// call (flushing). So a call is made only once its attempt_started is durable,
// a watcher sees an event only once it is, and a one-attempt run writes
// its four events in two. ev and st are the tracker's: read during the
// call only, as the Observer does.
func (r *run) record(ev *stubbornv1.RunEvent, st *stubbornv1.ControlState) {
	// The tracker calls record under its own lock, one event at a time, so
	// r.mu is taken only to number and to keep the event: the watchers'
	// since never waits for the store's I/O (flush does it unlocked).
	r.mu.Lock()
	if r.lost || r.done {
		r.mu.Unlock()
		return
	}
	seq := int64(len(r.events)+r.writing+len(r.pending)) + 1
	lastStatus := r.lastStatus
	r.mu.Unlock()

	ev.RunId = r.id
	ev.Seq = seq
	enc, err := EncodeEvent(ev)
	if err == nil && len(enc.Data) > r.maxEvent-eventFraming {
		// Larger than the store's messages (or a watcher's): its texts
		// are cut, and the run goes on.
		r.log.Warn("event too large: its texts are cut", "run_id", r.id, "seq", seq, "bytes", len(enc.Data), "limit", r.maxEvent)
		ev = controls.BoundEvent(ev, r.maxEvent-eventFraming)
		enc, err = EncodeEvent(ev)
	}
	if err != nil {
		// Not expected: the API's strings are checked or made UTF-8 before
		// they reach an event. The run cannot go on without its journal.
		r.log.Error("run stopped: its event cannot be encoded", "run_id", r.id, "err", err)
		r.lose(err, err)
		return
	}
	var state []byte
	status := st.GetStatus()
	if enc.Finished || status != lastStatus {
		// run_started and run_finished carry the state: their encoding
		// has the state's.
		if state = enc.state(); state == nil {
			if state, err = proto.Marshal(controls.BoundState(st, controls.MaxStateBytes)); err != nil {
				r.log.Warn("saving run state", "run_id", r.id, "err", err)
			}
		}
	}

	r.mu.Lock()
	if r.lost {
		r.mu.Unlock()
		return
	}
	r.pending = append(r.pending, enc)
	if state != nil {
		r.pendingState, r.pendingStatus = state, status
	}
	r.lastStatus = status
	if r.observe != nil && !enc.Finished {
		r.observe(ev)
	}
	r.mu.Unlock()
	switch k := ev.GetKind().(type) {
	case *stubbornv1.RunEvent_DecisionRequested, *stubbornv1.RunEvent_DecisionReceived,
		*stubbornv1.RunEvent_RunFinished:
		// The run waits for a person now, a caller waits for the decision
		// to be taken, or the run is over.
		r.flush()
	case *stubbornv1.RunEvent_BackoffScheduled:
		if k.BackoffScheduled.GetWait().AsDuration() > 0 || r.calls.Load() > 0 {
			// The run waits now. (A zero wait is no wait: the events go
			// with the next attempt's, written before its call.)
			r.flush()
		}
	default:
		if r.calls.Load() > 0 {
			// Another call is in flight (a race's candidates): the run
			// waits for it, and this event is news now.
			r.flush()
		}
	}
	if enc.Finished {
		// The run's end is observed once written: a run whose last write
		// failed is observed to stop (loseLocked), not to end.
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.done && r.observe != nil {
			r.observe(ev)
			r.observe = nil
		}
	}
}

// flush writes the run's pending events to the store in one write (fenced:
// a write after another server took the run over fails), saves the state
// when their status changed, journals them and wakes the watchers. One
// flush at a time, in order; one that finds nothing pending returns once
// the flush before it has written.
//
// Each store bounds its own calls (JetStream's have the client's default
// timeout, and are made again through an outage for up to its
// WriteRetry), so flush gives them no deadline (writeContext).
func (r *run) flush() {
	r.flushMu.Lock()
	defer r.flushMu.Unlock()
	r.mu.Lock()
	evs, state, status := r.pending, r.pendingState, r.pendingStatus
	r.pending, r.pendingState = nil, nil
	r.writing = len(evs)
	if r.lost || len(evs) == 0 {
		r.writing = 0
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()

	if err := r.store.Append(writeContext{r}, evs...); err != nil {
		var refused *RefusedError
		if errors.As(err, &refused) && r.endRefused(evs, refused) {
			return
		}
		r.log.Warn("run lost: its journal moved on without this server", "run_id", r.id, "err", err)
		r.lose(err, errLost)
		return
	}
	finished := evs[len(evs)-1].Finished
	if state != nil && (finished && r.saveEnd || !finished && status != r.savedStatus) {
		if err := r.store.PutState(writeContext{r}, r.id, state); err != nil {
			r.log.Warn("saving run state", "run_id", r.id, "err", err)
			r.mu.Lock()
			r.endUnsaved = finished
			r.mu.Unlock()
			// The write may have landed all the same (a timeout): the
			// store may hold this state, so the next differs from what is
			// known saved, and the end must be saved over it.
			r.saveEnd, r.savedStatus = true, -1
		} else {
			r.saveEnd, r.savedStatus = true, status
		}
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	r.writing = 0
	if r.lost {
		return // abandoned meanwhile: the events are in the store, which its watchers follow now
	}
	if r.events == nil {
		r.events = make([]Event, 0, journalCap)
	}
	r.events = append(r.events, evs...)
	if evs[len(evs)-1].Finished {
		r.done = true
		r.tracker = nil
		close(r.ended)
	}
	r.wakeLocked()
}

// writeContext is the context of a run's store writes. It is never
// cancelled: a write under way is made whole (as a run that is let go
// leaves it), and a cancelled run's run_finished is still written. It
// carries the run's ended channel (stopWritesKey): a store that makes a
// failed write again through an outage (JetStream) stops trying once this
// server lets the run go (lose, abandon). A type of its own, not
// context.WithValue: nothing to allocate per write, and no goroutine for
// the deadlines derived from it (it has no Done channel).
type writeContext struct{ r *run }

func (writeContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (writeContext) Done() <-chan struct{}       { return nil }
func (writeContext) Err() error                  { return nil }

func (c writeContext) Value(key any) any {
	if key == (stopWritesKey{}) {
		return (<-chan struct{})(c.r.ended)
	}
	return nil
}

// eventFraming is what an event's encoding adds to its message's size.
const eventFraming = 64

// endRefused ends a run whose events the store refused for good (too
// large, a full stream): FAILED, with the reason, in a run_finished small
// enough for the store to take, after the events it did write. The run's
// context is cancelled: its control stops, and nothing it records after
// is written. It reports false when that run_finished could not be
// written either (or the run's first event was refused: Start fails it),
// and the run is to be lost as for any failed write.
func (r *run) endRefused(evs []Event, refused *RefusedError) bool {
	r.mu.Lock()
	base := r.base
	r.mu.Unlock()
	written := evs[:refused.Written]
	if base == nil || evs[0].Seq == 1 && len(written) == 0 {
		return false
	}
	now := timestamppb.New(r.clock.Now())
	st := constantPart(base)
	st.Status = stubbornv1.RunStatus_RUN_STATUS_FAILED
	st.StatusReason = controls.Cut(errRefused.Error()+": "+refused.Err.Error(), controls.MaxReasonBytes)
	st.StatusReasonCode = stubbornv1.StatusReason_STATUS_REASON_STORE_REFUSED
	st.UpdateTime, st.EndTime = now, now
	ev := &stubbornv1.RunEvent{
		RunId: r.id, Seq: evs[refused.Written].Seq, Time: now,
		Kind: &stubbornv1.RunEvent_RunFinished{RunFinished: &stubbornv1.RunFinished{State: st}},
	}
	enc, err := EncodeEvent(controls.BoundEvent(ev, refusedEventBytes))
	if err == nil {
		err = r.store.Append(writeContext{r}, enc)
	}
	if err != nil {
		r.log.Error("run stopped: the store refused its events, and its end", "run_id", r.id, "refused", refused.Err, "err", err)
		return false
	}
	r.log.Error("run failed: the store refused its events", "run_id", r.id, "seq", evs[refused.Written].Seq, "err", refused.Err)
	if r.saveEnd {
		if data, err := proto.Marshal(st); err == nil {
			if err := r.store.PutState(writeContext{r}, r.id, data); err != nil {
				r.log.Warn("saving run state", "run_id", r.id, "err", err)
			}
		}
	}
	r.mu.Lock()
	r.writing = 0
	r.pending, r.pendingState = nil, nil
	r.events = append(r.events, written...)
	r.events = append(r.events, enc)
	r.done = true
	r.tracker = nil
	close(r.ended)
	r.wakeLocked()
	observe := r.observe
	r.observe = nil
	r.mu.Unlock()
	if observe != nil {
		observe(ev)
	}
	r.cancel(errRefused)
	return true
}

// refusedEventBytes bounds the run_finished of a run whose events the
// store refused: far below any store's message size.
const refusedEventBytes = 64 << 10

// isDone reports whether the run has ended here.
func (r *run) isDone() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done
}

// flushing is the Delegates of a run's controls: each call, and each
// health check (it may take a while), is made once the events before it
// are written (run.flush).
type flushing struct {
	controls.Delegates
	r *run
}

func (f flushing) Serving(ctx context.Context, name string) bool {
	f.r.flush()
	return f.Delegates.Serving(ctx, name)
}

func (f flushing) Call(ctx context.Context, c controls.Call) (*stubbornv1.Result, error) {
	f.r.flush()
	f.r.calls.Add(1)
	defer f.r.calls.Add(-1)
	if f.r.isLost() || f.r.isDone() {
		// The write failed: the run's context ends (lose, endRefused),
		// and nothing is sent on its behalf.
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return nil, &controls.CallError{Code: codes.Aborted, Message: "not sent: " + errLost.Error(), NotSent: true}
	}
	return f.Delegates.Call(ctx, c)
}

// replaying says the run's tracker is about to replay its journal: until
// it goes live (wentLive), caughtUp waits.
func (r *run) replaying() {
	r.mu.Lock()
	r.replay = make(chan struct{})
	r.mu.Unlock()
}

// wentLive says the run's tracker has replayed its journal. Called with
// the tracker's lock held (Tracker.OnLive).
func (r *run) wentLive() {
	r.mu.Lock()
	if r.replay != nil {
		close(r.replay)
		r.replay = nil
	}
	r.mu.Unlock()
}

// caughtUp waits, bounded by ctx, until the run's tracker is not replaying
// its journal: GetRun and DecideRun see the run as it is, not the part of
// its history replayed so far.
func (r *run) caughtUp(ctx context.Context) error {
	r.mu.Lock()
	c := r.replay
	r.mu.Unlock()
	if c == nil {
		return nil
	}
	select {
	case <-c:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// setTracker makes tr the run's tracker.
func (r *run) setTracker(tr *controls.Tracker) {
	r.mu.Lock()
	r.tracker = tr
	r.mu.Unlock()
}

// lose stops the run after a failed write: err is why, cause what its
// context is cancelled with.
func (r *run) lose(err, cause error) {
	r.mu.Lock()
	r.lostErr = err
	r.loseLocked()
	r.mu.Unlock()
	r.cancel(cause)
}

// live returns the run's tracker while it goes on here, nil once it ended.
func (r *run) live() *controls.Tracker {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tracker
}

// snapshot returns the run's current state: the tracker's while it goes on
// here, its run_finished event's once it has ended.
func (r *run) snapshot() (*stubbornv1.ControlState, error) {
	r.mu.Lock()
	tr := r.tracker
	var final Event
	if tr == nil && r.done {
		final = r.events[len(r.events)-1]
	}
	r.mu.Unlock()
	if tr != nil {
		return tr.Snapshot(), nil
	}
	if final.Data == nil {
		return nil, fmt.Errorf("%w: run %s is not driven here", ErrUnavailable, r.id)
	}
	ev, err := final.Decode()
	if err != nil {
		return nil, err
	}
	if ev.GetRunFinished().GetState() == nil {
		return nil, fmt.Errorf("run %s: its last event is not run_finished", r.id)
	}
	return ev.GetRunFinished().GetState(), nil
}

// abandon stops the run from writing anything more.
func (r *run) abandon() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.loseLocked()
}

func (r *run) loseLocked() {
	if r.lost {
		return
	}
	r.lost = true
	if r.observe != nil && !r.done {
		r.observe(nil) // this server stops driving the run without run_finished
	}
	if !r.done {
		close(r.ended)
	}
	r.wakeLocked()
}

// journalCap is the in-memory journal's first capacity: a run with one or
// two attempts never grows it.
const journalCap = 8

// wakeLocked wakes the watchers waiting for a change. Callers hold r.mu.
func (r *run) wakeLocked() {
	if r.changed != nil {
		close(r.changed)
		r.changed = nil
	}
}

// lostBecause returns why the run's last write failed, or nil.
func (r *run) lostBecause() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lostErr
}

func (r *run) isLost() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lost
}

// since returns the events after seq, whether the run has finished, and
// whether it was lost. When there are no such events and the run goes on
// here, it also returns a channel closed on the next change.
func (r *run) since(seq int64) (evs []Event, changed <-chan struct{}, done, lost bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	seq = max(seq, 0)
	if seq < int64(len(r.events)) {
		return r.events[seq:], nil, r.done, r.lost
	}
	if !r.done && !r.lost {
		if r.changed == nil {
			r.changed = make(chan struct{})
		}
		changed = r.changed
	}
	return nil, changed, r.done, r.lost
}
