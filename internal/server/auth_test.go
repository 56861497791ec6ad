package server_test

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
)

const (
	tokenA = "token-of-tenant-a-0123456789abcdef0123456789abcdef"
	tokenB = "token-of-tenant-b-0123456789abcdef0123456789abcdef"
)

// as returns ctx that sends token as a bearer token.
func as(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

func twoTenants(a, b delegates.Limits) []delegates.Tenant {
	return []delegates.Tenant{
		{Name: "a", TokenSHA256: []string{delegates.HashToken(tokenA)}, Limits: a},
		{Name: "b", TokenSHA256: []string{delegates.HashToken(tokenB)}, Limits: b},
	}
}

// awaiting starts, as ctx's tenant, a run that waits for a decision at
// once: a retry of the always UNAVAILABLE "down" with no retries, asking.
func awaiting(t *testing.T, ctx context.Context, c stubbornv1.ControlServiceClient) string {
	t.Helper()
	zero := int32(0)
	res, err := c.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "wait for me", Retry: &stubbornv1.RetrySpec{
		Target: "down", Attempts: &zero, OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_ASK,
	}})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		st, err := c.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: res.GetRunId()})
		return err == nil && st.GetState().GetStatus() == stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION
	}, 10*time.Second, 5*time.Millisecond)
	return res.GetRunId()
}

// notFoundLikeUnknown asserts err is NOT_FOUND with the message an unknown
// run id gets (errUnknown, for the id "run_unknown").
func notFoundLikeUnknown(t *testing.T, id string, err, errUnknown error) {
	t.Helper()
	require.Equal(t, codes.NotFound, status.Code(err), "%v", err)
	require.Equal(t, codes.NotFound, status.Code(errUnknown), "%v", errUnknown)
	assert.Equal(t, strings.ReplaceAll(status.Convert(errUnknown).Message(), "run_unknown", "ID"),
		strings.ReplaceAll(status.Convert(err).Message(), id, "ID"))
}

func TestTenantsAreIsolatedOverGRPC(t *testing.T) {
	e := startWith(t, setup{tenants: twoTenants(delegates.Limits{}, delegates.Limits{})})
	ctx := testCtx(t)
	ctxA, ctxB := as(ctx, tokenA), as(ctx, tokenB)
	id := awaiting(t, ctxA, e.client)
	const unknown = "run_unknown"

	// b: every RPC about a's run is NOT_FOUND, word for word as for a run
	// that does not exist, and ListRuns leaves it out.
	_, err := e.client.GetRun(ctxB, &stubbornv1.GetRunRequest{RunId: id})
	_, errU := e.client.GetRun(ctxB, &stubbornv1.GetRunRequest{RunId: unknown})
	notFoundLikeUnknown(t, id, err, errU)

	watch := func(ctx context.Context, id string) error {
		s, err := e.client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: id})
		require.NoError(t, err)
		_, err = s.Recv()
		return err
	}
	notFoundLikeUnknown(t, id, watch(ctxB, id), watch(ctxB, unknown))

	_, err = e.client.CancelRun(ctxB, &stubbornv1.CancelRunRequest{RunId: id})
	_, errU = e.client.CancelRun(ctxB, &stubbornv1.CancelRunRequest{RunId: unknown})
	notFoundLikeUnknown(t, id, err, errU)

	_, err = e.client.DecideRun(ctxB, &stubbornv1.DecideRunRequest{RunId: id, Decision: stubbornv1.Decision_DECISION_FAIL})
	_, errU = e.client.DecideRun(ctxB, &stubbornv1.DecideRunRequest{RunId: unknown, Decision: stubbornv1.Decision_DECISION_FAIL})
	notFoundLikeUnknown(t, id, err, errU)

	list, err := e.client.ListRuns(ctxB, &stubbornv1.ListRunsRequest{})
	require.NoError(t, err)
	assert.Empty(t, list.GetRuns())

	// a: sees it, watches it, lists it, decides it; b's attempts changed
	// nothing.
	got, err := e.client.GetRun(ctxA, &stubbornv1.GetRunRequest{RunId: id})
	require.NoError(t, err)
	assert.Equal(t, "a", got.GetState().GetTenant())
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, got.GetState().GetStatus())
	list, err = e.client.ListRuns(ctxA, &stubbornv1.ListRunsRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetRuns(), 1)
	assert.Equal(t, id, list.GetRuns()[0].GetRunId())
	wctx, stopWatch := context.WithCancel(ctxA)
	s, err := e.client.WatchRun(wctx, &stubbornv1.WatchRunRequest{RunId: id})
	require.NoError(t, err)
	first, err := s.Recv()
	require.NoError(t, err)
	assert.EqualValues(t, 1, first.GetEvent().GetSeq())
	stopWatch()
	dec, err := e.client.DecideRun(ctxA, &stubbornv1.DecideRunRequest{RunId: id, Decision: stubbornv1.Decision_DECISION_FAIL})
	require.NoError(t, err)
	assert.NotEqual(t, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, dec.GetState().GetStatus())
	canc, err := e.client.CancelRun(ctxA, &stubbornv1.CancelRunRequest{RunId: id})
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, canc.GetState().GetStatus())

	// a cancels a run of its own.
	id2 := awaiting(t, ctxA, e.client)
	canc, err = e.client.CancelRun(ctxA, &stubbornv1.CancelRunRequest{RunId: id2})
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_CANCELLED, canc.GetState().GetStatus())
}

