//go:build browser

package consoletest

import (
	"context"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
	"github.com/stubbornhq/stubborn/internal/server"
)

// stack is a Stubborn server on loopback, as `stubborn serve -listen
// -http-listen` runs it: gRPC for the test's own calls, HTTP (the API and
// the console) for the browser.
type stack struct {
	st     *server.Stubborn
	client stubbornv1.ControlServiceClient
	// url is the HTTP listener's base URL: the console is at url+"/".
	url string
}

// setup is what startServer builds.
type setup struct {
	// delegates are served with demo.Serve, each on a loopback port of its
	// own, and registered idempotent under their names.
	delegates map[string]stubbornv1.DelegateServiceServer
	// tenants go into the registry as they are.
	tenants []delegates.Tenant
	// seed makes the backoffs' jitter deterministic (server.Config.Seed).
	seed uint64
	// pages are served next to the server's HTTP handler, by path.
	pages map[string]http.Handler
	// configure, when set, changes the registry before the server starts.
	configure func(*delegates.Config)
	// clock, when set, is the server's clock (server.Config.Clock).
	clock controls.Clock
}

// skewClock is the wall clock moved on by a skew the test sets: the
// server's time jumps ahead as if that long had passed, while its sleeps
// are real.
type skewClock struct {
	controls.RealClock
	skew atomic.Int64 // nanoseconds
}

func (c *skewClock) Now() time.Time { return time.Now().Add(time.Duration(c.skew.Load())) }

// startServer starts the delegates, the server and its HTTP listener; all
// stop when the test ends (after a browser the test starts later).
func startServer(t *testing.T, su setup) *stack {
	t.Helper()
	cfg := &delegates.Config{Tenants: su.tenants}
	for _, name := range slices.Sorted(maps.Keys(su.delegates)) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s := demo.Serve(lis, su.delegates[name])
		t.Cleanup(s.Stop)
		cfg.Delegates = append(cfg.Delegates, delegates.Delegate{
			Name: name, Target: lis.Addr().String(), Idempotent: true,
			Timeout: delegates.Duration(time.Minute),
		})
	}
	if su.configure != nil {
		su.configure(cfg)
	}
	st, err := server.New(server.Config{Registry: cfg, Logger: slog.New(slog.DiscardHandler), Seed: su.seed, Clock: su.clock})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = st.Serve(lis) }()
	t.Cleanup(func() { st.Stop(5 * time.Second) })
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })

	h, err := st.HTTPHandler()
	if err != nil {
		t.Fatal(err)
	}
	if len(su.pages) > 0 {
		mux := http.NewServeMux()
		mux.Handle("/", h)
		for path, p := range su.pages {
			mux.Handle(path, p)
		}
		h = mux
	}
	hs := httptest.NewUnstartedServer(h) // on 127.0.0.1
	hs.Config = server.NewHTTPServer(h)
	hs.Start()
	t.Cleanup(func() {
		// Streams the browser left open (WatchRun, WatchRuns) end here,
		// not when their runs do.
		hs.CloseClientConnections()
		hs.Close()
	})
	t.Logf("server: console at %s/", hs.URL)
	return &stack{st: st, client: stubbornv1.NewControlServiceClient(conn), url: hs.URL}
}

// ctx is a context for the test's own calls, bounded.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// as returns ctx that sends token as a bearer token.
func as(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// waitStatus polls GetRun until the run has the status.
func (s *stack) waitStatus(t *testing.T, ctx context.Context, id string, want stubbornv1.RunStatus, d time.Duration) *stubbornv1.ControlState {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		res, err := s.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
		if err != nil {
			t.Fatalf("GetRun %s: %v", id, err)
		}
		if res.GetState().GetStatus() == want {
			return res.GetState()
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s is %v after %v, want %v", id, res.GetState().GetStatus(), d, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
