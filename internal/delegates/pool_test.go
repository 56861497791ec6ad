package delegates_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// listen opens a loopback listener on a free port.
func listen(t *testing.T) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return lis
}

// serve runs svc on a loopback port until the test ends and returns the
// address.
func serve(t *testing.T, svc stubbornv1.DelegateServiceServer) string {
	t.Helper()
	lis := listen(t)
	s := demo.Serve(lis, svc)
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

// deadPort returns a loopback address with nothing listening on it.
func deadPort(t *testing.T) string {
	t.Helper()
	lis := listen(t)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close())
	return addr
}

// newPool builds a pool over cfg that is closed when the test ends.
func newPool(t *testing.T, cfg *delegates.Config) *delegates.Pool {
	t.Helper()
	p, err := delegates.NewPool(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, p.Close()) })
	return p
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func callError(t *testing.T, err error) *controls.CallError {
	t.Helper()
	var ce *controls.CallError
	require.ErrorAs(t, err, &ce)
	return ce
}

func TestPoolRegistry(t *testing.T) {
	cfg, err := delegates.Parse([]byte(fullConfig))
	require.NoError(t, err)
	p := newPool(t, cfg)

	assert.Equal(t, []string{"search", "judge-name", "local"}, p.Names())
	d, ok := p.Lookup("search")
	require.True(t, ok)
	assert.Equal(t, "127.0.0.1:7301", d.Target)
	_, ok = p.Lookup("nope")
	assert.False(t, ok)
	assert.Equal(t, controls.DelegateInfo{Idempotent: true}, p.Info("search"))
	assert.Equal(t, controls.DelegateInfo{ReadOnly: true}, p.Info("judge-name"))
	assert.Equal(t, controls.DelegateInfo{}, p.Info("nope"))

	// Nothing is dialled until a call: building the pool needs no servers.
	res, err := p.Call(testCtx(t), controls.Call{Delegate: "nope", Brief: "b", Attempt: 1})
	assert.Nil(t, res)
	assert.Equal(t, &controls.CallError{
		Code: codes.NotFound, Message: `delegate "nope" is not in the registry`, Refused: true,
	}, callError(t, err))
}

func TestNewPoolRejectsBadConfig(t *testing.T) {
	_, err := delegates.NewPool(&delegates.Config{Delegates: []delegates.Delegate{
		{Name: "a", Target: "127.0.0.1:1"}, {Name: "a", Target: "127.0.0.1:2"},
	}})
	require.ErrorIs(t, err, delegates.ErrInvalidConfig)
}

func TestCallEchoAndFlaky(t *testing.T) {
	flaky := &demo.Flaky{FailFirst: 2}
	perm := &demo.Flaky{FailFirst: 1, Code: codes.InvalidArgument}
	p := newPool(t, &delegates.Config{Delegates: []delegates.Delegate{
		{Name: "echo", Target: serve(t, demo.Echo{})},
		{Name: "flaky", Target: serve(t, flaky), Idempotent: true},
		{Name: "perm", Target: serve(t, perm)},
	}})
	ctx := testCtx(t)

	res, err := p.Call(ctx, controls.Call{Delegate: "echo", Brief: "hello", Attempt: 1})
	require.NoError(t, err)
	assert.Equal(t, "echo: hello", res.GetText())

	for i, msg := range []string{"flaky: failing call 1 of 2", "flaky: failing call 2 of 2"} {
		_, err := p.Call(ctx, controls.Call{Delegate: "flaky", Brief: "b", Attempt: int32(i + 1)})
		assert.Equal(t, &controls.CallError{Code: codes.Unavailable, Message: msg}, callError(t, err))
	}
	res, err = p.Call(ctx, controls.Call{Delegate: "flaky", Brief: "b", Attempt: 3})
	require.NoError(t, err)
	assert.Equal(t, "echo: b", res.GetText())
	assert.Equal(t, 3, flaky.Calls())

	_, err = p.Call(ctx, controls.Call{Delegate: "perm", Brief: "b", Attempt: 1})
	assert.Equal(t, &controls.CallError{Code: codes.InvalidArgument, Message: "flaky: failing call 1 of 1"}, callError(t, err))
}

