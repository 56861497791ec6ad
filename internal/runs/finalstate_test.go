package runs_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	runstore "github.com/stubbornhq/stubborn/internal/runs/store"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/jstest"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
	"github.com/stubbornhq/stubborn/internal/runs/jsstore"
)

// listed returns the runs List gives, by id, failing on a run listed twice.
func listed(t *testing.T, m *runs.Manager) map[string]*stubbornv1.ControlState {
	t.Helper()
	list, _, err := m.List(runstest.Ctx(t), stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED, 100, "")
	require.NoError(t, err)
	out := map[string]*stubbornv1.ControlState{}
	for _, st := range list {
		require.NotContains(t, out, st.GetRunId(), "listed twice")
		out[st.GetRunId()] = st
	}
	return out
}

// TestOnJetStreamARunsEndIsReadFromItsJournal: on JetStream a run that saved
// no state before its end does not save its final one (a write less per
// run): the store's State and States read it from the journal's
// run_finished, so every reader still sees the run finished, listed once.
// A run that did save a state (it waited for a decision) saves its final
// one too, so that the saved one is never stale; and a run still going is
// listed with its claim's state.
func TestOnJetStreamARunsEndIsReadFromItsJournal(t *testing.T) {
	store, nc := jstest.Open(t, jsstore.JetStreamConfig{Lease: time.Second})
	states := runstest.StatesBucket(t, nc)

	g := runstest.NewGated(controls.DelegateInfo{Idempotent: true})
	m := runstest.NewManager(t, g, runs.Config{Store: store, Lease: time.Second})
	// A second server's view: only the store.
	other := runstest.NewManager(t, g, runs.Config{Store: store, Lease: time.Second})
	assert.Empty(t, listed(t, m), "no journal at all: List answers, empty")

	// One attempt, never waiting: no state saved, ever.
	plain, err := runstest.Start(m, context.Background(), "plain", runstest.Chain("d"), nil)
	require.NoError(t, err)
	g.Answer("plain", controlstest.OK("done"))
	plainFinal := runstest.Final(t, runstest.WatchAll(t, m, plain.GetRunId(), 0))
	require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, plainFinal.GetStatus())

	// Waits for a decision (a saved state), then succeeds.
	asked := runstest.StartAsking(t, m, g, states, "asked")
	g.Answer("asked", controlstest.OK("done"))
	_, err = m.Decide(runstest.Ctx(t), asked, stubbornv1.Decision_DECISION_RETRY, nil)
	require.NoError(t, err)
	askedFinal := runstest.Final(t, runstest.WatchAll(t, m, asked, 0))
	require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, askedFinal.GetStatus())

	// Still going: its call waits.
	going, err := runstest.Start(m, context.Background(), "going", runstest.Chain("d"), nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return g.Called("going") == 1 }, 5*time.Second, time.Millisecond)

	assert.Nil(t, runstest.SavedState(t, states, plain.GetRunId()), "the plain run saved no state")
	assert.True(t, proto.Equal(askedFinal, runstest.SavedState(t, states, asked)), "the saved state of the asked run is its final one")
	assert.Nil(t, runstest.SavedState(t, states, going.GetRunId()), "the running run's state is its claim's")

	for _, c := range []struct {
		id   string
		want *stubbornv1.ControlState
	}{{plain.GetRunId(), plainFinal}, {asked, askedFinal}} {
		got, err := store.State(runstest.Ctx(t), c.id)
		require.NoError(t, err)
		assert.True(t, proto.Equal(c.want, got), "store.State of %s", c.id)
		got, err = other.Get(runstest.Ctx(t), c.id)
		require.NoError(t, err)
		assert.True(t, proto.Equal(c.want, got), "Get of %s", c.id)
	}
	got, err := store.State(runstest.Ctx(t), going.GetRunId())
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_RUNNING, got.GetStatus())

	list := listed(t, other)
	require.Len(t, list, 3)
	assert.True(t, proto.Equal(plainFinal, list[plain.GetRunId()]))
	assert.True(t, proto.Equal(askedFinal, list[asked]))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_RUNNING, list[going.GetRunId()].GetStatus())

	g.Answer("going", controlstest.OK("done"))
	goingFinal := runstest.Final(t, runstest.WatchAll(t, m, going.GetRunId(), 0))
	assert.True(t, proto.Equal(goingFinal, listed(t, other)[going.GetRunId()]), "listed finished once it is")
}

