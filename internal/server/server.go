// Package server implements stubborn.v1.ControlService over package runs,
// and builds the gRPC server with its interceptors, health and reflection.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/jsstore"
)

// options configure the ControlService.
type options struct {
	// Limits bound requests. Zero fields take defaultLimits.
	Limits limits
	// Known reports whether a delegate name is in the registry. Required.
	Known func(name string) bool
	// IsDelegate reports whether a known name is a delegate rather than a
	// preset; judges and analysts must be delegates. Nil means Known.
	IsDelegate func(name string) bool
	// HasJudge says a default judge delegate is configured.
	HasJudge bool
	// KindOf returns a delegate's kind (delegates.KindOpenAI, …), "" for a
	// preset or an unknown name; PresetOf a preset's control. With them a
	// run's typed conversation is checked against every delegate it can
	// reach (what each kind cannot carry is refused). Nil: not checked.
	KindOf   func(name string) string
	PresetOf func(name string) (*stubbornv1.ControlSpec, bool)
	// Logger receives request logs and recovered panics. Nil means
	// slog.Default().
	Logger *slog.Logger
	// Tenants are the tenants' own options, by name (tenantsFrom). A
	// tenant not here, the default tenant "" included, has the server's
	// Limits only and may name every delegate.
	Tenants map[string]tenantOptions
	// ActiveRuns counts the runs in progress for the max_concurrent_runs
	// limits; its Observer must see the runs layer's runs. Nil means those
	// limits are not enforced.
	ActiveRuns *activeRuns
	// NoReflection leaves the reflection service out.
	NoReflection bool
	// Describe returns the registry for ListDelegates (delegates.Pool's
	// Describe). Nil means an empty registry.
	Describe func() ([]*stubbornv1.DelegateDescription, []*stubbornv1.PresetDescription)

	// regs holds the registries (New's, which Reload replaces): callers
	// are authenticated by the current registry's tenants, and a reload
	// ends the streams whose credentials it took away. Required.
	regs *registries
}

// service implements stubborn.v1.ControlService.
type service struct {
	stubbornv1.UnimplementedControlServiceServer
	runs *runs.Manager
	// regs holds the registry requests are judged by: the tenants'
	// policies and the server's limits (registry.go).
	regs     *registries
	active   *activeRuns
	watching watchers
	// reading counts each tenant's reads in progress.
	reading readers
	// following counts the WatchRuns streams that follow the runs.
	following atomic.Int32
	// streams are the authenticated streams in flight, which a reload
	// that takes their credentials away ends (revoke.go).
	streams liveStreams
	// malformed holds the requests the server's codec could not decode,
	// until the interceptors answer them (malformed.go).
	malformed malformedRequests
	spend     *tenantSpend // the tenants' spend limits (tenantspend.go); nil: none
}

var _ stubbornv1.ControlServiceServer = (*service)(nil)

// newService returns the ControlService over m. Serve it on a server from
// newGRPCServer: Run and WatchRun send each event as it was encoded when
// recorded, which that server's codec passes through (codec.go).
func newService(m *runs.Manager, o options) *service {
	return &service{runs: m, active: o.ActiveRuns, regs: o.regs}
}

// policy returns what applies to ctx's tenant under the current registry.
func (s *service) policy(ctx context.Context) *policy {
	return s.regs.current().policy(ctx)
}

