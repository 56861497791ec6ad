package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
	"github.com/stubbornhq/stubborn/internal/runs/jsstore"
	"github.com/stubbornhq/stubborn/internal/server"
)

// Delegate names in the Stubborn registry the harness builds.
const (
	echoName    = "echo"    // demo.Echo: scenarios 1–3
	flaky2Name  = "flaky2"  // attempts 1 and 2 fail: scenario 4
	downName    = "down"    // every attempt fails: scenario 5
	watchedName = "watched" // gated, then fails until its last attempt: scenario 6
)

// stores are the run stores the Stubborn scenarios can run on, by -store
// name. Each adjusts the server config and returns a cleanup. Only the
// in-memory journal exists today; the durable JetStream modes (issue #8,
// item 7: one entry per durability setting) are added here.
var stores = map[string]func(cfg *server.Config) (cleanup func(), err error){
	"memory":            func(*server.Config) (func(), error) { return func() {}, nil },
	"embedded-always":   embedded(jsstore.SyncAlways),
	"embedded-interval": embedded(jsstore.SyncInterval),
	// The embedded JetStream with its streams and buckets in memory: the
	// engine's one durable code path without the disk, beside "memory"
	// (the memory store), to weigh keeping two stores.
	"embedded-memstorage": embeddedStorage(jsstore.SyncInterval, true),
}

// embedded keeps runs in an in-process JetStream in a temporary directory,
// fsyncing as durability says: the default `stubborn serve`.
func embedded(durability jsstore.Durability) func(cfg *server.Config) (func(), error) {
	return embeddedStorage(durability, false)
}

// embeddedStorage is embedded, its streams and buckets in memory when
// memory is set (jsstore.JetStreamConfig.Memory).
func embeddedStorage(durability jsstore.Durability, memory bool) func(cfg *server.Config) (func(), error) {
	return func(cfg *server.Config) (func(), error) {
		dir, err := os.MkdirTemp("", "stubborn-bench-")
		if err != nil {
			return nil, err
		}
		e, err := jsstore.StartEmbedded(jsstore.EmbeddedConfig{DataDir: dir, Durability: durability, SyncPeriod: time.Second})
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		store, err := jsstore.NewJetStream(context.Background(), e.Conn, jsstore.JetStreamConfig{Memory: memory})
		if err != nil {
			e.Close()
			_ = os.RemoveAll(dir)
			return nil, err
		}
		cfg.Runs.Store, cfg.Runs.SoleOwner, cfg.Runs.CancelOnClose = store, true, true
		return func() { _ = store.Close(); e.Close(); _ = os.RemoveAll(dir) }, nil
	}
}

func storeNames() string {
	names := make([]string, 0, len(stores))
	for n := range stores {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ",")
}

// failFirst fails every attempt whose number is at most n with UNAVAILABLE
// and echoes otherwise. It keys on ExecuteRequest.attempt, so the failures
// are deterministic per run however many runs call it at once.
type failFirst struct {
	stubbornv1.UnimplementedDelegateServiceServer
	n     int32
	calls atomic.Int64
}

func (f *failFirst) Execute(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
	f.calls.Add(1)
	if req.GetAttempt() <= f.n {
		return nil, status.Errorf(codes.Unavailable, "bench: attempt %d of run %s fails", req.GetAttempt(), req.GetRunId())
	}
	return demo.Echo{}.Execute(ctx, req)
}

// watched holds a run's first attempt until its gate opens (so that every
// watcher is attached before the live events start), then fails every
// attempt before attempt last, and echoes on attempt last.
type watched struct {
	stubbornv1.UnimplementedDelegateServiceServer
	last int32
	gate atomic.Pointer[chan struct{}]
}

func (w *watched) Execute(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
	if req.GetAttempt() == 1 {
		if g := w.gate.Load(); g != nil {
			select {
			case <-*g:
			case <-ctx.Done():
				return nil, status.FromContextError(ctx.Err()).Err()
			}
		}
	}
	if req.GetAttempt() < w.last {
		return nil, status.Errorf(codes.Unavailable, "bench: attempt %d fails", req.GetAttempt())
	}
	return demo.Echo{}.Execute(ctx, req)
}

