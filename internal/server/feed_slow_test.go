package server_test

import (
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/server"
)

// A WatchRuns client that never reads is ended once it falls 1000
// summaries behind (issue 30 item 6): the server lets go of the stream (its
// feed subscription, its goroutine) without the client reading, and when
// the client reads at last it gets what the connection held, then
// RESOURCE_EXHAUSTED "fell 1000 behind; reattach". Before, the stream's
// Send blocked on flow control and it was held open for as long as the
// client stayed.
func TestWatchRunsNeverReadIsEnded(t *testing.T) {
	e := start(t, delegates.Limits{})
	ctx := testCtx(t)
	feed, err := e.client.WatchRuns(ctx, &stubbornv1.WatchRunsRequest{})
	require.NoError(t, err)
	first, err := feed.Recv() // following: then never read
	require.NoError(t, err)
	require.Nil(t, first.GetRun())
	require.Equal(t, 1, server.FeedWatchers(e.st))

	var mu sync.Mutex
	started := 0
	deadline := time.Now().Add(20 * time.Second)
	for server.FeedWatchers(e.st) > 0 {
		require.True(t, time.Now().Before(deadline), "a stream that never reads was still open after %d runs", started)
		if started < 20000 {
			var wg sync.WaitGroup
			sem := make(chan struct{}, 16)
			for range 200 {
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem }()
					_, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "b", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}})
					assert.NoError(t, err)
					mu.Lock()
					started++
					mu.Unlock()
				})
			}
			wg.Wait()
		} else {
			time.Sleep(50 * time.Millisecond)
		}
	}
	t.Logf("ended after %d runs", started)

	n := 0
	for {
		_, err = feed.Recv()
		if err != nil {
			break
		}
		n++
	}
	require.False(t, errors.Is(err, io.EOF), "ended without a status")
	st := status.Convert(err)
	assert.Equal(t, codes.ResourceExhausted, st.Code(), "%v", err)
	assert.Contains(t, st.Message(), "fell 1000 behind; reattach")
	assert.Less(t, n, 3*started, "not every change was queued")
}
