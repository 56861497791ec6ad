package fleetguardtest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stubbornhq/stubborn/internal/fleetguard"
)

// Cluster is three nats-server processes (built from the module's
// nats-server) in one JetStream cluster on 127.0.0.1: what a fleet's
// replicas share in production, the NATS servers' CPU apart from the
// test's.
type Cluster struct {
	URLs []string
}

// StartCluster builds nats-server into a temporary directory and starts
// the cluster, stopped at the test's end.
func StartCluster(tb testing.TB) *Cluster {
	tb.Helper()
	dir := tb.TempDir()
	bin := filepath.Join(dir, "nats-server")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2").CombinedOutput(); err != nil {
		tb.Fatalf("building nats-server: %v: %s", err, out)
	}
	ports := make([]int, 6)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		ports[i] = l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
	}
	var routes []string
	for i := range 3 {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[3+i]))
	}
	c := &Cluster{}
	for i := range 3 {
		cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", fmt.Sprint(ports[i]), "-js", "-sd", filepath.Join(dir, fmt.Sprintf("n%d", i)),
			"--server_name", fmt.Sprintf("n%d", i), "--cluster_name", "fleet", "--cluster", routes[i], "--routes", strings.Join(routes, ","))
		if err := cmd.Start(); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		c.URLs = append(c.URLs, fmt.Sprintf("nats://127.0.0.1:%d", ports[i]))
	}
	return c
}

// Fleet opens a Fleet for replica on the cluster (buckets of 3 replicas),
// once the cluster has formed.
func (c *Cluster) Fleet(tb testing.TB, replica string) *fleetguard.Fleet {
	tb.Helper()
	nc, err := nats.Connect(strings.Join(c.URLs, ","), nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true))
	if err != nil {
		tb.Fatal(err)
	}
	var f *fleetguard.Fleet
	for deadline := time.Now().Add(time.Minute); f == nil; {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		f, err = fleetguard.Open(ctx, nc, fleetguard.Config{Replica: replica, Replicas: 3})
		cancel()
		if err != nil && time.Now().After(deadline) {
			tb.Fatalf("the cluster did not form: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	tb.Cleanup(func() { f.Close(); nc.Close() })
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if up, _ := f.Scope(); up {
			return f
		}
		if time.Now().After(deadline) {
			tb.Fatal("the fleet's breakers were not read within 30s")
		}
	}
}
