package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/jsstore"
)

// healthNames are the services whose health says whether Stubborn serves.
var healthNames = []string{"", stubbornv1.ControlService_ServiceDesc.ServiceName}

// TestServeFollowsItsStoreConnection: `serve -nats-url` reports
// NOT_SERVING in health while its NATS server is gone and SERVING once it
// is back, for the whole server and for the ControlService; when the
// connection is closed for good (here: the NATS server's password
// changes, which nats.go gives up on after two refusals), it logs an
// ERROR and exits 1 for a supervisor to restart it. The password in
// -nats-url is never logged. Before, health said
// SERVING throughout and the process stayed up with every StartRun failing
// "nats: connection closed" (issue 17, finding 1).
func TestServeFollowsItsStoreConnection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	port := freePorts(t, 1)[0]
	opts := func(password string) *server.Options {
		return &server.Options{
			Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: filepath.Join(dir, "nats"),
			Username: "stubborn", Password: password, NoSigs: true, NoLog: true,
		}
	}
	startNATS := func() *server.Server {
		ns, err := server.NewServer(opts("first"))
		require.NoError(t, err)
		ns.Start()
		require.True(t, ns.ReadyForConnections(10*time.Second))
		t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
		return ns
	}
	ns := startNATS()

	config := filepath.Join(dir, "stubborn.yaml")
	require.NoError(t, os.WriteFile(config, []byte("delegates:\n  - {name: echo, target: \"127.0.0.1:1\"}\n"), 0o600))
	s := startLoggedServer(t, "-config", config, "-listen", fmt.Sprintf("127.0.0.1:%d", freePorts(t, 1)[0]),
		"-nats-url", fmt.Sprintf("nats://stubborn:first@127.0.0.1:%d", port), "-replicas", "1")
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	hc := healthpb.NewHealthClient(conn)
	healthIs := func(want healthpb.HealthCheckResponse_ServingStatus) func() bool {
		return func() bool {
			for _, name := range healthNames {
				res, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: name})
				if err != nil || res.GetStatus() != want {
					return false
				}
			}
			return true
		}
	}
	require.True(t, healthIs(healthpb.HealthCheckResponse_SERVING)())

	ns.Shutdown()
	ns.WaitForShutdown()
	require.Eventually(t, healthIs(healthpb.HealthCheckResponse_NOT_SERVING), 5*time.Second, 20*time.Millisecond)
	ns = startNATS()
	require.Eventually(t, healthIs(healthpb.HealthCheckResponse_SERVING), 10*time.Second, 20*time.Millisecond)

	require.NoError(t, ns.ReloadOptions(opts("second")))
	select {
	case <-s.eof:
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not exit")
	}
	err = s.cmd.Wait()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "serve exits non-zero: %v", err)
	assert.Equal(t, 1, exit.ExitCode())
	logs := s.logs.String()
	assert.Contains(t, logs, `"level":"ERROR","msg":"shutting down: the store cannot be reached again"`)
	assert.Contains(t, logs, "authorization violation")
	assert.NotContains(t, logs, "first@", "the password in -nats-url is not logged")
}

// loggedChild is a `stubborn serve` child process whose log can be read
// once it has ended (eof closed).
type loggedChild struct {
	cmd  *exec.Cmd
	addr string
	logs strings.Builder // written until eof is closed
	eof  chan struct{}
}

// startLoggedServer runs `stubborn serve` as a child process and waits
// until it serves.
func startLoggedServer(t *testing.T, args ...string) *loggedChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"serve", "-log-format", "json"}, args...)...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	s := &loggedChild{cmd: cmd, eof: make(chan struct{})}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-s.eof
		_ = cmd.Wait()
	})
	addrc := make(chan string, 1)
	go func() {
		defer close(s.eof)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			s.logs.WriteString(line + "\n")
			if strings.Contains(line, `"msg":"stubborn serving"`) {
				_, rest, _ := strings.Cut(line, `"addr":"`)
				addr, _, _ := strings.Cut(rest, `"`)
				addrc <- addr
			}
		}
	}()
	select {
	case s.addr = <-addrc:
	case <-s.eof:
		t.Fatalf("server did not start:\n%s", s.logs.String())
	case <-time.After(60 * time.Second):
		t.Fatal("server did not start")
	}
	return s
}

// TestEmbeddedStoreClosedIsFatal: the embedded store's in-process
// connection closed for good (a control line over 4 KiB, as a 4,000-byte
// run id made in issue 17) turns health NOT_SERVING and sends the reason to
// fatal, which makes `serve` exit 1 (TestServeFollowsItsStoreConnection).
func TestEmbeddedStoreClosedIsFatal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := storeFlags{dataDir: t.TempDir(), durability: string(jsstore.SyncInterval), syncPeriod: time.Second, lease: runs.DefaultLease, outputFlush: runs.DefaultOutputFlushInterval, outputFlushBytes: runs.DefaultOutputFlushBytes}
	rc, w, closeStore, err := f.open(ctx, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer closeStore()
	require.NotNil(t, rc.Store)
	hs := health.NewServer()
	var mu sync.Mutex
	var set []bool
	w.attach(func(serving bool) {
		mu.Lock()
		set = append(set, serving)
		mu.Unlock()
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if serving {
			st = healthpb.HealthCheckResponse_SERVING
		}
		for _, name := range healthNames {
			hs.SetServingStatus(name, st)
		}
	})
	check := func() healthpb.HealthCheckResponse_ServingStatus {
		res, err := hs.Check(ctx, &healthpb.HealthCheckRequest{Service: healthNames[1]})
		require.NoError(t, err)
		return res.GetStatus()
	}
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, check())
	// The store's own requests at start (the index's reconcile) done: the
	// connection's first error is the publish below, not one of theirs
	// meeting the closed connection.
	<-rc.Store.(*jsstore.JetStream).IndexReconciled()

	require.NoError(t, w.conn.Publish("stubborn.events."+strings.Repeat("x", 5000), nil))
	select {
	case err := <-w.fatal:
		assert.ErrorContains(t, err, "closed for good")
		assert.Contains(t, strings.ToLower(err.Error()), "maximum control line exceeded")
	case <-ctx.Done():
		t.Fatal("no fatal error")
	}
	assert.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, check())
	mu.Lock()
	assert.Equal(t, []bool{true, false}, set)
	mu.Unlock()
}