// proxy is the physical limit Stubborn is compared with: a DelegateService
// that forwards Execute, and nothing else, over one shared connection.
type proxy struct {
	stubbornv1.UnimplementedDelegateServiceServer
	next stubbornv1.DelegateServiceClient
}

func (p proxy) Execute(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
	return p.next.Execute(ctx, req)
}

// streamer is the physical limit of Run's shape: a ControlService whose Run
// forwards the brief to the delegate, like the proxy, then streams the
// events of a run captured from Stubborn (the same messages, the same
// sizes), with no bookkeeping at all.
type streamer struct {
	stubbornv1.UnimplementedControlServiceServer
	next   stubbornv1.DelegateServiceClient
	events []*stubbornv1.RunEvent
	live   bool // send the events recorded before the delegate call before it (scenario 2c)
}

func (s *streamer) Run(req *stubbornv1.RunRequest, stream grpc.ServerStreamingServer[stubbornv1.RunResponse]) error {
	send := func(evs []*stubbornv1.RunEvent) error {
		for _, ev := range evs {
			if err := stream.Send(&stubbornv1.RunResponse{Event: ev}); err != nil {
				return err
			}
		}
		return nil
	}
	rest := s.events
	if s.live {
		// The events Stubborn records before it calls the delegate go
		// out before the call, as Run sends them.
		n := 0
		for n < len(rest) && rest[n].GetAttemptStarted() == nil {
			n++
		}
		if n < len(rest) {
			n++
		}
		if err := send(rest[:n]); err != nil {
			return err
		}
		rest = rest[n:]
	}
	if _, err := s.next.Execute(stream.Context(), &stubbornv1.ExecuteRequest{Brief: req.GetTaskBrief()}); err != nil {
		return err
	}
	return send(rest)
}

// startStreamer serves a streamer of events on loopback and returns a
// client of it.
func (w *world) startStreamer(events []*stubbornv1.RunEvent, live bool) (stubbornv1.ControlServiceClient, error) {
	next, err := w.dial(w.echoAddr)
	if err != nil {
		return nil, err
	}
	lis, err := listen()
	if err != nil {
		return nil, err
	}
	gs := grpc.NewServer()
	stubbornv1.RegisterControlServiceServer(gs, &streamer{next: stubbornv1.NewDelegateServiceClient(next), events: events, live: live})
	go func() { _ = gs.Serve(lis) }()
	w.servers = append(w.servers, gs)
	c, err := w.dial(lis.Addr().String())
	if err != nil {
		return nil, err
	}
	return stubbornv1.NewControlServiceClient(c), nil
}

// world is everything the scenarios share: the delegate servers, the plain
// proxy, and the client connections to them.
type world struct {
	servers []*grpc.Server
	conns   []*grpc.ClientConn

	echoAddr string
	direct   stubbornv1.DelegateServiceClient // caller → delegate
	proxied  stubbornv1.DelegateServiceClient // caller → proxy → delegate

	down    *failFirst
	watched *watched
	reg     *delegates.Config
}

func listen() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }

// serveDelegate serves svc as demo.Serve does, on a loopback port, and
// returns its address.
func serveDelegate(svc stubbornv1.DelegateServiceServer) (*grpc.Server, string, error) {
	lis, err := listen()
	if err != nil {
		return nil, "", err
	}
	return demo.Serve(lis, svc), lis.Addr().String(), nil
}

// serveProxy serves a proxy to next on a loopback port and returns its
// address.
func serveProxy(next stubbornv1.DelegateServiceClient) (*grpc.Server, string, error) {
	lis, err := listen()
	if err != nil {
		return nil, "", err
	}
	gs := grpc.NewServer()
	stubbornv1.RegisterDelegateServiceServer(gs, proxy{next: next})
	go func() { _ = gs.Serve(lis) }()
	return gs, lis.Addr().String(), nil
}

