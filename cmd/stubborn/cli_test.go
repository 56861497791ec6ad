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
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
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

	// list -json: a RunSummary a line, in protojson's names.
	out, code, err = cli("list", "-json")
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	var summary stubbornv1.RunSummary
	require.NoError(t, protojson.Unmarshal([]byte(strings.TrimSuffix(out, "\n")), &summary), out)
	assert.Equal(t, id, summary.GetRunId())
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, summary.GetStatus())
	assert.Contains(t, out, `"runId":`)
	out, _, err = cli("list", "-json", "-status", "failed")
	require.NoError(t, err)
	assert.Empty(t, out, "no runs: no lines")

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
	// The client is interrupted once it has seen the backoff itself: the
	// server lists a run as backing off before its stream has reached the
	// client, and a client that knows no run id yet has nothing to cancel.
	seen := &syncBuffer{}
	go func() {
		code, _ := run(ctx, []string{"run", "-control", "RETRY", "-target", "down", "-brief", "x", "-on-exhausted", "ON_EXHAUSTED_FAIL",
			"-base-wait", "1h", "-max-wait", "1h", "-cancel-on-interrupt"}, seen)
		done <- code
	}()
	require.Eventually(t, func() bool { return strings.Contains(seen.String(), "backing off") }, 10*time.Second, 20*time.Millisecond)
	interrupt()
	assert.Equal(t, 130, <-done)
	out, _, err = cli("list", "-status", "cancelled")
	require.NoError(t, err)
	assert.Contains(t, out, "retry of down")

	// Without it, a second Ctrl-C (at a terminal) cancels the run.
	again := make(chan os.Signal, 1)
	moreInterrupts = func() (<-chan os.Signal, func()) { return again, func() {} }
	t.Cleanup(func() { moreInterrupts = defaultMoreInterrupts })
	ctx, interrupt = context.WithCancel(context.Background())
	defer interrupt()
	seen = &syncBuffer{}
	go func() {
		code, _ := run(ctx, []string{"run", "-control", "retry", "-target", "down", "-brief", "twice", "-on-exhausted", "fail",
			"-base-wait", "1h", "-max-wait", "1h"}, seen)
		done <- code
	}()
	require.Eventually(t, func() bool { return strings.Contains(seen.String(), "backing off") }, 10*time.Second, 20*time.Millisecond)
	out, _, err = cli("list", "-status", "backing_off")
	require.NoError(t, err)
	assert.Contains(t, out, "retry of down")
	interrupt()
	again <- os.Interrupt
	assert.Equal(t, 130, <-done)
	out, _, err = cli("list", "-status", "cancelled")
	require.NoError(t, err)
	assert.Equal(t, 2, strings.Count(out, "retry of down"), out)

	// Forgotten on request.
	out, code, err = cli("delete", id)
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	assert.Equal(t, "run "+id+": deleted\n", out)
	_, code, err = cli("get", id)
	assert.Equal(t, 1, code)
	assert.ErrorContains(t, err, "run not found")
}

