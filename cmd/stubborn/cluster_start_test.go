package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// TestReplicasStartedTogetherOnAFreshClusterAllServe starts three
// replicas at the same moment on a fresh three-node NATS cluster, each
// through another node: all of them create (or find) the streams and
// buckets, come up and serve, and a run started through one is read
// through the others. Before, replicas started together failed to start
// with "bucket stubborn_runs: context deadline exceeded" (issue 29, item
// 7).
func TestReplicasStartedTogetherOnAFreshClusterAllServe(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	urls := startNATSCluster(t)

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ok := demo.Serve(lis, demo.NewScripted(func(context.Context, *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		return &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{Text: "done"}}, nil
	}))
	t.Cleanup(ok.Stop)
	dir := t.TempDir()
	config := filepath.Join(dir, "stubborn.yaml")
	require.NoError(t, os.WriteFile(config, fmt.Appendf(nil, "delegates:\n  - {name: ok, target: %q, idempotent: true}\n", lis.Addr()), 0o600))

	type started struct {
		addr string
		err  error
		logs string
	}
	results := make([]started, len(urls))
	ports := freePorts(t, len(urls))
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i, url := range urls {
		cmd := exec.Command(os.Args[0], "serve", "-log-format", "json", "-config", config,
			"-listen", fmt.Sprintf("127.0.0.1:%d", ports[i]), "-nats-url", url, "-replicas", "3", "-lease", "2s")
		cmd.Env = append(os.Environ(), childEnv+"=1")
		out, err := cmd.StderrPipe()
		require.NoError(t, err)
		wg.Go(func() {
			<-gate
			if err := cmd.Start(); err != nil {
				results[i].err = err
				return
			}
			var logs strings.Builder
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				line := sc.Text()
				logs.WriteString(line + "\n")
				if strings.Contains(line, `"msg":"stubborn serving"`) {
					results[i].addr = fmt.Sprintf("127.0.0.1:%d", ports[i])
					break
				}
			}
			if results[i].addr == "" {
				results[i].err = fmt.Errorf("replica %d did not start: %v", i, cmd.Wait())
			}
			results[i].logs = logs.String()
			// Keep draining: a child blocked on a full pipe stops.
			go func() { _, _ = bufio.NewReader(out).WriteTo(discard{}) }()
		})
		t.Cleanup(func() {
			if cmd.Process != nil {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}
		})
	}
	begin := time.Now()
	close(gate)
	wg.Wait()
	t.Logf("all three replicas up %v after they were started together", time.Since(begin).Round(time.Millisecond))
	for i, r := range results {
		assert.NoError(t, r.err, "replica %d:\n%s", i, r.logs)
	}
	if t.Failed() {
		t.FailNow()
	}

	clients := make([]stubbornv1.ControlServiceClient, len(results))
	for i, r := range results {
		conn, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		clients[i] = stubbornv1.NewControlServiceClient(conn)
	}
	for i, c := range clients {
		res, err := c.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "hello", Retry: &stubbornv1.RetrySpec{Target: "ok"}})
		require.NoError(t, err, "replica %d serves", i)
		other := clients[(i+1)%len(clients)]
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			st, err := other.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: res.GetRunId()})
			if assert.NoError(c, err) {
				assert.Equal(c, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetState().GetStatus())
			}
		}, 30*time.Second, 20*time.Millisecond, "a run started on replica %d, read on the next", i)
	}

	// Who drives a run, whether a server is alive, whether a run was
	// deleted: read from their stream's leader (leaderReads), never from
	// a NATS node that may lag.
	nc, err := nats.Connect(urls[0])
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	for _, name := range []string{"KV_stubborn_owners", "KV_stubborn_heartbeats", "KV_stubborn_deleted", "KV_stubborn_marks"} {
		st, err := js.Stream(ctx, name)
		require.NoError(t, err, name)
		assert.False(t, st.CachedInfo().Config.AllowDirect, "stream %s allows direct gets", name)
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
