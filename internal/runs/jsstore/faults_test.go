package jsstore

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
	"github.com/stubbornhq/stubborn/internal/runs/memstore"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// Regression tests of issue 29's findings that a single process (or two
// managers in one) can show: a stale copy of a run, decisions, runs lost
// by a failed write, the state a resumed run saves. The fault suite of
// real processes is in cmd/stubborn (chaos_test.go).

// held is a Delegates whose calls each wait for the test to answer them,
// by attempt, or for their context to end. It keeps each call's context.
type held struct {
	info    controls.DelegateInfo
	mu      sync.Mutex
	calls   map[int32]context.Context
	answers map[int32]chan controlstest.Reply
}

func newHeld(info controls.DelegateInfo) *held {
	return &held{info: info, calls: map[int32]context.Context{}, answers: map[int32]chan controlstest.Reply{}}
}

func (h *held) gate(attempt int32) chan controlstest.Reply {
	h.mu.Lock()
	defer h.mu.Unlock()
	q, ok := h.answers[attempt]
	if !ok {
		q = make(chan controlstest.Reply, 1)
		h.answers[attempt] = q
	}
	return q
}

func (h *held) Answer(attempt int32, r controlstest.Reply) { h.gate(attempt) <- r }

func (h *held) Call(ctx context.Context, c controls.Call) (*stubbornv1.Result, error) {
	h.mu.Lock()
	h.calls[c.Attempt] = ctx
	h.mu.Unlock()
	select {
	case r := <-h.gate(c.Attempt):
		if r.Err != nil {
			return nil, r.Err
		}
		return &stubbornv1.Result{Text: r.Text}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (h *held) Info(string) controls.DelegateInfo    { return h.info }
func (h *held) Serving(context.Context, string) bool { return true }

// called returns attempt's call's context, nil until it is made.
func (h *held) Called(attempt int32) context.Context {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls[attempt]
}

// rawSeqs returns the seqs of run id's journal as stored.
func rawSeqs(t *testing.T, store store.Store, id string) []int64 {
	t.Helper()
	if js, ok := store.(*JetStream); ok {
		seqs, err := RawJournalSeqs(runstest.Ctx(t), js, id)
		require.NoError(t, err)
		return seqs
	}
	evs, err := store.Events(runstest.Ctx(t), id, 0)
	require.NoError(t, err)
	var seqs []int64
	for _, ev := range evs {
		seqs = append(seqs, ev.Seq)
	}
	return seqs
}

// dense asserts that seqs are 1…n.
func dense(t *testing.T, seqs []int64) {
	t.Helper()
	for i, seq := range seqs {
		if !assert.EqualValues(t, i+1, seq, "the journal is dense, without repeats: %v", seqs) {
			return
		}
	}
}

// TestAServerDrivesARunAtMostOnce (issue 29, findings 1 and 8): a is cut
// off while its call runs, b takes the run over, b dies and a, back,
// takes the run back while its first copy's call is still in flight.
// That copy is stopped before the new one calls (its call's context is
// done), and nothing it would write gets into the journal: the journal,
// as stored, is dense without repeats. Before, both copies drove the
// run in one process, and the old one's events landed after the new
// one's, numbered again (the expected sequence came from a map both
// copies shared).
func TestAServerDrivesARunAtMostOnce(t *testing.T) {
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			const lease = 300 * time.Millisecond
			open := newStore(t, lease)
			store := open()
			h := newHeld(controls.DelegateInfo{Idempotent: true})
			a := runstest.NewManager(t, h, runs.Config{Store: store, Lease: lease, Owner: "a", Clock: controls.RealClock{}})
			t.Cleanup(func() { // before a closes: no call is left hanging
				for n := int32(1); n <= 6; n++ {
					select {
					case h.gate(n) <- controlstest.OK("left"):
					default:
					}
				}
			})
			st, err := runstest.Start(a, context.Background(), "brief", runstest.RetrySpec(5), nil)
			require.NoError(t, err)
			require.Eventually(t, func() bool { return h.Called(1) != nil }, 5*time.Second, time.Millisecond)

			a.PauseHeartbeats()
			b, err := runs.New(runs.Config{Store: open(), Delegates: h, Lease: lease, Owner: "b", Clock: controls.RealClock{}})
			require.NoError(t, err)
			require.Eventually(t, func() bool { return h.Called(2) != nil }, 10*time.Second, time.Millisecond, "b takes the run over")
			b.Kill()

			a.ResumeHeartbeats()
			require.Eventually(t, func() bool { return h.Called(3) != nil }, 10*time.Second, time.Millisecond, "a takes it back")
			require.Error(t, h.Called(1).Err(), "a's first copy was stopped before its new copy called")
			h.Answer(1, controlstest.OK("from the stale copy"))
			h.Answer(3, controlstest.OK("fresh"))
			fin := runstest.Final(t, runstest.WatchAll(t, a, st.GetRunId(), 0))
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, fin.GetStatus())
			assert.Equal(t, "fresh", fin.GetResult().GetText())
			dense(t, rawSeqs(t, store, st.GetRunId()))
			dense(t, rawSeqs(t, open(), st.GetRunId()))
		})
	}
}

