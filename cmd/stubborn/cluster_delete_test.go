package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
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

// TestClusterDeletedRunIsGoneOnEveryReplica: two Stubborn replicas on a
// real three-node NATS cluster. Runs that A drives, in every state
// (finished, in an attempt, backing off, awaiting a decision, racing a
// decision), are deleted with DeleteRun(cancel), through A or through B;
// right after each DeleteRun, and for a while after the last, neither
// replica lists any of them in either view, and a WatchRuns stream on B
// tells of each deletion after anything else of the run. Before, the
// runs deleted in flight came back in the summaries.
func TestClusterDeletedRunIsGoneOnEveryReplica(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	urls := startNATSCluster(t)

	serve := func(fn func(context.Context) (*stubbornv1.ExecuteResponse, error)) string {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		s := demo.Serve(lis, demo.NewScripted(func(ctx context.Context, _ *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
			return fn(ctx)
		}))
		t.Cleanup(s.Stop)
		return lis.Addr().String()
	}
	ok := serve(func(context.Context) (*stubbornv1.ExecuteResponse, error) {
		return &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{Text: "done"}}, nil
	})
	hangs := serve(func(ctx context.Context) (*stubbornv1.ExecuteResponse, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	busy := serve(func(context.Context) (*stubbornv1.ExecuteResponse, error) {
		return nil, status.Error(codes.Unavailable, "busy")
	})
	config := filepath.Join(t.TempDir(), "stubborn.yaml")
	require.NoError(t, os.WriteFile(config, fmt.Appendf(nil, "delegates:\n"+
		"  - {name: ok, target: %q, idempotent: true}\n"+
		"  - {name: hangs, target: %q, idempotent: true}\n"+
		"  - {name: busy, target: %q, idempotent: true}\n", ok, hangs, busy), 0o600))
	replica := func(url string) stubbornv1.ControlServiceClient {
		port := freePorts(t, 1)[0]
		s := startServer(t, "-config", config, "-listen", fmt.Sprintf("127.0.0.1:%d", port), "-nats-url", url, "-replicas", "3")
		conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		return stubbornv1.NewControlServiceClient(conn)
	}
	clientA, clientB := replica(urls[0]), replica(urls[1])
	replicas := map[string]stubbornv1.ControlServiceClient{"A": clientA, "B": clientB}

	wctx, stopWatching := context.WithCancel(ctx)
	feed, err := clientB.WatchRuns(wctx, &stubbornv1.WatchRunsRequest{})
	require.NoError(t, err)
	first, err := feed.Recv()
	require.NoError(t, err)
	require.Nil(t, first.GetRun())
	var (
		mu       sync.Mutex
		followed []*stubbornv1.WatchRunsResponse
	)
	received := make(chan struct{})
	go func() {
		defer close(received)
		for {
			m, err := feed.Recv()
			if err != nil {
				return
			}
			mu.Lock()
			followed = append(followed, m)
			mu.Unlock()
		}
	}()
	defer func() { stopWatching(); <-received }()

	zero, one, three := int32(0), int32(1), int32(3)
	hour := durationpb.New(time.Hour)
	ask := &stubbornv1.RetrySpec{Target: "busy", Attempts: &zero, OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_ASK}
	kinds := []struct {
		what string
		spec *stubbornv1.RetrySpec
		want stubbornv1.RunStatus
	}{
		{"finished", &stubbornv1.RetrySpec{Target: "ok"}, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED},
		{"running", &stubbornv1.RetrySpec{Target: "hangs", Attempts: &one}, stubbornv1.RunStatus_RUN_STATUS_RUNNING},
		{"backing off", &stubbornv1.RetrySpec{Target: "busy", Attempts: &three, BaseWait: hour, MaxWait: hour}, stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF},
		{"awaiting", ask, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION},
		{"racing a decision", ask, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION},
	}
	// Two of each, one deleted through A (its driver), one through B.
	type started struct {
		what, id string
		by       string
		want     stubbornv1.RunStatus
	}
	var all []started
	for _, by := range []string{"A", "B"} {
		for _, k := range kinds {
			res, err := clientA.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: k.what, Retry: k.spec})
			require.NoError(t, err)
			all = append(all, started{k.what, res.GetRunId(), by, k.want})
		}
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for _, r := range all {
			res, err := clientA.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: r.id})
			if assert.NoError(c, err) {
				assert.Equal(c, r.want, res.GetState().GetStatus(), r.what)
			}
		}
		for name, client := range replicas {
			res, err := client.ListRuns(ctx, &stubbornv1.ListRunsRequest{View: stubbornv1.RunView_RUN_VIEW_SUMMARY, PageSize: 100})
			if assert.NoError(c, err) {
				assert.Len(c, res.GetSummaries(), len(all), "%s lists every run", name)
			}
		}
	}, time.Minute, 20*time.Millisecond, "runs in every state, listed on both replicas")

	notListed := func(c assert.TestingT, r started, when string) {
		for name, client := range replicas {
			sums, err := client.ListRuns(ctx, &stubbornv1.ListRunsRequest{View: stubbornv1.RunView_RUN_VIEW_SUMMARY, PageSize: 100})
			if assert.NoError(c, err) {
				for _, s := range sums.GetSummaries() {
					assert.NotEqual(c, r.id, s.GetRunId(), "%s (deleted through %s): in %s's summaries %s", r.what, r.by, name, when)
				}
			}
			full, err := client.ListRuns(ctx, &stubbornv1.ListRunsRequest{View: stubbornv1.RunView_RUN_VIEW_FULL, PageSize: 100})
			if assert.NoError(c, err) {
				for _, st := range full.GetRuns() {
					assert.NotEqual(c, r.id, st.GetRunId(), "%s (deleted through %s): in %s's full listing %s", r.what, r.by, name, when)
				}
			}
		}
	}
	for _, r := range all {
		del := func() {
			_, err := replicas[r.by].DeleteRun(ctx, &stubbornv1.DeleteRunRequest{RunId: r.id, Cancel: true})
			require.NoError(t, err, "%s through %s", r.what, r.by)
		}
		if r.what == "racing a decision" {
			decided := make(chan struct{})
			go func() {
				defer close(decided)
				_, _ = clientA.DecideRun(ctx, &stubbornv1.DecideRunRequest{RunId: r.id, Decision: stubbornv1.Decision_DECISION_RETRY})
			}()
			del()
			<-decided
		} else {
			del()
		}
		notListed(t, r, "right after its DeleteRun")
	}
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		for _, r := range all {
			notListed(t, r, "after its DeleteRun")
		}
		if t.Failed() {
			return
		}
	}

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range all {
			told := false
			for _, m := range followed {
				told = told || m.GetDeletedRunId() == r.id
			}
			assert.True(c, told, "B's WatchRuns tells of the deletion of %s (through %s)", r.what, r.by)
		}
	}, 30*time.Second, 20*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for _, r := range all {
		deleted := false
		for _, m := range followed {
			switch {
			case m.GetDeletedRunId() == r.id:
				deleted = true
			case m.GetRun().GetRunId() == r.id:
				assert.False(t, deleted, "%s (through %s): a summary (%s) after its deletion", r.what, r.by, m.GetRun().GetStatus())
			}
		}
	}
}
