package runs

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"

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
)

// errCancelled is the cause a run's context carries after CancelRun.
var errCancelled = errors.New("cancelled by CancelRun")

// errShutdown is the cause a run's context carries when the server stops.
var errShutdown = errors.New("server shut down")

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
	// Seed, when non-zero, seeds every run's jitter deterministically (tests).
	Seed uint64
	// MaxFinished is how many finished runs are kept for GetRun, WatchRun and
	// ListRuns; older ones are forgotten. 0 means 10,000.
	MaxFinished int
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
	// one being run_finished.
	ObserveRun(runCtx, reqCtx context.Context, st *stubbornv1.ControlState, resumed bool) (context.Context, func(ev *stubbornv1.RunEvent))
}

// Manager runs and keeps runs in memory.
type Manager struct {
	cfg    Config
	ctx    context.Context // parent of every run; cancelled by Close
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	runs     map[string]*run
	finished []string // ids of finished runs, oldest first
	counter  uint64   // creation order, for ListRuns
	closed   bool
}

// New returns a Manager. Close it to stop every run.
func New(cfg Config) *Manager {
	if cfg.Clock == nil {
		cfg.Clock = controls.RealClock{}
	}
	if cfg.MaxFinished <= 0 {
		cfg.MaxFinished = 10_000
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Manager{cfg: cfg, ctx: ctx, cancel: cancel, runs: map[string]*run{}}
}

// Close cancels every run that is still going and waits for them to end.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.cancel(errShutdown)
	m.wg.Wait()
}

// Start accepts a run and starts its control in the background. The request
// must already be valid. It returns the run's state when accepted.
//
// ctx is the request's context: it is used for tracing only, since the run
// outlives the request.
func (m *Manager) Start(ctx context.Context, brief string, spec *stubbornv1.ControlSpec, opts *stubbornv1.RunOptions) (*stubbornv1.ControlState, error) {
	id := newID()
	opts = proto.CloneOf(opts)
	if opts == nil {
		opts = &stubbornv1.RunOptions{}
	}
	if opts.GetIdempotencyKey() == "" {
		opts.IdempotencyKey = id
	}
	now := m.cfg.Clock.Now()
	state := &stubbornv1.ControlState{
		RunId:      id,
		Status:     stubbornv1.RunStatus_RUN_STATUS_PENDING,
		TaskBrief:  brief,
		Control:    proto.CloneOf(spec),
		Options:    opts,
		CreateTime: timestamppb.New(now),
		UpdateTime: timestamppb.New(now),
	}
	r := &run{id: id, changed: make(chan struct{}), ended: make(chan struct{})}
	runCtx, cancel := context.WithCancelCause(m.ctx)
	r.cancel = cancel
	if d := opts.GetRunTimeout().AsDuration(); d > 0 {
		var stop context.CancelFunc
		runCtx, stop = context.WithDeadline(runCtx, now.Add(d))
		r.stopTimer = stop
	}
	if m.cfg.Observer != nil {
		runCtx, r.observe = m.cfg.Observer.ObserveRun(runCtx, ctx, state, false)
	}
	r.tracker = controls.NewTracker(state, m.cfg.Clock, r.append)
	accepted := r.tracker.Snapshot()

	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		r.cancel(ErrClosed)
		if r.stopTimer != nil {
			r.stopTimer()
		}
		return nil, ErrClosed
	}
	m.counter++
	r.order = m.counter
	m.runs[id] = r
	m.wg.Add(1)
	m.mu.Unlock()
	go m.drive(runCtx, r, brief, spec)
	return accepted, nil
}

