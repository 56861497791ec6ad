package runs_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
	"github.com/stubbornhq/stubborn/internal/runs/memstore"
	runstore "github.com/stubbornhq/stubborn/internal/runs/store"
)

// countingAppends records how many events each store write held.
type countingAppends struct {
	runstore.Store
	mu      sync.Mutex
	batches []int
}

func (c *countingAppends) Append(ctx context.Context, w *runstore.Writer, evs ...runstore.Event) error {
	c.mu.Lock()
	c.batches = append(c.batches, len(evs))
	c.mu.Unlock()
	return c.Store.Append(ctx, w, evs...)
}

func (c *countingAppends) writes() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.batches...)
}

// durableFirst is a delegate that, when called, reads the run's journal
// from the store: the attempt it is called for must be its last event.
type durableFirst struct {
	store runstore.Store
	fail  int32 // attempts up to this one fail UNAVAILABLE
	mu    sync.Mutex
	seen  []string
}

func (d *durableFirst) Call(ctx context.Context, c controls.Call) (*stubbornv1.Result, error) {
	var id string
	if err := d.store.States(ctx, func(st *stubbornv1.ControlState) bool { id = st.GetRunId(); return false }); err != nil {
		return nil, err
	}
	evs, err := d.store.Events(ctx, id, 0)
	if err != nil {
		return nil, err
	}
	last := "nothing"
	if n := len(evs); n > 0 {
		ev, err := evs[n-1].Decode()
		if err != nil {
			return nil, err
		}
		last = fmt.Sprintf("%s %d", controlstest.Kind(ev), ev.GetAttemptStarted().GetAttempt().GetNumber())
	}
	d.mu.Lock()
	d.seen = append(d.seen, fmt.Sprintf("call %d: %s", c.Attempt, last))
	d.mu.Unlock()
	if c.Attempt <= d.fail {
		return nil, &controls.CallError{Code: codes.Unavailable, Message: "busy"}
	}
	return &stubbornv1.Result{Text: "ok"}, nil
}
func (d *durableFirst) Info(string) controls.DelegateInfo {
	return controls.DelegateInfo{Idempotent: true}
}
func (d *durableFirst) Serving(context.Context, string) bool { return true }

// TestEventsAreWrittenTogetherAndBeforeEachCall: the events a run records
// between two waits or calls are written to the store in one write; every
// delegate call is made once its attempt_started is in the store; and a
// watcher, or a reader of the store from any event on, sees each event
// once, in order.
func TestEventsAreWrittenTogetherAndBeforeEachCall(t *testing.T) {
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			counted := &countingAppends{Store: open(t, time.Second)()}
			d := &durableFirst{store: counted, fail: 2}
			m := runstest.NewManager(t, d, runs.Config{Store: counted, Lease: time.Second})
			st, err := runstest.Start(m, context.Background(), "brief", runstest.RetrySpec(3), nil)
			require.NoError(t, err)
			evs := runstest.WatchAll(t, m, st.GetRunId(), 0)
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, runstest.Final(t, evs).GetStatus())

			assert.Equal(t, []string{"call 1: attempt_started 1", "call 2: attempt_started 2", "call 3: attempt_started 3"}, d.seen)
			// run_started+attempt_started; attempt_finished+failure_analyzed
			// +backoff_scheduled (twice); attempt_started; attempt_finished
			// +run_finished.
			assert.Equal(t, []int{2, 3, 1, 3, 1, 2}, counted.writes(), "events per store write")
			assert.Equal(t, []string{
				"run_started", "attempt_started", "attempt_finished", "failure_analyzed", "backoff_scheduled",
				"attempt_started", "attempt_finished", "failure_analyzed", "backoff_scheduled",
				"attempt_started", "attempt_finished", "run_finished",
			}, kinds(evs))

			for after := range int64(len(evs)) {
				recorded, err := counted.Events(runstest.Ctx(t), st.GetRunId(), after)
				require.NoError(t, err)
				stored := runstest.DecodeAll(t, recorded)
				require.Len(t, stored, len(evs)-int(after), "Events after %d", after)
				var followed []*stubbornv1.RunEvent
				require.NoError(t, counted.Follow(runstest.Ctx(t), st.GetRunId(), after, runstest.Decoding(func(ev *stubbornv1.RunEvent) error {
					followed = append(followed, ev)
					return nil
				})))
				require.Len(t, followed, len(evs)-int(after), "Follow after %d", after)
				for i := range followed {
					assert.Equal(t, after+int64(i)+1, stored[i].GetSeq())
					assert.Equal(t, after+int64(i)+1, followed[i].GetSeq())
				}
			}
		})
	}
}

// countingWrites counts the store writes of each kind: events per
// journal write, and state writes.
type countingWrites struct {
	countingAppends
	puts []stubbornv1.RunStatus
}

