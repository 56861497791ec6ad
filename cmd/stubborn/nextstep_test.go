package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// Issue 35: the CLI says what to do next. These tests run the commands as
// typed, against real servers on 127.0.0.1.

// captureStderr sends what the client commands write besides their output
// (waits, hints) to a buffer for the test.
func captureStderr(t *testing.T) *syncBuffer {
	t.Helper()
	buf := &syncBuffer{}
	stderr = buf
	t.Cleanup(func() { stderr = os.Stderr })
	return buf
}

// cliResult is what one command printed and returned.
type cliResult struct {
	out  string
	code int
	err  error
}

// goCLI runs a command in the background; its result comes on the channel.
func goCLI(ctx context.Context, out *syncBuffer, args ...string) <-chan cliResult {
	done := make(chan cliResult, 1)
	go func() {
		code, err := run(ctx, args, out)
		done <- cliResult{out.String(), code, err}
	}()
	return done
}

func cliOnce(args ...string) cliResult {
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, err := run(ctx, args, &out)
	return cliResult{out.String(), code, err}
}

// blocker is a delegate whose calls wait until release is closed, then
// echo; a call cancelled meanwhile ends.
func blocker(release <-chan struct{}) stubbornv1.DelegateServiceServer {
	return demo.NewScripted(func(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		select {
		case <-release:
			return demo.Echo{}.Execute(ctx, req)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
}

// serveDelegate serves svc on a port of its own, until the test ends.
func serveDelegate(t *testing.T, svc stubbornv1.DelegateServiceServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := demo.Serve(lis, svc)
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

// freeAddr is a loopback address nothing listens on (a port taken and
// given back).
func freeAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close())
	return addr
}

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "stubborn.yaml")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o600))
	return path
}

// The README's "Running it" pasted: `serve &` and at once `run`. The run
// waits for the server that is starting, and says so; with no server, a
// client says where it looked and what to check, without grpc-go's
// wrapper.
func TestClientWaitsForAStartingServer(t *testing.T) {
	errs := captureStderr(t)
	config := writeConfig(t, fmt.Sprintf("delegates:\n  - {name: echo, target: %q}\n", serveDelegate(t, demo.Echo{})))
	addr := freeAddr(t)
	t.Setenv("STUBBORN_ADDR", addr)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := goCLI(ctx, &syncBuffer{}, "run", "-brief", "hi", "-delegates", "echo", "-wait", "1m")
	require.Eventually(t, func() bool { return strings.Contains(errs.String(), "waiting up to 1m0s") }, 30*time.Second, 10*time.Millisecond)
	assert.Equal(t, "stubborn: no server answers on "+addr+" yet: waiting up to 1m0s for one (-wait)\n", errs.String())
	startServer(t, "-memory", "-config", config, "-listen", addr)
	res := <-done
	require.NoError(t, res.err)
	assert.Equal(t, 0, res.code)
	assert.Contains(t, res.out, `run finished: SUCCEEDED after 1 attempt(s), winner echo, result "echo: hi"`)

	nobody := freeAddr(t)
	// Ctrl-C while it waits: 130, nothing more to say.
	wctx, interrupt := context.WithCancel(ctx)
	waiting := goCLI(wctx, &syncBuffer{}, "get", "run_x", "-addr", nobody, "-wait", "1m")
	require.Eventually(t, func() bool { return strings.Contains(errs.String(), "no server answers on "+nobody) }, 30*time.Second, 10*time.Millisecond)
	interrupt()
	res = <-waiting
	assert.NoError(t, res.err)
	assert.Equal(t, 130, res.code)

	res = cliOnce("list", "-addr", nobody, "-wait", "0")
	assert.Equal(t, 1, res.code)
	require.Error(t, res.err)
	assert.Equal(t, fmt.Sprintf("no Stubborn server answers on %s (connection refused): is `stubborn serve` running on %s? (-addr, STUBBORN_ADDR)", nobody, nobody), res.err.Error())
}

