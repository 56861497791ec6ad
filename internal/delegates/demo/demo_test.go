package demo_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func req(brief string) *stubbornv1.ExecuteRequest {
	return &stubbornv1.ExecuteRequest{Brief: brief}
}

func TestEcho(t *testing.T) {
	resp, err := demo.Echo{}.Execute(testCtx(t), req("hi"))
	require.NoError(t, err)
	assert.Equal(t, "echo: hi", resp.GetResult().GetText())
}

func TestFlakyConcurrent(t *testing.T) {
	f := &demo.Flaky{FailFirst: 5}
	ctx := testCtx(t)
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed []string
	)
	for range 20 {
		wg.Go(func() {
			_, err := f.Execute(ctx, req("b"))
			if err != nil {
				assert.Equal(t, codes.Unavailable, status.Code(err))
				mu.Lock()
				failed = append(failed, status.Convert(err).Message())
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	assert.Equal(t, 20, f.Calls())
	assert.ElementsMatch(t, []string{
		"flaky: failing call 1 of 5", "flaky: failing call 2 of 5", "flaky: failing call 3 of 5",
		"flaky: failing call 4 of 5", "flaky: failing call 5 of 5",
	}, failed)

	perm := &demo.Flaky{FailFirst: 1, Code: codes.PermissionDenied}
	_, err := perm.Execute(ctx, req("b"))
	assert.Equal(t, codes.PermissionDenied, status.Code(err))
	resp, err := perm.Execute(ctx, req("b"))
	require.NoError(t, err)
	assert.Equal(t, "echo: b", resp.GetResult().GetText())
}

func TestSlow(t *testing.T) {
	s := &demo.Slow{Delay: 10 * time.Millisecond}
	resp, err := s.Execute(testCtx(t), req("b"))
	require.NoError(t, err)
	assert.Equal(t, "slow: b", resp.GetResult().GetText())
	assert.Equal(t, 0, s.Cancelled())

	s = &demo.Slow{Delay: time.Minute}
	ctx, cancel := context.WithTimeout(testCtx(t), 20*time.Millisecond)
	defer cancel()
	_, err = s.Execute(ctx, req("b"))
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
	assert.Equal(t, 1, s.Started())
	assert.Equal(t, 1, s.Cancelled())
}

func TestScriptedRecords(t *testing.T) {
	s := demo.NewScripted(nil)
	ctx := metadata.NewIncomingContext(testCtx(t), metadata.Pairs("k", "v"))
	resp, err := s.Execute(ctx, req("one"))
	require.NoError(t, err)
	assert.Equal(t, "echo: one", resp.GetResult().GetText())

	boom := demo.NewScripted(func(context.Context, *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		return nil, status.Error(codes.Internal, "boom")
	})
	_, err = boom.Execute(testCtx(t), req("two"))
	assert.Equal(t, codes.Internal, status.Code(err))

	got := s.Received()
	require.Len(t, got, 1)
	assert.Equal(t, "one", got[0].Request.GetBrief())
	assert.Equal(t, []string{"v"}, got[0].Header.Get("k"))
	assert.Len(t, boom.Received(), 1)
}

func TestServeHealth(t *testing.T) {
	for _, tt := range []struct {
		name string
		svc  stubbornv1.DelegateServiceServer
		want healthpb.HealthCheckResponse_ServingStatus
		err  codes.Code
	}{
		{"echo", demo.Echo{}, healthpb.HealthCheckResponse_SERVING, codes.OK},
		{"down", demo.Down{}, healthpb.HealthCheckResponse_NOT_SERVING, codes.Unavailable},
	} {
		t.Run(tt.name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			s := demo.Serve(lis, tt.svc)
			defer s.Stop()
			conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			require.NoError(t, err)
			defer conn.Close()
			ctx := testCtx(t)

			h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
			require.NoError(t, err)
			assert.Equal(t, tt.want, h.GetStatus())
			_, err = stubbornv1.NewDelegateServiceClient(conn).Execute(ctx, req("b"))
			assert.Equal(t, tt.err, status.Code(err))
		})
	}
}

// TestServeOnDelegatekit: Serve is built on delegatekit, so a panic in a
// delegate is INTERNAL, not a dead server, and reflection is served.
func TestServeOnDelegatekit(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := demo.Serve(lis, demo.NewScripted(func(_ context.Context, r *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		if r.GetBrief() == "panic" {
			panic("demo panic")
		}
		return nil, nil
	}))
	defer s.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	client := stubbornv1.NewDelegateServiceClient(conn)
	ctx := testCtx(t)

	_, err = client.Execute(ctx, req("panic"))
	assert.Equal(t, codes.Internal, status.Code(err))
	resp, err := client.Execute(ctx, req("nil"))
	require.NoError(t, err)
	assert.NotNil(t, resp.GetResult(), "a nil response is an empty result")
	assert.Contains(t, s.GetServiceInfo(), "grpc.reflection.v1.ServerReflection")
}

// TestNewServerShutsDown: a NewServer's Serve ends when its context does.
func TestNewServerShutsDown(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(testCtx(t))
	served := make(chan error, 1)
	go func() { served <- demo.NewServer(demo.Echo{}).Serve(ctx, lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	resp, err := stubbornv1.NewDelegateServiceClient(conn).Execute(testCtx(t), req("b"))
	require.NoError(t, err)
	assert.Equal(t, "echo: b", resp.GetResult().GetText())
	cancel()
	require.NoError(t, <-served)
}