func TestCallsWithoutValidCredentialsAreUnauthenticated(t *testing.T) {
	e := startWith(t, setup{tenants: twoTenants(delegates.Limits{}, delegates.Limits{})})
	ctx := testCtx(t)
	for name, ctx := range map[string]context.Context{
		"no token":     ctx,
		"wrong token":  as(ctx, "not-a-token-of-anyone"),
		"empty token":  metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "),
		"basic":        metadata.AppendToOutgoingContext(ctx, "authorization", "Basic YTpi"),
		"two tokens":   metadata.AppendToOutgoingContext(as(ctx, tokenA), "authorization", "Bearer "+tokenB),
		"token, no sp": metadata.AppendToOutgoingContext(ctx, "authorization", tokenA),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{})
			assert.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
			_, err = e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "b", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}})
			assert.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
			assert.NotContains(t, err.Error(), tokenA, "a token is never quoted")
			s, err := e.client.Run(ctx, &stubbornv1.RunRequest{TaskBrief: "b", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}})
			require.NoError(t, err)
			_, err = s.Recv()
			assert.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
		})
	}
	// Nothing ran.
	list, err := e.client.ListRuns(as(ctx, tokenA), &stubbornv1.ListRunsRequest{})
	require.NoError(t, err)
	assert.Empty(t, list.GetRuns())

	// Health answers without credentials; reflection asks for them.
	h, err := healthpb.NewHealthClient(e.conn).Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, h.GetStatus())
	rc, err := reflectionpb.NewServerReflectionClient(e.conn).ServerReflectionInfo(ctx)
	require.NoError(t, err)
	// The server may refuse the stream before the request is sent: Send then
	// reports io.EOF and Recv the status.
	if err := rc.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		require.ErrorIs(t, err, io.EOF)
	}
	_, err = rc.Recv()
	assert.Equal(t, codes.Unauthenticated, status.Code(err))
	rc, err = reflectionpb.NewServerReflectionClient(e.conn).ServerReflectionInfo(as(ctx, tokenB))
	require.NoError(t, err)
	require.NoError(t, rc.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}))
	_, err = rc.Recv()
	require.NoError(t, err)
	require.NoError(t, rc.CloseSend())
}

// exhaustedNaming asserts err is RESOURCE_EXHAUSTED, names limit, and
// carries a QuotaFailure about subject.
func exhaustedNaming(t *testing.T, err error, limit, subject string) *status.Status {
	t.Helper()
	st := status.Convert(err)
	require.Equal(t, codes.ResourceExhausted, st.Code(), "%v", err)
	assert.Contains(t, st.Message(), limit)
	var qf *errdetails.QuotaFailure
	for _, d := range st.Details() {
		if q, ok := d.(*errdetails.QuotaFailure); ok {
			qf = q
		}
	}
	require.NotNil(t, qf, "a QuotaFailure detail")
	assert.Equal(t, subject, qf.GetViolations()[0].GetSubject())
	return st
}

func echoRun(brief string) *stubbornv1.StartRunRequest {
	return &stubbornv1.StartRunRequest{TaskBrief: brief, FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}}
}