// TestAResumedRunSavesItsFinalState: a server that takes a run over cannot
// tell whether its driver before saved a state (which the journal's end
// would not replace), so it saves the final one: here a run cancelled
// while it awaits a decision, a status its first driver saved.
func TestAResumedRunSavesItsFinalState(t *testing.T) {
	const lease = 200 * time.Millisecond
	store, nc := jstest.Open(t, jsstore.JetStreamConfig{Lease: lease})
	states := runstest.StatesBucket(t, nc)

	g := runstest.NewGated(controls.DelegateInfo{Idempotent: true})
	first, err := runs.New(runs.Config{Delegates: g, Store: store, Lease: lease, Owner: "first"})
	require.NoError(t, err)
	id := runstest.StartAsking(t, first, g, states, "b")
	first.Kill()

	second := runstest.NewManager(t, g, runs.Config{Store: store, Lease: lease, Owner: "second", SoleOwner: true})
	require.Eventually(t, func() bool { return second.Owns(id) }, 10*time.Second, 5*time.Millisecond, "taken over")
	_, err = second.Cancel(runstest.Ctx(t), id)
	require.NoError(t, err)
	fin := runstest.Final(t, runstest.WatchAll(t, second, id, 0))
	require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_CANCELLED, fin.GetStatus())
	require.Eventually(t, func() bool { return proto.Equal(fin, runstest.SavedState(t, states, id)) },
		5*time.Second, time.Millisecond, "the final state is saved")
	got, err := store.State(runstest.Ctx(t), id)
	require.NoError(t, err)
	assert.True(t, proto.Equal(fin, got))
}

// slowRelease holds every Release until release is closed.
type slowRelease struct {
	runs.JournalFinal
	release chan struct{}
}

func (s slowRelease) Release(ctx context.Context, runID string) error {
	select {
	case <-s.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.JournalFinal.Release(ctx, runID)
}

// TestARunJustFinishedReadsFinishedEverywhere: between a run's last
// journal write and the release of its claim, another server reads the
// run finished (the journal's run_finished), not the claim's RUNNING.
func TestARunJustFinishedReadsFinishedEverywhere(t *testing.T) {
	// Claims in owners entries: a claim in the journal goes with the
	// run's last write, and there is no moment between the two.
	store, _ := jstest.Open(t, jsstore.JetStreamConfig{Lease: time.Second, ClaimInOwners: true})
	held := slowRelease{runs.JournalFinal{Store: store}, make(chan struct{})}
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {controlstest.OK("x")}})
	a := runstest.NewManager(t, d, runs.Config{Store: held, Lease: time.Second})
	b := runstest.NewManager(t, d, runs.Config{Store: store, Lease: time.Second})
	t.Cleanup(func() { close(held.release) }) // before the managers close: a's waits for its release
	st, err := runstest.Start(a, context.Background(), "brief", runstest.Chain("a"), nil)
	require.NoError(t, err)
	fin := runstest.Final(t, runstest.WatchAll(t, a, st.GetRunId(), 0))
	driver, err := store.Driver(runstest.Ctx(t), st.GetRunId())
	require.NoError(t, err)
	require.NotEmpty(t, driver, "the claim is still held")
	got, err := b.Get(runstest.Ctx(t), st.GetRunId())
	require.NoError(t, err)
	assert.True(t, proto.Equal(fin, got), "finished, from the journal: got %v", got.GetStatus())
	assert.True(t, proto.Equal(fin, listed(t, b)[st.GetRunId()]))
}

