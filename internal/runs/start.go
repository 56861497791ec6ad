package runs

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
)

// Task is what a run is asked to do: its brief and, for a conversation,
// either its typed conversation (ControlState.conversation) or its
// messages and model parameters (ControlState.task_messages,
// model_params), never both. Read only.
type Task struct {
	Brief        string
	Messages     []*structpb.Struct
	ModelParams  *structpb.Struct
	Conversation *stubbornv1.Conversation
}

// Start accepts a run of task and starts its control in the background.
// The request must already be valid; the run keeps task and spec (they are
// not copied: the caller must not change them). It returns the run's state
// when accepted.
//
// The caller's idempotency key is honoured (keys.go): when opts has one
// that names a run of ctx's tenant within the key's window, Start returns
// that run's current state and existing true instead of starting another,
// or KeyConflictError when that run was started with a different request.
//
// ctx is the request's context: it is used for tracing, and for the tenant
// the run belongs to (TenantFrom), since the run outlives the request.
func (m *Manager) Start(ctx context.Context, task Task, spec *stubbornv1.ControlSpec, opts *stubbornv1.RunOptions) (st *stubbornv1.ControlState, existing bool, err error) {
	id := newID()
	if opts == nil {
		opts = &stubbornv1.RunOptions{}
	}
	if opts.GetIdempotencyKey() == "" {
		opts = proto.CloneOf(opts) // the request's own stays as it came
		opts.IdempotencyKey = id
		st, err = m.start(ctx, id, task, spec, opts)
		return st, false, err
	}
	tenant := TenantFrom(ctx)
	reserved, cur, err := m.existingRun(ctx, tenant, id, task, spec, opts)
	if err != nil || cur != nil {
		return cur, cur != nil, err
	}
	st, err = m.start(ctx, id, task, spec, opts)
	if err != nil && reserved != nil && !errors.Is(err, errMaybeStarted) {
		// Not started: the key is free again (else the next start with
		// it would wait keyClaimGrace).
		reserved()
	}
	return st, false, err
}

// errMaybeStarted: a run whose claim's write failed in a way that may
// have landed. Its idempotency key stays reserved for it: the caller's
// retry with that key finds the run if it exists.
var errMaybeStarted = errors.New("the run may have started; a StartRun with the same idempotency key finds it")

