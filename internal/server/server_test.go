package server_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
	"github.com/stubbornhq/stubborn/internal/fleetguard"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/jsstore"
	"github.com/stubbornhq/stubborn/internal/runs/store"
	"github.com/stubbornhq/stubborn/internal/server"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// gate is a delegate whose every call blocks until the test lets it answer,
// so a test decides exactly when each attempt ends.
type gate struct {
	answers chan error // nil error: success
}

func newGate() *gate { return &gate{answers: make(chan error, 16)} }

func (g *gate) svc() stubbornv1.DelegateServiceServer {
	return demo.NewScripted(func(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		select {
		case err := <-g.answers:
			if err != nil {
				return nil, err
			}
			return &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{Text: "gate: " + req.GetBrief()}}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
}

// env is a Stubborn server and its delegates, all on loopback.
type env struct {
	client stubbornv1.ControlServiceClient
	conn   *grpc.ClientConn
	addr   string
	slow   *demo.Slow
	gate   *gate
	st     *server.Stubborn
	// cfg is the registry the server started with.
	cfg *delegates.Config
}

// setup varies what start builds.
type setup struct {
	limits delegates.Limits
	clock  controls.Clock
	// extra delegates, served next to the standard ones.
	extra map[string]stubbornv1.DelegateServiceServer
	// notIdempotent lists delegates declared neither idempotent nor
	// read_only; all others are idempotent.
	notIdempotent []string
	// presets go into the config as they are.
	presets []delegates.Preset
	// budget goes into the config as it is.
	budget *delegates.RetryBudget
	// judge is the config's default judge delegate. Empty means none.
	judge string
	// tenants go into the config as they are (auth.go).
	tenants []delegates.Tenant
	// delegateTLS, when set, serves the delegates with these options and
	// gives every registry entry this TLS.
	delegateTLS *delegateTLS
	// serverOptions are added to the server's (TLS credentials).
	serverOptions []grpc.ServerOption
	// dialOptions replace the client's plaintext credentials.
	dialOptions []grpc.DialOption
	// logger defaults to a discarding one.
	logger *slog.Logger
	// registry entries added as they are (HTTP kinds).
	entries []delegates.Delegate
	// jetstream runs the server on a JetStream store of its own (an
	// embedded NATS server) instead of the memory store.
	jetstream bool
	// store, when set, is the server's store (replicas sharing one).
	store store.Store
	// configure, when set, changes the registry before the server starts.
	configure func(*delegates.Config)
	// fleet, when set, shares the guards with other servers (Config.Fleet).
	fleet *fleetguard.Fleet
	// notify tells people when runs wait (Config.Notify).
	notify server.NotifyConfig
}

// delegateTLS serves delegates over TLS and tells the registry how to reach
// them.
type delegateTLS struct {
	serve  []grpc.ServerOption
	config delegates.TLS
}

func start(t *testing.T, limits delegates.Limits) *env {
	t.Helper()
	return startWith(t, setup{limits: limits})
}

func startWith(t testing.TB, su setup) *env {
	t.Helper()
	limits := su.limits
	e := &env{slow: &demo.Slow{Delay: time.Minute}, gate: newGate()}
	svcs := map[string]stubbornv1.DelegateServiceServer{
		"echo":  demo.Echo{},
		"flaky": &demo.Flaky{FailFirst: 2},
		"down":  demo.Down{},
		"slow":  e.slow,
		"gate":  e.gate.svc(),
		"broken": demo.NewScripted(func(context.Context, *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
			return nil, status.Error(codes.Internal, "broken: always fails")
		}),
	}
	maps.Copy(svcs, su.extra)
	cfg := &delegates.Config{Limits: limits, Presets: su.presets, RetryBudget: su.budget, Judge: su.judge, Tenants: su.tenants}
	for name, svc := range svcs {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		var (
			serve []grpc.ServerOption
			dtls  delegates.TLS
		)
		if su.delegateTLS != nil {
			serve, dtls = su.delegateTLS.serve, su.delegateTLS.config
		}
		s := demo.Serve(lis, svc, serve...)
		t.Cleanup(s.Stop)
		cfg.Delegates = append(cfg.Delegates, delegates.Delegate{
			Name: name, Target: lis.Addr().String(), Idempotent: !slices.Contains(su.notIdempotent, name),
			Timeout: delegates.Duration(time.Minute), TLS: dtls,
		})
	}
	cfg.Delegates = append(cfg.Delegates, su.entries...)
	if su.configure != nil {
		su.configure(cfg)
	}
	logger := su.logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	store := su.store
	if su.jetstream {
		store = jetStreamStore(t)
	}
	st, err := server.New(server.Config{Registry: cfg, Logger: logger, Clock: su.clock, ServerOptions: su.serverOptions, Runs: runs.Config{Store: store}, Fleet: su.fleet, Notify: su.notify})
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = st.Serve(lis) }()
	dial := su.dialOptions
	if dial == nil {
		dial = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	e.addr, e.st, e.cfg = lis.Addr().String(), st, cfg
	conn, err := grpc.NewClient(e.addr, dial...)
	require.NoError(t, err)
	e.conn = conn
	e.client = stubbornv1.NewControlServiceClient(conn)
	t.Cleanup(func() {
		_ = conn.Close()
		st.Stop(5 * time.Second)
	})
	return e
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// collect reads a stream to its end.
func collect[T any, PT interface {
	*T
	GetEvent() *stubbornv1.RunEvent
}](t *testing.T, s grpc.ServerStreamingClient[T]) []*stubbornv1.RunEvent {
	t.Helper()
	var out []*stubbornv1.RunEvent
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		out = append(out, PT(m).GetEvent())
	}
}

func lastState(t *testing.T, evs []*stubbornv1.RunEvent) *stubbornv1.ControlState {
	t.Helper()
	require.NotEmpty(t, evs)
	f := evs[len(evs)-1].GetRunFinished()
	require.NotNil(t, f, "last event must be run_finished")
	return f.GetState()
}

func assertDense(t *testing.T, evs []*stubbornv1.RunEvent, from int64) {
	t.Helper()
	for i, ev := range evs {
		assert.Equal(t, from+int64(i), ev.GetSeq(), "event %d", i)
	}
}

func TestRunFallbackChainStreamsEveryAttempt(t *testing.T) {
	e := start(t, delegates.Limits{})
	ctx := testCtx(t)
	stream, err := e.client.Run(ctx, &stubbornv1.RunRequest{
		TaskBrief:     "find it",
		FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"down", "broken", "echo"}},
	})
	require.NoError(t, err)
	evs := collect(t, stream)
	assertDense(t, evs, 1)

	st := lastState(t, evs)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus())
	assert.Equal(t, "echo", st.GetWinner())
	assert.Equal(t, "echo: find it", st.GetResult().GetText())
	assert.EqualValues(t, 3, st.GetAttempts())
	require.Len(t, st.GetFailureHistory(), 2)
	assert.Equal(t, "down", st.GetFailureHistory()[0].GetDelegate())
	assert.Equal(t, "broken", st.GetFailureHistory()[1].GetDelegate())
	assert.Equal(t, "broken: always fails", st.GetFailureHistory()[1].GetReason())

	var started []string
	for _, ev := range evs {
		if a := ev.GetAttemptStarted(); a != nil {
			started = append(started, a.GetAttempt().GetDelegate())
			assert.Equal(t, "find it", a.GetAttempt().GetBrief(), "every delegate gets the original brief")
		}
	}
	assert.Equal(t, []string{"down", "broken", "echo"}, started)
	outcomes := []stubbornv1.AttemptOutcome{}
	for _, a := range st.GetAttemptLog() {
		outcomes = append(outcomes, a.GetOutcome())
	}
	assert.Equal(t, []stubbornv1.AttemptOutcome{
		stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SKIPPED,
		stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_ERROR,
		stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED,
	}, outcomes)
}