func (c *countingWrites) PutState(ctx context.Context, runID string, state []byte) error {
	st := &stubbornv1.ControlState{}
	if err := proto.Unmarshal(state, st); err != nil {
		return err
	}
	c.mu.Lock()
	c.puts = append(c.puts, st.GetStatus())
	c.mu.Unlock()
	return c.Store.PutState(ctx, runID, state)
}

// TestAZeroWaitIsNoWait: a retry whose waits are zero writes each
// backoff_scheduled with the next attempt's events, before its call, and
// saves no BACKING_OFF state that lasts no time: the journal and what
// watchers see are the same, in 4 writes instead of 6, with 1 state write
// (the end) instead of 5, or none where the store reads the end from the
// journal.
func TestAZeroWaitIsNoWait(t *testing.T) {
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			store := open(t, time.Second)()
			counted := &countingWrites{countingAppends: countingAppends{Store: store}}
			var managed runstore.Store = counted
			inJournal := runs.ReadsFinalFromJournal(store)
			if inJournal {
				// Counted, and still read from the journal at the end.
				managed = runs.JournalFinal{Store: counted}
			}
			d := &durableFirst{store: counted, fail: 2}
			m := runstest.NewManager(t, d, runs.Config{Store: managed, Lease: time.Second})
			spec := runstest.RetrySpec(3)
			spec.GetRetry().BaseWait, spec.GetRetry().MaxWait = durationpb.New(0), durationpb.New(0)
			st, err := runstest.Start(m, context.Background(), "brief", spec, nil)
			require.NoError(t, err)
			evs := runstest.WatchAll(t, m, st.GetRunId(), 0)
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, runstest.Final(t, evs).GetStatus())
			assert.Equal(t, []string{
				"run_started", "attempt_started", "attempt_finished", "failure_analyzed", "backoff_scheduled",
				"attempt_started", "attempt_finished", "failure_analyzed", "backoff_scheduled",
				"attempt_started", "attempt_finished", "run_finished",
			}, kinds(evs))
			assert.Equal(t, []string{"call 1: attempt_started 1", "call 2: attempt_started 2", "call 3: attempt_started 3"}, d.seen,
				"each call once its attempt_started is written")
			assert.Equal(t, []int{2, 4, 4, 2}, counted.writes(), "events per store write")
			if inJournal {
				assert.Empty(t, counted.puts, "states saved: none, the end is the journal's")
			} else {
				assert.Equal(t, []stubbornv1.RunStatus{stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED}, counted.puts, "states saved: the end")
			}
			recorded, err := counted.Events(runstest.Ctx(t), st.GetRunId(), 0)
			require.NoError(t, err)
			assert.Equal(t, kinds(evs), kinds(runstest.DecodeAll(t, recorded)))
			got, err := counted.State(runstest.Ctx(t), st.GetRunId())
			require.NoError(t, err)
			assert.True(t, proto.Equal(runstest.Final(t, evs), got), "the store's state is the end")
		})
	}
}

// slowDecisions takes its time to write a decision.
type slowDecisions struct{ runstore.Store }

func (s slowDecisions) Append(ctx context.Context, w *runstore.Writer, evs ...runstore.Event) error {
	for _, e := range evs {
		if ev, err := e.Decode(); err == nil && ev.GetDecisionReceived() != nil {
			time.Sleep(100 * time.Millisecond)
		}
	}
	return s.Store.Append(ctx, w, evs...)
}

// TestADecisionIsWrittenBeforeDecideReturns: a decision taken is in the
// store when DecideRun answers, so a crash right after cannot lose it.
func TestADecisionIsWrittenBeforeDecideReturns(t *testing.T) {
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			store := slowDecisions{open(t, time.Second)()}
			g := runstest.NewGated(controls.DelegateInfo{Idempotent: true})
			m := runstest.NewManager(t, g, runs.Config{Store: store, Lease: time.Second})
			ask := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{Target: "d", Attempts: new(int32)}}}
			st, err := runstest.Start(m, context.Background(), "z", ask, nil)
			require.NoError(t, err)
			g.Answer("z", controlstest.Fail(codes.Unavailable, "busy"))
			require.Eventually(t, func() bool {
				got, err := m.Get(context.Background(), st.GetRunId())
				return err == nil && got.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION
			}, 5*time.Second, time.Millisecond)
			_, err = m.Decide(context.Background(), st.GetRunId(), stubbornv1.Decision_DECISION_RETRY, nil)
			require.NoError(t, err)
			recorded, err := store.Events(runstest.Ctx(t), st.GetRunId(), 0)
			require.NoError(t, err)
			assert.Contains(t, kinds(runstest.DecodeAll(t, recorded)), "decision_received")
		})
	}
}