func TestCallNothingListening(t *testing.T) {
	p := newPool(t, &delegates.Config{Delegates: []delegates.Delegate{
		{Name: "gone", Target: deadPort(t)},
	}})
	ctx := testCtx(t)
	_, err := p.Call(ctx, controls.Call{Delegate: "gone", Brief: "b", Attempt: 1})
	ce := callError(t, err)
	t.Logf("grpc-go says: %s", ce.Message)
	assert.Equal(t, codes.Unavailable, ce.Code)
	assert.True(t, ce.NotSent, "connection refused must be NotSent: %q", ce.Message)
	assert.False(t, ce.Refused)
	assert.NoError(t, ctx.Err())
}

func TestCallServerWordsDoNotMakeNotSent(t *testing.T) {
	relay := demo.NewScripted(func(context.Context, *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		return nil, status.Error(codes.Unavailable, "upstream: dial tcp 10.1.1.1:80: connect: connection refused")
	})
	p := newPool(t, &delegates.Config{Delegates: []delegates.Delegate{{Name: "relay", Target: serve(t, relay)}}})
	_, err := p.Call(testCtx(t), controls.Call{Delegate: "relay", Brief: "b", Attempt: 1})
	ce := callError(t, err)
	assert.Equal(t, codes.Unavailable, ce.Code)
	assert.False(t, ce.NotSent, "the delegate got the call")
	assert.Len(t, relay.Received(), 1)
}

func TestCallHintsOverTheWire(t *testing.T) {
	hinted := demo.NewScripted(func(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		switch req.GetBrief() {
		case "details":
			st, err := status.New(codes.ResourceExhausted, "quota").WithDetails(upstream(429), retryIn(3*time.Second))
			if err != nil {
				return nil, err
			}
			return nil, st.Err()
		case "pushback":
			if err := grpc.SetTrailer(ctx, metadata.Pairs(delegates.PushbackTrailer, "1200")); err != nil {
				return nil, err
			}
			return nil, status.Error(codes.Unavailable, "busy")
		case "stop":
			if err := grpc.SetTrailer(ctx, metadata.Pairs(delegates.PushbackTrailer, "-1")); err != nil {
				return nil, err
			}
			return nil, status.Error(codes.Unavailable, "busy")
		case "empty":
			return &stubbornv1.ExecuteResponse{}, nil
		}
		return nil, status.Error(codes.Internal, "unexpected brief")
	})
	p := newPool(t, &delegates.Config{Delegates: []delegates.Delegate{{Name: "h", Target: serve(t, hinted)}}})
	ctx := testCtx(t)
	call := func(brief string) (*stubbornv1.Result, error) {
		return p.Call(ctx, controls.Call{Delegate: "h", Brief: brief, Attempt: 1})
	}

	_, err := call("details")
	assert.Equal(t, &controls.CallError{
		Code: codes.ResourceExhausted, Message: "quota", HTTPStatus: 429, HasHint: true, RetryHint: 3 * time.Second,
	}, callError(t, err))
	_, err = call("pushback")
	assert.Equal(t, &controls.CallError{
		Code: codes.Unavailable, Message: "busy", HasHint: true, RetryHint: 1200 * time.Millisecond,
	}, callError(t, err))
	_, err = call("stop")
	assert.Equal(t, &controls.CallError{
		Code: codes.Unavailable, Message: "busy", HasHint: true, RetryHint: delegates.NoRetryHint,
	}, callError(t, err))
	res, err := call("empty")
	require.NoError(t, err)
	require.NotNil(t, res, "an unset result is an empty one")
	assert.Empty(t, res.GetText())
}

