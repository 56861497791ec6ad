package server_test

import (
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/server"
)

// A caller that starts a run again with its idempotency key (it timed out,
// say) gets the run it started: StartRun its id and state, Run its events
// from seq 1; the same key with another request is ALREADY_EXISTS naming
// that run. On the memory store and on JetStream.
func TestAnIdempotencyKeyNamesOneRun(t *testing.T) {
	for _, js := range []bool{false, true} {
		e := startWith(t, setup{jetstream: js})
		ctx := testCtx(t)
		req := &stubbornv1.StartRunRequest{
			TaskBrief: "charge order 42", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}},
			Options: &stubbornv1.RunOptions{IdempotencyKey: "order-42", Metadata: map[string]string{"attempt": "1"}},
		}
		var firstHeader, againHeader metadata.MD
		first, err := e.client.StartRun(ctx, req, grpc.Header(&firstHeader))
		require.NoError(t, err)
		assert.Empty(t, firstHeader.Get(server.ReplayHeader), "a new run is no replay")
		runToEnd(t, ctx, e.client, first.GetRunId())
		req.Options.Metadata["attempt"] = "2" // metadata is not the request
		again, err := e.client.StartRun(ctx, req, grpc.Header(&againHeader))
		require.NoError(t, err)
		assert.Equal(t, first.GetRunId(), again.GetRunId())
		assert.Equal(t, []string{"true"}, againHeader.Get(server.ReplayHeader), "the caller learns that nothing new started")
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, again.GetState().GetStatus(), "its current state")

		stream, err := e.client.Run(ctx, &stubbornv1.RunRequest{TaskBrief: req.TaskBrief, FallbackChain: req.FallbackChain, Options: req.Options})
		require.NoError(t, err)
		h, err := stream.Header()
		require.NoError(t, err)
		assert.Equal(t, []string{"true"}, h.Get(server.ReplayHeader))
		var seqs []int64
		for {
			m, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
			assert.Equal(t, first.GetRunId(), m.GetEvent().GetRunId())
			seqs = append(seqs, m.GetEvent().GetSeq())
		}
		require.NotEmpty(t, seqs)
		assert.EqualValues(t, 1, seqs[0], "Run streams the existing run from seq 1")

		req.TaskBrief = "charge order 43"
		_, err = e.client.StartRun(ctx, req)
		assert.Equal(t, codes.AlreadyExists, status.Code(err))
		assert.Contains(t, status.Convert(err).Message(), first.GetRunId())
		assert.Contains(t, status.Convert(err).Message(), "options.idempotency_key")

		list, err := e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{})
		require.NoError(t, err)
		assert.Len(t, list.GetRuns(), 1, "one run for the key")
	}
}

// TestConcurrentStartRunsWithAKeyMakeOneRun: 50 identical StartRuns at
// once against two replicas sharing a JetStream store make exactly one
// run, and each gets its id.
func TestConcurrentStartRunsWithAKeyMakeOneRun(t *testing.T) {
	stores := jetStreamStores(t, 2)
	replicas := []*env{startWith(t, setup{store: stores[0]}), startWith(t, setup{store: stores[1]})}
	ctx := testCtx(t)
	req := &stubbornv1.StartRunRequest{
		TaskBrief: "charge order 42", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}},
		Options: &stubbornv1.RunOptions{IdempotencyKey: "order-42"},
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		ids  = map[string]int{}
		errs []error
	)
	for i := range 50 {
		wg.Go(func() {
			res, err := replicas[i%2].client.StartRun(ctx, req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			ids[res.GetRunId()]++
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	require.Len(t, ids, 1, "one run")
	for id, n := range ids {
		assert.Equal(t, 50, n)
		runToEnd(t, ctx, replicas[0].client, id)
	}
	// The listing index is written off the run's path: a loaded machine
	// may list the run a moment after it ended.
	for _, r := range replicas {
		assert.Eventually(t, func() bool {
			list, err := r.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{})
			return err == nil && len(list.GetRuns()) == 1
		}, 10*time.Second, 10*time.Millisecond, "one run in the shared store")
	}
}

// A misspelt delegate is NOT_FOUND with the closest name the caller may
// use; a name close to none gets no guess.
func TestAnUnknownDelegateSuggestsTheClosest(t *testing.T) {
	e := start(t, delegates.Limits{})
	ctx := testCtx(t)
	_, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "b", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo", "ecoh"}}})
	assert.Equal(t, codes.NotFound, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), `fallback_chain.chain[1]: delegate "ecoh" is not in the registry (did you mean "echo"?)`)
	_, err = e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "b", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"zzzzzz"}}})
	assert.Equal(t, codes.NotFound, status.Code(err))
	assert.NotContains(t, status.Convert(err).Message(), "did you mean")
}
