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
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// TestARunRidesOutANATSRestart: the NATS server that a replica keeps its
// runs on restarts without JetStream while a run's delegate call is in
// flight; the call ends, and the run's write finds no stream to take it;
// a few seconds later NATS restarts with JetStream on the same store. The
// run's write is made again until it lands, and the run finishes SUCCEEDED, its delegate called
// once and each event recorded once. Before, the failed write stopped the
// run on this replica, which left it RUNNING until the replica stopped.
func TestARunRidesOutANATSRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bin := buildNATSServer(t, dir)
	port := freePorts(t, 1)[0]
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	startNATS := func(js bool) *exec.Cmd {
		args := []string{"-a", "127.0.0.1", "-p", fmt.Sprint(port)}
		if js {
			args = append(args, "-js", "-sd", filepath.Join(dir, "store"))
		}
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		require.Eventually(t, func() bool {
			nc, err := nats.Connect(url)
			if err != nil {
				return false
			}
			nc.Close()
			return true
		}, 30*time.Second, 50*time.Millisecond, "nats-server answers")
		return cmd
	}
	natsServer := startNATS(true)

	var released atomic.Bool
	var calls, returned atomic.Int32
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	slow := demo.Serve(lis, demo.NewScripted(func(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		calls.Add(1)
		defer returned.Add(1)
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
	config := filepath.Join(dir, "stubborn.yaml")
	require.NoError(t, os.WriteFile(config, fmt.Appendf(nil, "delegates:\n  - {name: slow, target: %q}\n", lis.Addr()), 0o600))

	// The lease (and so the writes' retry) outlasts the outage.
	s := startServer(t, "-config", config, "-listen", fmt.Sprintf("127.0.0.1:%d", freePorts(t, 1)[0]),
		"-nats-url", url, "-replicas", "1", "-lease", "30s")
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	client := stubbornv1.NewControlServiceClient(conn)

	res, err := client.StartRun(ctx, &stubbornv1.StartRunRequest{
		TaskBrief: "outage", Retry: &stubbornv1.RetrySpec{Target: "slow"},
	})
	require.NoError(t, err)
	id := res.GetRunId()
	require.Eventually(t, func() bool { return calls.Load() == 1 }, 30*time.Second, 10*time.Millisecond)

	// NATS restarts without JetStream for a while (as a cluster does
	// while it elects a stream's leader, no one takes the stream's
	// writes), then with it, on the same store.
	restart := func(js bool) {
		require.NoError(t, natsServer.Process.Kill())
		_ = natsServer.Wait()
		natsServer = startNATS(js)
	}
	restart(false)
	released.Store(true)
	require.Eventually(t, func() bool { return returned.Load() == 1 }, 30*time.Second, 10*time.Millisecond)
	// The write made when the call ended finds no stream (once the
	// client has reconnected: within 2 s) and fails, at least once.
	time.Sleep(5 * time.Second)
	restart(true)
	wctx, wcancel := context.WithTimeout(ctx, 40*time.Second)
	defer wcancel()
	w, err := client.WatchRun(wctx, &stubbornv1.WatchRunRequest{RunId: id})
	require.NoError(t, err)

	var evs []*stubbornv1.RunEvent
	for {
		m, err := w.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "events so far: %v", evs)
		evs = append(evs, m.GetEvent())
	}
	require.NotEmpty(t, evs)
	final := evs[len(evs)-1].GetRunFinished().GetState()
	require.NotNil(t, final, "the run finished")
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, final.GetStatus(), final.GetStatusReason())
	for i, ev := range evs {
		assert.EqualValues(t, i+1, ev.GetSeq(), "each event once, in order")
	}
	assert.EqualValues(t, 1, calls.Load(), "the delegate was called once")
	got, err := client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, got.GetState().GetStatus())
}