func TestStartRateIsPerTenant(t *testing.T) {
	// a may start 2 runs, then one every 1000 s: the third is over.
	e := startWith(t, setup{tenants: twoTenants(delegates.Limits{RunStartsPerSecond: 0.001, RunStartBurst: 2}, delegates.Limits{})})
	ctx := testCtx(t)
	ctxA, ctxB := as(ctx, tokenA), as(ctx, tokenB)
	for range 2 {
		_, err := e.client.StartRun(ctxA, echoRun("x"))
		require.NoError(t, err)
	}
	_, err := e.client.StartRun(ctxA, echoRun("x"))
	st := exhaustedNaming(t, err, "run_starts_per_second", "tenant:a")
	assert.Contains(t, st.Message(), `tenant "a"`)
	var retry *errdetails.RetryInfo
	for _, d := range st.Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			retry = r
		}
	}
	require.NotNil(t, retry)
	assert.Greater(t, retry.GetRetryDelay().AsDuration(), 100*time.Second)
	s, err := e.client.Run(ctxA, &stubbornv1.RunRequest{TaskBrief: "x", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}})
	require.NoError(t, err)
	_, err = s.Recv()
	exhaustedNaming(t, err, "run_starts_per_second", "tenant:a")

	// No trace: a has its two runs only. b is not limited by a's rate.
	list, err := e.client.ListRuns(ctxA, &stubbornv1.ListRunsRequest{})
	require.NoError(t, err)
	assert.Len(t, list.GetRuns(), 2)
	for range 5 {
		_, err := e.client.StartRun(ctxB, echoRun("x"))
		require.NoError(t, err)
	}
}

func TestServerStartRateIsShared(t *testing.T) {
	e := startWith(t, setup{
		limits:  delegates.Limits{RunStartsPerSecond: 0.001, RunStartBurst: 3},
		tenants: twoTenants(delegates.Limits{}, delegates.Limits{}),
	})
	ctx := testCtx(t)
	for _, tok := range []string{tokenA, tokenB, tokenA} {
		_, err := e.client.StartRun(as(ctx, tok), echoRun("x"))
		require.NoError(t, err)
	}
	_, err := e.client.StartRun(as(ctx, tokenB), echoRun("x"))
	st := exhaustedNaming(t, err, "run_starts_per_second", "server")
	assert.Contains(t, st.Message(), "the server")
}

// runToEnd watches a run until it ends.
func runToEnd(t *testing.T, ctx context.Context, c stubbornv1.ControlServiceClient, id string) {
	t.Helper()
	s, err := c.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: id})
	require.NoError(t, err)
	for {
		if _, err := s.Recv(); err != nil {
			require.ErrorIs(t, err, io.EOF)
			return
		}
	}
}

func TestConcurrentRunsPerTenant(t *testing.T) {
	// a: one run at a time, and two starts in all (no refill to speak of).
	e := startWith(t, setup{tenants: twoTenants(delegates.Limits{MaxConcurrentRuns: 1, RunStartsPerSecond: 0.001, RunStartBurst: 2}, delegates.Limits{})})
	ctx := testCtx(t)
	ctxA, ctxB := as(ctx, tokenA), as(ctx, tokenB)
	first := awaiting(t, ctxA, e.client)
	_, err := e.client.StartRun(ctxA, echoRun("x"))
	st := exhaustedNaming(t, err, "max_concurrent_runs", "tenant:a")
	assert.Contains(t, st.Message(), "1 runs in progress")
	list, err := e.client.ListRuns(ctxA, &stubbornv1.ListRunsRequest{})
	require.NoError(t, err)
	assert.Len(t, list.GetRuns(), 1, "the refused start left no run")

	// b is not limited by a's runs.
	for range 3 {
		awaiting(t, ctxB, e.client)
	}
	// Once a's run has ended, a may start another.
	_, err = e.client.DecideRun(ctxA, &stubbornv1.DecideRunRequest{RunId: first, Decision: stubbornv1.Decision_DECISION_FAIL})
	require.NoError(t, err)
	runToEnd(t, ctxA, e.client, first)
	// Its second start: the refused ones gave theirs back.
	require.Eventually(t, func() bool {
		_, err := e.client.StartRun(ctxA, echoRun("x"))
		return err == nil
	}, 10*time.Second, 5*time.Millisecond)
	_, err = e.client.StartRun(ctxA, echoRun("x"))
	exhaustedNaming(t, err, "run_starts_per_second", "tenant:a")
}

