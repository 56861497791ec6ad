package runs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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
	"github.com/stubbornhq/stubborn/internal/runs/jsstore"
	"github.com/stubbornhq/stubborn/internal/runs/memstore"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// stores are the Store implementations every test here runs against. Each
// returns a function that opens a new view of one shared store, as each
// server has its own connection.
var stores = map[string]func(t *testing.T, lease time.Duration) func() store.Store{
	"memory": func(_ *testing.T, lease time.Duration) func() store.Store {
		m := memstore.NewMemory(lease)
		return func() store.Store { return m }
	},
	"jetstream": func(t *testing.T, lease time.Duration) func() store.Store {
		e, err := jsstore.StartEmbedded(jsstore.EmbeddedConfig{DataDir: t.TempDir()})
		require.NoError(t, err)
		t.Cleanup(e.Close)
		return func() store.Store {
			nc, err := nats.Connect("", nats.InProcessServer(e.Server))
			require.NoError(t, err)
			s, err := jsstore.NewJetStream(runstest.Ctx(t), nc, jsstore.JetStreamConfig{Lease: lease})
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			return s
		}
	},
}

func TestStoresRunAndServe(t *testing.T) {
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			store := newStore(t, time.Second)()
			d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {controlstest.Fail(codes.Internal, "no")}, "b": {controlstest.OK("yes")}})
			m := runstest.NewManager(t, d, runs.Config{Store: store, Lease: time.Second})
			st, err := runstest.Start(m, context.Background(), "brief", runstest.Chain("a", "b"), nil)
			require.NoError(t, err)
			evs := runstest.WatchAll(t, m, st.GetRunId(), 0)
			fin := runstest.Final(t, evs)
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, fin.GetStatus())

			// The store holds the same journal and the final state.
			recorded, err := store.Events(runstest.Ctx(t), st.GetRunId(), 0)
			require.NoError(t, err)
			stored := runstest.DecodeAll(t, recorded)
			require.Len(t, stored, len(evs))
			for i := range evs {
				assert.True(t, proto.Equal(evs[i], stored[i]), "event %d", i+1)
			}
			got, err := store.State(runstest.Ctx(t), st.GetRunId())
			require.NoError(t, err)
			assert.True(t, proto.Equal(fin, got))

			// Follow replays a finished run and ends.
			var followed []*stubbornv1.RunEvent
			require.NoError(t, store.Follow(runstest.Ctx(t), st.GetRunId(), 2, runstest.Decoding(func(ev *stubbornv1.RunEvent) error {
				followed = append(followed, ev)
				return nil
			})))
			assert.Len(t, followed, len(evs)-2)
			_, err = store.State(runstest.Ctx(t), "run_nope")
			assert.ErrorIs(t, err, runs.ErrNotFound)

			list, _, err := m.List(runstest.Ctx(t), stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, 10, "")
			require.NoError(t, err)
			assert.Len(t, list, 1)
		})
	}
}