func TestCallSendsRunMetadata(t *testing.T) {
	rec := demo.NewScripted(nil)
	p := newPool(t, &delegates.Config{Delegates: []delegates.Delegate{{Name: "rec", Target: serve(t, rec)}}})
	meta := map[string]string{"tenant": "acme", "lang": "go"}
	res, err := p.Call(testCtx(t), controls.Call{
		Delegate: "rec", Brief: "the brief", Attempt: 3,
		RunID: "run-1", IdempotencyKey: "key-1", Metadata: meta,
	})
	require.NoError(t, err)
	assert.Equal(t, "echo: the brief", res.GetText())
	_, err = p.Call(testCtx(t), controls.Call{Delegate: "rec", Brief: "bare"})
	require.NoError(t, err)

	got := rec.Received()
	require.Len(t, got, 2)
	r := got[0].Request
	assert.Equal(t, "the brief", r.GetBrief())
	assert.Equal(t, "run-1", r.GetRunId())
	assert.Equal(t, int32(3), r.GetAttempt())
	assert.Equal(t, "key-1", r.GetIdempotencyKey())
	assert.Equal(t, meta, r.GetMetadata())
	h := got[0].Header
	assert.Equal(t, []string{"3"}, h.Get(delegates.HeaderAttempt))
	assert.Equal(t, []string{"key-1"}, h.Get(delegates.HeaderIdempotencyKey))
	assert.Equal(t, []string{"run-1"}, h.Get(delegates.HeaderRunID))

	// Without the run's fields nor attempt number nothing extra is sent.
	bare := got[1]
	assert.Empty(t, bare.Request.GetRunId())
	assert.Empty(t, bare.Request.GetIdempotencyKey())
	assert.Empty(t, bare.Request.GetMetadata())
	assert.Empty(t, bare.Header.Get(delegates.HeaderAttempt))
	assert.Empty(t, bare.Header.Get(delegates.HeaderIdempotencyKey))
	assert.Empty(t, bare.Header.Get(delegates.HeaderRunID))
}

func TestCallAttemptTimeout(t *testing.T) {
	slow := &demo.Slow{Delay: time.Minute}
	quick := &demo.Slow{Delay: 300 * time.Millisecond}
	p := newPool(t, &delegates.Config{Delegates: []delegates.Delegate{
		{Name: "slow", Target: serve(t, slow), Timeout: delegates.Duration(time.Minute)},
		{Name: "short", Target: serve(t, slow), Timeout: delegates.Duration(100 * time.Millisecond)},
		{Name: "quick", Target: serve(t, quick), Timeout: delegates.Duration(50 * time.Millisecond)},
	}})
	ctx := testCtx(t)

	// Per-call attempt timeout overrides the configured minute.
	start := time.Now()
	_, err := p.Call(ctx, controls.Call{Delegate: "slow", Brief: "b", Attempt: 1, AttemptTimeout: 100 * time.Millisecond})
	assert.Equal(t, &controls.CallError{
		Code: codes.DeadlineExceeded, Message: "attempt timed out after 100ms",
	}, callError(t, err))
	assert.Less(t, time.Since(start), 5*time.Second)
	require.NoError(t, ctx.Err(), "the run goes on")
	// The deadline reached the delegate too.
	require.Eventually(t, func() bool { return slow.Cancelled() == 1 }, 5*time.Second, 10*time.Millisecond)

	// The configured timeout applies when the call sets none.
	_, err = p.Call(ctx, controls.Call{Delegate: "short", Brief: "b", Attempt: 2})
	assert.Equal(t, codes.DeadlineExceeded, callError(t, err).Code)

	// A longer per-call timeout lets a delegate finish that its own
	// configured timeout would cut off.
	_, err = p.Call(ctx, controls.Call{Delegate: "quick", Brief: "b", Attempt: 1})
	assert.Equal(t, codes.DeadlineExceeded, callError(t, err).Code)
	res, err := p.Call(ctx, controls.Call{Delegate: "quick", Brief: "b", Attempt: 2, AttemptTimeout: 5 * time.Second})
	require.NoError(t, err)
	assert.Equal(t, "slow: b", res.GetText())
}

