package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
)

func TestListRunsSummariesAndFilters(t *testing.T) {
	for _, js := range []bool{false, true} {
		t.Run(fmt.Sprintf("jetstream=%t", js), func(t *testing.T) { listRunsSummaries(t, js) })
	}
}

func listRunsSummaries(t *testing.T, js bool) {
	e := startWith(t, setup{jetstream: js})
	ctx := testCtx(t)
	chain, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "a long brief", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"down", "echo"}}})
	require.NoError(t, err)
	runToEnd(t, ctx, e.client, chain.GetRunId())
	retry, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "b", Retry: &stubbornv1.RetrySpec{Target: "flaky"}})
	require.NoError(t, err)
	runToEnd(t, ctx, e.client, retry.GetRunId())

	res, err := e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{View: stubbornv1.RunView_RUN_VIEW_SUMMARY})
	require.NoError(t, err)
	assert.Empty(t, res.GetRuns(), "summaries only")
	require.Len(t, res.GetSummaries(), 2)
	s := res.GetSummaries()[1] // newest first
	assert.Equal(t, chain.GetRunId(), s.GetRunId())
	assert.Equal(t, "fallback_chain", s.GetControl())
	assert.Equal(t, []string{"down", "echo"}, s.GetDelegates())
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, s.GetStatus())
	assert.Equal(t, "echo", s.GetWinner())
	assert.EqualValues(t, 2, s.GetAttempts())
	assert.NotNil(t, s.GetCreateTime())

	for _, c := range []struct {
		req  *stubbornv1.ListRunsRequest
		want []string
	}{
		{&stubbornv1.ListRunsRequest{Control: "retry"}, []string{retry.GetRunId()}},
		{&stubbornv1.ListRunsRequest{Delegate: "echo"}, []string{chain.GetRunId()}},
		{&stubbornv1.ListRunsRequest{Delegate: "flaky", Control: "fallback_chain"}, nil},
	} {
		c.req.View = stubbornv1.RunView_RUN_VIEW_SUMMARY
		res, err := e.client.ListRuns(ctx, c.req)
		require.NoError(t, err)
		var got []string
		for _, s := range res.GetSummaries() {
			got = append(got, s.GetRunId())
		}
		assert.Equal(t, c.want, got, "%v", c.req)
	}
	full, err := e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{Control: "fallback_chain"})
	require.NoError(t, err)
	require.Len(t, full.GetRuns(), 1)
	assert.Equal(t, "a long brief", full.GetRuns()[0].GetTaskBrief())

	_, err = e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{Control: "retrying"})
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "control: must be one of retry, retry_with_learning, fallback_chain, race, balance")
	_, err = e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{View: 9})
	assert.Contains(t, status.Convert(err).Message(), "view: unknown value 9")
}

func TestListDelegatesShowsWhatATenantMayUse(t *testing.T) {
	tenants := twoTenants(delegates.Limits{}, delegates.Limits{})
	tenants[1].Delegates = []string{"echo", "flaky"}
	e := startWith(t, setup{tenants: tenants, notIdempotent: []string{"down"}})
	ctx := testCtx(t)
	res, err := e.client.ListDelegates(as(ctx, tokenB), &stubbornv1.ListDelegatesRequest{})
	require.NoError(t, err)
	var names []string
	for _, d := range res.GetDelegates() {
		names = append(names, d.GetName())
		assert.Equal(t, "grpc", d.GetKind())
		assert.True(t, d.GetIdempotent())
		assert.Equal(t, time.Minute, d.GetTimeout().AsDuration())
	}
	assert.ElementsMatch(t, []string{"echo", "flaky"}, names)

	// a sees every delegate; a fallback chain asks down's health, which
	// is then reported.
	_, err = e.client.Run(as(ctx, tokenA), &stubbornv1.RunRequest{TaskBrief: "x", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"down", "echo"}}})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		res, err := e.client.ListDelegates(as(ctx, tokenA), &stubbornv1.ListDelegatesRequest{})
		require.NoError(t, err)
		for _, d := range res.GetDelegates() {
			if d.GetName() == "down" {
				return d.GetHealth() == stubbornv1.DelegateHealth_DELEGATE_HEALTH_NOT_SERVING && !d.GetIdempotent()
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond)
}

// TestWatchRunsFollowsStartsAndStatusChanges, on the memory store (the
// runs this server drives) and on JetStream (its listing index).
func TestWatchRunsFollowsStartsAndStatusChanges(t *testing.T) {
	for _, js := range []bool{false, true} {
		t.Run(fmt.Sprintf("jetstream=%t", js), func(t *testing.T) { watchRunsFollows(t, js) })
	}
}

func watchRunsFollows(t *testing.T, js bool) {
	e := startWith(t, setup{tenants: twoTenants(delegates.Limits{}, delegates.Limits{}), jetstream: js})
	ctx := testCtx(t)
	wctx, stop := context.WithCancel(as(ctx, tokenA))
	defer stop()
	feed, err := e.client.WatchRuns(wctx, &stubbornv1.WatchRunsRequest{Control: "retry"})
	require.NoError(t, err)
	first, err := feed.Recv() // the stream follows: runs from now on are seen
	require.NoError(t, err)
	assert.Nil(t, first.GetRun(), "the first message says the stream follows")

	// b's run and a's chain are not a's retries: not seen.
	_, err = e.client.StartRun(as(ctx, tokenB), &stubbornv1.StartRunRequest{TaskBrief: "b", Retry: &stubbornv1.RetrySpec{Target: "echo"}})
	require.NoError(t, err)
	_, err = e.client.StartRun(as(ctx, tokenA), &stubbornv1.StartRunRequest{TaskBrief: "c", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}})
	require.NoError(t, err)
	id := awaiting(t, as(ctx, tokenA), e.client)

	var seen []stubbornv1.RunStatus
	for {
		m, err := feed.Recv()
		require.NoError(t, err)
		require.Equal(t, id, m.GetRun().GetRunId(), "only a's retries")
		seen = append(seen, m.GetRun().GetStatus())
		if m.GetRun().GetStatus() == stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION {
			break
		}
	}
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_RUNNING, seen[0], "a run is seen as it starts: %v", seen)
	_, err = e.client.DecideRun(as(ctx, tokenA), &stubbornv1.DecideRunRequest{RunId: id, Decision: stubbornv1.Decision_DECISION_FAIL})
	require.NoError(t, err)
	for {
		m, err := feed.Recv()
		require.NoError(t, err)
		if s := m.GetRun().GetStatus(); s == stubbornv1.RunStatus_RUN_STATUS_FAILED {
			assert.Equal(t, "retry", m.GetRun().GetControl())
			break
		}
	}
}
