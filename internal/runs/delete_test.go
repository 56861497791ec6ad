package runs_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/jstest"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
	"github.com/stubbornhq/stubborn/internal/runs/jsstore"
)

// TestADeletedRunIsGoneEverywhere: a run that server A drove and keeps in
// memory, deleted through server B, is gone from every read on both: its
// state, journal and summary, and its idempotency key names nothing. A
// run in flight is deleted only when asked to cancel it.
func TestADeletedRunIsGoneEverywhere(t *testing.T) {
	e := jstest.Start(t)
	storeA, _ := jstest.OpenOn(t, e, jsstore.JetStreamConfig{Lease: time.Second})
	storeB, _ := jstest.OpenOn(t, e, jsstore.JetStreamConfig{Lease: time.Second})
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{
		"a": {controlstest.OK("x"), controlstest.OK("y")},
		"d": {{Err: &controls.CallError{Code: codes.Unavailable, Message: "refused", NotSent: true}}},
	})
	mA := runstest.NewManager(t, d, runs.Config{Store: storeA, Lease: time.Second, Owner: "a"})
	mB := runstest.NewManager(t, d, runs.Config{Store: storeB, Lease: time.Second, Owner: "b"})
	ctx := runstest.Ctx(t)
	<-storeA.IndexReconciled()
	<-storeB.IndexReconciled()

	st, _, err := mA.Start(ctx, runs.Task{Brief: "brief"}, runstest.Chain("a"), keyed("order-42", nil))
	require.NoError(t, err)
	runstest.Final(t, runstest.WatchAll(t, mA, st.GetRunId(), 0))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Contains(c, runstest.Summaries(t, ctx, mB), st.GetRunId())
	}, 10*time.Second, 10*time.Millisecond)

	require.NoError(t, mB.Delete(ctx, st.GetRunId(), false))
	for name, m := range map[string]*runs.Manager{"b": mB, "a, which drove it": mA} {
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			_, err := m.Get(ctx, st.GetRunId())
			assert.ErrorIs(c, err, runs.ErrNotFound, name)
		}, 10*time.Second, 10*time.Millisecond)
		assert.NotContains(t, runstest.Summaries(t, ctx, m), st.GetRunId(), name)
	}
	evs, err := storeB.Events(ctx, st.GetRunId(), 0)
	require.NoError(t, err)
	assert.Empty(t, evs)
	again, existing, err := mB.Start(ctx, runs.Task{Brief: "brief"}, runstest.Chain("a"), keyed("order-42", nil))
	require.NoError(t, err)
	assert.False(t, existing, "the key names nothing any more")
	assert.NotEqual(t, st.GetRunId(), again.GetRunId())

	// In flight (awaiting a decision): only with cancel.
	zero := int32(0)
	waiting, err := runstest.Start(mA, ctx, "brief", &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
		Target: "d", Attempts: &zero, OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_ASK,
	}}}, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		got, err := mA.Get(ctx, waiting.GetRunId())
		return err == nil && got.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION
	}, 10*time.Second, 10*time.Millisecond)
	assert.ErrorIs(t, mA.Delete(ctx, waiting.GetRunId(), false), runs.ErrNotFinished)
	require.NoError(t, mA.Delete(ctx, waiting.GetRunId(), true))
	_, err = mA.Get(ctx, waiting.GetRunId())
	assert.ErrorIs(t, err, runs.ErrNotFound)

	// Another tenant's run is not there to delete.
	assert.ErrorIs(t, mA.Delete(runs.WithTenant(ctx, "other"), again.GetRunId(), false), runs.ErrNotFound)
}