// Flag mistakes get a sentence, not the usage: the closest flag, a
// duration's unit, the flag a control takes its delegates with.
func TestFlagMistakesInWords(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "-contrl", "retry"}, "unknown flag -contrl: did you mean -control? (`stubborn run -h` lists its flags)"},
		{[]string{"run", "--delegate=echo"}, "unknown flag -delegate: did you mean -delegates? (`stubborn run -h` lists its flags)"},
		{[]string{"list", "-frobnicate"}, "unknown flag -frobnicate (`stubborn list -h` lists its flags)"},
		{[]string{"get", "run_x", "-jsn"}, "unknown flag -jsn: did you mean -json?"},
		{[]string{"run", "-max-wait", "10", "-brief", "x"}, "-max-wait 10: durations need a unit: 10s"},
		{[]string{"watch", "run_x", "-wait", "soon"}, "-wait soon: durations need a unit: such as 500ms, 10s, 1m30s"},
		{[]string{"list", "-limit", "many"}, `-limit "many": parse error (how many runs to list`},
		{[]string{"run", "-control", "retry", "-delegates", "echo", "-brief", "x"}, "-control retry names its one delegate with -target, not -delegates (which is for fallback-chain and race): -target echo"},
		{[]string{"run", "-control", "race", "-target", "echo", "-brief", "x"}, "-control race names its delegates with -delegates, not -target (which is for retry and retry-with-learning): -delegates echo"},
		{[]string{"serve", "-listn", "127.0.0.1:0"}, "unknown flag -listn: did you mean -listen?"},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			res := cliOnce(tt.args...)
			assert.Equal(t, 2, res.code)
			require.Error(t, res.err)
			assert.Contains(t, res.err.Error(), tt.want)
		})
	}
	// -h is not a mistake.
	res := cliOnce("run", "-h")
	assert.Equal(t, 0, res.code)
	assert.NoError(t, res.err)
}

// A server's errors in words, each with the next step: a token to send, a
// run not found, a run in flight to delete; decide fail prints how the run
// ended; get shows an attempt in flight as running; registry -json; a
// replayed idempotency key says so.
func TestServerErrorsInWords(t *testing.T) {
	errs := captureStderr(t)
	release := make(chan struct{})
	config := writeConfig(t, fmt.Sprintf("delegates:\n  - {name: echo, target: %q}\n  - {name: blocker, target: %q, idempotent: true}\n  - {name: down, target: %q, idempotent: true}\n"+
		"tenants:\n  - {name: a, token_sha256: [%q]}\n",
		serveDelegate(t, demo.Echo{}), serveDelegate(t, blocker(release)), serveDelegate(t, demo.Down{}), delegates.HashToken("secret-token")))
	s := startServer(t, "-memory", "-config", config, "-listen", "127.0.0.1:0")
	t.Setenv("STUBBORN_ADDR", s.addr)

	res := cliOnce("list")
	assert.Equal(t, 1, res.code)
	require.Error(t, res.err)
	assert.Equal(t, "no credentials: send authorization: Bearer <token>, or a client certificate of a tenant: send a token: STUBBORN_TOKEN (a tenant's; `stubborn token` makes one)", res.err.Error())
	t.Setenv("STUBBORN_TOKEN", "secret-token")

	res = cliOnce("get", "run_nope")
	assert.Equal(t, 1, res.code)
	require.Error(t, res.err)
	assert.NotContains(t, res.err.Error(), "rpc error")
	assert.Contains(t, res.err.Error(), `run not found: "run_nope" (it may have been deleted, or be another tenant's)`)

	res = cliOnce("run", "-brief", "hi", "-delegates", "ecoh")
	assert.Equal(t, 1, res.code)
	require.Error(t, res.err)
	assert.Equal(t, `fallback_chain.chain[0]: delegate "ecoh" is not in the registry (did you mean "echo"?)`, res.err.Error())

	// A run in flight: get says its attempt is running; delete says how
	// to delete it.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out := &syncBuffer{}
	running := goCLI(ctx, out, "run", "-control", "retry", "-target", "blocker", "-brief", "wait")
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "attempt 1 → blocker") }, 30*time.Second, 10*time.Millisecond)
	id := regexp.MustCompile(`run (run_\w+) started`).FindStringSubmatch(out.String())[1]
	res = cliOnce("get", id)
	require.NoError(t, res.err)
	assert.Contains(t, res.out, "#1 blocker: running\n")
	res = cliOnce("delete", id)
	assert.Equal(t, 1, res.code)
	require.Error(t, res.err)
	assert.Contains(t, res.err.Error(), "`stubborn delete -addr "+s.addr+" "+id+" cancel` cancels it and deletes it")
	res = cliOnce("delete", id, "cancel")
	require.NoError(t, res.err)
	assert.Equal(t, "run "+id+": deleted\n", res.out)
	assert.Equal(t, 1, (<-running).code)

	// decide fail prints how the run ended, not the status it had.
	out = &syncBuffer{}
	asking := goCLI(ctx, out, "run", "-control", "retry", "-target", "down", "-attempts", "0", "-on-exhausted", "ask", "-brief", "x")
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "AWAITING DECISION") }, 30*time.Second, 10*time.Millisecond)
	id = regexp.MustCompile(`run (run_\w+) started`).FindStringSubmatch(out.String())[1]
	res = cliOnce("decide", id, "fail")
	require.NoError(t, res.err)
	assert.Regexp(t, `^run `+id+`: FAILED`, res.out)
	assert.Equal(t, 1, (<-asking).code)

	// registry -json is the whole ListDelegatesResponse.
	res = cliOnce("registry", "-json")
	require.NoError(t, res.err)
	var reg stubbornv1.ListDelegatesResponse
	require.NoError(t, protojson.Unmarshal([]byte(res.out), &reg), res.out)
	require.Len(t, reg.GetDelegates(), 3)
	assert.Equal(t, "blocker", reg.GetDelegates()[1].GetName())
	assert.True(t, reg.GetDelegates()[1].GetIdempotent())

	// The same idempotency key again: the run it started, and a word
	// saying so.
	close(release)
	first := cliOnce("run", "-brief", "hi", "-delegates", "echo", "-idempotency-key", "k-1")
	require.NoError(t, first.err)
	assert.NotContains(t, errs.String(), "already started")
	second := cliOnce("run", "-brief", "hi", "-delegates", "echo", "-idempotency-key", "k-1")
	require.NoError(t, second.err)
	assert.Equal(t, first.out, second.out)
	assert.Contains(t, errs.String(), "stubborn: -idempotency-key \"k-1\" already started a run: nothing new started, following that run from its start\n")
}