func TestCallRunCancelled(t *testing.T) {
	slow := &demo.Slow{Delay: time.Minute}
	p := newPool(t, &delegates.Config{Delegates: []delegates.Delegate{{Name: "slow", Target: serve(t, slow)}}})

	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := p.Call(ctx, controls.Call{Delegate: "slow", Brief: "b", Attempt: 1})
		errc <- err
	}()
	require.Eventually(t, func() bool { return slow.Started() == 1 }, 5*time.Second, 5*time.Millisecond)
	cancel()
	select {
	case err := <-errc:
		require.ErrorIs(t, err, context.Canceled)
		var ce *controls.CallError
		assert.False(t, errors.As(err, &ce), "a run cancel is the context's error, not a CallError")
	case <-time.After(5 * time.Second):
		t.Fatal("Call did not return after cancel")
	}
	require.Eventually(t, func() bool { return slow.Cancelled() == 1 }, 5*time.Second, 5*time.Millisecond,
		"the cancellation must reach the delegate")

	// A run deadline shorter than the attempt timeout is the run's, too.
	dctx, dcancel := context.WithTimeout(testCtx(t), 100*time.Millisecond)
	defer dcancel()
	_, err := p.Call(dctx, controls.Call{Delegate: "slow", Brief: "b", Attempt: 2})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var ce *controls.CallError
	assert.False(t, errors.As(err, &ce))

	// An already-ended run sends nothing.
	_, err = p.Call(ctx, controls.Call{Delegate: "slow", Brief: "b", Attempt: 3})
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, 2, slow.Started())
}

func TestServing(t *testing.T) {
	// A server with no health service answers UNIMPLEMENTED.
	bare := grpc.NewServer()
	stubbornv1.RegisterDelegateServiceServer(bare, demo.Echo{})
	lis := listen(t)
	go func() { _ = bare.Serve(lis) }()
	t.Cleanup(bare.Stop)

	p := newPool(t, &delegates.Config{Delegates: []delegates.Delegate{
		{Name: "echo", Target: serve(t, demo.Echo{})},
		{Name: "down", Target: serve(t, demo.Down{})},
		{Name: "bare", Target: lis.Addr().String()},
		{Name: "gone", Target: deadPort(t)},
	}})
	ctx := testCtx(t)

	assert.True(t, p.Serving(ctx, "echo"))
	assert.False(t, p.Serving(ctx, "down"))
	assert.False(t, p.Serving(ctx, "down"), "cached")
	assert.True(t, p.Serving(ctx, "bare"), "UNIMPLEMENTED: cannot tell, try it")
	assert.True(t, p.Serving(ctx, "gone"), "error: cannot tell, try it")
	assert.True(t, p.Serving(ctx, "nope"), "unknown name: the call will say NOT_FOUND")

	done, cancel := context.WithCancel(ctx)
	cancel()
	assert.True(t, p.Serving(done, "echo"))

	_, err := p.Call(ctx, controls.Call{Delegate: "down", Brief: "b", Attempt: 1})
	assert.Equal(t, &controls.CallError{Code: codes.Unavailable, Message: "down: not serving"}, callError(t, err))
}