// newGRPCServer returns a gRPC server with logging, recovery and
// authentication (by svc's current registry) interceptors, the ControlService,
// health (grpc.health.v1) and, unless o.NoReflection, reflection
// registered. The returned health server lets the caller flip the status on
// shutdown.
//
// The logging interceptor (callLog) logs one line per call when it
// finishes: method, code, duration, peer, trace_id, run_id and tenant; at
// debug for a call that succeeded (callLevel), built only when the logger
// writes that level. It never logs payloads (requests, responses: briefs,
// results) nor metadata (tokens). When the logger writes nothing even at
// ERROR (slog.DiscardHandler, say), the interceptor is left out. That is
// decided here, once: a logger whose level is raised later gets no call
// lines.
func newGRPCServer(svc *service, o options, extra ...grpc.ServerOption) (*grpc.Server, *health.Server) {
	logger := o.Logger
	if logger == nil {
		logger = slog.Default()
	}
	onPanic := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		logger.ErrorContext(ctx, "panic in handler", "panic", p, "stack", string(debug.Stack()))
		return status.Error(codes.Internal, "internal error")
	})
	var unary []grpc.UnaryServerInterceptor
	var stream []grpc.StreamServerInterceptor
	if logger.Enabled(context.Background(), slog.LevelError) {
		u, st := callLog(logger)
		unary = append(unary, u)
		stream = append(stream, st)
	}
	unary = append(unary, recovery.UnaryServerInterceptor(onPanic))
	stream = append(stream, recovery.StreamServerInterceptor(onPanic))
	authUnary, authStream := authInterceptors(svc.authenticate)
	unary = append(unary, authUnary)
	stream = append(stream, authStream, svc.revocable)
	// A request the codec could not decode is answered last, just before
	// the handler: the call is logged with its code, and a caller without
	// credentials is UNAUTHENTICATED whatever it sent. The interceptors
	// before read no request field but run_id, which the log leaves out
	// unless it is well formed (loggable).
	malformedUnary, malformedStream := malformedInterceptors(&svc.malformed)
	unary = append(unary, malformedUnary)
	stream = append(stream, malformedStream)
	opts := append([]grpc.ServerOption{
		codecOption(&svc.malformed),
		// Streams are served on goroutines kept between them, whose stacks
		// have already grown, instead of a new goroutine each (marked
		// experimental in grpc-go; a busy server spawns goroutines as
		// before).
		grpc.NumStreamWorkers(streamWorkers),
		grpc.ChainUnaryInterceptor(unary...),
		grpc.ChainStreamInterceptor(stream...),
	}, extra...)
	g := grpc.NewServer(opts...)
	stubbornv1.RegisterControlServiceServer(g, svc)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(stubbornv1.ControlService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, hs)
	if !o.NoReflection {
		reflection.Register(g)
	}
	return g, hs
}

// loggable is req for telemetry.LogFields, or nil when its run_id is not a
// well-formed one: a request refused for its run_id does not put the value
// in the log.
func loggable(req any) any {
	if r, ok := req.(interface{ GetRunId() string }); ok && !validRunID(r.GetRunId()) {
		return nil
	}
	return req
}

// Run starts a run and streams its events until it ends. The run goes on
// if the client hangs up.
func (s *service) Run(req *stubbornv1.RunRequest, stream grpc.ServerStreamingServer[stubbornv1.RunResponse]) error {
	st, err := s.start(stream.Context(), req)
	if err != nil {
		return err
	}
	// The starter's own stream counts as a watcher, whatever the limit.
	release, _ := s.watching.acquire(st.GetRunId(), 0, true)
	defer release()
	return s.watch(stream.Context(), st.GetRunId(), 0, stream)
}

// StartRun starts a run detached.
func (s *service) StartRun(ctx context.Context, req *stubbornv1.StartRunRequest) (*stubbornv1.StartRunResponse, error) {
	st, err := s.start(ctx, req)
	if err != nil {
		return nil, err
	}
	return &stubbornv1.StartRunResponse{RunId: st.GetRunId(), State: st}, nil
}

