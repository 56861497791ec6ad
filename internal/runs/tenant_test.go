package runs_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
	"github.com/stubbornhq/stubborn/internal/runs/memstore"
)

// TestTenantsSeeOnlyTheirOwnRuns starts a run as tenant a on one replica and
// looks at it as tenant b (and as the default tenant) from that replica and
// from another one sharing the store: every method answers exactly what it
// answers for a run that does not exist, while tenant a sees and cancels it.
func TestTenantsSeeOnlyTheirOwnRuns(t *testing.T) {
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"hang": {{Hang: true}}, "ok": {controlstest.OK("fine")}})
	store := memstore.NewMemory(time.Minute)
	m1 := runstest.NewManager(t, d, runs.Config{Store: store, Owner: "one", CancelOnClose: true})
	m2 := runstest.NewManager(t, d, runs.Config{Store: store, Owner: "two", CancelOnClose: true})

	ctxA := runs.WithTenant(runstest.Ctx(t), "a")
	ctxB := runs.WithTenant(runstest.Ctx(t), "b")
	st, err := runstest.Start(m1, ctxA, "brief", runstest.Chain("hang"), nil)
	require.NoError(t, err)
	id := st.GetRunId()
	assert.Equal(t, "a", st.GetTenant())
	done, err := runstest.Start(m1, ctxB, "brief", runstest.Chain("ok"), nil)
	require.NoError(t, err)
	require.NoError(t, m1.Watch(ctxB, done.GetRunId(), 0, func(runs.Event) error { return nil })) // b's own run, to its end

	const unknown = "run_doesnotexist"
	sameAsUnknown := func(t *testing.T, err, errUnknown error) {
		t.Helper()
		require.ErrorIs(t, err, runs.ErrNotFound)
		require.ErrorIs(t, errUnknown, runs.ErrNotFound)
		assert.Equal(t, strings.ReplaceAll(errUnknown.Error(), unknown, "ID"), strings.ReplaceAll(err.Error(), id, "ID"))
	}
	for _, m := range []*runs.Manager{m1, m2} {
		for name, ctx := range map[string]context.Context{"b": ctxB, "default": runstest.Ctx(t)} {
			t.Run(m.Owner()+"/"+name, func(t *testing.T) {
				_, err := m.Get(ctx, id)
				_, errU := m.Get(ctx, unknown)
				sameAsUnknown(t, err, errU)

				noop := func(runs.Event) error { return nil }
				sameAsUnknown(t, m.Watch(ctx, id, 0, noop), m.Watch(ctx, unknown, 0, noop))

				_, err = m.Decide(ctx, id, stubbornv1.Decision_DECISION_RETRY, nil)
				_, errU = m.Decide(ctx, unknown, stubbornv1.Decision_DECISION_RETRY, nil)
				sameAsUnknown(t, err, errU)

				_, err = m.Cancel(ctx, id)
				_, errU = m.Cancel(ctx, unknown)
				sameAsUnknown(t, err, errU)

				list, next, err := m.List(ctx, stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED, 10, "")
				require.NoError(t, err)
				assert.Empty(t, next)
				for _, s := range list {
					assert.NotEqual(t, id, s.GetRunId(), "another tenant's run is listed")
				}
			})
		}
	}

	// b's own run is listed for b; a's for a, and a's is still running.
	list, _, err := m2.List(ctxB, stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED, 10, "")
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, done.GetRunId(), list[0].GetRunId())
	list, _, err = m2.List(ctxA, stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED, 10, "")
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, id, list[0].GetRunId())
	got, err := m2.Get(ctxA, id)
	require.NoError(t, err)
	assert.Equal(t, "a", got.GetTenant())

	// a cancels it through the other replica.
	got, err = m2.Cancel(ctxA, id)
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_CANCELLED, got.GetStatus())
	var last *stubbornv1.RunEvent
	require.NoError(t, m1.Watch(ctxA, id, 0, runstest.Decoding(func(ev *stubbornv1.RunEvent) error { last = ev; return nil })))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_CANCELLED, last.GetRunFinished().GetState().GetStatus())
}