// The config reloads when its file changes (written in place or renamed
// over, as editors do) and on SIGHUP; a bad file is logged and the config
// in use kept, and SIGHUP never ends the server.
func TestServeReloadsConfig(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	echo := demo.Serve(lis, demo.Echo{})
	t.Cleanup(echo.Stop)
	dir := t.TempDir()
	config := filepath.Join(dir, "stubborn.yaml")
	one := fmt.Sprintf("delegates:\n  - {name: echo, target: %q, idempotent: true}\n", lis.Addr())
	two := one + fmt.Sprintf("  - {name: again, target: %q, idempotent: true}\n", lis.Addr())
	require.NoError(t, os.WriteFile(config, []byte(one), 0o600))
	s := startServer(t, "-memory", "-config", config, "-listen", "127.0.0.1:0")
	t.Setenv("STUBBORN_ADDR", s.addr)
	cli := func(args ...string) (string, int, error) {
		var out bytes.Buffer
		code, err := run(context.Background(), args, &out)
		return out.String(), code, err
	}
	logged := func(msg, why string, n int) {
		t.Helper()
		require.Eventually(t, func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			count := 0
			for _, line := range strings.Split(s.logs.String(), "\n") {
				if strings.Contains(line, `"msg":"`+msg+`"`) && strings.Contains(line, `"why":"`+why+`"`) {
					count++
				}
			}
			return count >= n
		}, 10*time.Second, 10*time.Millisecond, "%d × %s (%s)", n, msg, why)
	}

	// Renamed over, as an editor saves.
	tmp := filepath.Join(dir, ".stubborn.yaml.swp")
	require.NoError(t, os.WriteFile(tmp, []byte(two), 0o600))
	require.NoError(t, os.Rename(tmp, config))
	logged("config reloaded", "the file changed", 1)
	s.mu.Lock()
	assert.Contains(t, s.logs.String(), `"delegates_added":["again"],"delegates_removed":null,"delegates_changed":null`)
	s.mu.Unlock()
	out, code, err := cli("run", "-brief", "hi", "-delegates", "again")
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "echo: hi")

	// A bad file, written in place: logged, the config in use kept.
	require.NoError(t, os.WriteFile(config, []byte(two+"  - {name: bad, target: x, idempotnt: true}\n"), 0o600))
	logged("config not reloaded: keeping the one in use", "the file changed", 1)
	s.mu.Lock()
	assert.Contains(t, s.logs.String(), "idempotnt")
	s.mu.Unlock()
	out, _, err = cli("registry")
	require.NoError(t, err)
	assert.Contains(t, out, "delegate  again ")

	// SIGHUP reads it again: still bad, still served.
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGHUP))
	logged("config not reloaded: keeping the one in use", "SIGHUP", 1)

	// Fixed, without "again", and echo changed: new runs naming again
	// are NOT_FOUND, and the log says what changed.
	changed := strings.Replace(one, "idempotent: true", "idempotent: true, timeout: 7s", 1)
	require.NoError(t, os.WriteFile(config, []byte(changed), 0o600))
	logged("config reloaded", "the file changed", 2)
	s.mu.Lock()
	assert.Contains(t, s.logs.String(), `"delegates_added":null,"delegates_removed":["again"],"delegates_changed":["echo"]`)
	s.mu.Unlock()
	_, code, err = cli("run", "-brief", "hi", "-delegates", "again")
	assert.Equal(t, 1, code)
	assert.ErrorContains(t, err, `delegate "again" is not in the registry`)
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGHUP))
	logged("config reloaded", "SIGHUP", 1)
	out, _, err = cli("registry")
	require.NoError(t, err)
	assert.Contains(t, out, "delegate  echo ")
	assert.NotContains(t, out, "again")
}

// TestRegistrySaysWhatALastCallDid: a delegate no health check asked shows
// what its calls did: none yet, ok and when, or failing since when, with
// the last error.
func TestRegistrySaysWhatALastCallDid(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(now.Add(-d)) }
	h, trait := callHealth(&stubbornv1.DelegateDescription{}, now)
	assert.Equal(t, "no calls", h)
	assert.Empty(t, trait)
	h, trait = callHealth(&stubbornv1.DelegateDescription{LastCallTime: ago(3 * time.Second)}, now)
	assert.Equal(t, "calls ok", h)
	assert.Equal(t, "last call ok 3s ago", trait)
	h, trait = callHealth(&stubbornv1.DelegateDescription{LastCallTime: ago(time.Second), LastCallCode: int32(codes.Unavailable), FailingSince: ago(2 * time.Minute),
		RecentFailures: []*stubbornv1.DelegateFailure{{Code: int32(codes.Unavailable), Message: "connection refused"}}}, now)
	assert.Equal(t, "failing", h)
	assert.Equal(t, "failing since "+now.Add(-2*time.Minute).Local().Format("15:04:05")+` (2m0s ago): Unavailable "connection refused"`, trait)
}
