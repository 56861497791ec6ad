package jsstore

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
)

// TestTheIndexListsATenantsRunsOfEveryReplica: two servers share a
// JetStream store. Each lists, from the index, the runs of its caller's
// tenant that either drives, with their current status, and never
// another tenant's; a follower on one sees the other's runs start and
// change status.
func TestTheIndexListsATenantsRunsOfEveryReplica(t *testing.T) {
	e := startEmbedded(t)
	storeA, _ := openJetStream(t, e, JetStreamConfig{Lease: time.Second})
	storeB, _ := openJetStream(t, e, JetStreamConfig{Lease: time.Second})
	require.Eventually(t, func() bool { return storeA.IndexReady() && storeB.IndexReady() }, 10*time.Second, 10*time.Millisecond)
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{
		"a": {controlstest.OK("fine")},
		"d": {{Err: &controls.CallError{Code: codes.Unavailable, Message: "refused", NotSent: true}}},
	})
	zero := int32(0)
	ask := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
		Target: "d", Attempts: &zero, OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_ASK,
	}}}
	mA := runstest.NewManager(t, d, runs.Config{Store: storeA, Lease: time.Second, Owner: "a"})
	mB := runstest.NewManager(t, d, runs.Config{Store: storeB, Lease: time.Second, Owner: "b"})
	acme := runs.WithTenant(runstest.Ctx(t), "acme")
	other := runs.WithTenant(runstest.Ctx(t), "other")

	// A follower on A, from before the runs.
	followCtx, stopFollowing := context.WithCancel(acme)
	var (
		mu       sync.Mutex
		followed []*stubbornv1.RunSummary
		done     = make(chan error, 1)
		started  = make(chan struct{})
	)
	go func() {
		done <- mA.FollowSummaries(followCtx, func(s *stubbornv1.RunSummary, deleted string) error {
			if deleted != "" {
				return nil
			}
			if s == nil {
				close(started)
				return nil
			}
			mu.Lock()
			followed = append(followed, s)
			mu.Unlock()
			return nil
		})
	}()
	<-started

	onA, err := runstest.Start(mA, acme, "brief", runstest.Chain("a"), nil)
	require.NoError(t, err)
	onB, err := runstest.Start(mB, acme, "brief", ask, nil)
	require.NoError(t, err)
	theirs, err := runstest.Start(mB, other, "brief", runstest.Chain("a"), nil)
	require.NoError(t, err)

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		got := runstest.Summaries(t, acme, mA)
		assert.Len(c, got, 2, "acme's two runs, not other's")
		assert.Equal(c, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, got[onA.GetRunId()].GetStatus())
		// B's run waits for a decision: A reads it from the index,
		// B's summary.
		assert.Equal(c, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, got[onB.GetRunId()].GetStatus())
		assert.Equal(c, []string{"d"}, got[onB.GetRunId()].GetDelegates())
		assert.Equal(c, "retry", got[onB.GetRunId()].GetControl())
	}, 10*time.Second, 20*time.Millisecond)
	assert.NotContains(t, runstest.Summaries(t, acme, mB), theirs.GetRunId())
	assert.Contains(t, runstest.Summaries(t, other, mA), theirs.GetRunId(), "other's run, listed for other")

	// Filters and pages.
	page, next, err := mA.ListSummaries(acme, runs.Filter{Control: "retry"}, 10, "")
	require.NoError(t, err)
	require.Len(t, page, 1)
	assert.Equal(t, onB.GetRunId(), page[0].GetRunId())
	assert.Empty(t, next)
	page, next, err = mA.ListSummaries(acme, runs.Filter{}, 1, "")
	require.NoError(t, err)
	require.Len(t, page, 1)
	assert.Equal(t, onB.GetRunId(), page[0].GetRunId(), "newest first")
	page, _, err = mA.ListSummaries(acme, runs.Filter{}, 1, next)
	require.NoError(t, err)
	require.Len(t, page, 1)
	assert.Equal(t, onA.GetRunId(), page[0].GetRunId())

	// The follower on A saw B's run (and its own), never other's.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		mu.Lock()
		defer mu.Unlock()
		seen := map[string]stubbornv1.RunStatus{}
		for _, s := range followed {
			seen[s.GetRunId()] = s.GetStatus()
		}
		assert.Equal(c, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, seen[onB.GetRunId()])
		assert.Equal(c, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, seen[onA.GetRunId()])
		assert.NotContains(c, seen, theirs.GetRunId())
	}, 10*time.Second, 20*time.Millisecond)
	stopFollowing()
	assert.ErrorIs(t, <-done, context.Canceled)
}

// TestTheIndexIsReconciledOnStart: summaries that are missing or stale
// (a server that stopped before its indexer wrote them, an older version
// that kept no index) are written when a server starts on the store, and
// until then listing reads the states.
func TestTheIndexIsReconciledOnStart(t *testing.T) {
	e := startEmbedded(t)
	store, nc := openJetStream(t, e, JetStreamConfig{Lease: time.Second})
	require.Eventually(t, store.IndexReady, 10*time.Second, 10*time.Millisecond)
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {controlstest.OK("fine")}})
	m := runstest.NewManager(t, d, runs.Config{Store: store, Lease: time.Second, Owner: "a"})
	ctx := runstest.Ctx(t)
	var ids []string
	for range 3 {
		st, err := runstest.Start(m, ctx, "brief", runstest.Chain("a"), nil)
		require.NoError(t, err)
		runstest.Final(t, runstest.WatchAll(t, m, st.GetRunId(), 0))
		ids = append(ids, st.GetRunId())
	}
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	index, err := js.KeyValue(ctx, "stubborn_index")
	require.NoError(t, err)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		keys, err := index.ListKeys(ctx)
		if !assert.NoError(c, err) {
			return
		}
		n := 0
		for range keys.Keys() {
			n++
		}
		assert.Equal(c, 3, n)
	}, 10*time.Second, 10*time.Millisecond)
	// Damage it: one summary gone, one stale.
	keys, err := index.ListKeys(ctx)
	require.NoError(t, err)
	var all []string
	for k := range keys.Keys() {
		all = append(all, k)
	}
	require.NoError(t, index.Purge(ctx, all[0]))
	stale, err := index.Get(ctx, all[1])
	require.NoError(t, err)
	_, err = index.Put(ctx, all[2], stale.Value()) // another run's summary
	require.NoError(t, err)

	// A new server on the store lists them right once it has reconciled.
	store2, _ := openJetStream(t, e, JetStreamConfig{Lease: time.Second})
	m2 := runstest.NewManager(t, d, runs.Config{Store: store2, Lease: time.Second, Owner: "b"})
	require.Eventually(t, store2.IndexReady, 10*time.Second, 10*time.Millisecond)
	got := runstest.Summaries(t, ctx, m2)
	require.Len(t, got, 3)
	for _, id := range ids {
		assert.Equal(t, id, got[id].GetRunId())
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, got[id].GetStatus(), "run %s", id)
	}
	// Listing reads the index, not the states: a summary purged behind
	// the servers' backs is not listed (by a server that does not drive
	// the run) until the next reconcile.
	require.NoError(t, index.Purge(ctx, all[0]))
	assert.Len(t, runstest.Summaries(t, ctx, m2), 2)
}