// TestADecisionIsAnsweredOnlyOnceRecorded (finding 4): a, back from a
// stop during which b took over its run awaiting a decision, is asked to
// decide it. An OK means the decision is in the journal (a sends it to
// b, which drives the run); before, a answered OK from its stale copy,
// the write failed, and b kept waiting for good.
func TestADecisionIsAnsweredOnlyOnceRecorded(t *testing.T) {
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			const lease = 300 * time.Millisecond
			open := newStore(t, lease)
			d := runstest.NotSent()
			a := runstest.NewManager(t, d, runs.Config{Store: open(), Lease: lease, Owner: "a"})
			id := runstest.AwaitingOn(t, a)
			a.PauseHeartbeats()
			b := runstest.NewManager(t, d, runs.Config{Store: open(), Lease: lease, Owner: "b"})
			require.Eventually(t, func() bool { return b.Owns(id) }, 10*time.Second, 5*time.Millisecond)
			a.ResumeHeartbeats()

			_, err := a.Decide(runstest.Ctx(t), id, stubbornv1.Decision_DECISION_FAIL, nil)
			if err != nil {
				require.ErrorIs(t, err, runs.ErrUnavailable, "not recorded: UNAVAILABLE, never OK")
				return
			}
			require.Eventually(t, func() bool {
				st, err := b.Get(runstest.Ctx(t), id)
				return err == nil && st.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_FAILED
			}, 10*time.Second, 5*time.Millisecond, "the decision an OK answered reached the run")
			assert.True(t, runstest.JournalHas(t, open(), id, func(ev *stubbornv1.RunEvent) bool { return ev.GetDecisionReceived() != nil }))
		})
	}
}

// TestAStaleCopyIsNotServed (finding 5): a is stopped past its lease, b
// takes its run awaiting a decision over and ends it; a, back, answers
// GetRun with the run as it is, not its copy still awaiting.
func TestAStaleCopyIsNotServed(t *testing.T) {
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			const lease = 300 * time.Millisecond
			open := newStore(t, lease)
			d := runstest.NotSent()
			a := runstest.NewManager(t, d, runs.Config{Store: open(), Lease: lease, Owner: "a"})
			id := runstest.AwaitingOn(t, a)
			a.PauseHeartbeats()
			b := runstest.NewManager(t, d, runs.Config{Store: open(), Lease: lease, Owner: "b"})
			require.Eventually(t, func() bool { return b.Owns(id) }, 10*time.Second, 5*time.Millisecond)
			require.Eventually(t, func() bool {
				_, err := b.Decide(runstest.Ctx(t), id, stubbornv1.Decision_DECISION_FAIL, nil)
				return err == nil
			}, 10*time.Second, 5*time.Millisecond)
			reader := open()
			require.Eventually(t, func() bool { // written, not only decided on b
				st, err := reader.State(runstest.Ctx(t), id)
				return err == nil && st.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_FAILED
			}, 10*time.Second, 5*time.Millisecond)
			a.ResumeHeartbeats()

			st, err := a.Get(runstest.Ctx(t), id)
			require.NoError(t, err)
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, st.GetStatus(), "a serves the run, not its stale copy")
			assert.False(t, a.Owns(id))
		})
	}
}