// countingStates counts the state writes.
type countingStates struct {
	runstore.Store
	mu   sync.Mutex
	puts int
}

func (c *countingStates) PutState(ctx context.Context, runID string, state []byte) error {
	c.mu.Lock()
	c.puts++
	c.mu.Unlock()
	return c.Store.PutState(ctx, runID, state)
}

// TestTheClaimCarriesTheFirstState: a run is accepted with one write, its
// claim, which carries its state: every server reads and lists the run from
// then on, also after another server took it over, and a run that succeeds
// at once saves its state once more, at the end.
func TestTheClaimCarriesTheFirstState(t *testing.T) {
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			const lease = 300 * time.Millisecond
			shared := open(t, lease)
			counted := &countingStates{Store: shared()}
			g := runstest.NewGated(controls.DelegateInfo{Idempotent: true})
			a, err := runs.New(runs.Config{Delegates: g, Store: counted, Lease: lease, Owner: "a"})
			require.NoError(t, err)
			t.Cleanup(a.Close)
			st, err := runstest.Start(a, context.Background(), "x", runstest.RetrySpec(2), nil)
			require.NoError(t, err)
			require.Eventually(t, func() bool { return g.Called("x") == 1 }, 5*time.Second, time.Millisecond)

			other := shared()
			got, err := other.State(runstest.Ctx(t), st.GetRunId())
			require.NoError(t, err)
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_RUNNING, got.GetStatus())
			assert.Equal(t, "x", got.GetTaskBrief())
			listed := 0
			require.NoError(t, other.States(runstest.Ctx(t), func(s *stubbornv1.ControlState) bool {
				if s.GetRunId() == st.GetRunId() {
					listed++
				}
				return true
			}))
			assert.Equal(t, 1, listed, "listed once")
			assert.Zero(t, counted.puts, "no state write but the claim's")

			a.Kill()
			b := runstest.NewManager(t, g, runs.Config{Store: other, Lease: lease, Owner: "b"})
			require.Eventually(t, func() bool { return b.Owns(st.GetRunId()) }, 10*time.Second, 5*time.Millisecond, "b took the run over")
			got, err = other.State(runstest.Ctx(t), st.GetRunId())
			require.NoError(t, err, "the state survives the takeover")
			assert.Equal(t, "x", got.GetTaskBrief())
			g.Answer("x", controlstest.OK("fine"))
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, runstest.Final(t, runstest.WatchAll(t, b, st.GetRunId(), 0)).GetStatus())
			require.Eventually(t, func() bool {
				got, err := other.State(runstest.Ctx(t), st.GetRunId())
				return err == nil && got.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED
			}, 5*time.Second, 5*time.Millisecond, "the final state is saved")
		})
	}
}

// fastAndSlow fails "fast" at once and answers "slow" once released.
type fastAndSlow struct{ release chan struct{} }

func (f fastAndSlow) Call(ctx context.Context, c controls.Call) (*stubbornv1.Result, error) {
	if c.Delegate == "fast" {
		return nil, &controls.CallError{Code: codes.Internal, Message: "no"}
	}
	select {
	case <-f.release:
		return &stubbornv1.Result{Text: "slow and sure"}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
func (fastAndSlow) Info(string) controls.DelegateInfo    { return controls.DelegateInfo{} }
func (fastAndSlow) Serving(context.Context, string) bool { return true }

// TestARaceShowsEachCandidateAsItEnds: while other calls are in flight,
// an event is written and shown at once: a race's watchers see a
// candidate fail while the others still run.
func TestARaceShowsEachCandidateAsItEnds(t *testing.T) {
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			d := fastAndSlow{release: make(chan struct{})}
			m := runstest.NewManager(t, d, runs.Config{Store: open(t, time.Second)(), Lease: time.Second})
			race := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Race{Race: &stubbornv1.RaceSpec{Candidates: []string{"fast", "slow"}}}}
			st, err := runstest.Start(m, context.Background(), "brief", race, nil)
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(runstest.Ctx(t))
			defer cancel()
			seen := make(chan string, 100)
			go func() {
				_ = m.Watch(ctx, st.GetRunId(), 0, runstest.Decoding(func(ev *stubbornv1.RunEvent) error {
					seen <- controlstest.Kind(ev) + " " + ev.GetAttemptFinished().GetAttempt().GetDelegate()
					return nil
				}))
			}()
			deadline := time.After(5 * time.Second)
		wait:
			for {
				select {
				case k := <-seen:
					if k == "attempt_finished fast" {
						break wait
					}
				case <-deadline:
					t.Fatal("the fast candidate's end was not shown while the slow one ran")
				}
			}
			close(d.release)
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, runstest.Final(t, runstest.WatchAll(t, m, st.GetRunId(), 0)).GetStatus())
		})
	}
}