func TestRunRetryWithLearningFlakyThenSucceeds(t *testing.T) {
	e := start(t, delegates.Limits{})
	ctx := testCtx(t)
	stream, err := e.client.Run(ctx, &stubbornv1.RunRequest{
		TaskBrief:         "summarise",
		RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "flaky"},
	})
	require.NoError(t, err)
	st := lastState(t, collect(t, stream))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus())
	assert.EqualValues(t, 3, st.GetAttempts(), "default max_retries is 3 and flaky fails twice")
	require.Len(t, st.GetAttemptLog(), 3)
	assert.Equal(t, "summarise", st.GetAttemptLog()[0].GetBrief())
	want := "summarise\n\nPrior attempts failed. You MUST try a different approach.\n" +
		"\nAttempt 1: Error: flaky: failing call 1 of 2\nFailure reason: flaky: failing call 1 of 2\n" +
		"\nAttempt 2: Error: flaky: failing call 2 of 2\nFailure reason: flaky: failing call 2 of 2\n"
	assert.Equal(t, want, st.GetAttemptLog()[2].GetBrief())
}

func TestBadInputIsRejectedNamingTheField(t *testing.T) {
	e := start(t, delegates.Limits{MaxBriefBytes: 64})
	ctx := testCtx(t)
	chain := func(names ...string) *stubbornv1.FallbackChainSpec {
		return &stubbornv1.FallbackChainSpec{Chain: names}
	}
	n := func(v int32) *int32 { return &v }
	tests := []struct {
		name  string
		req   *stubbornv1.RunRequest
		code  codes.Code
		field string
	}{
		{"unknown delegate", &stubbornv1.RunRequest{TaskBrief: "x", FallbackChain: chain("echo", "nope")}, codes.NotFound, `fallback_chain.chain[1]: delegate "nope"`},
		{"unknown target", &stubbornv1.RunRequest{TaskBrief: "x", RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "nope"}}, codes.NotFound, "retry_with_learning.target"},
		{"empty chain", &stubbornv1.RunRequest{TaskBrief: "x", FallbackChain: chain()}, codes.InvalidArgument, "fallback_chain.chain"},
		{"empty name in chain", &stubbornv1.RunRequest{TaskBrief: "x", FallbackChain: chain("echo", "")}, codes.InvalidArgument, "fallback_chain.chain[1]"},
		{"max_retries 0", &stubbornv1.RunRequest{TaskBrief: "x", RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "echo", MaxRetries: n(0)}}, codes.InvalidArgument, "retry_with_learning.max_retries"},
		{"max_retries negative", &stubbornv1.RunRequest{TaskBrief: "x", RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "echo", MaxRetries: n(-2)}}, codes.InvalidArgument, "retry_with_learning.max_retries"},
		{"missing brief", &stubbornv1.RunRequest{FallbackChain: chain("echo")}, codes.InvalidArgument, "task_brief"},
		{"blank brief", &stubbornv1.RunRequest{TaskBrief: " \n", FallbackChain: chain("echo")}, codes.InvalidArgument, "task_brief"},
		{"brief over the limit", &stubbornv1.RunRequest{TaskBrief: strings.Repeat("b", 65), FallbackChain: chain("echo")}, codes.InvalidArgument, "task_brief: is 65 bytes, more than the limit of 64"},
		{"no control", &stubbornv1.RunRequest{TaskBrief: "x"}, codes.InvalidArgument, "exactly one of retry, retry_with_learning, fallback_chain, race, balance"},
		{"two controls", &stubbornv1.RunRequest{TaskBrief: "x", FallbackChain: chain("echo"), Race: &stubbornv1.RaceSpec{Candidates: []string{"echo"}}}, codes.InvalidArgument, "got fallback_chain and race"},
		{"empty race", &stubbornv1.RunRequest{TaskBrief: "x", Race: &stubbornv1.RaceSpec{}}, codes.InvalidArgument, "race.candidates"},
		{"negative attempts", &stubbornv1.RunRequest{TaskBrief: "x", Retry: &stubbornv1.RetrySpec{Target: "echo", Attempts: n(-1)}}, codes.InvalidArgument, "retry.attempts"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, call := range []func() error{
				func() error {
					s, err := e.client.Run(ctx, tt.req)
					if err != nil {
						return err
					}
					_, err = s.Recv()
					return err
				},
				func() error {
					b, err := proto.Marshal(tt.req) // StartRunRequest has the same fields and numbers
					require.NoError(t, err)
					sr := &stubbornv1.StartRunRequest{}
					require.NoError(t, proto.Unmarshal(b, sr))
					_, err = e.client.StartRun(ctx, sr)
					return err
				},
			} {
				err := call()
				require.Error(t, err)
				st := status.Convert(err)
				assert.Equal(t, tt.code, st.Code(), st.Message())
				assert.Contains(t, st.Message(), tt.field)
				if tt.code == codes.InvalidArgument {
					var br *errdetails.BadRequest
					for _, d := range st.Details() {
						if b, ok := d.(*errdetails.BadRequest); ok {
							br = b
						}
					}
					require.NotNil(t, br, "INVALID_ARGUMENT carries a google.rpc.BadRequest")
					assert.NotEmpty(t, br.GetFieldViolations())
				}
			}
		})
	}
	// Nothing ran, and the server is still up.
	list, err := e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{})
	require.NoError(t, err)
	assert.Empty(t, list.GetRuns())
	h, err := healthpb.NewHealthClient(e.conn).Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, h.GetStatus())
}

