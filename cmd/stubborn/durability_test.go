package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// childEnv makes the test binary run as `stubborn` (see TestMain).
const childEnv = "STUBBORN_TEST_CHILD"

// child is a `stubborn serve` child process.
type child struct {
	cmd  *exec.Cmd
	addr string
	mu   *sync.Mutex // guards logs
	logs *strings.Builder
}

// startServer runs `stubborn serve` as a child process and waits until it
// answers.
func startServer(t *testing.T, args ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"serve", "-log-format", "json"}, args...)...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	mu := &sync.Mutex{}
	s := &child{cmd: cmd, logs: &strings.Builder{}, mu: mu}
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			mu.Lock()
			s.logs.WriteString(line + "\n")
			mu.Unlock()
			if strings.Contains(line, `"msg":"stubborn serving"`) {
				_, rest, _ := strings.Cut(line, `"addr":"`)
				addr, _, _ := strings.Cut(rest, `"`)
				addrc <- addr
			}
		}
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	select {
	case s.addr = <-addrc:
	case <-time.After(60 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("server did not start:\n%s", s.logs.String())
	}
	return s
}

func (s *child) kill(t *testing.T) {
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGKILL))
	_ = s.cmd.Wait()
}

// calls counts the calls a delegate got per run and attempt.
type calls struct {
	mu sync.Mutex
	n  map[string]int // "run/attempt" → calls
}

func (c *calls) add(req *stubbornv1.ExecuteRequest) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	k := fmt.Sprintf("%s/%d", req.GetRunId(), req.GetAttempt())
	c.n[k]++
	return c.n[k]
}

func (c *calls) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.n {
		n += v
	}
	return n
}

func (c *calls) forRun(run string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for k, v := range c.n {
		if strings.HasPrefix(k, run+"/") {
			n += v
		}
	}
	return n
}

// hangUntil is a delegate that counts its calls in c and answers "done"
// once released is set, or fails when its call's context ends first.
func hangUntil(released *atomic.Bool, c *calls) demo.Func {
	return func(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		c.add(req)
		for !released.Load() {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
		return &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{Text: "done"}}, nil
	}
}