// TestAStaleOwnerCannotWrite: a server frozen past its lease loses its run
// to another, and when it wakes up its appends are refused.
func TestAStaleOwnerCannotWrite(t *testing.T) {
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			const lease = 300 * time.Millisecond
			open := newStore(t, lease)
			store := open()
			g := runstest.NewGated(controls.DelegateInfo{Idempotent: true})
			a := runstest.NewManager(t, g, runs.Config{Store: store, Lease: lease, Owner: "a", Clock: controls.RealClock{}})
			st, err := runstest.Start(a, context.Background(), "brief", runstest.RetrySpec(3), nil)
			require.NoError(t, err)
			require.Eventually(t, func() bool { return g.Called("") == 1 }, 5*time.Second, time.Millisecond)

			a.PauseHeartbeats() // a freezes: it stops beating, its call hangs
			b := runstest.NewManager(t, g, runs.Config{Store: open(), Lease: lease, Owner: "b", Clock: controls.RealClock{}})
			// b takes the run over: the in-flight attempt comes back
			// interrupted and, the delegate being idempotent, is retried.
			require.Eventually(t, func() bool { return g.Called("") == 2 }, 10*time.Second, 5*time.Millisecond)

			// a wakes up: its hanging call answers, and its write is refused.
			g.Answer("brief", controlstest.OK("from a"))
			g.Answer("brief", controlstest.OK("from b"))
			fin := runstest.Final(t, runstest.WatchAll(t, b, st.GetRunId(), 0))
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, fin.GetStatus())

			recorded, err := open().Events(runstest.Ctx(t), st.GetRunId(), 0) // a reader of its own: reading makes a view current
			require.NoError(t, err)
			journal := runstest.DecodeAll(t, recorded)
			var resumed bool
			for i, ev := range journal {
				assert.EqualValues(t, i+1, ev.GetSeq(), "dense")
				if r := ev.GetRunResumed(); r != nil {
					resumed = true
					assert.Equal(t, "b", r.GetOwner())
				}
				if resumed {
					// Nothing a wrote after b took over got in.
					if f := ev.GetAttemptFinished(); f != nil && f.GetAttempt().GetNumber() == 1 {
						assert.Equal(t, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_INTERRUPTED, f.GetAttempt().GetOutcome())
					}
				}
			}
			assert.True(t, resumed)
			err = a.AppendForTest(runstest.Ctx(t), st.GetRunId())
			assert.True(t, errors.Is(err, runs.ErrConflict), "a stale append is refused: %v", err)
		})
	}
}

// TestRestartResumesEveryRun: a server dies with runs in an attempt, in a
// backoff and awaiting a decision; a new one on the same store finishes
// them all, calls no non-idempotent delegate twice, and watchers resuming
// from their last seq see every event once.
func TestRestartResumesEveryRun(t *testing.T) {
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			const lease = 200 * time.Millisecond
			open := newStore(t, lease)
			store := open()
			g := runstest.NewGated(controls.DelegateInfo{Idempotent: true})
			a, err := runs.New(runs.Config{Delegates: g, Store: store, Lease: lease, Owner: "a"})
			require.NoError(t, err)

			inAttempt, err := runstest.Start(a, context.Background(), "x", runstest.RetrySpec(2), nil)
			require.NoError(t, err)
			backoff := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
				Target: "d", BaseWait: durationpb.New(time.Second), MaxWait: durationpb.New(time.Second),
			}}}
			inBackoff, err := runstest.Start(a, context.Background(), "y", backoff, nil)
			require.NoError(t, err)
			g.Answer("y", controlstest.Fail(codes.Unavailable, "busy"))
			ask := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
				Target: "d", Attempts: new(int32),
			}}}
			awaiting, err := runstest.Start(a, context.Background(), "z", ask, nil)
			require.NoError(t, err)
			g.Answer("z", controlstest.Fail(codes.Unavailable, "busy"))
			require.Eventually(t, func() bool {
				st, err := a.Get(context.Background(), awaiting.GetRunId())
				return err == nil && st.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION && g.Called("x") == 1
			}, 5*time.Second, time.Millisecond)
			seen := map[string]int64{}
			for _, id := range []string{inAttempt.GetRunId(), inBackoff.GetRunId(), awaiting.GetRunId()} {
				evs, err := store.Events(runstest.Ctx(t), id, 0)
				require.NoError(t, err)
				seen[id] = int64(len(evs))
			}
			a.Kill()

			b := runstest.NewManager(t, g, runs.Config{Store: open(), Lease: lease, Owner: "b", SoleOwner: true})
			for _, brief := range []string{"x", "y", "z"} {
				g.Answer(brief, controlstest.OK("fine"))
			}
			require.Eventually(t, func() bool {
				st, err := b.Get(context.Background(), awaiting.GetRunId())
				return err == nil && st.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION &&
					b.Owns(awaiting.GetRunId())
			}, 10*time.Second, 5*time.Millisecond, "the run awaiting a decision still awaits it")
			assert.Equal(t, 1, g.Called("z"), "a run awaiting a decision calls nobody until decided")
			_, err = b.Decide(context.Background(), awaiting.GetRunId(), stubbornv1.Decision_DECISION_RETRY, nil)
			require.NoError(t, err)
			for id, after := range seen {
				rest := runstest.WatchAll(t, b, id, after)
				require.NotEmpty(t, rest, id)
				for i, ev := range rest {
					assert.Equal(t, after+int64(i)+1, ev.GetSeq(), "%s: no gap, no duplicate", id)
				}
				assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, runstest.Final(t, rest).GetStatus(), id)
			}
		})
	}
}