// failingAppend fails the at-th Append with an error that may pass (as a
// NATS timeout does), once.
type failingAppend struct {
	store.Store
	n, at int32
	count atomic.Int32
}

func (f *failingAppend) Append(ctx context.Context, w *store.Writer, evs ...store.Event) error {
	if f.count.Add(1) == f.at {
		return errors.New("nats: timeout")
	}
	return f.Store.Append(ctx, w, evs...)
}

// staleDriver answers Driver with "" (no driver: as a NATS server that
// lags would, for an entry it does not have yet) its first stale times.
type staleDriver struct {
	*failingAppend
	stale atomic.Int32
}

func (s *staleDriver) Driver(ctx context.Context, id string) (string, error) {
	if s.stale.Add(-1) >= 0 {
		return "", nil
	}
	return s.failingAppend.Driver(ctx, id)
}

// TestARunLostByAFailedWriteIsDrivenAgain (finding 3): a write of a's
// fails, so a stops driving the run; the store still names a its driver,
// and a is alive, so no other server would take it over. a drives it
// again from its journal (the interrupted attempt retried: idempotent),
// also when the first reads of its driver are stale. Before, the run
// stayed RUNNING for good.
func TestARunLostByAFailedWriteIsDrivenAgain(t *testing.T) {
	for name, stale := range map[string]int32{"": 0, "stale reads": 2} {
		t.Run(name, func(t *testing.T) {
			const lease = 200 * time.Millisecond
			d := controlstest.NewDelegates(map[string][]controlstest.Reply{"d": {controlstest.OK("lost"), controlstest.OK("again")}})
			d.SetInfo("d", controls.DelegateInfo{Idempotent: true})
			h, logger := runstest.NewCapturedLogs()
			store := &staleDriver{failingAppend: &failingAppend{Store: memstore.NewMemory(lease), at: 2}}
			store.stale.Store(stale)
			a := runstest.NewManager(t, d, runs.Config{Store: store, Lease: lease, Owner: "a", Logger: logger})
			st, err := runstest.Start(a, runstest.Ctx(t), "brief", runstest.RetrySpec(3), nil)
			require.NoError(t, err)
			// Read from the store: the tracker says SUCCEEDED before
			// the end is written, and that write is the one that fails.
			require.Eventually(t, func() bool {
				owner, err := store.failingAppend.Driver(runstest.Ctx(t), st.GetRunId())
				return err == nil && owner == ""
			}, 10*time.Second, 5*time.Millisecond, "the run ends and is let go: %v", h.Lines(slog.LevelInfo))
			got, err := a.Get(runstest.Ctx(t), st.GetRunId())
			require.NoError(t, err)
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, got.GetStatus())
			assert.Equal(t, "again", got.GetResult().GetText())
			_, ok := h.Find(slog.LevelInfo, "driving a run lost here again")
			assert.True(t, ok)
		})
	}
}