// ambiguousStates saves every BACKING_OFF state and reports a failure, as
// a write whose answer timed out.
type ambiguousStates struct{ runs.JournalFinal }

func (a ambiguousStates) PutState(ctx context.Context, runID string, state []byte) error {
	if err := a.JournalFinal.PutState(ctx, runID, state); err != nil {
		return err
	}
	st := &stubbornv1.ControlState{}
	if err := proto.Unmarshal(state, st); err != nil {
		return err
	}
	if st.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF {
		return errors.New("timeout")
	}
	return nil
}

// TestASaveThatMayHaveLandedIsSavedOver: a state write that fails may have
// landed all the same; the run then saves its next status, and its end,
// over it.
func TestASaveThatMayHaveLandedIsSavedOver(t *testing.T) {
	store, nc := jstest.Open(t, jsstore.JetStreamConfig{Lease: time.Second})
	states := runstest.StatesBucket(t, nc)
	g := runstest.NewGated(controls.DelegateInfo{Idempotent: true})
	g.Answer("brief", controlstest.Fail(codes.Unavailable, "busy"))
	g.Answer("brief", controlstest.OK("x"))
	m := runstest.NewManager(t, g, runs.Config{Store: ambiguousStates{runs.JournalFinal{Store: store}}, Lease: time.Second})
	st, err := runstest.Start(m, context.Background(), "brief", runstest.RetrySpec(2), nil)
	require.NoError(t, err)
	fin := runstest.Final(t, runstest.WatchAll(t, m, st.GetRunId(), 0))
	require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, fin.GetStatus(), fin.GetStatusReason())
	require.Eventually(t, func() bool { return proto.Equal(fin, runstest.SavedState(t, states, st.GetRunId())) },
		5*time.Second, time.Millisecond, "the end is saved over the BACKING_OFF that may have landed")
}

// TestSaveFinalStatesSavesEveryEnd: with SaveFinalStates (a rolling
// upgrade from servers that read finished runs from the states bucket
// only), a run that saved nothing before saves its end.
func TestSaveFinalStatesSavesEveryEnd(t *testing.T) {
	store, nc := jstest.Open(t, jsstore.JetStreamConfig{Lease: time.Second, SaveFinalStates: true})
	require.False(t, runs.ReadsFinalFromJournal(store))
	states := runstest.StatesBucket(t, nc)
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {controlstest.OK("x")}})
	m := runstest.NewManager(t, d, runs.Config{Store: store, Lease: time.Second})
	st, err := runstest.Start(m, context.Background(), "brief", runstest.Chain("a"), nil)
	require.NoError(t, err)
	fin := runstest.Final(t, runstest.WatchAll(t, m, st.GetRunId(), 0))
	require.Eventually(t, func() bool { return proto.Equal(fin, runstest.SavedState(t, states, st.GetRunId())) },
		5*time.Second, time.Millisecond, "the end is saved")
}

// TestListingReadsEveryJournal: ListRuns reads the last message of every
// journal, past the consumer's first batches, and ends.
func TestListingReadsEveryJournal(t *testing.T) {
	store, _ := jstest.Open(t, jsstore.JetStreamConfig{Lease: time.Second, Memory: true})
	const n = 1200
	for i := range n {
		id := fmt.Sprintf("run_%04d", i)
		ev, err := runstore.EncodeEvent(&stubbornv1.RunEvent{RunId: id, Seq: 1, Kind: &stubbornv1.RunEvent_RunFinished{RunFinished: &stubbornv1.RunFinished{
			State: &stubbornv1.ControlState{RunId: id, Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED},
		}}})
		require.NoError(t, err)
		require.NoError(t, store.Append(runstest.Ctx(t), nil, ev))
	}
	seen := map[string]bool{}
	require.NoError(t, store.States(runstest.Ctx(t), func(st *stubbornv1.ControlState) bool {
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus())
		seen[st.GetRunId()] = true
		return true
	}))
	assert.Len(t, seen, n)
}