// TestCommandsReachTheDriver: any server answers for any run, and carries
// CancelRun and DecideRun to the server that drives it.
func TestCommandsReachTheDriver(t *testing.T) {
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			open := newStore(t, time.Second)
			g := runstest.NewGated(controls.DelegateInfo{Idempotent: true})
			a := runstest.NewManager(t, g, runs.Config{Store: open(), Lease: time.Second, Owner: "a"})
			b := runstest.NewManager(t, g, runs.Config{Store: open(), Lease: time.Second, Owner: "b"})
			ask := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{Target: "d", Attempts: new(int32)}}}
			st, err := runstest.Start(a, context.Background(), "ask", ask, nil)
			require.NoError(t, err)
			g.Answer("ask", controlstest.Fail(codes.Unavailable, "busy"))
			require.Eventually(t, func() bool {
				got, err := b.Get(context.Background(), st.GetRunId())
				return err == nil && got.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION
			}, 10*time.Second, 5*time.Millisecond, "b sees the state a saved")

			g.Answer("ask", controlstest.OK("second time lucky"))
			got, err := b.Decide(context.Background(), st.GetRunId(), stubbornv1.Decision_DECISION_RETRY, nil)
			require.NoError(t, err, "b carries the decision to a")
			assert.NotEqual(t, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, got.GetStatus())
			fin := runstest.Final(t, runstest.WatchAll(t, b, st.GetRunId(), 0)) // b follows a's run through the store
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, fin.GetStatus())
			_, err = b.Decide(context.Background(), st.GetRunId(), stubbornv1.Decision_DECISION_RETRY, nil)
			assert.ErrorIs(t, err, runs.ErrNotAwaitingDecision)

			hang, err := runstest.Start(a, context.Background(), "hang", runstest.RetrySpec(1), nil)
			require.NoError(t, err)
			require.Eventually(t, func() bool { return g.Called("hang") == 1 }, 10*time.Second, time.Millisecond)
			cancelled, err := b.Cancel(context.Background(), hang.GetRunId())
			require.NoError(t, err, "b carries the cancel to a")
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_CANCELLED, cancelled.GetStatus())
		})
	}
}

// TestACommandWaitsForATakeover: a decision sent to a replica while the
// run's driver has just died (its lease not yet run out) waits, within the
// call's deadline, until the run is taken over and is carried out there;
// before, it was refused UNAVAILABLE ("no responders") at once.
func TestACommandWaitsForATakeover(t *testing.T) {
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			const lease = 300 * time.Millisecond
			open := newStore(t, lease)
			g := runstest.NewGated(controls.DelegateInfo{Idempotent: true})
			a, err := runs.New(runs.Config{Delegates: g, Store: open(), Lease: lease, Owner: "a"})
			require.NoError(t, err)
			b := runstest.NewManager(t, g, runs.Config{Store: open(), Lease: lease, Owner: "b"})
			ask := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{Target: "d", Attempts: new(int32)}}}
			st, err := runstest.Start(a, context.Background(), "ask", ask, nil)
			require.NoError(t, err)
			g.Answer("ask", controlstest.Fail(codes.Unavailable, "busy"))
			require.Eventually(t, func() bool {
				got, err := b.Get(context.Background(), st.GetRunId())
				return err == nil && got.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION
			}, 10*time.Second, 5*time.Millisecond, "b sees the state a saved")

			a.Kill()
			g.Answer("ask", controlstest.OK("after the takeover"))
			ctx, cancel := context.WithTimeout(context.Background(), 20*lease)
			defer cancel()
			got, err := b.Decide(ctx, st.GetRunId(), stubbornv1.Decision_DECISION_RETRY, nil)
			require.NoError(t, err, "the decision waits for b to take the run over")
			assert.NotEqual(t, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, got.GetStatus())
			assert.True(t, b.Owns(st.GetRunId()))
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, runstest.Final(t, runstest.WatchAll(t, b, st.GetRunId(), 0)).GetStatus())
		})
	}
}