// TestABigResultIsWrittenInSeveralMessages: a step's events that do not
// fit in one NATS message (a result of 400 KB is in attempt_finished and
// twice in run_finished) are written in several, and the run ends.
func TestABigResultIsWrittenInSeveralMessages(t *testing.T) {
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			big := strings.Repeat("x", 400<<10)
			d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {controlstest.OK(big)}})
			store := open(t, time.Second)()
			m := runstest.NewManager(t, d, runs.Config{Store: store, Lease: time.Second})
			st, err := runstest.Start(m, context.Background(), "brief", runstest.Chain("a"), nil)
			require.NoError(t, err)
			fin := runstest.Final(t, runstest.WatchAll(t, m, st.GetRunId(), 0))
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, fin.GetStatus())
			assert.Equal(t, big, fin.GetResult().GetText())
			recorded, err := store.Events(runstest.Ctx(t), st.GetRunId(), 0)
			require.NoError(t, err)
			assert.Equal(t, []string{"run_started", "attempt_started", "attempt_finished", "run_finished"}, kinds(runstest.DecodeAll(t, recorded)))
		})
	}
}

// refusedEnd refuses a run's last write, as when another server took the
// run over meanwhile.
type refusedEnd struct{ runstore.Store }

func (s refusedEnd) Append(ctx context.Context, w *runstore.Writer, evs ...runstore.Event) error {
	if evs[len(evs)-1].Finished {
		return runs.ErrConflict
	}
	return s.Store.Append(ctx, w, evs...)
}

// observed records what an Observer is shown.
type observed struct {
	mu    sync.Mutex
	kinds []string
}

func (o *observed) ObserveRun(runCtx, _ context.Context, _ *stubbornv1.ControlState, _ bool) (context.Context, func(*stubbornv1.RunEvent)) {
	return runCtx, func(ev *stubbornv1.RunEvent) {
		o.mu.Lock()
		defer o.mu.Unlock()
		if ev == nil {
			o.kinds = append(o.kinds, "stopped")
			return
		}
		o.kinds = append(o.kinds, controlstest.Kind(ev))
	}
}

func (o *observed) seen() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.kinds...)
}

// TestTheObserverSeesTheEndOnlyOnceWritten: a run whose end could not be
// written is observed to stop without run_finished (its new driver will
// finish it), not to finish here. The events before it are observed as
// they are recorded.
func TestTheObserverSeesTheEndOnlyOnceWritten(t *testing.T) {
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {controlstest.OK("x")}})
	obs := &observed{}
	m := runstest.NewManager(t, d, runs.Config{Store: refusedEnd{memstore.NewMemory(time.Minute)}, Observer: obs})
	st, err := runstest.Start(m, context.Background(), "brief", runstest.Chain("a"), nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return !m.Owns(st.GetRunId()) }, 5*time.Second, time.Millisecond, "the run is lost")
	assert.Equal(t, []string{"run_started", "attempt_started", "attempt_finished", "stopped"}, obs.seen())
}

// refusedStates refuses to save states.
type refusedStates struct{ runstore.Store }

func (refusedStates) PutState(context.Context, string, []byte) error {
	return errors.New("refused")
}

// TestARunWhoseEndIsNotSavedKeepsItsClaim: when the final state cannot be
// saved, the run keeps its claim (and the state it carries), and the next
// server to drive it saves the final state from the journal, then lets go.
func TestARunWhoseEndIsNotSavedKeepsItsClaim(t *testing.T) {
	store := memstore.NewMemory(300 * time.Millisecond)
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {controlstest.OK("x")}})
	a := runstest.NewManager(t, d, runs.Config{Store: refusedStates{store}, Lease: 300 * time.Millisecond, Owner: "a"})
	st, err := runstest.Start(a, context.Background(), "brief", runstest.Chain("a"), nil)
	require.NoError(t, err)
	runstest.Final(t, runstest.WatchAll(t, a, st.GetRunId(), 0))
	a.Close() // retired, then left
	owner, err := store.Driver(runstest.Ctx(t), st.GetRunId())
	require.NoError(t, err)
	assert.Equal(t, "a", owner, "the claim stays")
	got, err := store.State(runstest.Ctx(t), st.GetRunId())
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_RUNNING, got.GetStatus(), "the claim's state")

	runstest.NewManager(t, d, runs.Config{Store: store, Lease: 300 * time.Millisecond, Owner: "b"})
	require.Eventually(t, func() bool {
		got, err := store.State(runstest.Ctx(t), st.GetRunId())
		owner, _ := store.Driver(runstest.Ctx(t), st.GetRunId())
		return err == nil && got.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED && owner == ""
	}, 10*time.Second, 10*time.Millisecond, "b saved the final state and let the run go")
}