// start checks a run request against the caller's tenant's policy and the
// server's, then starts the run. The start rate is checked first (so a
// flood of requests costs no validation), then the request, then the
// concurrent runs. A request refused for a limit leaves no trace: no run,
// and its start is given back to the rate.
func (s *service) start(ctx context.Context, req runRequest) (*stubbornv1.ControlState, error) {
	// The request is judged by one registry, which its run keeps.
	reg := s.regs.acquire()
	defer s.regs.release(reg)
	if err := reauthenticate(ctx, reg); err != nil {
		return nil, err
	}
	ctx = context.WithValue(ctx, registryKey{}, reg)
	p := reg.policy(ctx)
	if err := s.spend.admit(ctx, reg.cfg, p.tenant); err != nil {
		return nil, err // a tenant over its spend limit takes no start from its rate
	}
	undo, err := s.takeStart(p)
	if err != nil {
		return nil, err
	}
	spec, err := p.val.runSpec(req)
	if err != nil {
		return nil, err // an invalid request keeps its start: checking it was work
	}
	var slot *runSlot
	if s.active != nil {
		if slot, err = s.active.reserve(p, p.server.limits.MaxConcurrentRuns); err != nil {
			undo()
			return nil, err
		}
		ctx = withReservation(ctx, slot) // the run's observer takes it over
	}
	st, existing, err := s.runs.Start(ctx, taskOf(req, p.val.limits.MaxBriefBytes), spec, withPresetLimit(req.GetOptions(), spec, reg.pool))
	if err != nil || existing {
		// No new run: its concurrency slot and its start are given back
		// (the run an idempotency key named counts where it started).
		if slot != nil {
			slot.release()
		}
		undo()
	}
	if err != nil {
		return nil, toStatus(err)
	}
	if existing {
		// The caller learns that nothing new started (the CLI says so).
		// A call that is not gRPC's (the front door) has no header.
		_ = grpc.SetHeader(ctx, metadata.Pairs(ReplayHeader, "true"))
	}
	logging.AddFields(ctx, logging.Fields{"run_id", st.GetRunId()}) // for the call's log line
	return st, nil
}

// withPresetLimit returns the options of a run of spec: o, with the spend
// limit of the first preset the control names (at its top) that has one
// when o sets none. The run keeps it (its state's options), whatever the
// registry says later.
func withPresetLimit(o *stubbornv1.RunOptions, spec *stubbornv1.ControlSpec, pool *delegates.Pool) *stubbornv1.RunOptions {
	if o.GetSpendLimit() != nil || pool == nil {
		return o
	}
	for _, name := range controls.Named(spec) {
		if l := pool.PresetLimit(name); l != nil {
			o = proto.CloneOf(o)
			if o == nil {
				o = &stubbornv1.RunOptions{}
			}
			o.SpendLimit = proto.CloneOf(l)
			return o
		}
	}
	return o
}

// ReplayHeader is the response header of a Run or StartRun call whose
// options.idempotency_key named a run already started: its value is
// "true", and the call started nothing (it replays or returns that run).
const ReplayHeader = "stubborn-idempotency-replay"

// WatchRun streams a run's events after after_seq, then live ones.
func (s *service) WatchRun(req *stubbornv1.WatchRunRequest, stream grpc.ServerStreamingServer[stubbornv1.WatchRunResponse]) error {
	var v violations
	checkRunID(&v, "run_id", req.GetRunId())
	if req.GetAfterSeq() < 0 {
		v.add("after_seq", "must not be negative, got %d", req.GetAfterSeq())
	}
	if b := req.GetMaxBatch(); b < 0 || b > maxWatchBatch {
		v.add("max_batch", "must be from 0 to %d, got %d", maxWatchBatch, b)
	}
	if err := v.err(); err != nil {
		return err
	}
	logging.AddFields(stream.Context(), logging.Fields{"run_id", req.GetRunId()}) // for the call's log line
	doneReading, err := s.reading.acquire(s.policy(stream.Context()))
	if err != nil {
		return err
	}
	defer doneReading()
	release, err := s.watcher(stream.Context(), req.GetRunId())
	if err != nil {
		return err
	}
	defer release()
	if req.GetMaxBatch() > 1 {
		err := s.runs.WatchBatches(stream.Context(), req.GetRunId(), req.GetAfterSeq(), int(req.GetMaxBatch()), func(evs []runs.Event) error {
			return stream.SendMsg(eventBatch(evs))
		})
		return watchStatus(stream.Context(), err)
	}
	return s.watch(stream.Context(), req.GetRunId(), req.GetAfterSeq(), stream)
}

// streamWorkers is how many goroutines serve streams without being made
// anew for each (grpc.NumStreamWorkers): a Run or WatchRun stream keeps its
// worker for as long as it lasts.
const streamWorkers = 64