// TestAResumedRunKeepsItsSavedStatus (finding 9): a run awaiting a
// decision, taken over, reads AWAITING_DECISION in the store, with its
// attempt, while its new driver has it; before, run_resumed saved it as
// RUNNING with no attempts until the decision came.
func TestAResumedRunKeepsItsSavedStatus(t *testing.T) {
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			const lease = 300 * time.Millisecond
			open := newStore(t, lease)
			d := runstest.NotSent()
			// On the real clock, so that the resumed run parks (and writes
			// run_resumed) as it waits for the decision.
			a := runstest.NewManager(t, d, runs.Config{Store: open(), Lease: lease, Owner: "a", Clock: controls.RealClock{}})
			id := runstest.AwaitingOn(t, a)
			a.Kill()
			b := runstest.NewManager(t, d, runs.Config{Store: open(), Lease: lease, Owner: "b", Clock: controls.RealClock{}})
			reader := open()
			require.Eventually(t, func() bool {
				return runstest.JournalHas(t, reader, id, func(ev *stubbornv1.RunEvent) bool { return ev.GetRunResumed() != nil })
			}, 10*time.Second, 5*time.Millisecond, "b resumed it")
			require.True(t, b.Owns(id))
			for range 20 {
				st, err := reader.State(runstest.Ctx(t), id)
				require.NoError(t, err)
				require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, st.GetStatus())
				require.Len(t, st.GetAttemptLog(), 1)
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// stalledAppend holds every Append until released: a server that has
// taken a run over but cannot write yet.
type stalledAppend struct {
	store.Store
	release chan struct{}
}

func (s *stalledAppend) Append(ctx context.Context, w *store.Writer, evs ...store.Event) error {
	<-s.release
	return s.Store.Append(ctx, w, evs...)
}

// TestAStaleWaitDoesNotCallAfterATakeover (finding 2): a's run waits in
// a backoff, parked; a is stopped past its lease and b takes the run
// over, but has written nothing yet. a, back, wakes from its wait: it
// must not call attempt 2, since its heartbeats landing again let its
// writes through the lease's fence, and the journal b reads would not
// have that call's attempt_started in the order b writes. The call is
// made once, by b, after its attempt_started. Before, a called too.
func TestAStaleWaitDoesNotCallAfterATakeover(t *testing.T) {
	const lease = 300 * time.Millisecond
	hinted := controlstest.Reply{Err: &controls.CallError{Code: codes.Unavailable, Message: "later", RetryHint: 1500 * time.Millisecond, HasHint: true}}
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"d": {hinted, controlstest.OK("done")}})
	d.SetInfo("d", controls.DelegateInfo{Idempotent: true})
	mem := memstore.NewMemory(lease)
	spec := runstest.RetrySpec(2)
	spec.GetRetry().MaxWait = durationpb.New(2 * time.Second)
	a := runstest.NewManager(t, d, runs.Config{Store: mem, Lease: lease, Owner: "a", Clock: controls.RealClock{}})
	st, err := runstest.Start(a, runstest.Ctx(t), "brief", spec, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return a.Parked() == 1 }, 5*time.Second, time.Millisecond, "a's run waits, parked")

	a.PauseHeartbeats()
	stalled := &stalledAppend{Store: mem, release: make(chan struct{})}
	b := runstest.NewManager(t, d, runs.Config{Store: stalled, Lease: lease, Owner: "b", Clock: controls.RealClock{}})
	require.Eventually(t, func() bool {
		owner, err := mem.Driver(runstest.Ctx(t), st.GetRunId())
		return err == nil && owner == "b"
	}, 10*time.Second, 5*time.Millisecond, "b takes the run over")
	a.ResumeHeartbeats()
	time.Sleep(2 * time.Second) // a's wait is over
	assert.Len(t, d.Calls(), 1, "a, stale, does not call")
	close(stalled.release)
	fin := runstest.Final(t, runstest.WatchAll(t, b, st.GetRunId(), 0))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, fin.GetStatus())
	assert.Len(t, d.Calls(), 2)
	dense(t, rawSeqs(t, mem, st.GetRunId()))
}

// failingEvents fails its first read of a journal whole (the store not
// answering as a run is resumed).
type failingEvents struct {
	store.Store
	failed atomic.Bool
}

func (f *failingEvents) JournalFrom(ctx context.Context, id string, w *store.Writer) ([]runs.Event, error) {
	if f.failed.CompareAndSwap(false, true) {
		return nil, errors.New("nats: API error: code=503 err_code=10008 description=JetStream system temporarily unavailable")
	}
	return f.Store.JournalFrom(ctx, id, w)
}