func TestConcurrentRunsOfTheServer(t *testing.T) {
	e := startWith(t, setup{limits: delegates.Limits{MaxConcurrentRuns: 2}})
	ctx := testCtx(t)
	awaiting(t, ctx, e.client)
	awaiting(t, ctx, e.client)
	_, err := e.client.StartRun(ctx, echoRun("x"))
	exhaustedNaming(t, err, "max_concurrent_runs", "server")
}

func TestWatchersPerRun(t *testing.T) {
	e := startWith(t, setup{tenants: twoTenants(delegates.Limits{}, delegates.Limits{}), limits: delegates.Limits{MaxWatchersPerRun: 2}})
	ctx := testCtx(t)
	ctxA, ctxB := as(ctx, tokenA), as(ctx, tokenB)
	id := awaiting(t, ctxA, e.client)
	var streams []grpc.ServerStreamingClient[stubbornv1.WatchRunResponse]
	wctx, stop := context.WithCancel(ctxA)
	for range 2 {
		s, err := e.client.WatchRun(wctx, &stubbornv1.WatchRunRequest{RunId: id})
		require.NoError(t, err)
		_, err = s.Recv()
		require.NoError(t, err)
		streams = append(streams, s)
	}
	s, err := e.client.WatchRun(ctxA, &stubbornv1.WatchRunRequest{RunId: id})
	require.NoError(t, err)
	_, err = s.Recv()
	st := exhaustedNaming(t, err, "max_watchers_per_run", "run:"+id)
	assert.Contains(t, st.Message(), "the limit is 2")

	// To b the run does not exist, full or not.
	s, err = e.client.WatchRun(ctxB, &stubbornv1.WatchRunRequest{RunId: id})
	require.NoError(t, err)
	_, err = s.Recv()
	assert.Equal(t, codes.NotFound, status.Code(err))

	// A watcher that leaves makes room.
	stop()
	require.Eventually(t, func() bool {
		wctx, cancel := context.WithTimeout(ctxA, time.Second)
		defer cancel()
		s, err := e.client.WatchRun(wctx, &stubbornv1.WatchRunRequest{RunId: id})
		if err != nil {
			return false
		}
		_, err = s.Recv()
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	_ = streams
}

func TestTenantDelegatesAndLimits(t *testing.T) {
	tenants := twoTenants(delegates.Limits{MaxBriefBytes: 10, MaxChain: 1}, delegates.Limits{})
	tenants[0].Delegates = []string{"echo"}
	e := startWith(t, setup{tenants: tenants})
	ctx := testCtx(t)
	ctxA, ctxB := as(ctx, tokenA), as(ctx, tokenB)

	_, err := e.client.StartRun(ctxA, &stubbornv1.StartRunRequest{TaskBrief: "x", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"flaky"}}})
	_, errU := e.client.StartRun(ctxA, &stubbornv1.StartRunRequest{TaskBrief: "x", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"nosuch"}}})
	require.Equal(t, codes.NotFound, status.Code(err))
	assert.Equal(t, strings.ReplaceAll(status.Convert(errU).Message(), "nosuch", "X"), strings.ReplaceAll(status.Convert(err).Message(), "flaky", "X"),
		"a delegate the tenant may not use is as unknown as one not in the registry")
	_, err = e.client.StartRun(ctxA, echoRun(strings.Repeat("x", 11)))
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "limit of 10")
	_, err = e.client.StartRun(ctxA, &stubbornv1.StartRunRequest{TaskBrief: "x", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo", "echo"}}})
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	_, err = e.client.StartRun(ctxA, echoRun("short"))
	require.NoError(t, err)

	// b has the server's limits and every delegate.
	_, err = e.client.StartRun(ctxB, &stubbornv1.StartRunRequest{TaskBrief: strings.Repeat("x", 100), FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"flaky", "echo"}}})
	require.NoError(t, err)
}

func TestWithoutTenantsEveryCallerIsTheDefaultTenant(t *testing.T) {
	e := start(t, delegates.Limits{})
	ctx := testCtx(t)
	res, err := e.client.StartRun(ctx, echoRun("x"))
	require.NoError(t, err)
	assert.Empty(t, res.GetState().GetTenant())
	// A token is not asked for, and changes nothing.
	got, err := e.client.GetRun(as(ctx, "whatever"), &stubbornv1.GetRunRequest{RunId: res.GetRunId()})
	require.NoError(t, err)
	assert.Equal(t, res.GetRunId(), got.GetState().GetRunId())
}
