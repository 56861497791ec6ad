package main

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// withListen returns args with -listen's value replaced by addr.
func withListen(args []string, addr string) []string {
	out := append([]string(nil), args...)
	for i := range out {
		if out[i] == "-listen" && i+1 < len(out) {
			out[i+1] = addr
		}
	}
	return out
}

// flagValue returns the value of flag name in args.
func flagValue(args []string, name string) string {
	for i := range args {
		if args[i] == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// TestASecondServerOnAHeldDataDirRefuses: a user who starts a second
// `serve` from the same directory to get another port once got a second
// embedded JetStream on the first one's files, which resumed the first
// one's runs and damaged a stream. The second now refuses at once, naming
// the directory and the first one's pid, and touches nothing; the first
// keeps serving and finishes its runs with no damage; once the first dies
// by SIGKILL, a new server opens the directory at once and finds every run.
func TestASecondServerOnAHeldDataDirRefuses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var released atomic.Bool
	hangCalls := &calls{}
	failing := func(context.Context, *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		return nil, status.Error(codes.Unavailable, "always down")
	}
	addr, args := serveScripted(t, []scripted{
		{"hang", hangUntil(&released, hangCalls), true}, {"failing", failing, true},
	}, "")
	first := startServer(t, args...)
	client := dialControl(t, addr)

	attempts := int32(0)
	ids := map[string]string{} // run → what it waits for
	for i := range 4 {
		req := &stubbornv1.StartRunRequest{TaskBrief: "task", Retry: &stubbornv1.RetrySpec{Target: "hang", OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL}}
		kind := "an attempt"
		if i%2 == 1 {
			req.Retry = &stubbornv1.RetrySpec{Target: "failing", Attempts: &attempts}
			kind = "a decision"
		}
		res, err := client.StartRun(ctx, req)
		require.NoError(t, err)
		ids[res.GetRunId()] = kind
	}
	require.Eventually(t, func() bool {
		res, err := client.ListRuns(ctx, &stubbornv1.ListRunsRequest{Status: stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION})
		return err == nil && len(res.GetRuns()) == 2 && hangCalls.total() == 2
	}, time.Minute, 50*time.Millisecond)

	dataDir := flagValue(args, "-data-dir")
	before := filesUnder(t, dataDir)
	second := exec.Command(os.Args[0], append([]string{"serve"}, withListen(args, fmt.Sprintf("127.0.0.1:%d", freePorts(t, 1)[0]))...)...) // #nosec G204 -- this test's own binary
	second.Env = append(os.Environ(), childEnv+"=1")
	began := time.Now()
	out, err := second.CombinedOutput()
	took := time.Since(began)
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "the second server must refuse: %s", out)
	assert.Equal(t, 1, exit.ExitCode())
	assert.Contains(t, string(out), "data directory "+dataDir+" is in use by process "+fmt.Sprint(first.cmd.Process.Pid))
	assert.Contains(t, string(out), "-data-dir")
	assert.Contains(t, string(out), "-nats-url")
	t.Logf("the second server refused in %v", took)
	assert.Equal(t, before, filesUnder(t, dataDir), "the second server touched nothing")

	// The first is unharmed: it finishes its runs and takes decisions.
	released.Store(true)
	for id, kind := range ids {
		if kind == "a decision" {
			_, err := client.DecideRun(ctx, &stubbornv1.DecideRunRequest{RunId: id, Decision: stubbornv1.Decision_DECISION_FAIL})
			require.NoError(t, err, id)
		}
	}
	require.Eventually(t, func() bool {
		for id := range ids {
			st, err := client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
			if err != nil || !isTerminalStatus(st.GetState().GetStatus()) {
				return false
			}
		}
		return true
	}, time.Minute, 50*time.Millisecond, "the first server finishes its runs")
	first.mu.Lock()
	logs := first.logs.String()
	first.mu.Unlock()
	assert.NotContains(t, logs, `"level":"ERROR"`)
	assert.NotContains(t, logs, "damaged")

	// SIGKILL, and at once a new server on the directory: every run is there.
	first.kill(t)
	third := startServer(t, args...)
	for id := range ids {
		st, err := client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
		require.NoError(t, err, id)
		assert.True(t, isTerminalStatus(st.GetState().GetStatus()), "%s: %s", id, st.GetState().GetStatus())
	}
	third.kill(t)
}

