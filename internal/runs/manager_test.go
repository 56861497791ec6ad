package runs_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
	"github.com/stubbornhq/stubborn/internal/runs/memstore"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestWatchersSeeTheSameDenseSequence(t *testing.T) {
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{
		"a": {controlstest.Fail(14, "down")},
		"b": {controlstest.OK("fine")},
	})
	m := runstest.NewManager(t, d, runs.Config{})
	st, err := runstest.Start(m, context.Background(), "brief", runstest.Chain("a", "b"), nil)
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_RUNNING, st.GetStatus(), "a run is accepted RUNNING")
	assert.Equal(t, st.GetRunId(), st.GetOptions().GetIdempotencyKey(), "the run id is the default idempotency key")

	const watchers = 50
	got := make([][]*stubbornv1.RunEvent, watchers)
	var wg sync.WaitGroup
	for i := range watchers {
		wg.Go(func() { got[i] = runstest.WatchAll(t, m, st.GetRunId(), 0) })
	}
	wg.Wait()
	for i := range watchers {
		require.Len(t, got[i], len(got[0]))
		for j, ev := range got[i] {
			assert.EqualValues(t, j+1, ev.GetSeq())
			assert.Equal(t, st.GetRunId(), ev.GetRunId())
			assert.True(t, proto.Equal(got[0][j], ev))
		}
	}
	fin := runstest.Final(t, got[0])
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, fin.GetStatus())
	assert.Equal(t, "b", fin.GetWinner())

	// Resuming anywhere gives exactly the rest; past the end, nothing.
	for k := range int64(len(got[0]) + 2) {
		rest := runstest.WatchAll(t, m, st.GetRunId(), k)
		assert.Len(t, rest, max(0, len(got[0])-int(k)), "after_seq %d", k)
	}
	g, err := m.Get(context.Background(), st.GetRunId())
	require.NoError(t, err)
	assert.True(t, proto.Equal(fin, g))
}

func TestCancelEndsAHangingRun(t *testing.T) {
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"hang": {{Hang: true}}})
	m := runstest.NewManager(t, d, runs.Config{})
	st, err := runstest.Start(m, context.Background(), "brief", runstest.Chain("hang"), nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(d.Calls()) == 1 }, 5*time.Second, time.Millisecond)
	got, err := m.Cancel(runstest.Ctx(t), st.GetRunId())
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_CANCELLED, got.GetStatus())
	assert.Equal(t, "cancelled: cancelled by CancelRun", got.GetStatusReason())
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_CANCELLED, got.GetStatusReasonCode())
	assert.Equal(t, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_CANCELLED, got.GetAttemptLog()[0].GetOutcome())
}

func TestRunTimeoutFailsTheRun(t *testing.T) {
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"hang": {{Hang: true}}})
	m := runstest.NewManager(t, d, runs.Config{Clock: controls.RealClock{}})
	st, err := runstest.Start(m, context.Background(), "brief", runstest.Chain("hang"), &stubbornv1.RunOptions{RunTimeout: durationpb.New(20 * time.Millisecond)})
	require.NoError(t, err)
	fin := runstest.Final(t, runstest.WatchAll(t, m, st.GetRunId(), 0))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, fin.GetStatus())
	assert.Equal(t, "run timeout exceeded", fin.GetStatusReason())
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_RUN_TIMEOUT, fin.GetStatusReasonCode())
}

func TestDecideOnlyWhenAwaiting(t *testing.T) {
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {controlstest.OK("x")}})
	m := runstest.NewManager(t, d, runs.Config{})
	st, err := runstest.Start(m, context.Background(), "brief", runstest.Chain("a"), nil)
	require.NoError(t, err)
	runstest.WatchAll(t, m, st.GetRunId(), 0)
	_, err = m.Decide(context.Background(), st.GetRunId(), stubbornv1.Decision_DECISION_RETRY, nil)
	assert.ErrorIs(t, err, runs.ErrNotAwaitingDecision)
	_, err = m.Decide(context.Background(), "run_missing", stubbornv1.Decision_DECISION_RETRY, nil)
	assert.ErrorIs(t, err, runs.ErrNotFound)
}

