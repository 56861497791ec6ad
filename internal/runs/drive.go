package runs

import (
	"context"
	mrand "math/rand/v2"
	"runtime/debug"
	"sync"
	"time"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
)

// drive runs the control to its end with tr, state's tracker. A new run's
// run_started is recorded already (Start). With replay, tr replays the
// run's journal from run_started on (a run taken over, resumedBecause
// saying why, or a parked run woken), and the run's cancellation is held
// back until the replay has caught up (run.wentLive), so that a run
// cancelled meanwhile ends with its whole history. A run whose own
// control waits long enough is parked (runClock): the control's goroutine,
// this one, ends in its wait, and drive leaves the run waiting on park's
// timer, holding no goroutine.
func (m *Manager) drive(ctx context.Context, r *run, tr *controls.Tracker, state *stubbornv1.ControlState, replay bool, resumedBecause string) {
	// The run's calls are on behalf of its tenant (TenantFrom): what the
	// server keeps of them (a delegate's recent failures) is the tenant's.
	ctx = WithTenant(ctx, r.tenant)
	runCtx := ctx
	defer func() {
		if w := r.takeEvicted(); w != nil {
			// The control's goroutine ended in its wait (runtime.Goexit):
			// the run is parked once the events before the wait are
			// written, for a woken run replays its journal in memory.
			// Meanwhile DecideRun waits for the parking (decide).
			r.flush()
			m.park(r, &parking{ctx: runCtx, tracker: tr, decision: w.Decision}, w.Until)
			return
		}
		m.endDrive(r)
	}()
	defer func() {
		// A bug in a control must end its run, not the server.
		if p := recover(); p != nil {
			m.log.Error("panic in run", "run_id", r.id, "panic", p, "stack", string(debug.Stack()))
			tr.Finish(stubbornv1.RunStatus_RUN_STATUS_FAILED, nil, "", "internal error", stubbornv1.StatusReason_STATUS_REASON_INTERNAL_ERROR)
			r.flush()
			m.retire(r)
		}
	}()
	if replay {
		held, release, stop := holdCancel(ctx)
		defer stop()
		ctx = held
		r.mu.Lock()
		r.onLive = release
		r.mu.Unlock()
		tr.Start()
		if resumedBecause != "" {
			tr.Resumed(m.owner, resumedBecause)
		}
	}
	// What the criteria, the call context and the control read of the run
	// never changes once it is accepted: no need for a copy of the state;
	// the run's constant part (track) is that.
	r.mu.Lock()
	deps, snapshot := r.deps, r.base
	r.mu.Unlock()
	if snapshot == nil {
		snapshot = constantPart(state)
	}
	presets := deps.Presets
	if recorded := snapshot.GetPresets(); len(recorded) > 0 {
		// The tree the run was accepted with, whatever the registry
		// says now (a reload between a crash and this takeover).
		presets = controls.PresetMap(recorded)
	}
	// The Env and its Delegates in one allocation: flushing, put in the
	// interface as a value, would be one more.
	de := &driveEnv{delegates: flushing{deps.Delegates, r, controls.RunCall(snapshot)}}
	env := &de.Env
	*env = controls.Env{
		Delegates: &de.delegates,
		Presets:   presets,
		Budgets:   deps.Budgets,
		Guards:    deps.Guards,
		NeverAsk:  snapshot.GetOptions().GetNeverAsk(),
		Tracker:   tr,
		Clock:     m.clock(r),
		Rand:      m.rand(r),
	}
	if deps.Criteria != nil {
		env.Criteria = deps.Criteria(snapshot)
	}
	out := controls.Execute(ctx, env, snapshot.GetTaskBrief(), snapshot.GetControl())
	if out.Code == stubbornv1.StatusReason_STATUS_REASON_NONDETERMINISTIC_REPLAY {
		// Its journal no longer matches what the run's control asks for
		// (a preset changed between a crash and this takeover, or a bug).
		m.log.Error("run ended: its replay went another way than its journal", "run_id", r.id, "reason", out.Reason)
	}
	tr.Finish(out.Status, out.Result, out.Winner, out.Reason, out.Code)
	r.flush() // run_finished, before the claim goes
	m.retire(r)
}

// driveEnv is what a drive's controls reach (Env), with the run's
// Delegates that Env.Delegates points to.
type driveEnv struct {
	controls.Env
	delegates flushing
}

// bind gives run r what its control reaches while this server drives it
// (Config.Bind), before its first drive here.
func (m *Manager) bind(ctx context.Context, r *run) {
	deps := Deps{Delegates: m.cfg.Delegates, Presets: m.cfg.Presets, Budgets: m.cfg.Budgets, Criteria: m.cfg.Criteria}
	var release func()
	if m.cfg.Bind != nil {
		deps, release = m.cfg.Bind(ctx)
	}
	r.mu.Lock()
	r.deps, r.unbind = deps, release
	r.mu.Unlock()
}

// endDrive ends run r's drive here: finished, abandoned or lost.
func (m *Manager) endDrive(r *run) {
	r.mu.Lock()
	cancel, stopTimer, unbind := r.cancel, r.stopTimer, r.unbind
	// What a finished run no longer needs: kept, its context and its
	// request's decoded control (in base) would be scanned by the garbage
	// collector for as long as the run is kept (MaxFinished).
	r.cancel, r.stopTimer, r.base = nil, nil, nil
	r.deps, r.unbind = Deps{}, nil
	r.mu.Unlock()
	if unbind != nil {
		unbind()
	}
	if stopTimer != nil {
		stopTimer()
	}
	if cancel != nil {
		cancel(nil)
	}
	m.wg.Done()
}

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
// once the run is accepted (id, task, control, options, tenant, creation,
// trace), sharing their messages, which nobody changes either.
func constantPart(st *stubbornv1.ControlState) *stubbornv1.ControlState {
	return &stubbornv1.ControlState{
		RunId:        st.GetRunId(),
		TaskBrief:    st.GetTaskBrief(),
		TaskMessages: st.GetTaskMessages(),
		ModelParams:  st.GetModelParams(),
		Conversation: st.GetConversation(),
		Control:      st.GetControl(),
		Options:      st.GetOptions(),
		CreateTime:   st.GetCreateTime(),
		Tenant:       st.GetTenant(),
		Traceparent:  st.GetTraceparent(),
		Presets:      st.GetPresets(),
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
	if m.runs[r.id] != r {
		return // a stale copy: the run's copy here now is another (resumeBecause)
	}
	if !lost {
		m.reclaimedLocked(r.id)
	}
	m.finished = append(m.finished, r.id)
	for len(m.finished) > m.cfg.MaxFinished {
		delete(m.runs, m.finished[0])
		m.finished = m.finished[1:]
	}
}