// TestAClaimWithoutAJournalIsLetGo: a claim with neither journal nor state
// (they expired) has nothing to resume from: the next server lets go of it
// instead of failing to resume it at every scan.
func TestAClaimWithoutAJournalIsLetGo(t *testing.T) {
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			open := newStore(t, time.Second)
			store := open()
			require.NoError(t, store.Claim(runstest.Ctx(t), "run_unstarted", "gone", nil))
			d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {controlstest.OK("x")}})
			m := runstest.NewManager(t, d, runs.Config{Store: open(), Lease: time.Second, Owner: "next", SoleOwner: true})
			require.Eventually(t, func() bool {
				claimed := false
				require.NoError(t, store.Owners(runstest.Ctx(t), func(runID, _ string) bool {
					claimed = claimed || runID == "run_unstarted"
					return true
				}))
				return !claimed
			}, 10*time.Second, 5*time.Millisecond, "the claim is let go")
			_, err := m.Get(runstest.Ctx(t), "run_unstarted")
			assert.ErrorIs(t, err, runs.ErrNotFound)
		})
	}
}

// TestWatchBatchesLocallyAndThroughTheStore: batches hold at most max
// events, in order, without gaps, whether the watcher's server drives the
// run or follows it through the store.
func TestWatchBatchesLocallyAndThroughTheStore(t *testing.T) {
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			open := newStore(t, time.Second)
			d := controlstest.NewDelegates(map[string][]controlstest.Reply{
				"a": {controlstest.Fail(codes.Unavailable, "down")},
				"b": {controlstest.Fail(codes.Unavailable, "down")},
				"c": {controlstest.OK("fine")},
			})
			driver := runstest.NewManager(t, d, runs.Config{Store: open(), Lease: time.Second, Owner: "driver"})
			other := runstest.NewManager(t, d, runs.Config{Store: open(), Lease: time.Second, Owner: "other"})
			st, err := runstest.Start(driver, context.Background(), "brief", runstest.Chain("a", "b", "c"), nil)
			require.NoError(t, err)
			want := runstest.WatchAll(t, driver, st.GetRunId(), 0)
			require.Greater(t, len(want), 3)

			for _, m := range []*runs.Manager{driver, other} {
				var got []*stubbornv1.RunEvent
				var sizes []int
				require.NoError(t, m.WatchBatches(runstest.Ctx(t), st.GetRunId(), 1, 3, func(evs []runs.Event) error {
					sizes = append(sizes, len(evs))
					got = append(got, runstest.DecodeAll(t, evs)...)
					return nil
				}))
				require.Len(t, got, len(want)-1, "%s: every event after seq 1", m.Owner())
				for i, ev := range got {
					assert.True(t, proto.Equal(want[i+1], ev), "%s: event %d", m.Owner(), i+2)
				}
				for _, n := range sizes {
					assert.True(t, n >= 1 && n <= 3, "%s: a batch of %d", m.Owner(), n)
				}
			}
		})
	}
}

// claimGate is a Store whose Claim waits until the test lets it go on.
type claimGate struct {
	store.Store
	entered, release chan struct{}
}

func (g *claimGate) Claim(ctx context.Context, runID, owner string, state []byte) error {
	close(g.entered)
	<-g.release
	return g.Store.Claim(ctx, runID, owner, state)
}

