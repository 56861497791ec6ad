package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/delegates/demo"
)

// The client commands as a user types them: STUBBORN_ADDR instead of
// -addr, a second run with an idempotency key follows the first's run,
// list says what it shows, get prints a few lines, registry lists what
// may be named, and a misspelt delegate gets a guess.
func TestClientCommandsAsTyped(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	echo := demo.Serve(lis, demo.Echo{})
	t.Cleanup(echo.Stop)
	downLis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	down := demo.Serve(downLis, demo.Down{})
	t.Cleanup(down.Stop)
	config := filepath.Join(t.TempDir(), "stubborn.yaml")
	require.NoError(t, os.WriteFile(config, fmt.Appendf(nil, "delegates:\n  - {name: echo, target: %q, idempotent: true}\n  - {name: down, target: %q, idempotent: true}\npresets:\n  - {name: twice, retry: {target: echo, attempts: 1}}\n", lis.Addr(), downLis.Addr()), 0o600))
	s := startServer(t, "-memory", "-config", config, "-listen", "127.0.0.1:0")
	t.Setenv("STUBBORN_ADDR", s.addr)
	cli := func(args ...string) (string, int, error) {
		var out bytes.Buffer
		code, err := run(context.Background(), args, &out)
		return out.String(), code, err
	}

	out, code, err := cli("list")
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	assert.Equal(t, "no runs\n", out)

	first, code, err := cli("run", "-brief", "hi", "-delegates", "echo", "-idempotency-key", "order-42", "-metadata", "a=b")
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	second, _, err := cli("run", "-brief", "hi", "-delegates", "echo", "-idempotency-key", "order-42")
	require.NoError(t, err)
	assert.Equal(t, first, second, "the same run, replayed from seq 1")
	id := strings.Fields(first)[3]
	require.True(t, strings.HasPrefix(id, "run_"), first)

	out, _, err = cli("get", id)
	require.NoError(t, err)
	assert.Contains(t, out, "run "+id+": SUCCEEDED")
	assert.Contains(t, out, `result    "echo: hi"`)

	out, _, err = cli("list")
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(out, "\n"), "one run: %s", out)

	out, _, err = cli("registry")
	require.NoError(t, err)
	assert.Contains(t, out, "delegate  echo ")
	assert.Contains(t, out, "preset    twice                    retry of echo")

	_, code, err = cli("run", "-brief", "hi", "-delegates", "ecoh")
	assert.Equal(t, 1, code)
	assert.ErrorContains(t, err, `(did you mean "echo"?)`)

	_, code, err = cli("list", "-status", "awaiting")
	assert.Equal(t, 2, code)
	assert.ErrorContains(t, err, "awaiting_decision")

	// Interrupted (its context ends, as Ctrl-C ends run's), -cancel-on-
	// interrupt cancels the run; enum values in the .proto's spelling.
	ctx, interrupt := context.WithCancel(context.Background())
	defer interrupt()
	done := make(chan int, 1)
	go func() {
		code, _ := run(ctx, []string{"run", "-control", "RETRY", "-target", "down", "-brief", "x", "-on-exhausted", "ON_EXHAUSTED_FAIL",
			"-base-wait", "1h", "-max-wait", "1h", "-cancel-on-interrupt"}, &bytes.Buffer{})
		done <- code
	}()
	require.Eventually(t, func() bool {
		out, _, err := cli("list", "-status", "BACKING_OFF")
		return err == nil && strings.Contains(out, "retry of down")
	}, 10*time.Second, 20*time.Millisecond)
	interrupt()
	assert.Equal(t, 130, <-done)
	out, _, err = cli("list", "-status", "cancelled")
	require.NoError(t, err)
	assert.Contains(t, out, "retry of down")

	// Forgotten on request.
	out, code, err = cli("delete", id)
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	assert.Equal(t, "run "+id+": deleted\n", out)
	_, code, err = cli("get", id)
	assert.Equal(t, 1, code)
	assert.ErrorContains(t, err, "NotFound")
}

// SIGHUP does not end the server (by default it would, silently): it says
// that this version does not reload its config, and serves on.
func TestServeSurvivesSIGHUP(t *testing.T) {
	config := filepath.Join(t.TempDir(), "stubborn.yaml")
	require.NoError(t, os.WriteFile(config, []byte("delegates: []\n"), 0o600))
	s := startServer(t, "-memory", "-config", config, "-listen", "127.0.0.1:0")
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return strings.Contains(s.logs.String(), "does not reload its config")
	}, 10*time.Second, 10*time.Millisecond)
	out, code, err := func() (string, int, error) {
		var out bytes.Buffer
		code, err := run(context.Background(), []string{"list", "-addr", s.addr}, &out)
		return out.String(), code, err
	}()
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	assert.Equal(t, "no runs\n", out, "still serving")
}