// TestDecisionsRightAfterARestart: a server SIGKILLed with 50 runs in
// mixed states and started again on its data directory takes over the
// runs its predecessor drove before it answers: a DecideRun sent as soon
// as the port answers is carried out for every run awaiting a decision,
// with no retry. Before, some were refused UNAVAILABLE ("no responders")
// until the dead process's lease ran out.
func TestDecisionsRightAfterARestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var released atomic.Bool
	hangCalls, hintCalls := &calls{}, &calls{}
	hinted := func(_ context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		if hintCalls.add(req) == 1 && req.GetAttempt() == 1 {
			st, _ := status.New(codes.Unavailable, "busy").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(5 * time.Second)})
			return nil, st.Err()
		}
		return &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{Text: "after the wait"}}, nil
	}
	failing := func(context.Context, *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		return nil, status.Error(codes.Unavailable, "always down")
	}
	echo := func(context.Context, *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		return &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{Text: "ok"}}, nil
	}
	addr, args := serveScripted(t, []scripted{
		{"hang", hangUntil(&released, hangCalls), true}, {"hinted", hinted, true},
		{"failing", failing, true}, {"echo", echo, true},
	}, "")
	srv := startServer(t, args...)
	client := dialControl(t, addr)

	zero, two := int32(0), int32(2)
	retry := func(target string, attempts *int32, ask bool) *stubbornv1.StartRunRequest {
		oe := stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL
		if ask {
			oe = stubbornv1.OnExhausted_ON_EXHAUSTED_ASK
		}
		return &stubbornv1.StartRunRequest{TaskBrief: "task", Retry: &stubbornv1.RetrySpec{
			Target: target, Attempts: attempts, OnExhausted: oe,
			BaseWait: durationpb.New(10 * time.Millisecond), MaxWait: durationpb.New(15 * time.Second),
		}}
	}
	mix := []struct {
		n   int
		req *stubbornv1.StartRunRequest
	}{
		{15, retry("hang", &two, false)},
		{10, retry("hinted", &two, false)},
		{15, retry("failing", &zero, true)},
		{10, retry("echo", &two, false)},
	}
	var awaiting []string
	for _, k := range mix {
		for range k.n {
			res, err := client.StartRun(ctx, k.req)
			require.NoError(t, err)
			if k.req.GetRetry().GetTarget() == "failing" {
				awaiting = append(awaiting, res.GetRunId())
			}
		}
	}
	count := func(s stubbornv1.RunStatus) int {
		res, err := client.ListRuns(ctx, &stubbornv1.ListRunsRequest{Status: s, PageSize: 100})
		if err != nil {
			return -1
		}
		return len(res.GetRuns())
	}
	require.Eventually(t, func() bool {
		return hangCalls.total() == 15 && count(stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF) == 10 &&
			count(stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION) == 15 &&
			count(stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED) == 10
	}, time.Minute, 100*time.Millisecond, "runs in attempts, backoff, awaiting a decision and finished")

	srv.kill(t)
	released.Store(true)
	// The new server is not waited for: each decision goes as soon as the
	// port answers (WaitForReady), once, and must be carried out.
	restarted := exec.Command(os.Args[0], append([]string{"serve", "-log-format", "json"}, args...)...) // #nosec G204 -- this test's own binary
	restarted.Env = append(os.Environ(), childEnv+"=1")
	require.NoError(t, restarted.Start())
	t.Cleanup(func() { _ = restarted.Process.Kill(); _ = restarted.Wait() })
	client = dialControl(t, addr) // the old connection went with the killed server
	var wg sync.WaitGroup
	for _, id := range awaiting {
		wg.Go(func() {
			st, err := client.DecideRun(ctx, &stubbornv1.DecideRunRequest{RunId: id, Decision: stubbornv1.Decision_DECISION_FAIL}, grpc.WaitForReady(true))
			if assert.NoError(t, err, "run %s awaiting a decision, decided right after the restart", id) {
				assert.NotEqual(t, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, st.GetState().GetStatus(), id)
			}
		})
	}
	wg.Wait()
	for _, id := range awaiting {
		require.Eventually(t, func() bool {
			st, err := client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
			return err == nil && st.GetState().GetStatus() == stubbornv1.RunStatus_RUN_STATUS_FAILED
		}, time.Minute, 50*time.Millisecond, "run %s ends FAILED as decided", id)
	}
}

// dialControl is a ControlService client of the server at addr.
func dialControl(t *testing.T, addr string) stubbornv1.ControlServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return stubbornv1.NewControlServiceClient(conn)
}

// isTerminalStatus reports whether a run with status s has ended.
func isTerminalStatus(s stubbornv1.RunStatus) bool {
	switch s {
	case stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, stubbornv1.RunStatus_RUN_STATUS_FAILED,
		stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED, stubbornv1.RunStatus_RUN_STATUS_CANCELLED:
		return true
	}
	return false
}

// filesUnder lists the names of the files under dir, with the lock file's
// content: what a second server would have changed (the running one's
// own writes change only contents).
func filesUnder(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if d.Name() == "stubborn.lock" {
			b, err := os.ReadFile(path) // #nosec G304 -- the test's own directory
			path += " " + strings.TrimSpace(string(b))
			if err != nil {
				return err
			}
		}
		out = append(out, path)
		return nil
	}))
	return out
}