// drive runs the control to its end.
func (m *Manager) drive(ctx context.Context, r *run, brief string, spec *stubbornv1.ControlSpec) {
	defer m.wg.Done()
	defer r.cancel(nil)
	if r.stopTimer != nil {
		defer r.stopTimer()
	}
	defer func() {
		// A bug in a control must end its run, not the server.
		if p := recover(); p != nil {
			slog.Error("panic in run", "run_id", r.id, "panic", p, "stack", string(debug.Stack()))
			r.tracker.Finish(stubbornv1.RunStatus_RUN_STATUS_FAILED, nil, "", "internal error")
			m.retire(r.id)
		}
	}()
	r.tracker.Start()
	snapshot := r.tracker.Snapshot()
	env := &controls.Env{
		Delegates: m.cfg.Delegates,
		Presets:   m.cfg.Presets,
		Budgets:   m.cfg.Budgets,
		Tracker:   r.tracker,
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
	out := controls.Execute(callCtx, env, brief, spec)
	r.tracker.Finish(out.Status, out.Result, out.Winner, out.Reason)
	m.retire(r.id)
}

func (m *Manager) rand(r *run) *mrand.Rand {
	if m.cfg.Seed != 0 {
		return mrand.New(mrand.NewPCG(m.cfg.Seed, r.order))
	}
	return nil
}

// retire remembers that a run finished and forgets the oldest finished runs
// beyond the limit.
func (m *Manager) retire(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.finished = append(m.finished, id)
	for len(m.finished) > m.cfg.MaxFinished {
		delete(m.runs, m.finished[0])
		m.finished = m.finished[1:]
	}
}

func (m *Manager) get(id string) (*run, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.runs[id]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	return r, nil
}

// Get returns a run's current state.
func (m *Manager) Get(id string) (*stubbornv1.ControlState, error) {
	r, err := m.get(id)
	if err != nil {
		return nil, err
	}
	return r.tracker.Snapshot(), nil
}

// Watch sends the run's events with seq > afterSeq, then live ones as they
// happen, and returns nil after the run_finished event. It returns early
// with ctx's error or the first error of send. No lock is held while send
// runs.
func (m *Manager) Watch(ctx context.Context, id string, afterSeq int64, send func(*stubbornv1.RunEvent) error) error {
	r, err := m.get(id)
	if err != nil {
		return err
	}
	next := afterSeq
	for {
		evs, changed, done := r.since(next)
		for _, ev := range evs {
			if err := send(ev); err != nil {
				return err
			}
			next = ev.GetSeq()
		}
		if done && len(evs) == 0 {
			return nil
		}
		if len(evs) > 0 {
			continue // more may have arrived while sending
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Cancel cancels a run and waits (bounded by ctx) until it has ended. A
// finished run is returned as it is.
func (m *Manager) Cancel(ctx context.Context, id string) (*stubbornv1.ControlState, error) {
	r, err := m.get(id)
	if err != nil {
		return nil, err
	}
	r.cancel(errCancelled)
	select {
	case <-r.ended:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return r.tracker.Snapshot(), nil
}

// Decide answers a run awaiting a decision.
func (m *Manager) Decide(id string, d stubbornv1.Decision) (*stubbornv1.ControlState, error) {
	r, err := m.get(id)
	if err != nil {
		return nil, err
	}
	if err := r.tracker.Decide(d); err != nil {
		return nil, fmt.Errorf("%w (status %s)", err, r.tracker.Status())
	}
	return r.tracker.Snapshot(), nil
}

// List returns runs newest first, filtered by status when it is not
// UNSPECIFIED, pageSize at most, and the token of the next page ("" when
// this is the last).
func (m *Manager) List(status stubbornv1.RunStatus, pageSize int, pageToken string) ([]*stubbornv1.ControlState, string, error) {
	before := uint64(0)
	if pageToken != "" {
		b, err := base64.RawURLEncoding.DecodeString(pageToken)
		if err == nil {
			before, err = strconv.ParseUint(strings.TrimPrefix(string(b), "before:"), 10, 64)
		}
		if err != nil || before == 0 {
			return nil, "", ErrBadPageToken
		}
	}
	m.mu.Lock()
	all := make([]*run, 0, len(m.runs))
	for _, r := range m.runs {
		if before == 0 || r.order < before {
			all = append(all, r)
		}
	}
	m.mu.Unlock()
	sort.Slice(all, func(i, j int) bool { return all[i].order > all[j].order })

	var out []*stubbornv1.ControlState
	for i, r := range all {
		st := r.tracker.Snapshot()
		if status != stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED && st.GetStatus() != status {
			continue
		}
		if len(out) == pageSize {
			return out, base64.RawURLEncoding.EncodeToString([]byte("before:" + strconv.FormatUint(all[i-1].order, 10))), nil
		}
		out = append(out, st)
	}
	return out, "", nil
}

// newID returns a random run id.
func newID() string {
	return "run_" + strings.ToLower(rand.Text())
}

// run is one run in memory: its tracker and the journal of its events.
type run struct {
	id        string
	order     uint64
	tracker   *controls.Tracker
	cancel    context.CancelCauseFunc
	stopTimer context.CancelFunc
	observe   func(*stubbornv1.RunEvent) // the Observer's, or nil

	mu      sync.Mutex
	events  []*stubbornv1.RunEvent
	changed chan struct{} // closed and replaced on every append
	done    bool
	ended   chan struct{} // closed after run_finished is journaled
}

// append is the tracker's sink: it numbers the event, journals it and wakes
// the watchers.
func (r *run) append(ev *stubbornv1.RunEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev.RunId = r.id
	ev.Seq = int64(len(r.events)) + 1
	r.events = append(r.events, ev)
	if ev.GetRunFinished() != nil {
		r.done = true
		close(r.ended)
	}
	if r.observe != nil {
		r.observe(ev)
	}
	close(r.changed)
	r.changed = make(chan struct{})
}

// since returns the events after seq, a channel closed on the next append,
// and whether the run has finished.
func (r *run) since(seq int64) ([]*stubbornv1.RunEvent, <-chan struct{}, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if seq < 0 {
		seq = 0
	}
	var evs []*stubbornv1.RunEvent
	if seq < int64(len(r.events)) {
		evs = r.events[seq:]
	}
	return evs, r.changed, r.done
}
