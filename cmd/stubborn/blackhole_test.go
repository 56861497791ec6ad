package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// blackholeProxy forwards TCP connections to upstream, unless blackholed: then
// it accepts connections and reads what both sides send, forwarding none
// of it, as a link that went silent does.
type blackholeProxy struct {
	lis      net.Listener
	upstream string
	black    atomic.Bool
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

func startBlackholeProxy(t *testing.T, upstream string) *blackholeProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &blackholeProxy{lis: lis, upstream: upstream}
	p.wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", upstream)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			p.wg.Go(func() { p.pipe(u, c) })
			p.wg.Go(func() { p.pipe(c, u) })
		}
	})
	t.Cleanup(func() {
		_ = lis.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// pipe copies from src to dst, dropping what it reads while blackholed.
func (p *blackholeProxy) pipe(dst, src net.Conn) {
	defer func() { _ = dst.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.black.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				_ = src.Close()
			}
			return
		}
	}
}

// TestHealthFollowsABlackholedStoreLink: the link between `serve` and its
// NATS server goes silent (a blackhole: connections accepted, nothing
// forwarded either way). Health turns NOT_SERVING within the lease plus
// 2 s, and SERVING again once the link carries traffic again. Before,
// health said SERVING for 11–17.6 s with a 6 s lease, 22 s with 10 s
// (issue 29, item 6): nats.go noticed the silent connection only through
// its default pings, and health followed the connection only.
func TestHealthFollowsABlackholedStoreLink(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: filepath.Join(dir, "nats"), NoSigs: true, NoLog: true,
	})
	require.NoError(t, err)
	ns.Start()
	require.True(t, ns.ReadyForConnections(10*time.Second))
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	proxy := startBlackholeProxy(t, ns.Addr().String())

	const lease = 4 * time.Second
	config := filepath.Join(dir, "stubborn.yaml")
	require.NoError(t, os.WriteFile(config, []byte("delegates:\n  - {name: echo, target: \"127.0.0.1:1\"}\n"), 0o600))
	s := startLoggedServer(t, "-config", config, "-listen", fmt.Sprintf("127.0.0.1:%d", freePorts(t, 1)[0]),
		"-nats-url", "nats://"+proxy.lis.Addr().String(), "-replicas", "1", "-lease", lease.String())
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	hc := healthpb.NewHealthClient(conn)
	status := func() healthpb.HealthCheckResponse_ServingStatus {
		res, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return healthpb.HealthCheckResponse_UNKNOWN
		}
		return res.GetStatus()
	}
	// Serving, and beating through the proxy, for a lease and more.
	require.Eventually(t, func() bool { return status() == healthpb.HealthCheckResponse_SERVING }, 10*time.Second, 20*time.Millisecond)
	time.Sleep(lease + time.Second)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, status())

	proxy.black.Store(true)
	cut := time.Now()
	require.Eventually(t, func() bool { return status() == healthpb.HealthCheckResponse_NOT_SERVING }, 2*lease+5*time.Second, 20*time.Millisecond)
	notServing := time.Since(cut)
	t.Logf("NOT_SERVING %v after the link went silent (lease %v)", notServing.Round(10*time.Millisecond), lease)
	assert.LessOrEqual(t, notServing, lease+2*time.Second, "NOT_SERVING within the lease plus 2 s")

	proxy.black.Store(false)
	healed := time.Now()
	require.Eventually(t, func() bool { return status() == healthpb.HealthCheckResponse_SERVING }, 30*time.Second, 20*time.Millisecond)
	t.Logf("SERVING again %v after the link came back", time.Since(healed).Round(10*time.Millisecond))
	// Serving stays: the reconnected link carries the beats.
	time.Sleep(lease + time.Second)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, status())
}