// maxWatchBatch bounds WatchRunRequest.max_batch.
const maxWatchBatch = 1000

// watcher counts a watcher of run id, within max_watchers_per_run. When
// there is a limit, a run the caller cannot see is NOT_FOUND first, so the
// limit tells nothing about other tenants' runs.
func (s *service) watcher(ctx context.Context, id string) (release func(), err error) {
	limit := s.policy(ctx).limits.MaxWatchersPerRun
	if limit > 0 {
		if _, err := s.runs.Get(ctx, id); err != nil {
			return nil, toStatus(err)
		}
	}
	release, ok := s.watching.acquire(id, limit, false)
	if !ok {
		return nil, exhausted("run:"+id, fmt.Sprintf("limit max_watchers_per_run reached: run %s has %d watchers, the limit is %d; retry once one has left", id, limit, limit), 0)
	}
	return release, nil
}

// watch sends the run's events after seq after on stream, a Run or a
// WatchRun stream, each as it was encoded when recorded (see codec).
func (s *service) watch(ctx context.Context, id string, after int64, stream grpc.ServerStream) error {
	err := s.runs.Watch(ctx, id, after, func(ev runs.Event) error {
		return stream.SendMsg(eventResponse(ev.Data))
	})
	return watchStatus(ctx, err)
}

// watchStatus is the status a watching stream ends with.
func watchStatus(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		// The client went away; the run goes on.
		return status.FromContextError(ctx.Err()).Err()
	}
	return toStatus(err)
}

// GetRun returns a run's state.
func (s *service) GetRun(ctx context.Context, req *stubbornv1.GetRunRequest) (*stubbornv1.GetRunResponse, error) {
	if err := runID(req.GetRunId()); err != nil {
		return nil, err
	}
	doneReading, err := s.reading.acquire(s.policy(ctx))
	if err != nil {
		return nil, err
	}
	defer doneReading()
	st, err := s.runs.Get(ctx, req.GetRunId())
	if err != nil {
		return nil, toStatus(err)
	}
	return &stubbornv1.GetRunResponse{State: st, ServerTime: timestamppb.New(s.runs.Now())}, nil
}

// ListRuns pages through runs, newest first.
func (s *service) ListRuns(ctx context.Context, req *stubbornv1.ListRunsRequest) (*stubbornv1.ListRunsResponse, error) {
	var v violations
	if req.GetPageSize() < 0 {
		v.add("page_size", "must not be negative, got %d", req.GetPageSize())
	}
	f := checkFilter(&v, req.GetStatus(), req.GetControl(), req.GetDelegate())
	if _, ok := stubbornv1.RunView_name[int32(req.GetView())]; !ok {
		v.add("view", "unknown value %d", req.GetView())
	}
	checkPageToken(&v, req.GetPageToken())
	if err := v.err(); err != nil {
		return nil, err
	}
	doneReading, err := s.reading.acquire(s.policy(ctx))
	if err != nil {
		return nil, err
	}
	defer doneReading()
	size := int(req.GetPageSize())
	switch {
	case size == 0:
		size = 50
	case size > 1000:
		size = 1000
	}
	if req.GetView() == stubbornv1.RunView_RUN_VIEW_SUMMARY {
		sums, next, err := s.runs.ListSummaries(ctx, f, size, req.GetPageToken())
		if err != nil {
			return nil, toStatus(err)
		}
		return &stubbornv1.ListRunsResponse{Summaries: sums, NextPageToken: next, ServerTime: timestamppb.New(s.runs.Now())}, nil
	}
	list, next, err := s.runs.ListWhere(ctx, f, size, req.GetPageToken())
	if err != nil {
		return nil, toStatus(err)
	}
	return &stubbornv1.ListRunsResponse{Runs: list, NextPageToken: next, ServerTime: timestamppb.New(s.runs.Now())}, nil
}

// controlNames are the values of a control filter.
var controlNames = []string{"retry", "retry_with_learning", "fallback_chain", "race", "balance"}