func TestWatchRunResumesWithoutGapOrDuplicate(t *testing.T) {
	e := start(t, delegates.Limits{})
	ctx := testCtx(t)
	streamCtx, dropStream := context.WithCancel(ctx)
	stream, err := e.client.Run(streamCtx, &stubbornv1.RunRequest{
		TaskBrief:         "work",
		RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "gate"},
	})
	require.NoError(t, err)
	// Attempt 1 fails; read up to and including its failure analysis.
	e.gate.answers <- status.Error(codes.Unavailable, "first fails")
	var seen []*stubbornv1.RunEvent
	for {
		m, err := stream.Recv()
		require.NoError(t, err)
		seen = append(seen, m.GetEvent())
		if m.GetEvent().GetFailureAnalyzed() != nil {
			break
		}
	}
	k := seen[len(seen)-1].GetSeq()
	runID := seen[0].GetRunId()
	dropStream() // the client hangs up; the run goes on

	e.gate.answers <- status.Error(codes.Unavailable, "second fails")
	e.gate.answers <- nil
	w, err := e.client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: runID, AfterSeq: k})
	require.NoError(t, err)
	rest := collect(t, w)
	require.NotEmpty(t, rest)
	assertDense(t, rest, k+1)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, lastState(t, rest).GetStatus())

	all, err := e.client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: runID})
	require.NoError(t, err)
	full := collect(t, all)
	require.Len(t, full, len(seen)+len(rest))
	for i, ev := range append(seen, rest...) {
		assert.True(t, proto.Equal(full[i], ev), "event %d differs between the resumed and the full stream", i+1)
	}
	// Each event carries the run's status after it, as the one fold has
	// it, and the whole stream folds to the final state.
	status := stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED
	for _, ev := range full {
		status = controls.NextStatus(status, ev)
		assert.Equal(t, status, ev.GetStatus(), "seq %d", ev.GetSeq())
	}
	assert.NotContains(t, statuses(full), stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED)
	assert.True(t, proto.Equal(lastState(t, full), controls.Fold(full)), "the stream folds to the final state")
}

