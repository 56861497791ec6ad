// Package fleetguardtest starts what tests of fleet-wide guards need: an
// in-process nats-server with JetStream, and Fleets on it.
package fleetguardtest

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/stubbornhq/stubborn/internal/fleetguard"
)

// NATS is an in-process nats-server with JetStream on 127.0.0.1.
type NATS struct {
	*server.Server
	dir  string
	port int
}

// StartNATS starts one, stopped at the test's end.
func StartNATS(t testing.TB) *NATS {
	t.Helper()
	n := &NATS{dir: t.TempDir(), port: -1}
	n.Restart(t)
	n.port = n.Addr().(*net.TCPAddr).Port
	t.Cleanup(func() { n.Shutdown() })
	return n
}

// Restart starts it (again, on the same port and store directory).
func (n *NATS) Restart(t testing.TB) {
	t.Helper()
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: n.port, NoSigs: true, NoLog: true, JetStream: true, StoreDir: n.dir,
	})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	n.Server = ns
	t.Cleanup(ns.Shutdown)
}

// Fleet opens a Fleet for replica on its own connection to n, whose clock
// is now (nil: the wall clock), closed at the test's end; it returns once
// the Fleet has read the breakers.
func (n *NATS) Fleet(t testing.TB, replica string, now func() time.Time) *fleetguard.Fleet {
	t.Helper()
	nc, err := nats.Connect(n.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.PingInterval(200*time.Millisecond), nats.MaxPingsOutstanding(2))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f, err := fleetguard.Open(ctx, nc, fleetguard.Config{Replica: replica, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close(); nc.Close() })
	for deadline := time.Now().Add(10 * time.Second); ; {
		if up, _ := f.Scope(); up {
			return f
		}
		if time.Now().After(deadline) {
			t.Fatal("the fleet's breakers were not read within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
