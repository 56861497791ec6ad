package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
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
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// A run's cost survives a SIGKILL and a resume: the attempts before the
// kill keep the cost the journal has, the interrupted one is estimated
// (its call may have been billed), the one after it is its usage × price,
// and the run's total is their sum, counted once.
func TestARunsCostSurvivesASIGKILL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var released atomic.Bool
	var n atomic.Int32
	model := func(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		switch n.Add(1) {
		case 1:
			return nil, status.Error(codes.Unavailable, "busy")
		case 2:
			for !released.Load() {
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(10 * time.Millisecond):
				}
			}
		}
		return &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{Text: "done", Usage: &stubbornv1.Usage{InputTokens: 3, OutputTokens: 4, TotalTokens: 7}}}, nil
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srvDelegate := demo.Serve(lis, demo.NewScripted(model))
	t.Cleanup(srvDelegate.Stop)
	dir := t.TempDir()
	config := filepath.Join(dir, "stubborn.yaml")
	require.NoError(t, os.WriteFile(config, fmt.Appendf(nil, `delegates:
  - name: model
    target: %q
    idempotent: true
    timeout: 2m
    price: {input_per_mtok: 100000, output_per_mtok: 1000000}
`, lis.Addr()), 0o600))
	addr := fmt.Sprintf("127.0.0.1:%d", freePorts(t, 1)[0])
	args := []string{"-config", config, "-listen", addr, "-data-dir", filepath.Join(dir, "data"), "-durability", "always"}
	srv := startServer(t, args...)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	client := stubbornv1.NewControlServiceClient(conn)

	attempts := int32(3)
	res, err := client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "sixteen bytes!!!", Retry: &stubbornv1.RetrySpec{
		Target: "model", Attempts: &attempts, BaseWait: durationpb.New(time.Millisecond), OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL,
	}})
	require.NoError(t, err)
	id := res.GetRunId()
	var before *stubbornv1.ControlState
	require.Eventually(t, func() bool {
		g, err := client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
		before = g.GetState()
		return err == nil && len(before.GetAttemptLog()) == 2
	}, time.Minute, 20*time.Millisecond, "attempt 2 in flight")
	first := before.GetAttemptLog()[0]
	// Failed after it was sent: estimated, 16 bytes = 4 tokens in at 0.1
	// each, 1 token out (none came back) at 1.
	assert.True(t, first.GetCostEstimated())
	assert.InDelta(t, 4*0.1+1, first.GetCost(), 1e-9)

	srv.kill(t)
	released.Store(true)
	srv = startServer(t, args...)
	defer srv.kill(t)

	var st *stubbornv1.ControlState
	require.Eventually(t, func() bool {
		g, err := client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
		st = g.GetState()
		return err == nil && st.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED
	}, time.Minute, 20*time.Millisecond, "the run resumes and succeeds")
	log := st.GetAttemptLog()
	require.Len(t, log, 3, "attempt 2 interrupted, attempt 3 answered")
	assert.Equal(t, first.GetCost(), log[0].GetCost(), "the journal's cost, not a new one")
	assert.Equal(t, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_INTERRUPTED, log[1].GetOutcome())
	assert.True(t, log[1].GetCostEstimated(), "the interrupted call may have been billed: estimated")
	assert.Positive(t, log[1].GetCost())
	assert.False(t, log[2].GetCostEstimated())
	assert.InDelta(t, 3*0.1+4*1, log[2].GetCost(), 1e-9, "usage × price")
	total := log[0].GetCost() + log[1].GetCost() + log[2].GetCost()
	assert.InDelta(t, total, st.GetCost().GetTotal(), 1e-9, "each attempt counted once")
	assert.InDelta(t, total, st.GetCost().GetByDelegate()["model"], 1e-9)

	list, err := client.ListRuns(ctx, &stubbornv1.ListRunsRequest{View: stubbornv1.RunView_RUN_VIEW_SUMMARY})
	require.NoError(t, err)
	require.NotEmpty(t, list.GetSummaries())
	assert.InDelta(t, total, list.GetSummaries()[0].GetCost(), 1e-9, "the summary's cost")
}