// TestAStartThatMeetsCloseIsStillAccepted: a server that closes while a
// run starts (its run_started is not written any more) still answers that
// the run is accepted, and the next server resumes it from its saved state.
func TestAStartThatMeetsCloseIsStillAccepted(t *testing.T) {
	store := memstore.NewMemory(time.Second)
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {controlstest.OK("x")}})
	gate := &claimGate{Store: store, entered: make(chan struct{}), release: make(chan struct{})}
	closing := runstest.NewManager(t, d, runs.Config{Store: gate, Lease: time.Second, Owner: "closing"})

	type started struct {
		st  *stubbornv1.ControlState
		err error
	}
	res := make(chan started, 1)
	go func() {
		st, err := runstest.Start(closing, context.Background(), "brief", runstest.Chain("a"), nil)
		res <- started{st, err}
	}()
	<-gate.entered
	closed := make(chan struct{})
	go func() {
		closing.Close()
		close(closed)
	}()
	require.Eventually(t, closing.IsClosedForTest, 10*time.Second, time.Millisecond)
	close(gate.release)
	got := <-res
	require.NoError(t, got.err, "the run's state and claim are saved: it is accepted")
	<-closed

	next := runstest.NewManager(t, d, runs.Config{Store: store, Lease: time.Second, Owner: "next", SoleOwner: true})
	fin := runstest.Final(t, runstest.WatchAll(t, next, got.st.GetRunId(), 0))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, fin.GetStatus())
}

// claimThenGate is a Store whose Claim claims, then waits until the test
// lets it return: its server stalls right after claiming a run.
type claimThenGate struct {
	store.Store
	entered, release chan struct{}
}

func (g *claimThenGate) Claim(ctx context.Context, runID, owner string, state []byte) error {
	err := g.Store.Claim(ctx, runID, owner, state)
	close(g.entered)
	<-g.release
	return err
}

// TestAStarterThatStallsPastItsLeaseIsFencedOut: a server that stalls after
// claiming a new run, for longer than its lease, finds the run taken over
// when it wakes: it still reports the run accepted, its first write (the
// run's first events, before its first call) is refused, and it neither
// calls the delegate, nor drives the run, nor lets go of the new driver's
// claim.
func TestAStarterThatStallsPastItsLeaseIsFencedOut(t *testing.T) {
	const lease = 300 * time.Millisecond
	store := memstore.NewMemory(lease)
	g := runstest.NewGated(controls.DelegateInfo{Idempotent: true})
	gate := &claimThenGate{Store: store, entered: make(chan struct{}), release: make(chan struct{})}
	stalled := runstest.NewManager(t, g, runs.Config{Store: gate, Lease: lease, Owner: "stalled"})
	res := make(chan error, 1)
	var id string
	go func() {
		st, err := runstest.Start(stalled, context.Background(), "x", runstest.Chain("d"), nil)
		id = st.GetRunId()
		res <- err
	}()
	<-gate.entered
	stalled.PauseHeartbeats()
	next := runstest.NewManager(t, g, runs.Config{Store: store, Lease: lease, Owner: "next"})
	require.Eventually(t, func() bool { return g.Called("x") == 1 }, 10*time.Second, time.Millisecond, "next took the run over and called the delegate")
	close(gate.release)
	require.NoError(t, <-res, "the run is accepted: another server drives it")
	require.Eventually(t, func() bool { return !stalled.Owns(id) }, 10*time.Second, time.Millisecond, "the stalled server let the run go")
	assert.Equal(t, 1, g.Called("x"), "only the new driver called the delegate")

	owner := ""
	require.NoError(t, store.Owners(runstest.Ctx(t), func(runID, o string) bool {
		if runID == id {
			owner = o
		}
		return true
	}))
	assert.Equal(t, "next", owner, "the stalled server left the new driver's claim alone")
	g.Answer("x", controlstest.OK("fine"))
	fin := runstest.Final(t, runstest.WatchAll(t, next, id, 0))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, fin.GetStatus())
	assert.Equal(t, 1, g.Called("x"), "the stalled server never called the delegate")
}