func TestFinishedRunsBeyondTheMemoryLimitAreServedFromTheStore(t *testing.T) {
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {controlstest.OK("x")}})
	m := runstest.NewManager(t, d, runs.Config{MaxFinished: 2})
	var ids []string
	var finals []*stubbornv1.ControlState
	for range 3 {
		st, err := runstest.Start(m, context.Background(), "brief", runstest.Chain("a"), nil)
		require.NoError(t, err)
		finals = append(finals, runstest.Final(t, runstest.WatchAll(t, m, st.GetRunId(), 0)))
		ids = append(ids, st.GetRunId())
	}
	for i, id := range ids {
		got, err := m.Get(context.Background(), id)
		require.NoError(t, err)
		assert.True(t, proto.Equal(finals[i], got), "run %d", i)
		assert.Len(t, runstest.WatchAll(t, m, id, 0), 4, "run %d replays from the store", i)
	}
}

// panicking is a Delegates whose calls panic, like a bug in a control.
type panicking struct{ controls.Delegates }

func (panicking) Call(context.Context, controls.Call) (*stubbornv1.Result, error) {
	panic("boom")
}

func TestPanicInARunFailsOnlyThatRun(t *testing.T) {
	d := controlstest.NewDelegates(nil)
	m := runstest.NewManager(t, panicking{d}, runs.Config{})
	st, err := runstest.Start(m, context.Background(), "brief", runstest.Chain("a"), nil)
	require.NoError(t, err)
	fin := runstest.Final(t, runstest.WatchAll(t, m, st.GetRunId(), 0))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, fin.GetStatus())
	assert.Equal(t, "internal error", fin.GetStatusReason())
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_INTERNAL_ERROR, fin.GetStatusReasonCode())
	_, err = runstest.Start(m, context.Background(), "again", runstest.Chain("a"), nil)
	assert.NoError(t, err, "the manager still takes runs")
}

func TestListFiltersAndPages(t *testing.T) {
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{
		"ok": {controlstest.OK("x")}, "bad": {controlstest.Fail(3, "no")},
	})
	m := runstest.NewManager(t, d, runs.Config{})
	var ok, bad []string
	for i := range 6 {
		name := "ok"
		if i%2 == 1 {
			name = "bad"
		}
		st, err := runstest.Start(m, context.Background(), "brief", runstest.Chain(name), nil)
		require.NoError(t, err)
		runstest.WatchAll(t, m, st.GetRunId(), 0)
		if name == "ok" {
			ok = append([]string{st.GetRunId()}, ok...)
		} else {
			bad = append([]string{st.GetRunId()}, bad...)
		}
	}
	var got []string
	token := ""
	for {
		page, next, err := m.List(context.Background(), stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED, 2, token)
		require.NoError(t, err)
		for _, st := range page {
			got = append(got, st.GetRunId())
		}
		if token = next; token == "" {
			break
		}
	}
	assert.Equal(t, bad, got)
	all, next, err := m.List(context.Background(), stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED, 100, "")
	require.NoError(t, err)
	assert.Empty(t, next)
	assert.Len(t, all, len(ok)+len(bad))
	_, _, err = m.List(context.Background(), stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED, 1, "bm90LWEtdG9rZW4")
	assert.ErrorIs(t, err, runs.ErrBadPageToken)
}

func TestCloseCancelsRunsAndRefusesNewOnes(t *testing.T) {
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"hang": {{Hang: true}}})
	m, err := runs.New(runs.Config{Store: memstore.NewMemory(runs.DefaultLease), Delegates: d, Clock: controlstest.NewClock(), CancelOnClose: true})
	require.NoError(t, err)
	st, err := runstest.Start(m, context.Background(), "brief", runstest.Chain("hang"), nil)
	require.NoError(t, err)
	m.Close()
	got, err := m.Get(context.Background(), st.GetRunId())
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_CANCELLED, got.GetStatus())
	_, err = runstest.Start(m, context.Background(), "brief", runstest.Chain("hang"), nil)
	assert.ErrorIs(t, err, runs.ErrClosed)
}