// statuses lists the statuses the events carry.
func statuses(evs []*stubbornv1.RunEvent) []stubbornv1.RunStatus {
	var out []stubbornv1.RunStatus
	for _, ev := range evs {
		out = append(out, ev.GetStatus())
	}
	return out
}

func TestCancelRunCancelsTheDelegateCall(t *testing.T) {
	e := start(t, delegates.Limits{})
	ctx := testCtx(t)
	res, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{
		TaskBrief:     "take your time",
		FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"slow", "echo"}},
	})
	require.NoError(t, err)
	w, err := e.client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: res.GetRunId()})
	require.NoError(t, err)
	for { // wait until the call to slow is in flight
		m, err := w.Recv()
		require.NoError(t, err)
		if m.GetEvent().GetAttemptStarted() != nil {
			break
		}
	}
	require.Eventually(t, func() bool { return e.slow.Started() == 1 }, 10*time.Second, 5*time.Millisecond)

	c, err := e.client.CancelRun(ctx, &stubbornv1.CancelRunRequest{RunId: res.GetRunId()})
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_CANCELLED, c.GetState().GetStatus())
	assert.EqualValues(t, 1, c.GetState().GetAttempts(), "echo is never called after a cancel")
	require.Eventually(t, func() bool { return e.slow.Cancelled() == 1 }, 10*time.Second, 5*time.Millisecond,
		"the delegate's in-flight call must see a cancelled context")

	rest := collect(t, w)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_CANCELLED, lastState(t, rest).GetStatus())

	// Cancelling again returns the final state.
	again, err := e.client.CancelRun(ctx, &stubbornv1.CancelRunRequest{RunId: res.GetRunId()})
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_CANCELLED, again.GetState().GetStatus())
}

func TestRunOutlivesItsClient(t *testing.T) {
	e := start(t, delegates.Limits{})
	ctx := testCtx(t)
	streamCtx, hangUp := context.WithCancel(ctx)
	stream, err := e.client.Run(streamCtx, &stubbornv1.RunRequest{
		TaskBrief:         "go on without me",
		RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "gate"},
	})
	require.NoError(t, err)
	first, err := stream.Recv()
	require.NoError(t, err)
	hangUp()
	e.gate.answers <- nil
	w, err := e.client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: first.GetEvent().GetRunId()})
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, lastState(t, collect(t, w)).GetStatus())
}

