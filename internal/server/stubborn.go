package server

import (
	"cmp"
	"log/slog"
	"net"
	"reflect"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/fleetguard"
	"github.com/stubbornhq/stubborn/internal/notify"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/memstore"
	"github.com/stubbornhq/stubborn/internal/spend"
	"github.com/stubbornhq/stubborn/internal/telemetry"
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
	// Fleet, when set, makes the delegates' circuit breakers and rate
	// limits the fleet's: shared by the replicas on its NATS cluster
	// (docs/fleet-guards.md). Nil keeps them this server's own.
	Fleet *fleetguard.Fleet
	// Spend is the ledger of the tenants' spend (tenantspend.go), which
	// replicas sharing a store share. Nil keeps it in memory, this
	// server's own.
	Spend spend.Ledger
	// NoReflection leaves the reflection service out. Authentication (the
	// Registry's tenants) applies to reflection as to the ControlService.
	NoReflection bool
	// Notify tells people when runs wait for them (notify targets in the
	// Registry, decision links on the HTTP listener).
	Notify NotifyConfig
}

// Stubborn is a ready server: the gRPC server with every service registered,
// the runs it drives and the delegate connections it holds.
type Stubborn struct {
	GRPC   *grpc.Server
	Health *health.Server
	Runs   *runs.Manager
	svc    *service
	tel    *telemetry.Telemetry
	guards *delegates.Guards
	// failures keeps the delegates' recent failed calls (ListDelegates),
	// across reloads like guards.
	failures *delegates.Failures
	// traffic counts the delegates' calls in flight and their latency
	// (what a balance weighs), across reloads like guards.
	traffic *delegates.Traffic
	dial    []grpc.DialOption
	logger  *slog.Logger
	// reloadMu makes reloads one at a time.
	reloadMu sync.Mutex
	// door is the OpenAI-compatible front door (frontdoor.go), made by the
	// first HTTPHandler; doorClose ends its connection (Stop).
	doorOnce  sync.Once
	door      *frontDoor
	doorErr   error
	doorClose func()
	// notifier posts notices and serves decision links (notify.go); nil
	// without a public URL. publicURL is Config.Notify.PublicURL.
	notifier  *notify.Notifier
	publicURL string
}

// New builds a Stubborn server from cfg. Serve it, then Stop it.
//
// When the Registry names tenants, every call but health checks must
// authenticate as one (a bearer token or a TLS client certificate), each
// tenant sees its own runs only, and the tenants' limits apply besides the
// Registry's. TLS is the caller's: pass grpc.Creds in ServerOptions
// (ServerTLSConfig). Reload replaces the Registry while the server serves.
func New(cfg Config) (*Stubborn, error) {
	tc := cfg.Telemetry
	if tc.Logger == nil {
		tc.Logger = cfg.Logger
	}
	tel, err := telemetry.New(tc)
	if err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	s := &Stubborn{
		tel: tel, logger: logger, guards: delegates.NewGuards(cfg.Clock), failures: delegates.NewFailures(cfg.Clock),
		traffic: delegates.NewTraffic(),
		dial:    append([]grpc.DialOption{grpc.WithStatsHandler(tel.ClientHandler())}, cfg.DialOptions...),
	}
	s.guards.OnTransition = func(delegate string, t delegates.Transition) {
		tel.BreakerTransition(telemetry.BreakerChange{
			Delegate: delegate, From: t.From.String(), To: t.To.String(), Why: t.Why,
			Fleet: t.Fleet, OpenedBy: t.OpenedBy,
		})
	}
	s.guards.OnRefused = func(delegate string, by stubbornv1.RefusedBy) {
		tel.Refused(delegate, guardName(by))
	}
	if cfg.Fleet != nil {
		s.guards.UseFleet(cfg.Fleet)
	}
	reg, opts, err := s.build(cfg.Registry, nil)
	if err != nil {
		return nil, err
	}
	regs := &registries{idle: func(r *registry) {
		if err := r.pool.Close(); err != nil {
			logger.Warn("closing the connections of a replaced registry", "err", err)
		}
	}}
	_ = regs.swap(reg) // not retired yet
	active := newActiveRuns()
	rc := cfg.Runs
	if rc.Store == nil {
		// Runs as long as the process: nothing could resume them.
		rc.Store = memstore.NewMemory(cmp.Or(rc.Lease, runs.DefaultLease))
		rc.CancelOnClose = true
	}
	if rc.Logger == nil {
		rc.Logger = cfg.Logger
	}
	// The run engine's configuration is cfg.Runs, whole; the server sets
	// what it builds (what each run reaches, from the registry it started
	// under, and the observer), and the clock and seed when it has them.
	rc.Bind = regs.bind
	rc.Observer = active.Observer(tel)
	if err := s.newNotifier(cfg, regs, &rc); err != nil {
		regs.release(reg)
		return nil, err
	}
	if cfg.Clock != nil {
		rc.Clock = cfg.Clock
	}
	if cfg.Seed != 0 {
		rc.Seed = cfg.Seed
	}
	ts := newTenantSpend(cfg.Spend, clockNow(cfg.Clock), logger)
	rc.Observer = ts.observer(rc.Observer) // counts the tenants' spend
	m, err := runs.New(rc)
	if err != nil {
		regs.release(reg)
		ts.close()
		return nil, err
	}
	opts.ActiveRuns = active
	opts.NoReflection = cfg.NoReflection
	opts.Logger = cfg.Logger
	opts.regs = regs
	serverOpts := append([]grpc.ServerOption{grpc.StatsHandler(tel.ServerHandler())}, cfg.ServerOptions...)
	s.svc = newService(m, opts)
	s.svc.spend = ts
	s.GRPC, s.Health = newGRPCServer(s.svc, opts, serverOpts...)
	s.Runs = m
	s.publicURL = cfg.Notify.PublicURL
	s.startNotifier(m)
	return s, nil
}