// TestAnswersOverMaxResultBytesAreRefused: an answer over
// limits.max_result_bytes fails its attempt as refused (never retried),
// whether it is under gRPC's receive limit (checked after) or over it
// (gRPC's own RESOURCE_EXHAUSTED, which was taken for a delegate's quota
// and retried, pulling the same answer each time).
func TestAnswersOverMaxResultBytesAreRefused(t *testing.T) {
	p := newPool(t, &delegates.Config{
		Limits:    delegates.Limits{MaxResultBytes: 1000},
		Delegates: []delegates.Delegate{{Name: "echo", Target: serve(t, demo.Echo{})}},
	})
	ctx := testCtx(t)
	res, err := p.Call(ctx, controls.Call{Delegate: "echo", Brief: strings.Repeat("a", 900), Attempt: 1})
	require.NoError(t, err)
	assert.Len(t, res.GetText(), 906)

	for _, n := range []int{2000, 40 << 10} {
		_, err := p.Call(ctx, controls.Call{Delegate: "echo", Brief: strings.Repeat("a", n), Attempt: 1})
		ce := callError(t, err)
		assert.True(t, ce.Refused, "%d bytes: refused", n)
		assert.Equal(t, codes.ResourceExhausted, ce.Code)
		assert.Contains(t, ce.Message, "more than limits.max_result_bytes (1000)")
	}
}

// TestDescribeTellsUnreachableFromServing (issue 30, finding 8): a
// delegate whose health check cannot reach it (a port that refuses) is
// shown UNREACHABLE, not SERVING, and is still called (Serving true); one
// without a health service (UNIMPLEMENTED) stays SERVING; an HTTP kind
// whose health_url does not answer is UNREACHABLE too. A pool that
// replaces another (a reload) keeps what was known of an unchanged
// delegate's health, and forgets a changed one's.
func TestDescribeTellsUnreachableFromServing(t *testing.T) {
	bare := grpc.NewServer()
	stubbornv1.RegisterDelegateServiceServer(bare, demo.Echo{})
	lis := listen(t)
	go func() { _ = bare.Serve(lis) }()
	t.Cleanup(bare.Stop)
	cfg := &delegates.Config{Delegates: []delegates.Delegate{
		{Name: "down", Target: serve(t, demo.Down{})},
		{Name: "bare", Target: lis.Addr().String()},
		{Name: "gone", Target: deadPort(t)},
		{Name: "web", HTTP: &delegates.HTTP{URL: "http://" + deadPort(t), HealthURL: "http://" + deadPort(t) + "/healthz"}},
	}}
	p := newPool(t, cfg)
	ctx := testCtx(t)
	for _, name := range []string{"down", "bare", "gone", "web"} {
		p.Serving(ctx, name)
	}
	assert.True(t, p.Serving(ctx, "gone"), "an unreachable delegate is still called")
	health := func(p *delegates.Pool) map[string]stubbornv1.DelegateHealth {
		ds, _ := p.Describe()
		got := map[string]stubbornv1.DelegateHealth{}
		for _, d := range ds {
			got[d.GetName()] = d.GetHealth()
		}
		return got
	}
	assert.Equal(t, map[string]stubbornv1.DelegateHealth{
		"down": stubbornv1.DelegateHealth_DELEGATE_HEALTH_NOT_SERVING,
		"bare": stubbornv1.DelegateHealth_DELEGATE_HEALTH_SERVING,
		"gone": stubbornv1.DelegateHealth_DELEGATE_HEALTH_UNREACHABLE,
		"web":  stubbornv1.DelegateHealth_DELEGATE_HEALTH_UNREACHABLE,
	}, health(p))

	changed := &delegates.Config{Delegates: append([]delegates.Delegate(nil), cfg.Delegates...)}
	changed.Delegates[1].Idempotent = true // bare changes
	next, err := delegates.NewPoolWith(changed, delegates.PoolOptions{Previous: p})
	require.NoError(t, err)
	t.Cleanup(func() { _ = next.Close() })
	assert.Equal(t, map[string]stubbornv1.DelegateHealth{
		"down": stubbornv1.DelegateHealth_DELEGATE_HEALTH_NOT_SERVING,
		"bare": stubbornv1.DelegateHealth_DELEGATE_HEALTH_UNSPECIFIED,
		"gone": stubbornv1.DelegateHealth_DELEGATE_HEALTH_UNREACHABLE,
		"web":  stubbornv1.DelegateHealth_DELEGATE_HEALTH_UNREACHABLE,
	}, health(next), "a reload keeps what is known of an unchanged delegate")
}
