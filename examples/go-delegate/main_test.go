package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/stubbornhq/stubborn/delegatekit"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/server"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestRetryRunOverTheExample serves the example delegate and a Stubborn
// server on loopback and runs a retry over the delegate: the first attempt's
// 429 is retried after the delegate's one-second hint, the second succeeds.
func TestRetryRunOverTheExample(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	delegateCtx, stopDelegate := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- delegatekit.Serve(delegateCtx, lis, execute) }()
	defer func() {
		stopDelegate()
		assert.NoError(t, <-served)
	}()

	client := startStubborn(t, &delegates.Config{Delegates: []delegates.Delegate{{
		Name: "go-delegate", Target: lis.Addr().String(), Idempotent: true, Timeout: delegates.Duration(10 * time.Second),
	}}})
	stream, err := client.Run(ctx, &stubbornv1.RunRequest{
		TaskBrief: "fetch the rainfall report",
		Retry:     &stubbornv1.RetrySpec{Target: "go-delegate"},
	})
	require.NoError(t, err)
	var backoffs []*stubbornv1.BackoffScheduled
	var final *stubbornv1.ControlState
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		if b := resp.GetEvent().GetBackoffScheduled(); b != nil {
			backoffs = append(backoffs, b)
		}
		if f := resp.GetEvent().GetRunFinished(); f != nil {
			final = f.GetState()
		}
	}

	require.NotNil(t, final, "the run finished")
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, final.GetStatus())
	assert.EqualValues(t, 2, final.GetAttempts())
	assert.Equal(t, "done: fetch the rainfall report", final.GetResult().GetText())
	require.Len(t, backoffs, 1)
	assert.True(t, backoffs[0].GetFromHint(), "the wait is the delegate's Retry-After, not the backoff")
	assert.Equal(t, time.Second, backoffs[0].GetWait().AsDuration())
}

// startStubborn serves a Stubborn server (runs in memory) over reg on
// loopback until the test ends, and returns a client of it.
func startStubborn(t *testing.T, reg *delegates.Config) stubbornv1.ControlServiceClient {
	t.Helper()
	st, err := server.New(server.Config{Registry: reg, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = st.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = conn.Close()
		st.Stop(5 * time.Second)
	})
	return stubbornv1.NewControlServiceClient(conn)
}