// start starts run id.
func (m *Manager) start(ctx context.Context, id string, task Task, spec *stubbornv1.ControlSpec, opts *stubbornv1.RunOptions) (*stubbornv1.ControlState, error) {
	now := m.cfg.Clock.Now()
	// Saved as RUNNING (an attempt is about to start) from the first: the
	// state run_started saves a moment later would differ only in its
	// update time, and saving it again is one store write per run.
	state := &stubbornv1.ControlState{
		RunId:        id,
		Status:       stubbornv1.RunStatus_RUN_STATUS_RUNNING,
		TaskBrief:    task.Brief,
		TaskMessages: task.Messages,
		ModelParams:  task.ModelParams,
		Conversation: task.Conversation,
		Control:      spec,
		Options:      opts,
		CreateTime:   timestamppb.New(now),
		UpdateTime:   timestamppb.New(now),
		Tenant:       TenantFrom(ctx),
	}
	if err := m.store.Admit(ctx, proto.Size(state)); err != nil {
		return nil, err
	}
	r, err := m.admit(id, state.GetTenant())
	if err != nil {
		return nil, err
	}
	// The run is bound to the registry it is accepted by, and records the
	// presets its control reaches there: a takeover replays that tree.
	m.bind(ctx, r)
	r.mu.Lock()
	state.Presets = controls.ExpandPresets(spec, r.deps.Presets)
	r.mu.Unlock()
	runCtx := m.runContext(r, now, opts)
	if m.cfg.Observer != nil {
		runCtx, r.observe = m.cfg.Observer.ObserveRun(runCtx, ctx, state, false)
	}
	// The run is accepted once it has a driver and its state is saved, in
	// one write: its journal's first (run_started carries the state; the
	// store's claims.go), or, on a store that claims runs apart (Memory,
	// JetStream with ClaimInOwners), the claim, which carries the state,
	// and run_started is written with the events that follow it, before
	// the run's first call (record). A server that takes the run over then
	// (this one stalled past its lease, or stopped) resumes it from that
	// state, and its first write fences this one out.
	inJournal := m.store.ClaimsInJournal()
	var first chan struct{}
	if inJournal {
		// Claimed by its journal's first write (claims.go), made by
		// the run's own flush before its first call, which Start waits
		// for below. Set under r.mu: the run is the manager's already
		// (Close may abandon it).
		first = make(chan struct{})
		r.mu.Lock()
		r.jw.Claimer, r.firstDone = m.owner, first
		if r.lost {
			r.firstWrittenLocked()
		}
		r.mu.Unlock()
	} else {
		var data []byte
		data, err = proto.Marshal(state)
		if err == nil {
			err = m.store.Claim(ctx, id, m.owner, data)
		}
	}
	if err != nil {
		m.forget(r)
		if m.store.Transient(err) || errors.Is(err, ErrConflict) {
			// (A conflict too: run ids are new, so a claim that exists
			// is this one's, from a try whose answer was lost; and a
			// try fenced by the lease may follow one that landed.)
			// The claim may have landed all the same (its answer was
			// lost): then the run exists, and a StartRun with its
			// idempotency key, on any server, answers with it. It is
			// driven, a lease later, like a run lost here (reclaim.go):
			// never let go of, which would lose a run some caller was
			// told of.
			m.lostHere(id)
			return nil, fmt.Errorf("%w: %w: recording it: %v", ErrUnavailable, errMaybeStarted, err)
		}
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
	if inJournal {
		if err := m.awaitClaim(r, first); err != nil {
			return nil, err
		}
	}
	return accepted, nil
}

// firstWriteWait is how long Start waits for a run claimed in its journal
// to make its first write itself (before its first call, with the events
// that follow run_started: one write for both) before it writes
// run_started alone: a run whose control waits first (a call queued by a
// guard) is accepted without waiting for it.
const firstWriteWait = 10 * time.Millisecond

// awaitClaim waits for the first write of r, a new run claimed by it
// (first is r's firstDone), and returns why the run is not accepted.
func (m *Manager) awaitClaim(r *run, first <-chan struct{}) error {
	t := time.NewTimer(firstWriteWait)
	select {
	case <-first:
		t.Stop()
	case <-t.C:
		r.flushThrough(1) // run_started alone
		<-first
	}
	r.mu.Lock()
	landed, err := r.firstLanded, r.lostErr
	r.mu.Unlock()
	if landed {
		return nil
	}
	if err == nil {
		// Let go of (this server closes) before its first write was
		// seen to land: it may have landed all the same.
		return fmt.Errorf("%w: %w: this server is closing", ErrUnavailable, errMaybeStarted)
	}
	if m.store.Transient(err) || errors.Is(err, ErrConflict) {
		// It may have landed all the same (its answer was lost): then
		// the run exists, a StartRun with its idempotency key finds it,
		// and it is driven again a lease later (lostHere, from flush).
		return fmt.Errorf("%w: %w: recording it: %v", ErrUnavailable, errMaybeStarted, err)
	}
	return fmt.Errorf("recording the run: %w", err)
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

// tracker returns a new tracker for run r, of state replaying journal.
// Its waits for a decision are made on the run's clock, as its backoffs.
func (m *Manager) tracker(r *run, state *stubbornv1.ControlState, journal []*stubbornv1.RunEvent) *controls.Tracker {
	return controls.NewReplayTracker(state, m.clock(r), r.record, journal)
}

// unstart drops a run whose run_started the store failed to record: it is
// lost already (record said so to the observer). Its saved state becomes
// FAILED, so that no list shows it pending, and its claim goes.
func (m *Manager) unstart(r *run, state *stubbornv1.ControlState, cause error) {
	m.mu.Lock()
	delete(m.runs, r.id)
	m.mu.Unlock()
	r.unbindNow()
	if r.stopTimer != nil {
		r.stopTimer()
	}
	failed := proto.CloneOf(state)
	failed.Status = stubbornv1.RunStatus_RUN_STATUS_FAILED
	failed.StatusReason = "the run could not be recorded: " + cause.Error()
	failed.StatusReasonCode = stubbornv1.StatusReason_STATUS_REASON_NOT_RECORDED
	failed.EndTime = timestamppb.New(m.cfg.Clock.Now())
	data, err := proto.Marshal(failed)
	if r.jw.Claimer != "" {
		data, err = nil, nil // never claimed: nothing was written
	}
	if err == nil && data != nil {
		err = m.store.PutState(m.letGo, r.id, data)
	}
	if err == nil && data != nil {
		err = m.store.Release(m.letGo, r.id)
	}
	if err != nil {
		m.log.Warn("letting go of a run that could not start", "run_id", r.id, "err", err)
	}
	m.wg.Done()
}

// admit registers a local run of tenant, unless the manager is closed.
func (m *Manager) admit(id, tenant string) (*run, error) {
	maxEvent := min(MaxEventBytes, m.store.EventLimit())
	r := &run{
		runSetup: runSetup{
			id: id, tenant: tenant, store: m.store, log: m.log,
			ready: make(chan struct{}), ended: make(chan struct{}),
			maxEvent: maxEvent, clock: m.cfg.Clock, writers: &m.writes,
			mgr:          m,
			outputWindow: cmp.Or(m.cfg.OutputFlushInterval, DefaultOutputFlushInterval),
			// An event carries at most outputBytes of text: far below any
			// store's message, whatever the flag says.
			outputBytes: max(1, min(cmp.Or(m.cfg.OutputFlushBytes, DefaultOutputFlushBytes), maxEvent/4)),
		},
		runLife: runLife{lastStatus: -1},
		outbox:  outbox{savedStatus: -1, saveEnd: !m.store.FinalInJournal()},
	}
	r.runClock = runClock{m.cfg.Clock, r, m.cfg.ParkAfter}
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
	r.unbindNow()
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

// unbindNow lets go of what bind gave r, for a run that will not be
// driven.
func (r *run) unbindNow() {
	r.mu.Lock()
	unbind := r.unbind
	r.deps, r.unbind = Deps{}, nil
	r.mu.Unlock()
	if unbind != nil {
		unbind()
	}
}