func dial(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// newWorld starts the delegate servers and the proxy on loopback.
func newWorld(watchAttempts int) (*world, error) {
	w := &world{
		down:    &failFirst{n: math.MaxInt32},
		watched: &watched{last: int32(watchAttempts)},
		reg: &delegates.Config{
			// Scenario 5's waits are drawn from [0, 1000 h]: almost all
			// outlast the measurement (a short draw makes another attempt,
			// which fails, and waits again).
			Limits: delegates.Limits{MaxWait: delegates.Duration(1000 * time.Hour)},
		},
	}
	svcs := []struct {
		name string
		svc  stubbornv1.DelegateServiceServer
	}{
		{echoName, demo.Echo{}},
		{flaky2Name, &failFirst{n: 2}},
		{downName, w.down},
		{watchedName, w.watched},
	}
	for _, s := range svcs {
		gs, addr, err := serveDelegate(s.svc)
		if err != nil {
			w.close()
			return nil, err
		}
		w.servers = append(w.servers, gs)
		w.reg.Delegates = append(w.reg.Delegates, delegates.Delegate{
			Name: s.name, Target: addr, Idempotent: true,
			Timeout: delegates.Duration(time.Minute),
		})
		if s.name == echoName {
			w.echoAddr = addr
		}
	}

	direct, err := w.dial(w.echoAddr)
	if err != nil {
		w.close()
		return nil, err
	}
	w.direct = stubbornv1.NewDelegateServiceClient(direct)

	next, err := w.dial(w.echoAddr)
	if err != nil {
		w.close()
		return nil, err
	}
	ps, paddr, err := serveProxy(stubbornv1.NewDelegateServiceClient(next))
	if err != nil {
		w.close()
		return nil, err
	}
	w.servers = append(w.servers, ps)
	proxied, err := w.dial(paddr)
	if err != nil {
		w.close()
		return nil, err
	}
	w.proxied = stubbornv1.NewDelegateServiceClient(proxied)
	return w, nil
}

func (w *world) dial(addr string) (*grpc.ClientConn, error) {
	c, err := dial(addr)
	if err == nil {
		w.conns = append(w.conns, c)
	}
	return c, err
}

func (w *world) close() {
	for _, c := range w.conns {
		_ = c.Close()
	}
	for _, s := range w.servers {
		s.Stop()
	}
}

// stubborn is one Stubborn server on loopback with clients to it.
type stubborn struct {
	srv     *server.Stubborn
	conns   []*grpc.ClientConn
	client  stubbornv1.ControlServiceClient // over conns[0]
	cleanup func()
}

// startStubborn starts a fresh Stubborn server on store, over w's registry,
// and opens nconns client connections to it.
func startStubborn(w *world, store string, nconns int) (*stubborn, error) {
	cfg := server.Config{Registry: w.reg, Logger: slog.New(slog.DiscardHandler)}
	mk, ok := stores[store]
	if !ok {
		return nil, fmt.Errorf("unknown store %q (have %s)", store, storeNames())
	}
	cleanup, err := mk(&cfg)
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", store, err)
	}
	srv, err := server.New(cfg)
	if err != nil {
		cleanup()
		return nil, err
	}
	lis, err := listen()
	if err != nil {
		cleanup()
		return nil, err
	}
	go func() { _ = srv.Serve(lis) }()
	s := &stubborn{srv: srv, cleanup: cleanup}
	for range max(nconns, 1) {
		c, err := dial(lis.Addr().String())
		if err != nil {
			s.stop()
			return nil, err
		}
		s.conns = append(s.conns, c)
	}
	s.client = stubbornv1.NewControlServiceClient(s.conns[0])
	return s, nil
}

func (s *stubborn) stop() {
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.srv.Stop(5 * time.Second)
	s.cleanup()
}
