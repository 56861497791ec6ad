package delegatekit_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/stubbornhq/stubborn/delegatekit"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

func echo(_ context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.Result, error) {
	return &stubbornv1.Result{Text: "echo: " + req.GetBrief()}, nil
}

// TestShutdown: health goes NOT_SERVING and its watches end, while the call
// in flight finishes before Serve returns.
func TestShutdown(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	s := serve(t, func(context.Context, *stubbornv1.ExecuteRequest) (*stubbornv1.Result, error) {
		close(started)
		<-release
		return &stubbornv1.Result{Text: "finished"}, nil
	})
	ctx := testCtx(t)
	health := healthpb.NewHealthClient(s.conn)
	for _, svc := range []string{"", "stubborn.v1.DelegateService"} {
		h, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		require.NoError(t, err)
		assert.Equal(t, healthpb.HealthCheckResponse_SERVING, h.GetStatus(), svc)
	}
	watch, err := health.Watch(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	h, err := watch.Recv()
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, h.GetStatus())

	type answer struct {
		resp *stubbornv1.ExecuteResponse
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := s.delegate.Execute(ctx, req("long"))
		answered <- answer{resp, err}
	}()
	<-started
	stopped := make(chan error, 1)
	go func() { stopped <- s.shutdown() }()

	h, err = watch.Recv()
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, h.GetStatus())
	for err == nil { // NOT_SERVING may come twice, then the stream ends
		h, err = watch.Recv()
		if err == nil {
			assert.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, h.GetStatus())
		}
	}
	assert.Equal(t, codes.Unavailable, status.Code(err), err)
	select {
	case err := <-stopped:
		t.Fatalf("Serve returned %v with a call in flight", err)
	case <-time.After(50 * time.Millisecond):
	}

	close(release)
	a := <-answered
	require.NoError(t, a.err)
	assert.Equal(t, "finished", a.resp.GetResult().GetText())
	require.NoError(t, <-stopped)
}

// TestGraceBound: a call that outlasts the grace is cut off (its context
// ends) and Serve returns.
func TestGraceBound(t *testing.T) {
	const grace = 200 * time.Millisecond
	started := make(chan struct{})
	var sawCancel atomic.Bool
	s := serve(t, func(ctx context.Context, _ *stubbornv1.ExecuteRequest) (*stubbornv1.Result, error) {
		close(started)
		<-ctx.Done()
		sawCancel.Store(true)
		return nil, ctx.Err()
	}, delegatekit.WithGrace(grace))
	answered := make(chan error, 1)
	go func() {
		_, err := s.delegate.Execute(testCtx(t), req("forever"))
		answered <- err
	}()
	<-started
	begin := time.Now()
	require.NoError(t, s.shutdown())
	took := time.Since(begin)
	assert.GreaterOrEqual(t, took, grace)
	assert.Less(t, took, 5*time.Second)
	assert.Error(t, <-answered)
	assert.Eventually(t, sawCancel.Load, 5*time.Second, 5*time.Millisecond)
}

func TestSetServing(t *testing.T) {
	srv := delegatekit.NewServer(echo)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(testCtx(t))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	defer func() {
		cancel()
		assert.NoError(t, <-served)
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	check := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		h, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		require.NoError(t, err)
		return h.GetStatus()
	}
	srv.SetServing(false)
	assert.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, check(""))
	assert.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, check("stubborn.v1.DelegateService"))
	srv.SetServing(true)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, check(""))
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, check("stubborn.v1.DelegateService"))
}

func TestReflection(t *testing.T) {
	list := func(t *testing.T, conn *grpc.ClientConn) ([]string, error) {
		stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(testCtx(t))
		require.NoError(t, err)
		defer func() { _ = stream.CloseSend() }()
		// Send reports io.EOF when the server has ended the stream already
		// (no reflection: UNIMPLEMENTED); Recv tells why.
		_ = stream.Send(&reflectionpb.ServerReflectionRequest{
			MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
		})
		resp, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		var names []string
		for _, s := range resp.GetListServicesResponse().GetService() {
			names = append(names, s.GetName())
		}
		return names, nil
	}
	names, err := list(t, serve(t, echo).conn)
	require.NoError(t, err)
	assert.Subset(t, names, []string{"stubborn.v1.DelegateService", "grpc.health.v1.Health"})

	_, err = list(t, serve(t, echo, delegatekit.WithoutReflection()).conn)
	assert.Equal(t, codes.Unimplemented, status.Code(err))
}

func TestWithServerOptions(t *testing.T) {
	var seen atomic.Int32
	count := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		seen.Add(1)
		return h(ctx, req)
	}
	s := serve(t, echo, delegatekit.WithServerOptions(grpc.UnaryInterceptor(count)))
	resp, err := s.delegate.Execute(testCtx(t), req("hi"))
	require.NoError(t, err)
	assert.Equal(t, "echo: hi", resp.GetResult().GetText())
	assert.Equal(t, int32(1), seen.Load())
}

// TestServeEnded: Serve under a context already ended returns nil at once.
func TestServeEnded(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(testCtx(t))
	cancel()
	assert.NoError(t, delegatekit.Serve(ctx, lis, echo))
}

// TestListenAndServe: an address taken is an error of ListenAndServe.
func TestListenAndServe(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	err = delegatekit.ListenAndServe(testCtx(t), taken.Addr().String(), echo)
	var opErr *net.OpError
	assert.ErrorAs(t, err, &opErr)
}