// TestATakeoverWhoseResumeFailsIsTriedAgain (finding 3, its second path):
// b takes a dead server's run over, but reading its journal fails; the
// store names b its driver, so no other server will take it: b resumes
// it again later. Before, it stayed claimed by b and undriven for good.
func TestATakeoverWhoseResumeFailsIsTriedAgain(t *testing.T) {
	const lease = 200 * time.Millisecond
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"d": {{Hang: true}, controlstest.OK("done")}})
	d.SetInfo("d", controls.DelegateInfo{Idempotent: true})
	mem := memstore.NewMemory(lease)
	a := runstest.NewManager(t, d, runs.Config{Store: mem, Lease: lease, Owner: "a"})
	st, err := runstest.Start(a, runstest.Ctx(t), "brief", runstest.RetrySpec(3), nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(d.Calls()) == 1 }, 5*time.Second, time.Millisecond)
	a.Kill()

	h, logger := runstest.NewCapturedLogs()
	runstest.NewManager(t, d, runs.Config{Store: &failingEvents{Store: mem}, Lease: lease, Owner: "b", Logger: logger})
	require.Eventually(t, func() bool {
		got, err := mem.State(runstest.Ctx(t), st.GetRunId())
		owner, _ := mem.Driver(runstest.Ctx(t), st.GetRunId())
		return err == nil && got.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED && owner == ""
	}, 10*time.Second, 5*time.Millisecond, "b drives it to its end: %v", h.Lines(slog.LevelInfo))
	_, ok := h.Find(slog.LevelError, "resuming a run")
	assert.True(t, ok, "the failed resume is an ERROR")
}

// landedClaim makes the claim, then answers as if its answer was lost (a
// NATS timeout): the run exists, its server was told it may not.
type landedClaim struct{ *memstore.Memory } // its idempotency keys too

// Transient is JetStream's: a NATS timeout may pass.
func (l landedClaim) Transient(err error) bool { return transient(err) }

func (l landedClaim) Claim(ctx context.Context, id, owner string, state []byte) error {
	if err := l.Memory.Claim(ctx, id, owner, state); err != nil {
		return err
	}
	return nats.ErrTimeout
}

// TestAClaimWhoseAnswerWasLostIsDriven (finding 3, and "no run id lost"):
// StartRun's claim landed but its answer was lost. The caller is told
// UNAVAILABLE, the run may have started; the run is not let go (another
// caller, retrying with its idempotency key, may have been answered with
// it) but driven to its end, and a StartRun with the same key finds it.
// On 72c220f it stayed claimed and undriven for good.
func TestAClaimWhoseAnswerWasLostIsDriven(t *testing.T) {
	const lease = 200 * time.Millisecond
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"d": {controlstest.OK("done")}})
	mem := memstore.NewMemory(lease)
	a := runstest.NewManager(t, d, runs.Config{Store: landedClaim{mem}, Lease: lease, Owner: "a"})
	opts := &stubbornv1.RunOptions{IdempotencyKey: "key-1"}
	_, err := runstest.Start(a, runstest.Ctx(t), "brief", runstest.RetrySpec(1), opts)
	require.ErrorIs(t, err, runs.ErrUnavailable)
	var id string
	require.Eventually(t, func() bool {
		var found bool
		mem.States(runstest.Ctx(t), func(st *stubbornv1.ControlState) bool { //nolint:errcheck // polled
			id, found = st.GetRunId(), st.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED
			return true
		})
		return found
	}, 10*time.Second, 5*time.Millisecond, "the run is driven to its end")
	st, existing, err := a.Start(runstest.Ctx(t), runs.Task{Brief: "brief"}, runstest.RetrySpec(1), opts)
	require.NoError(t, err)
	assert.True(t, existing, "its key names it")
	assert.Equal(t, id, st.GetRunId())
	assert.Len(t, d.Calls(), 1)
}