// checkFilter adds what is wrong with a ListRuns or WatchRuns filter to v
// and returns it.
func checkFilter(v *violations, status stubbornv1.RunStatus, control, delegate string) runs.Filter {
	if _, ok := stubbornv1.RunStatus_name[int32(status)]; !ok {
		v.add("status", "unknown value %d", status)
	}
	if control != "" && !slices.Contains(controlNames, control) {
		v.add("control", "must be one of %s, or empty for all", strings.Join(controlNames, ", "))
	}
	if delegate != "" {
		if err := delegates.CheckName(delegate); err != nil {
			v.add("delegate", "%v", err)
		}
	}
	return runs.Filter{Status: status, Control: control, Delegate: delegate}
}

// CancelRun cancels a run and returns its state once it has ended.
func (s *service) CancelRun(ctx context.Context, req *stubbornv1.CancelRunRequest) (*stubbornv1.CancelRunResponse, error) {
	if err := runID(req.GetRunId()); err != nil {
		return nil, err
	}
	st, err := s.runs.Cancel(ctx, req.GetRunId())
	if err != nil {
		return nil, toStatus(err)
	}
	return &stubbornv1.CancelRunResponse{State: st}, nil
}

// DeleteRun forgets a finished run (or cancels and forgets one in flight).
func (s *service) DeleteRun(ctx context.Context, req *stubbornv1.DeleteRunRequest) (*stubbornv1.DeleteRunResponse, error) {
	if err := runID(req.GetRunId()); err != nil {
		return nil, err
	}
	logging.AddFields(ctx, logging.Fields{"run_id", req.GetRunId()}) // for the call's log line
	if err := s.runs.Delete(ctx, req.GetRunId(), req.GetCancel()); err != nil {
		return nil, toStatus(err)
	}
	return &stubbornv1.DeleteRunResponse{}, nil
}

// DecideRun answers a run awaiting a decision.
func (s *service) DecideRun(ctx context.Context, req *stubbornv1.DecideRunRequest) (*stubbornv1.DecideRunResponse, error) {
	var v violations
	checkRunID(&v, "run_id", req.GetRunId())
	switch req.GetDecision() {
	case stubbornv1.Decision_DECISION_RETRY, stubbornv1.Decision_DECISION_FAIL:
	default:
		v.add("decision", "must be DECISION_RETRY or DECISION_FAIL, got %s", req.GetDecision())
	}
	checkSpendLimit(&v, "spend_limit", req.GetSpendLimit())
	if err := v.err(); err != nil {
		return nil, err
	}
	if err := s.raisesLimit(ctx, req); err != nil {
		return nil, err
	}
	st, err := s.runs.Decide(ctx, req.GetRunId(), req.GetDecision(), req.GetSpendLimit())
	if err != nil {
		return nil, toStatus(err)
	}
	return &stubbornv1.DecideRunResponse{State: st}, nil
}

// raisesLimit checks that a RETRY of a run its spend limit stopped
// carries a limit that lets it go on: one higher than the limit it
// reached (max_cost or max_total_tokens, whichever it passed).
func (s *service) raisesLimit(ctx context.Context, req *stubbornv1.DecideRunRequest) error {
	if req.GetDecision() != stubbornv1.Decision_DECISION_RETRY {
		return nil
	}
	st, err := s.runs.Get(ctx, req.GetRunId())
	if err != nil {
		return toStatus(err)
	}
	if st.GetStatus() != stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION ||
		st.GetStatusReasonCode() != stubbornv1.StatusReason_STATUS_REASON_SPEND_LIMIT_REACHED {
		return nil
	}
	old, l, spent := st.GetOptions().GetSpendLimit(), req.GetSpendLimit(), st.GetCost()
	if l == nil {
		return status.Errorf(codes.FailedPrecondition, "spend_limit: run %s waits at its spend limit (%s): a RETRY must carry a higher spend_limit", req.GetRunId(), strings.TrimPrefix(st.GetStatusReason(), "spend limit reached: "))
	}
	costOK := l.GetMaxCost() == 0 || l.GetMaxCost() > spent.GetTotal() && l.GetMaxCost() > old.GetMaxCost()
	tokensOK := l.GetMaxTotalTokens() == 0 || l.GetMaxTotalTokens() > spent.GetTotalTokens() && l.GetMaxTotalTokens() > old.GetMaxTotalTokens()
	switch {
	case !costOK:
		return status.Errorf(codes.FailedPrecondition, "spend_limit.max_cost: %g does not raise the run's limit of %g (it has spent %g); set a higher one, or 0 for none", l.GetMaxCost(), old.GetMaxCost(), spent.GetTotal())
	case !tokensOK:
		return status.Errorf(codes.FailedPrecondition, "spend_limit.max_total_tokens: %d does not raise the run's limit of %d (it has used %d); set a higher one, or 0 for none", l.GetMaxTotalTokens(), old.GetMaxTotalTokens(), spent.GetTotalTokens())
	}
	return nil
}