// TestSIGKILLWithRunsInFlight kills the server with SIGKILL while 200 runs
// are in attempts, in backoff and awaiting a decision, restarts it on the
// same data directory, and checks that every run ends as its delegates
// dictate, that no delegate that is not idempotent was called twice for an
// attempt, and that watchers resuming from their last seq see every event
// once.
func TestSIGKILLWithRunsInFlight(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	var released atomic.Bool // before the kill, hanging calls never answer
	hangCalls, unsafeCalls, hintCalls, failCalls := &calls{}, &calls{}, &calls{}, &calls{}
	hang := func(c *calls) demo.Func { return hangUntil(&released, c) }
	hinted := func(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		if hintCalls.add(req) == 1 && req.GetAttempt() == 1 {
			st, _ := status.New(codes.Unavailable, "busy").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(10 * time.Second)})
			return nil, st.Err()
		}
		return &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{Text: "after the wait"}}, nil
	}
	failing := func(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		failCalls.add(req)
		return nil, status.Error(codes.Unavailable, "always down")
	}
	addr, args := serveScripted(t, []scripted{
		{"hang", hang(hangCalls), true}, {"unsafe", hang(unsafeCalls), false},
		{"hinted", hinted, true}, {"failing", failing, true},
	}, "", "-durability", "always")

	srv := startServer(t, args...)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	client := stubbornv1.NewControlServiceClient(conn)

	retry := func(target string, attempts int32, onExhausted stubbornv1.OnExhausted) *stubbornv1.StartRunRequest {
		return &stubbornv1.StartRunRequest{TaskBrief: "task", Retry: &stubbornv1.RetrySpec{
			Target: target, Attempts: &attempts, OnExhausted: onExhausted,
			BaseWait: durationpb.New(10 * time.Millisecond), MaxWait: durationpb.New(15 * time.Second),
		}}
	}
	kinds := []struct {
		name string
		n    int
		req  *stubbornv1.StartRunRequest
		want stubbornv1.RunStatus
	}{
		{"in an attempt, idempotent", 80, retry("hang", 2, stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL), stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED},
		{"in an attempt, not idempotent", 20, retry("unsafe", 2, stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL), stubbornv1.RunStatus_RUN_STATUS_FAILED},
		{"in backoff", 60, retry("hinted", 2, stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL), stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED},
		{"awaiting a decision", 40, retry("failing", 0, stubbornv1.OnExhausted_ON_EXHAUSTED_ASK), stubbornv1.RunStatus_RUN_STATUS_FAILED},
	}
	want := map[string]stubbornv1.RunStatus{}
	kindOf := map[string]string{}
	for _, k := range kinds {
		for range k.n {
			res, err := client.StartRun(ctx, k.req)
			require.NoError(t, err)
			want[res.GetRunId()] = k.want
			kindOf[res.GetRunId()] = k.name
		}
	}
	require.Len(t, want, 200)
	count := func(s stubbornv1.RunStatus) int {
		res, err := client.ListRuns(ctx, &stubbornv1.ListRunsRequest{Status: s, PageSize: 1000})
		if err != nil {
			return -1
		}
		return len(res.GetRuns())
	}
	require.Eventually(t, func() bool {
		return hangCalls.total() == 80 && unsafeCalls.total() == 20 &&
			count(stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF) == 60 &&
			count(stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION) == 40
	}, time.Minute, 200*time.Millisecond, "runs in attempts, backoff and awaiting a decision")

	// A watcher per kind reads part of its run, remembers its last seq.
	watched := map[string]int64{}
	for id := range want {
		if _, ok := watched[kindOf[id]]; ok {
			continue
		}
		wctx, stop := context.WithCancel(ctx)
		w, err := client.WatchRun(wctx, &stubbornv1.WatchRunRequest{RunId: id})
		require.NoError(t, err)
		m, err := w.Recv()
		require.NoError(t, err)
		stop()
		watched[kindOf[id]] = m.GetEvent().GetSeq()
		watched[id] = m.GetEvent().GetSeq()
	}

	srv.kill(t)
	released.Store(true)
	srv = startServer(t, args...)

	// Decide FAIL on every run that awaits a decision again.
	for id, k := range kindOf {
		if k != "awaiting a decision" {
			continue
		}
		require.Eventually(t, func() bool {
			_, err := client.DecideRun(ctx, &stubbornv1.DecideRunRequest{RunId: id, Decision: stubbornv1.Decision_DECISION_FAIL})
			return err == nil
		}, time.Minute, 20*time.Millisecond, "run %s awaits a decision after the restart", id)
	}
	for id, wantStatus := range want {
		after := watched[id]
		w, err := client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: id, AfterSeq: after})
		require.NoError(t, err)
		var last *stubbornv1.RunEvent
		next := after + 1
		for {
			m, err := w.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err, id)
			assert.Equal(t, next, m.GetEvent().GetSeq(), "%s: no gap, no duplicate", id)
			next = m.GetEvent().GetSeq() + 1
			last = m.GetEvent()
		}
		require.NotNil(t, last.GetRunFinished(), id)
		st := last.GetRunFinished().GetState()
		assert.Equal(t, wantStatus, st.GetStatus(), "%s (%s): %s", id, kindOf[id], st.GetStatusReason())
		if kindOf[id] == "in an attempt, not idempotent" {
			assert.Equal(t, 1, unsafeCalls.forRun(id), "%s: a delegate that is not idempotent is never called twice", id)
		}
	}
	srv.kill(t)
}

// scripted is a demo delegate a test serves on loopback (serveScripted).
type scripted struct {
	name       string
	fn         demo.Func
	idempotent bool
}

// serveScripted serves each of ds on loopback and writes a config that
// names them (timeout 2m), followed by extraYAML (presets, say). It
// returns the address and the args of a `serve` of that config on its own
// data directory, with more after them; startServer starts it.
func serveScripted(t *testing.T, ds []scripted, extraYAML string, more ...string) (addr string, args []string) {
	t.Helper()
	var yaml strings.Builder
	yaml.WriteString("delegates:\n")
	for _, d := range ds {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		srv := demo.Serve(lis, demo.NewScripted(d.fn))
		t.Cleanup(srv.Stop)
		fmt.Fprintf(&yaml, "  - {name: %s, target: %q, idempotent: %t, timeout: 2m}\n", d.name, lis.Addr(), d.idempotent)
	}
	yaml.WriteString(extraYAML)
	dir := t.TempDir()
	config := filepath.Join(dir, "stubborn.yaml")
	require.NoError(t, os.WriteFile(config, []byte(yaml.String()), 0o600))
	addr = fmt.Sprintf("127.0.0.1:%d", freePorts(t, 1)[0])
	args = append([]string{"-config", config, "-listen", addr, "-data-dir", filepath.Join(dir, "data")}, more...)
	return addr, args
}
