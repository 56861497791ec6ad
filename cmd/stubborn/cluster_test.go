package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// freePorts returns n ports free on 127.0.0.1 right now.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	var liss []net.Listener
	for range n {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		liss = append(liss, lis)
		ports = append(ports, lis.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range liss {
		require.NoError(t, l.Close())
	}
	return ports
}

// buildNATSServer builds nats-server from the module Stubborn already
// depends on, into dir, and returns its path.
func buildNATSServer(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "nats-server")
	build := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "building nats-server: %s", out)
	return bin
}

// startNATSCluster starts a three-node JetStream cluster of nats-server
// (buildNATSServer) on loopback. It returns the client URLs.
func startNATSCluster(t *testing.T) []string {
	t.Helper()
	dir := t.TempDir()
	bin := buildNATSServer(t, dir)

	ports := freePorts(t, 6)
	var routes []string
	for i := range 3 {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[3+i]))
	}
	var urls []string
	for i := range 3 {
		cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", fmt.Sprint(ports[i]), "-js", "-sd", filepath.Join(dir, fmt.Sprintf("n%d", i)),
			"--server_name", fmt.Sprintf("n%d", i), "--cluster_name", "stubborn-test",
			"--cluster", routes[i], "--routes", strings.Join(routes, ","))
		cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", ports[i]))
	}
	// Wait until the cluster can place a stream with three replicas.
	require.Eventually(t, func() bool {
		nc, err := nats.Connect(urls[0])
		if err != nil {
			return false
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "READY", Subjects: []string{"ready"}, Replicas: 3, Storage: jetstream.MemoryStorage})
		return err == nil
	}, time.Minute, 200*time.Millisecond, "the NATS cluster forms")
	return urls
}

// TestClusterReplicaTakesOverARun runs two Stubborn replicas on a real
// three-node NATS cluster; the replica driving a run is killed mid-run, the
// other takes the run over within the lease and finishes it, and WatchRun
// on either replica shows the same events.
func TestClusterReplicaTakesOverARun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	urls := startNATSCluster(t)

	var released atomic.Bool
	var calls atomic.Int32
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	slow := demo.Serve(lis, demo.NewScripted(func(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		calls.Add(1)
		for !released.Load() {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
		return &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{Text: "done"}}, nil
	}))
	t.Cleanup(slow.Stop)
	dir := t.TempDir()
	config := filepath.Join(dir, "stubborn.yaml")
	require.NoError(t, os.WriteFile(config, fmt.Appendf(nil, "delegates:\n  - {name: slow, target: %q, idempotent: true}\n", lis.Addr()), 0o600))

	const lease = 2 * time.Second
	replica := func(url string) (*child, stubbornv1.ControlServiceClient) {
		port := freePorts(t, 1)[0]
		s := startServer(t, "-config", config, "-listen", fmt.Sprintf("127.0.0.1:%d", port), "-nats-url", url, "-replicas", "3", "-lease", lease.String())
		conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		return s, stubbornv1.NewControlServiceClient(conn)
	}
	a, clientA := replica(urls[0])
	_, clientB := replica(urls[1])

	// B follows the list of runs, whichever replica drives them.
	feedB, err := clientB.WatchRuns(ctx, &stubbornv1.WatchRunsRequest{})
	require.NoError(t, err)
	following, err := feedB.Recv()
	require.NoError(t, err)
	require.Nil(t, following.GetRun())

	res, err := clientA.StartRun(ctx, &stubbornv1.StartRunRequest{
		TaskBrief: "survive", Retry: &stubbornv1.RetrySpec{Target: "slow"},
	})
	require.NoError(t, err)
	id := res.GetRunId()
	require.Eventually(t, func() bool { return calls.Load() == 1 }, 30*time.Second, 10*time.Millisecond)
	// B's list sees the run start on A (through the listing index).
	started, err := feedB.Recv()
	require.NoError(t, err)
	assert.Equal(t, id, started.GetRun().GetRunId())
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_RUNNING, started.GetRun().GetStatus(), "seen as it started on A")

	// B follows the run that A drives, live.
	wB, err := clientB.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: id})
	require.NoError(t, err)
	first, err := wB.Recv()
	require.NoError(t, err)
	require.NotNil(t, first.GetEvent().GetRunStarted())

	a.kill(t)
	killed := time.Now()
	require.Eventually(t, func() bool { return calls.Load() == 2 }, 4*lease, 10*time.Millisecond,
		"replica B retries the interrupted attempt after taking the run over")
	took := time.Since(killed)
	released.Store(true)

	var live []*stubbornv1.RunEvent
	live = append(live, first.GetEvent())
	for {
		m, err := wB.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		live = append(live, m.GetEvent())
	}
	final := live[len(live)-1].GetRunFinished().GetState()
	require.NotNil(t, final)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, final.GetStatus(), final.GetStatusReason())
	var resumed *stubbornv1.RunResumed
	for i, ev := range live {
		assert.EqualValues(t, i+1, ev.GetSeq())
		if r := ev.GetRunResumed(); r != nil {
			resumed = r
		}
	}
	require.NotNil(t, resumed, "the journal says who took the run over")
	assert.LessOrEqual(t, took, 3*lease, "taken over within the lease (plus a scan)")

	// B's list followed the run that A started and B finished to its
	// end, and B lists it from the index.
	for {
		m, err := feedB.Recv()
		require.NoError(t, err)
		require.Equal(t, id, m.GetRun().GetRunId())
		if m.GetRun().GetStatus() == stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED {
			break
		}
	}
	list, err := clientB.ListRuns(ctx, &stubbornv1.ListRunsRequest{View: stubbornv1.RunView_RUN_VIEW_SUMMARY})
	require.NoError(t, err)
	require.Len(t, list.GetSummaries(), 1)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, list.GetSummaries()[0].GetStatus())

	// A fresh watch on B replays the same events.
	w2, err := clientB.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: id})
	require.NoError(t, err)
	for i := 0; ; i++ {
		m, err := w2.Recv()
		if errors.Is(err, io.EOF) {
			assert.Equal(t, len(live), i)
			break
		}
		require.NoError(t, err)
		require.Less(t, i, len(live))
		assert.True(t, proto.Equal(live[i], m.GetEvent()), "event %d", i+1)
	}
}