// build makes the registry of cfg: its delegates' connections, what runs
// reach through them, the tenants' policies and authenticator. prev is
// the registry it replaces, if any.
func (s *Stubborn) build(cfg *delegates.Config, prev *registry) (*registry, options, error) {
	var prevPool *delegates.Pool
	if prev != nil {
		prevPool = prev.pool
	}
	pool, err := delegates.NewPoolWith(cfg, delegates.PoolOptions{
		Dial: s.dial, HTTPTransport: s.tel.HTTPTransport, Guards: s.guards, Failures: s.failures, Previous: prevPool,
		Traffic: s.traffic,
	})
	if err != nil {
		return nil, options{}, err
	}
	// Each attempt's call runs inside the attempt's span; its failure is
	// kept for ListDelegates.
	calls := s.failures.Record(s.tel.Delegates(pool, telemetry.ModelsFrom(modelOf(pool))), runs.TenantFrom) // the run's tenant (runs' drive puts it in the calls' context)
	var budgets controls.Budgets
	if b := cfg.RetryBudget; b != nil {
		if prev != nil && reflect.DeepEqual(prev.cfg.RetryBudget, b) {
			budgets = prev.deps.Budgets // the same buckets, with their tokens
		} else if budgets, err = controls.NewBudgetSet(b.MaxTokens, b.TokenRatio); err != nil {
			_ = pool.Close()
			return nil, options{}, err
		}
	}
	opts := options{
		Limits:  limitsFrom(cfg.Limits),
		Tenants: tenantsFrom(cfg.Tenants),
		Known:   pool.Known,
		IsDelegate: func(name string) bool {
			_, ok := pool.Lookup(name)
			return ok
		},
		HasJudge: cfg.Judge != "",
		KindOf: func(name string) string {
			d, _ := pool.Lookup(name)
			return d.Kind()
		},
		PresetOf: pool.Preset,
		Describe: pool.Describe,
	}
	reg := newRegistry(opts, prev)
	reg.cfg, reg.pool = cfg, pool
	// The guards are the server's, kept across reloads; set now that the
	// config is certain to be used.
	s.guards.Configure(cfg)
	reg.deps = runs.Deps{Delegates: calls, Presets: pool, Budgets: budgets, Criteria: criteriaFor(calls, cfg.Judge),
		Guards: delegates.StandingGuards{Guards: s.guards, Traffic: s.traffic}} // a balance asks them how delegates stand
	if len(cfg.Tenants) > 0 {
		reg.authn = newAuthenticator(cfg.Tenants)
	}
	return reg, opts, nil
}

// modelOf says which of pool's delegates are models, for the GenAI
// conventions of their calls' telemetry.
func modelOf(pool *delegates.Pool) func(string) (telemetry.Model, bool) {
	return func(name string) (telemetry.Model, bool) {
		d, ok := pool.Lookup(name)
		switch {
		case !ok:
		case d.OpenAI != nil:
			return telemetry.Model{Provider: "openai", Name: d.OpenAI.Model}, true // gen_ai.provider.name values
		case d.Anthropic != nil:
			return telemetry.Model{Provider: "anthropic", Name: d.Anthropic.Model}, true
		}
		return telemetry.Model{}, false
	}
}

// Reload replaces the registry (delegates, presets, judge, retry budget,
// limits and tenants) with cfg's, which must be valid (delegates.Load
// and Parse validate it whole). If cfg cannot be put to use (a delegate's
// TLS files cannot be read, say), nothing changes and the error says why.
// Otherwise, from the moment Reload returns:
//   - new requests are judged by cfg alone: a delegate or preset no longer
//     there is NOT_FOUND, the new limits apply, a tenant or token no longer
//     there is UNAUTHENTICATED;
//   - the streams (Run, WatchRun, WatchRuns) of a caller whose
//     credentials no longer authenticate as the same tenant end with
//     UNAUTHENTICATED;
//   - the runs in flight here, parked ones included, keep the registry
//     they started under, and its connections, until they end here; a
//     run resumed later (after a restart, or taken over) takes the
//     registry of the server resuming it.
//
// Every delegate gets a new connection (lazily, at its first call), so
// that a reload also reads the delegates' TLS files again.
func (s *Stubborn) Reload(cfg *delegates.Config) error {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	regs := s.svc.regs
	if err := checkNotify(cfg, s.publicURL); err != nil {
		return err
	}
	reg, _, err := s.build(cfg, regs.current())
	if err != nil {
		return err
	}
	if err := regs.swap(reg); err != nil {
		return err
	}
	s.svc.streams.revoke(reg.authn)
	return nil
}

// guardName is the metrics' name of a guard.
func guardName(by stubbornv1.RefusedBy) string {
	switch by {
	case stubbornv1.RefusedBy_REFUSED_BY_CIRCUIT_BREAKER:
		return "circuit_breaker"
	case stubbornv1.RefusedBy_REFUSED_BY_BULKHEAD:
		return "bulkhead"
	case stubbornv1.RefusedBy_REFUSED_BY_RATE_LIMIT:
		return "rate_limit"
	}
	return "other"
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
	s.stopNotifier() // after the runs: their last events are queued
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
	s.svc.spend.close() // the runs have ended: their spend is all seen
	// The runs have ended here: the current registry is the last held.
	s.svc.regs.retire()
	if s.doorClose != nil {
		s.doorClose()
	}
}
