package server

import (
	"log/slog"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/stubbornhq/stubborn/controls"
	"github.com/stubbornhq/stubborn/delegates"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/runs"
	"github.com/stubbornhq/stubborn/telemetry"
)

// Config is everything a Stubborn server is built from.
type Config struct {
	// Registry names the delegates and sets the limits. Required.
	Registry *delegates.Config
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Clock defaults to the wall clock; tests pass a fake one.
	Clock controls.Clock
	// Seed, when non-zero, makes backoff jitter deterministic (tests).
	Seed uint64
	// DialOptions are added to every delegate connection.
	DialOptions []grpc.DialOption
	// ServerOptions are added to the gRPC server.
	ServerOptions []grpc.ServerOption
	// Telemetry says where traces, metrics and run logs go: the server and
	// every delegate connection get otelgrpc stats handlers, each run and
	// attempt a span, the stubborn.* metrics are recorded. Its Logger
	// defaults to Logger. The zero value records no span and no metric but
	// still passes callers' trace context on to the delegates (with stats
	// handlers that do only that, not otelgrpc's).
	Telemetry telemetry.Config
	// Runs configures the run engine, and is passed to it whole (Store,
	// Owner, Lease, SoleOwner, CancelOnClose, MaxFinished, ParkAfter,
	// Logger …), except what New builds from the rest of Config and sets
	// over it: Delegates, Presets, Budgets, Observer and Criteria; Clock
	// and Seed when Config sets them. The zero value keeps runs in memory
	// and cancels them on Stop.
	Runs runs.Config
	// NoReflection leaves the reflection service out. Authentication (the
	// Registry's tenants) applies to reflection as to the ControlService.
	NoReflection bool
}

// Stubborn is a ready server: the gRPC server with every service registered,
// the runs it drives and the delegate connections it holds.
type Stubborn struct {
	GRPC   *grpc.Server
	Health *health.Server
	Runs   *runs.Manager
	Pool   *delegates.Pool
	svc    *Service
}

// New builds a Stubborn server from cfg. Serve it, then Stop it.
//
// When the Registry names tenants, every call but health checks must
// authenticate as one (NewAuthenticator), each tenant sees its own runs
// only, and the tenants' limits apply besides the Registry's. TLS is the
// caller's: pass grpc.Creds in ServerOptions (ServerTLSConfig).
func New(cfg Config) (*Stubborn, error) {
	tc := cfg.Telemetry
	if tc.Logger == nil {
		tc.Logger = cfg.Logger
	}
	tel, err := telemetry.New(tc)
	if err != nil {
		return nil, err
	}
	dial := append([]grpc.DialOption{grpc.WithStatsHandler(tel.ClientHandler())}, cfg.DialOptions...)
	pool, err := delegates.NewPoolWith(cfg.Registry, delegates.PoolOptions{Dial: dial, HTTPTransport: tel.HTTPTransport})
	if err != nil {
		return nil, err
	}
	// Each attempt's call runs inside the attempt's span.
	calls := tel.Delegates(pool)
	var budgets controls.Budgets
	if b := cfg.Registry.RetryBudget; b != nil {
		set, err := controls.NewBudgetSet(b.MaxTokens, b.TokenRatio)
		if err != nil {
			_ = pool.Close()
			return nil, err
		}
		budgets = set
	}
	active := NewActiveRuns()
	rc := cfg.Runs
	if rc.Store == nil {
		rc.CancelOnClose = true // nothing could resume them
	}
	if rc.Logger == nil {
		rc.Logger = cfg.Logger
	}
	// The run engine's configuration is cfg.Runs, whole; the server sets
	// what it builds (the delegates, presets, budgets, observer and
	// criteria), and the clock and seed when it has them.
	rc.Budgets = budgets
	rc.Delegates = calls
	rc.Presets = pool
	feed := newRunFeed()
	rc.Observer = feed.Observer(active.Observer(tel))
	rc.Criteria = criteriaFor(calls, cfg.Registry.Judge)
	if cfg.Clock != nil {
		rc.Clock = cfg.Clock
	}
	if cfg.Seed != 0 {
		rc.Seed = cfg.Seed
	}
	m, err := runs.New(rc)
	if err != nil {
		_ = pool.Close()
		return nil, err
	}
	opts := Options{
		Limits:       LimitsFrom(cfg.Registry.Limits),
		Tenants:      TenantsFrom(cfg.Registry.Tenants),
		ActiveRuns:   active,
		NoReflection: cfg.NoReflection,
		Known:        pool.Known,
		IsDelegate: func(name string) bool {
			_, ok := pool.Lookup(name)
			return ok
		},
		HasJudge: cfg.Registry.Judge != "",
		Logger:   cfg.Logger,
		Describe: pool.Describe,
		feed:     feed,
	}
	if len(cfg.Registry.Tenants) > 0 {
		opts.Authenticate = NewAuthenticator(cfg.Registry.Tenants).Authenticate
	}
	serverOpts := append([]grpc.ServerOption{grpc.StatsHandler(tel.ServerHandler())}, cfg.ServerOptions...)
	svc := NewService(m, opts)
	g, hs := NewGRPCServer(svc, opts, serverOpts...)
	return &Stubborn{GRPC: g, Health: hs, Runs: m, Pool: pool, svc: svc}, nil
}

// criteriaFor builds each run's failure criteria from its control spec,
// judged by the run's options.judge, else the server's default judge.
func criteriaFor(d controls.Delegates, defaultJudge string) func(*stubbornv1.ControlState) controls.Criteria {
	return func(st *stubbornv1.ControlState) controls.Criteria {
		judge := st.GetOptions().GetJudge()
		if judge == "" {
			judge = defaultJudge
		}
		return controls.NewCriteria(st.GetControl(), judge, controls.ForRun(d, st))
	}
}

// SetServing reports the server in health (grpc.health.v1) as SERVING or
// NOT_SERVING, both as a whole ("") and as stubborn.v1.ControlService: not
// serving while it cannot do its work (its store unreachable, say). After
// Stop it changes nothing: a stopped server stays NOT_SERVING.
func (s *Stubborn) SetServing(serving bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.Health.SetServingStatus("", st)
	s.Health.SetServingStatus(stubbornv1.ControlService_ServiceDesc.ServiceName, st)
}

// Serve serves on lis until Stop.
func (s *Stubborn) Serve(lis net.Listener) error { return s.GRPC.Serve(lis) }

// Stop reports NOT_SERVING, ends every run (their streams end with them),
// lets the RPCs in flight finish for up to grace, then closes everything.
func (s *Stubborn) Stop(grace time.Duration) {
	s.Health.Shutdown()
	s.Runs.Close()
	done := make(chan struct{})
	go func() {
		s.GRPC.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(grace):
		s.GRPC.Stop()
		<-done
	}
	_ = s.Pool.Close()
}
