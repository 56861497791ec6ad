package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
)

// TestConcurrentReadsArePerTenant (issue 30 item 2): a tenant's
// max_concurrent_reads bounds its ListRuns, GetRun and WatchRun in
// progress; over it each is RESOURCE_EXHAUSTED with a RetryInfo, while
// another tenant reads on; a read that ends makes room.
func TestConcurrentReadsArePerTenant(t *testing.T) {
	e := startWith(t, setup{tenants: twoTenants(delegates.Limits{MaxConcurrentReads: 2}, delegates.Limits{})})
	ctx := testCtx(t)
	ctxA, ctxB := as(ctx, tokenA), as(ctx, tokenB)
	id := awaiting(t, ctxA, e.client)
	wctx, stop := context.WithCancel(ctxA)
	defer stop()
	for range 2 { // two streams open: a's two reads
		s, err := e.client.WatchRun(wctx, &stubbornv1.WatchRunRequest{RunId: id})
		require.NoError(t, err)
		_, err = s.Recv()
		require.NoError(t, err)
	}
	refused := func(err error) {
		t.Helper()
		st := exhaustedNaming(t, err, "max_concurrent_reads", "tenant:a")
		var retry *errdetails.RetryInfo
		for _, d := range st.Details() {
			if r, ok := d.(*errdetails.RetryInfo); ok {
				retry = r
			}
		}
		require.NotNil(t, retry, "a RetryInfo detail")
		assert.Positive(t, retry.GetRetryDelay().AsDuration())
	}
	_, err := e.client.ListRuns(ctxA, &stubbornv1.ListRunsRequest{PageSize: 1})
	refused(err)
	_, err = e.client.GetRun(ctxA, &stubbornv1.GetRunRequest{RunId: id})
	refused(err)
	s, err := e.client.WatchRun(ctxA, &stubbornv1.WatchRunRequest{RunId: id})
	require.NoError(t, err)
	_, err = s.Recv()
	refused(err)

	// b is not a: its reads go on.
	_, err = e.client.ListRuns(ctxB, &stubbornv1.ListRunsRequest{PageSize: 1})
	require.NoError(t, err)
	_, err = e.client.GetRun(ctxB, &stubbornv1.GetRunRequest{RunId: id})
	assert.Equal(t, codes.NotFound, status.Code(err))

	// Streams that end make room.
	stop()
	require.Eventually(t, func() bool {
		_, err := e.client.GetRun(ctxA, &stubbornv1.GetRunRequest{RunId: id})
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	_, err = e.client.ListRuns(ctxA, &stubbornv1.ListRunsRequest{PageSize: 1})
	require.NoError(t, err)
}