// batches reads a WatchRun stream with max_batch > 1 to its end: the size
// of each response, and all the events.
func batches(t *testing.T, s grpc.ServerStreamingClient[stubbornv1.WatchRunResponse]) (sizes []int, evs []*stubbornv1.RunEvent) {
	t.Helper()
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return sizes, evs
		}
		require.NoError(t, err)
		require.Nil(t, m.GetEvent(), "a batched response uses events only")
		require.NotEmpty(t, m.GetEvents(), "a response carries at least one event")
		sizes = append(sizes, len(m.GetEvents()))
		evs = append(evs, m.GetEvents()...)
	}
}

func TestWatchRunInBatches(t *testing.T) {
	e := start(t, delegates.Limits{})
	ctx := testCtx(t)
	res, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{
		TaskBrief:         "work",
		RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "gate"},
	})
	require.NoError(t, err)
	id := res.GetRunId()
	live, err := e.client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: id, MaxBatch: 2})
	require.NoError(t, err)
	one, err := e.client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: id})
	require.NoError(t, err)
	e.gate.answers <- status.Error(codes.Unavailable, "first fails")
	e.gate.answers <- status.Error(codes.Unavailable, "second fails")
	e.gate.answers <- nil

	sizes, batched := batches(t, live)
	full := collect(t, one)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, lastState(t, full).GetStatus())
	require.Len(t, batched, len(full))
	for i := range full {
		assert.True(t, proto.Equal(full[i], batched[i]), "event %d differs between the batched and the one-by-one stream", i+1)
	}
	for _, n := range sizes {
		assert.LessOrEqual(t, n, 2)
	}

	// Replaying a finished run: every event is ready at once, so the
	// responses are as full as max_batch allows.
	n := len(full)
	for _, tc := range []struct {
		max, after int
		want       []int
	}{
		{max: 1000, want: []int{n}},
		{max: 3, after: 1, want: append(slices.Repeat([]int{3}, (n-1)/3), (n-1)%3)},
	} {
		w, err := e.client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: id, MaxBatch: int32(tc.max), AfterSeq: int64(tc.after)})
		require.NoError(t, err)
		sizes, evs := batches(t, w)
		want := slices.DeleteFunc(tc.want, func(k int) bool { return k == 0 })
		assert.Equal(t, want, sizes, "max_batch %d after %d", tc.max, tc.after)
		assertDense(t, evs, int64(tc.after)+1)
		assert.Len(t, evs, n-tc.after)
	}

	for _, bad := range []int32{-1, 1001} {
		w, err := e.client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: id, MaxBatch: bad})
		require.NoError(t, err)
		_, err = w.Recv()
		assert.Equal(t, codes.InvalidArgument, status.Code(err))
		assert.Contains(t, status.Convert(err).Message(), "max_batch")
	}
}

func TestUnknownAndFinishedRuns(t *testing.T) {
	e := start(t, delegates.Limits{})
	ctx := testCtx(t)
	_, err := e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: "run_nope"})
	assert.Equal(t, codes.NotFound, status.Code(err))
	w, err := e.client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: "run_nope"})
	require.NoError(t, err)
	_, err = w.Recv()
	assert.Equal(t, codes.NotFound, status.Code(err))
	_, err = e.client.DecideRun(ctx, &stubbornv1.DecideRunRequest{RunId: "run_nope", Decision: stubbornv1.Decision_DECISION_RETRY})
	assert.Equal(t, codes.NotFound, status.Code(err))
	_, err = e.client.GetRun(ctx, &stubbornv1.GetRunRequest{})
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	_, err = e.client.DecideRun(ctx, &stubbornv1.DecideRunRequest{RunId: "run_nope"})
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "decision")
	w, err = e.client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: "x", AfterSeq: -1})
	require.NoError(t, err)
	_, err = w.Recv()
	assert.Equal(t, codes.InvalidArgument, status.Code(err))

	s, err := e.client.Run(ctx, &stubbornv1.RunRequest{TaskBrief: "x", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}})
	require.NoError(t, err)
	st := lastState(t, collect(t, s))
	_, err = e.client.DecideRun(ctx, &stubbornv1.DecideRunRequest{RunId: st.GetRunId(), Decision: stubbornv1.Decision_DECISION_RETRY})
	assert.Equal(t, codes.FailedPrecondition, status.Code(err))

	got, err := e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: st.GetRunId()})
	require.NoError(t, err)
	assert.True(t, proto.Equal(st, got.GetState()), "GetRun %v\nfinal %v", got.GetState(), st)

	// Watching a finished run replays it and ends.
	w, err = e.client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: st.GetRunId(), AfterSeq: 2})
	require.NoError(t, err)
	replay := collect(t, w)
	assertDense(t, replay, 3)
	// After the last event there is nothing more.
	w, err = e.client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: st.GetRunId(), AfterSeq: 1000})
	require.NoError(t, err)
	assert.Empty(t, collect(t, w))
}

