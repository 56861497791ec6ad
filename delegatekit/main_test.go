package delegatekit_test

import (
	"bufio"
	"flag"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/stubbornhq/stubborn/delegatekit"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

func TestDefaultListen(t *testing.T) {
	env := func(port string) func(string) string {
		return func(k string) string {
			if k == "PORT" {
				return port
			}
			return ""
		}
	}
	assert.Equal(t, delegatekit.DefaultListen, delegatekit.DefaultListenFrom(env("")))
	assert.Equal(t, ":8080", delegatekit.DefaultListenFrom(env("8080")))
}

// mainChild marks the process this test starts: it runs Main.
const mainChild = "DELEGATEKIT_TEST_MAIN_CHILD"

// TestMainSignal runs Main in a child process (this test binary again), calls
// the delegate it serves, then stops it with SIGTERM.
func TestMainSignal(t *testing.T) {
	if os.Getenv(mainChild) == "1" {
		// The program's own -listen: Main uses it. Loopback, any port.
		flag.String("listen", "127.0.0.1:0", "")
		delegatekit.Main(echo, delegatekit.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))))
		return
	}
	if runtime.GOOS == "windows" {
		t.Skip("no SIGTERM to send on Windows")
	}
	ctx := testCtx(t)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestMainSignal$")
	cmd.Env = append(os.Environ(), mainChild+"=1")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := bufio.NewScanner(stderr)
	addr := ""
	for addr == "" && lines.Scan() {
		if m := regexp.MustCompile(`delegate serving" addr=(\S+)`).FindStringSubmatch(lines.Text()); m != nil {
			addr = m[1]
		}
	}
	require.NotEmpty(t, addr, "Main logs the address it serves on")

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	resp, err := stubbornv1.NewDelegateServiceClient(conn).Execute(ctx, req("main"))
	require.NoError(t, err)
	assert.Equal(t, "echo: main", resp.GetResult().GetText())
	h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, h.GetStatus())

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	rest, err := io.ReadAll(stderr)
	require.NoError(t, err)
	require.NoError(t, cmd.Wait(), "Main returns after a signal: the child exits 0")
	assert.True(t, strings.Contains(string(rest), "delegate stopped"), string(rest))
}
