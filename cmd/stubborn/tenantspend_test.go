package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// serve keeps the tenants' spend in its store: a restarted server finds
// what the default tenant spent today, and refuses its runs over its limit.
func TestATenantsSpendSurvivesARestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srvDelegate := demo.Serve(lis, demo.Echo{})
	t.Cleanup(srvDelegate.Stop)
	dir := t.TempDir()
	config := filepath.Join(dir, "stubborn.yaml")
	require.NoError(t, os.WriteFile(config, fmt.Appendf(nil, `spend_limit: {max_cost: 2, period: day}
delegates:
  - {name: echo, target: %q, idempotent: true, price: {per_call: 1}}
`, lis.Addr()), 0o600))
	addr := fmt.Sprintf("127.0.0.1:%d", freePorts(t, 1)[0])
	args := []string{"-config", config, "-listen", addr, "-data-dir", filepath.Join(dir, "data")}
	srv := startServer(t, args...)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	client := stubbornv1.NewControlServiceClient(conn)
	start := func(delegate string) error {
		_, err := client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "x", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{delegate}}})
		return err
	}
	run := func() error { return start("echo") }
	// A run of an unknown delegate spends nothing: the spend limit refuses
	// it first, else it is NOT_FOUND.
	probe := func() error { return start("nope") }
	require.Eventually(t, func() bool { return run() == nil }, time.Minute, 50*time.Millisecond, "the server answers")
	require.NoError(t, run())
	require.Eventually(t, func() bool { return status.Code(probe()) == codes.ResourceExhausted }, time.Minute, 50*time.Millisecond,
		"two calls at 1 reach the limit of 2")

	// A graceful stop writes what is left.
	require.NoError(t, srv.cmd.Process.Signal(syscall.SIGTERM))
	_ = srv.cmd.Wait()
	srv = startServer(t, args...)
	defer srv.kill(t)
	var err2 error
	require.Eventually(t, func() bool {
		err2 = probe()
		return status.Code(err2) != codes.Unavailable
	}, time.Minute, 50*time.Millisecond, "the server answers again")
	st := status.Convert(err2)
	require.Equal(t, codes.ResourceExhausted, st.Code(), "%v", err2)
	assert.Contains(t, st.Message(), "the default tenant reached its daily spend limit: spent 2 of spend_limit.max_cost 2; it resets at ")
}