// toStatus maps the runs layer's errors to gRPC status errors.
func toStatus(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, runs.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, runs.ErrNotFinished):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, runs.ErrNotAwaitingDecision):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, runs.ErrUnreadable):
		// This run's records are damaged; every other run reads, and
		// DeleteRun removes this one.
		return status.Error(codes.DataLoss, err.Error())
	case errors.Is(err, runs.ErrBadPageToken):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, runs.ErrKeyConflict):
		return status.Error(codes.AlreadyExists, "options.idempotency_key: "+err.Error())
	case errors.Is(err, runs.ErrClosed), errors.Is(err, runs.ErrUnavailable):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, runs.ErrConflict):
		// This server's write was fenced (its lease lapsed, or another
		// server took the run): nothing was done, and another server, or
		// this one a moment later, can do it.
		return status.Error(codes.Unavailable, err.Error()+"; nothing was done: try again")
	case errors.Is(err, runs.ErrStoreFull):
		// No RetryInfo: the store makes room as runs finish, not on a
		// schedule.
		return exhausted("store", err.Error(), 0)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	case jsstore.Transient(err):
		// The store did not answer in time, or had no server to take the
		// call (a NATS leader being elected, a reconnect).
		return status.Error(codes.Unavailable, "the run store did not answer: "+err.Error()+"; try again")
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Internal, err.Error())
}

// ListDelegates lists the delegates and presets ctx's tenant may name,
// each delegate with the recent failures and the latest call of ctx's
// tenant's runs.
func (s *service) ListDelegates(ctx context.Context, _ *stubbornv1.ListDelegatesRequest) (*stubbornv1.ListDelegatesResponse, error) {
	resp := &stubbornv1.ListDelegatesResponse{ServerTime: timestamppb.New(s.runs.Now())}
	reg := s.regs.current()
	if reg.describe == nil {
		return resp, nil
	}
	known := reg.policy(ctx).val.known
	ds, ps := reg.describe()
	for _, d := range ds {
		if known(d.GetName()) {
			if reg.pool != nil {
				// The caller's own runs' failures: another tenant's run
				// ids and messages are not its business.
				d.RecentFailures = reg.pool.RecentFailures(d.GetName(), runs.Owners(ctx))
				// What its calls did, for a delegate with no health
				// answer to show.
				if last := reg.pool.LastCall(d.GetName(), runs.Owners(ctx)); !last.At.IsZero() {
					d.LastCallTime = timestamppb.New(last.At)
					d.LastCallCode = int32(last.Code)
					if !last.FailingSince.IsZero() {
						d.FailingSince = timestamppb.New(last.FailingSince)
					}
				}
			}
			resp.Delegates = append(resp.Delegates, d)
		}
	}
	for _, p := range ps {
		if known(p.GetName()) {
			resp.Presets = append(resp.Presets, p)
		}
	}
	return resp, nil
}

// callLevel is the level of a call's line: debug when it succeeded,
// go-grpc-middleware's default for a server otherwise (info for a
// client's mistake, warn or error for the server's).
func callLevel(c codes.Code) logging.Level {
	if c == codes.OK {
		return logging.LevelDebug
	}
	return logging.DefaultServerCodeToLevel(c)
}
