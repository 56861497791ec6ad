package runs_test

import (
	"context"
	"sync"
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
	"github.com/stubbornhq/stubborn/internal/runs/jsstore"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// TestADeletedRunLeavesNoListingEntry deletes runs in every state
// (finished, in an attempt, parked in a backoff, awaiting a decision,
// racing a decision), each through the server that drives it or through
// another that shares the store, and lists on both right after each
// Delete and for a while after the last: no listing (summaries or whole
// states) shows a deleted run, and a follower of the runs' summaries is
// told of each deletion and sends no summary of the run after it. Before,
// the indexer wrote the summary of a cancelled run's end after the purge
// had removed it, and the run stayed in the summaries until a restart.
func TestADeletedRunLeavesNoListingEntry(t *testing.T) {
	for name, open := range stores {
		t.Run(name, func(t *testing.T) { deletedRunsLeaveNoEntry(t, open(t, time.Second)) })
	}
}

func deletedRunsLeaveNoEntry(t *testing.T, open func() store.Store) {
	ctx := runstest.Ctx(t)
	storeA, storeB := open(), open()
	for _, s := range []store.Store{storeA, storeB} {
		if js, ok := s.(*jsstore.JetStream); ok {
			<-js.IndexReconciled()
		}
	}
	g := runstest.NewGated(controls.DelegateInfo{Idempotent: true})
	a := runstest.NewManager(t, g, runs.Config{Store: storeA, Lease: time.Second, Owner: "a", Clock: controls.RealClock{}})
	b := runstest.NewManager(t, g, runs.Config{Store: storeB, Lease: time.Second, Owner: "b", Clock: controls.RealClock{}})

	// A follower on b, from before the runs (a store without an index
	// has none: its server's feed tells of deletions, server/).
	followCtx, stopFollowing := context.WithCancel(ctx)
	var (
		mu       sync.Mutex
		followed []string // "run <id>" or "deleted <id>", in order
	)
	following := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- b.FollowSummaries(followCtx, func(sum *stubbornv1.RunSummary, deleted string) error {
			switch {
			case sum == nil && deleted == "":
				close(following)
			case deleted != "":
				mu.Lock()
				followed = append(followed, "deleted "+deleted)
				mu.Unlock()
			default:
				mu.Lock()
				followed = append(followed, "run "+sum.GetRunId())
				mu.Unlock()
			}
			return nil
		})
	}()
	indexed := true
	select {
	case <-following:
	case err := <-done:
		require.ErrorIs(t, err, runs.ErrNoIndex)
		indexed = false
	}
	t.Cleanup(func() {
		stopFollowing()
		if indexed {
			<-done
		}
	})

	retry := func(attempts int32, onExhausted stubbornv1.OnExhausted, wait time.Duration) *stubbornv1.ControlSpec {
		return &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
			Target: "d", Attempts: &attempts, OnExhausted: onExhausted,
			BaseWait: durationpb.New(wait), MaxWait: durationpb.New(wait),
		}}}
	}
	g.Answer("finished", controlstest.OK("done"))
	g.Answer("parked", controlstest.Fail(codes.Unavailable, "busy"))
	g.Answer("awaiting", controlstest.Fail(codes.Unavailable, "busy"))
	g.Answer("racing", controlstest.Fail(codes.Unavailable, "busy"))
	kinds := []struct {
		brief string
		spec  *stubbornv1.ControlSpec
		want  stubbornv1.RunStatus
	}{
		{"finished", retry(1, stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL, time.Millisecond), stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED},
		{"attempt", retry(2, stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL, time.Millisecond), stubbornv1.RunStatus_RUN_STATUS_RUNNING},
		{"parked", retry(3, stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL, time.Hour), stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF},
		{"awaiting", retry(0, stubbornv1.OnExhausted_ON_EXHAUSTED_ASK, time.Millisecond), stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION},
		{"racing", retry(0, stubbornv1.OnExhausted_ON_EXHAUSTED_ASK, time.Millisecond), stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION},
	}
	var ids []string
	for _, k := range kinds {
		st, err := runstest.Start(a, context.Background(), k.brief, k.spec, nil)
		require.NoError(t, err)
		ids = append(ids, st.GetRunId())
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for i, id := range ids {
			st, err := a.Get(ctx, id)
			if assert.NoError(c, err) {
				assert.Equal(c, kinds[i].want, st.GetStatus(), kinds[i].brief)
			}
		}
		assert.Equal(c, 1, g.Called("attempt"))
	}, 10*time.Second, 5*time.Millisecond, "runs in every state")
	if indexed {
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			for name, m := range map[string]*runs.Manager{"a": a, "b": b} {
				listed := runstest.Summaries(t, ctx, m)
				for _, id := range ids {
					assert.Contains(c, listed, id, name)
				}
			}
		}, 10*time.Second, 5*time.Millisecond, "every run is indexed before it is deleted")
	}

	notListed := func(c assert.TestingT, id, when string) {
		for name, m := range map[string]*runs.Manager{"a": a, "b": b} {
			sums, _, err := m.ListSummaries(ctx, runs.Filter{}, 100, "")
			if assert.NoError(c, err) {
				for _, s := range sums {
					assert.NotEqual(c, id, s.GetRunId(), "%s: in %s's summaries %s", id, name, when)
				}
			}
			states, _, err := m.ListWhere(ctx, runs.Filter{}, 100, "")
			if assert.NoError(c, err) {
				for _, st := range states {
					assert.NotEqual(c, id, st.GetRunId(), "%s: in %s's listing %s", id, name, when)
				}
			}
		}
	}
	for i, id := range ids {
		by := a
		if i%2 == 1 {
			by = b // through a server that does not drive it
		}
		if kinds[i].brief == "racing" {
			decided := make(chan struct{})
			go func() {
				defer close(decided)
				_, _ = a.Decide(ctx, id, stubbornv1.Decision_DECISION_RETRY, nil)
			}()
			require.NoError(t, by.Delete(ctx, id, true), kinds[i].brief)
			<-decided
		} else {
			require.NoError(t, by.Delete(ctx, id, true), kinds[i].brief)
		}
		notListed(t, id, "right after its Delete")
	}
	// What a write queued before the deletion would bring back comes
	// within a few of the indexer's delays.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		for _, id := range ids {
			notListed(t, id, "after its Delete")
		}
		if t.Failed() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !indexed {
		return
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			assert.Contains(c, followed, "deleted "+id)
		}
	}, 10*time.Second, 5*time.Millisecond, "the follower is told of every deletion")
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		deleted := false
		for _, f := range followed {
			switch f {
			case "deleted " + id:
				deleted = true
			case "run " + id:
				assert.False(t, deleted, "%s: a summary after its deletion", id)
			}
		}
	}
}
