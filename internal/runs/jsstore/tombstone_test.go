package jsstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// TestADeletedRunIsNeverResumed deletes runs in every state (finished, in
// an attempt, parked in a backoff, awaiting a decision), has the server
// crash at each step of the deletion (JetStream: DeleteCrashAt) or, with
// the deletion done, has the store bring records of the runs back as a
// NATS server's crash recovery did (their claims and journals), kills the
// server and starts another on the store: none of the runs is resumed, no
// delegate is called again, and each is NOT_FOUND. Before, a run whose
// claim came back was resumed from it (issue 29, "DeleteRun is undone by a
// crash").
func TestADeletedRunIsNeverResumed(t *testing.T) {
	steps := map[string][]string{
		"memory":    {""},
		"jetstream": {"", "tombstone", "summary", "state", "owner's entry", "journal"},
	}
	for name, newStore := range stores {
		for _, step := range steps[name] {
			label := step
			if label == "" {
				label = "deleted, then its records came back"
			}
			t.Run(name+"/"+label, func(t *testing.T) {
				deletedAndCrashed(t, newStore, step)
			})
		}
	}
}

func deletedAndCrashed(t *testing.T, newStore func(*testing.T, time.Duration) func() store.Store, step string) {
	const lease = 300 * time.Millisecond
	ctx := runstest.Ctx(t)
	open := newStore(t, lease)
	store := open()
	g := runstest.NewGated(controls.DelegateInfo{Idempotent: true})
	a, err := runs.New(runs.Config{Delegates: g, Store: store, Lease: lease, Owner: "a"})
	require.NoError(t, err)
	t.Cleanup(a.Close)

	retry := func(target string, attempts int32, onExhausted stubbornv1.OnExhausted, wait time.Duration) *stubbornv1.ControlSpec {
		return &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
			Target: target, Attempts: &attempts, OnExhausted: onExhausted,
			BaseWait: durationpb.New(wait), MaxWait: durationpb.New(wait),
		}}}
	}
	g.Answer("finished", controlstest.OK("done"))
	g.Answer("parked", controlstest.Fail(codes.Unavailable, "busy"))
	g.Answer("awaiting", controlstest.Fail(codes.Unavailable, "busy"))
	kinds := map[string]struct {
		spec *stubbornv1.ControlSpec
		want stubbornv1.RunStatus
	}{
		"finished": {retry("d", 1, stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL, time.Millisecond), stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED},
		"attempt":  {retry("d", 2, stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL, time.Millisecond), stubbornv1.RunStatus_RUN_STATUS_RUNNING},
		"parked":   {retry("d", 3, stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL, time.Hour), stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF},
		"awaiting": {retry("d", 0, stubbornv1.OnExhausted_ON_EXHAUSTED_ASK, time.Millisecond), stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION},
	}
	ids := map[string]string{}
	for brief, k := range kinds {
		st, err := runstest.Start(a, context.Background(), brief, k.spec, nil)
		require.NoError(t, err)
		ids[brief] = st.GetRunId()
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for brief, id := range ids {
			st, err := a.Get(ctx, id)
			if assert.NoError(c, err) {
				assert.Equal(c, kinds[brief].want, st.GetStatus(), brief)
			}
		}
		assert.Equal(c, 1, g.Called("attempt"))
	}, 10*time.Second, 5*time.Millisecond, "runs in every state")
	journals := map[string][]runs.Event{}
	for brief, id := range ids {
		journals[brief], err = store.Events(ctx, id, 0)
		require.NoError(t, err)
	}

	crash := errors.New("crashed here")
	if step != "" {
		store.(*JetStream).DeleteCrashAt(step, crash)
	}
	for brief, id := range ids {
		err := a.Delete(ctx, id, true)
		if step == "" {
			require.NoError(t, err, brief)
		} else {
			require.ErrorIs(t, err, crash, brief)
		}
	}
	if step == "" {
		// What a NATS server brought back after a SIGKILL: the runs'
		// claims, here with their journals as they were before the
		// deletion (their last events: the cancel's run_finished).
		for brief, id := range ids {
			require.NoError(t, store.Claim(ctx, id, "a", nil), brief)
			require.NoError(t, store.Append(ctx, nil, journals[brief]...), brief)
		}
	}
	a.Kill()
	called := g.Called("")

	b := runstest.NewManager(t, g, runs.Config{Store: open(), Lease: lease, Owner: "b", SoleOwner: true, Clock: controls.RealClock{}})
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for brief, id := range ids {
			_, err := b.Get(ctx, id)
			assert.ErrorIs(c, err, runs.ErrNotFound, brief)
			driver, err := store.Driver(ctx, id)
			assert.NoError(c, err)
			assert.Empty(c, driver, "%s: its claim is gone", brief)
		}
	}, 10*time.Second, 5*time.Millisecond, "every deleted run is gone")
	time.Sleep(2 * lease) // a resumed run would call its delegate by now
	assert.Equal(t, called, g.Called(""), "no delegate called for a deleted run")
	for brief, id := range ids {
		assert.False(t, b.Owns(id), "%s is not resumed", brief)
		_, err := b.Get(ctx, id)
		assert.ErrorIs(t, err, runs.ErrNotFound, brief)
	}
}