func TestListRunsPages(t *testing.T) {
	e := start(t, delegates.Limits{})
	ctx := testCtx(t)
	var ids []string
	for range 5 {
		s, err := e.client.Run(ctx, &stubbornv1.RunRequest{TaskBrief: "x", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}})
		require.NoError(t, err)
		ids = append(ids, lastState(t, collect(t, s)).GetRunId())
	}
	var got []string
	token := ""
	for {
		page, err := e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{PageSize: 2, PageToken: token})
		require.NoError(t, err)
		assert.LessOrEqual(t, len(page.GetRuns()), 2)
		for _, r := range page.GetRuns() {
			got = append(got, r.GetRunId())
		}
		if token = page.GetNextPageToken(); token == "" {
			break
		}
	}
	want := []string{ids[4], ids[3], ids[2], ids[1], ids[0]}
	assert.Equal(t, want, got, "newest first, every run once")

	filtered, err := e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{Status: stubbornv1.RunStatus_RUN_STATUS_FAILED})
	require.NoError(t, err)
	assert.Empty(t, filtered.GetRuns())
	_, err = e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{PageToken: "garbage"})
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
}

func TestHealthAndReflection(t *testing.T) {
	e := start(t, delegates.Limits{})
	ctx := testCtx(t)
	h, err := healthpb.NewHealthClient(e.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "stubborn.v1.ControlService"})
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, h.GetStatus())

	rc, err := reflectionpb.NewServerReflectionClient(e.conn).ServerReflectionInfo(ctx)
	require.NoError(t, err)
	require.NoError(t, rc.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
	}))
	res, err := rc.Recv()
	require.NoError(t, err)
	require.NoError(t, rc.CloseSend())
	var names []string
	for _, s := range res.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	assert.Contains(t, names, "stubborn.v1.ControlService")
	assert.Contains(t, names, "grpc.health.v1.Health")
}

func TestPanicInHandlerIsInternal(t *testing.T) {
	// A Service without a runs layer panics on any call that reaches it.
	g := server.NewServerWithoutRuns(slog.New(slog.DiscardHandler))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); wg.Wait() })
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	client := stubbornv1.NewControlServiceClient(conn)
	ctx := testCtx(t)

	_, err = client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: "run_x"})
	assert.Equal(t, codes.Internal, status.Code(err))
	s, err := client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: "run_x"})
	require.NoError(t, err)
	_, err = s.Recv()
	assert.Equal(t, codes.Internal, status.Code(err))
	// The server is still up.
	_, err = client.GetRun(ctx, &stubbornv1.GetRunRequest{})
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
}

// jetStreamStore returns a JetStream store on an embedded NATS server of
// its own.
func jetStreamStore(t testing.TB) *jsstore.JetStream {
	t.Helper()
	return jetStreamStores(t, 1)[0]
}

// jetStreamStores returns n JetStream stores on one embedded NATS server,
// each on a connection of its own: the stores of n replicas.
func jetStreamStores(t testing.TB, n int) []*jsstore.JetStream {
	t.Helper()
	ns, err := jsstore.StartEmbedded(jsstore.EmbeddedConfig{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(ns.Close)
	var stores []*jsstore.JetStream
	for range n {
		nc, err := nats.Connect("", nats.InProcessServer(ns.Server))
		require.NoError(t, err)
		store, err := jsstore.NewJetStream(testCtx(t), nc, jsstore.JetStreamConfig{})
		require.NoError(t, err)
		t.Cleanup(func() { _ = store.Close() })
		stores = append(stores, store)
	}
	return stores
}
