package main

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// TestDeletedRunsStayDeletedAfterSIGKILL deletes runs in every state
// (finished, in an attempt, parked in a backoff, awaiting a decision),
// SIGKILLs the server a few seconds after the last DeleteRun answered OK,
// restarts it on the same data directory, and checks that every deleted
// run is NOT_FOUND, listed nowhere, and that no delegate is called for any
// of them again. Before, up to all of them came back and most were resumed,
// their delegates called again (issue 29, "DeleteRun is undone by a
// crash").
func TestDeletedRunsStayDeletedAfterSIGKILL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	var calls atomic.Int64
	hang := func(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		calls.Add(1)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	ok := func(context.Context, *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		calls.Add(1)
		return &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{Text: "done"}}, nil
	}
	failing := func(context.Context, *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		calls.Add(1)
		return nil, status.Error(codes.Unavailable, "down")
	}
	addr, args := serveScripted(t, []scripted{{"hang", hang, true}, {"ok", ok, true}, {"failing", failing, true}}, "")

	srv := startServer(t, args...)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	client := stubbornv1.NewControlServiceClient(conn)

	retry := func(target string, attempts int32, onExhausted stubbornv1.OnExhausted, wait time.Duration) *stubbornv1.StartRunRequest {
		return &stubbornv1.StartRunRequest{TaskBrief: "task", Retry: &stubbornv1.RetrySpec{
			Target: target, Attempts: &attempts, OnExhausted: onExhausted,
			BaseWait: durationpb.New(wait), MaxWait: durationpb.New(wait),
		}}
	}
	kinds := []struct {
		name string
		req  *stubbornv1.StartRunRequest
		want stubbornv1.RunStatus
	}{
		{"finished", retry("ok", 1, stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL, time.Millisecond), stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED},
		{"in an attempt", retry("hang", 2, stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL, time.Millisecond), stubbornv1.RunStatus_RUN_STATUS_RUNNING},
		{"parked in a backoff", retry("failing", 3, stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL, time.Minute), stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF},
		{"awaiting a decision", retry("failing", 0, stubbornv1.OnExhausted_ON_EXHAUSTED_ASK, time.Millisecond), stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION},
	}
	const perKind = 21
	kindOf := map[string]int{}
	for i, k := range kinds {
		for range perKind {
			res, err := client.StartRun(ctx, k.req)
			require.NoError(t, err)
			kindOf[res.GetRunId()] = i
		}
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for id, i := range kindOf {
			st, err := client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
			if !assert.NoError(c, err) || !assert.Equal(c, kinds[i].want, st.GetState().GetStatus(), kinds[i].name) {
				return
			}
			if i == 1 {
				assert.Positive(c, st.GetState().GetAttempts(), "its call is in flight")
			}
		}
	}, time.Minute, 100*time.Millisecond, "runs in every state")

	for id := range kindOf {
		_, err := client.DeleteRun(ctx, &stubbornv1.DeleteRunRequest{RunId: id, Cancel: true})
		require.NoError(t, err, id)
	}
	before := calls.Load()
	time.Sleep(4 * time.Second)
	srv.kill(t)
	srv = startServer(t, args...)
	defer srv.kill(t)

	// Time enough for a resumed run to call its delegate (the lease, and
	// the takeover that follows at once).
	time.Sleep(3 * time.Second)
	back := map[string]int{}
	for id, i := range kindOf {
		_, err := client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
		if status.Code(err) != codes.NotFound {
			back[kinds[i].name]++
		}
	}
	assert.Empty(t, back, "deleted runs answer GetRun again after the crash, by kind")
	listed, err := client.ListRuns(ctx, &stubbornv1.ListRunsRequest{PageSize: 1000})
	require.NoError(t, err)
	for _, r := range listed.GetRuns() {
		if _, ok := kindOf[r.GetRunId()]; ok {
			t.Errorf("deleted run %s is listed again (%s)", r.GetRunId(), r.GetStatus())
		}
	}
	assert.Equal(t, before, calls.Load(), "delegate calls for deleted runs after the restart")
	srv.mu.Lock()
	logs := srv.logs.String()
	srv.mu.Unlock()
	assert.NotContains(t, logs, `"msg":"resuming run"`)
}