// Following survives the server: run and watch, following a run when its
// server stops, wait for the server to come back and follow the run on
// from the last event they saw; Ctrl-C on watch exits 130 and says how to
// follow again.
func TestFollowingSurvivesTheServer(t *testing.T) {
	errs := captureStderr(t)
	release := make(chan struct{})
	config := writeConfig(t, fmt.Sprintf("delegates:\n  - {name: blocker, target: %q, idempotent: true}\n", serveDelegate(t, blocker(release))))
	args := []string{"-config", config, "-data-dir", filepath.Join(t.TempDir(), "data"), "-durability", "always"}
	s := startServer(t, append(args, "-listen", "127.0.0.1:0")...)
	t.Setenv("STUBBORN_ADDR", s.addr)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runOut := &syncBuffer{}
	running := goCLI(ctx, runOut, "run", "-control", "retry", "-target", "blocker", "-brief", "survive")
	require.Eventually(t, func() bool { return strings.Contains(runOut.String(), "attempt 1 → blocker") }, 30*time.Second, 10*time.Millisecond)
	id := regexp.MustCompile(`run (run_\w+) started`).FindStringSubmatch(runOut.String())[1]
	watchOut := &syncBuffer{}
	watching := goCLI(ctx, watchOut, "watch", id)
	require.Eventually(t, func() bool { return strings.Contains(watchOut.String(), "attempt 1 → blocker") }, 30*time.Second, 10*time.Millisecond)

	// Ctrl-C on a watch: 130, and how to follow again.
	wctx, interrupt := context.WithCancel(ctx)
	briefOut := &syncBuffer{}
	interrupted := goCLI(wctx, briefOut, "watch", id)
	require.Eventually(t, func() bool { return strings.Contains(briefOut.String(), "attempt 1 → blocker") }, 30*time.Second, 10*time.Millisecond)
	interrupt()
	res := <-interrupted
	assert.NoError(t, res.err)
	assert.Equal(t, 130, res.code)
	assert.Regexp(t, "stopped following run "+id+", which goes on on the server; follow it again with `stubborn watch -addr "+regexp.QuoteMeta(s.addr)+" "+id+` -after \d+`+"`", errs.String())

	// The server stops, and another starts on its address and store.
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	_ = s.cmd.Wait()
	require.Eventually(t, func() bool { return strings.Contains(errs.String(), "the server went away while following run "+id) }, 30*time.Second, 10*time.Millisecond)
	startServer(t, append(args, "-listen", s.addr)...)
	close(release)
	for name, done := range map[string]<-chan cliResult{"run": running, "watch": watching} {
		res := <-done
		require.NoError(t, res.err, name)
		assert.Equal(t, 0, res.code, name)
		assert.Contains(t, res.out, "run resumed by", name)
		assert.Contains(t, res.out, "attempt 1 ← blocker: INTERRUPTED", name)
		assert.Contains(t, res.out, `run finished: SUCCEEDED after 2 attempt(s), winner blocker, result "echo: survive"`, name)
		assert.Equal(t, 1, strings.Count(res.out, "run "+id+" started"), "%s: no event printed twice: %s", name, res.out)
	}
	assert.Equal(t, 2, strings.Count(errs.String(), "stubborn: following run "+id+" again, after seq "), errs.String())
}
