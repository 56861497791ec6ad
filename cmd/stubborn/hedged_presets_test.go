package main

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// TestAHedgedRaceOfPresetsSurvivesSIGKILL (issue 31): a hedged race whose
// candidates are presets is accepted, and survives SIGKILL of its server
// mid-race on the embedded store. Each run races p1 (a retry of a delegate
// that always fails), p2 (a retry of an idempotent delegate that hangs)
// and p3 (a retry of a delegate that is neither idempotent nor read_only,
// and hangs): p1 fails, so p2 starts at once; p3 starts after the delay.
// The server is killed while p2 and p3 hang, and started again. Then no
// step that finished is done again (the failing delegate's two calls), the
// interrupted calls follow the interrupted-attempt rule (p2's delegate is
// called again, as a new attempt; p3's never), no (run, attempt) is called
// twice, p2 wins, and every journal is dense and folds to its final state.
func TestAHedgedRaceOfPresetsSurvivesSIGKILL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const runs = 6

	var released atomic.Bool
	failCalls, hangCalls, unsafeCalls := &calls{}, &calls{}, &calls{}
	hang := func(c *calls) demo.Func { return hangUntil(&released, c) }
	failing := func(_ context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		failCalls.add(req)
		return nil, status.Error(codes.Unavailable, "always down")
	}
	addr, args := serveScripted(t, []scripted{
		{"failing", failing, true}, {"hang", hang(hangCalls), true}, {"unsafe", hang(unsafeCalls), false},
	}, `presets:
  - {name: p1, retry: {target: failing, attempts: 1, base_wait: 10ms, max_wait: 10ms, on_exhausted: fail}}
  - {name: p2, retry: {target: hang, attempts: 1, base_wait: 10ms, max_wait: 10ms, on_exhausted: fail}}
  - {name: p3, retry: {target: unsafe, attempts: 1, base_wait: 10ms, max_wait: 10ms, on_exhausted: fail}}
`, "-durability", "always")

	srv := startServer(t, args...)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	client := stubbornv1.NewControlServiceClient(conn)

	var ids []string
	for range runs {
		res, err := client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "task", Race: &stubbornv1.RaceSpec{
			Candidates: []string{"p1", "p2", "p3"}, HedgeDelay: durationpb.New(100 * time.Millisecond)}})
		require.NoError(t, err, "a hedged race of presets is accepted")
		ids = append(ids, res.GetRunId())
	}
	require.Eventually(t, func() bool {
		return failCalls.total() == 2*runs && hangCalls.total() == runs && unsafeCalls.total() == runs
	}, time.Minute, 20*time.Millisecond, "p1 failed, p2 and p3 hang in every run")
	// The calls are in flight once their attempt_started is written
	// (the journal holds the attempt before the call is sent).
	srv.kill(t)
	released.Store(true)
	srv = startServer(t, args...)
	defer srv.kill(t)

	for _, id := range ids {
		w, err := client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: id})
		require.NoError(t, err)
		var evs []*stubbornv1.RunEvent
		for {
			m, err := w.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err, id)
			evs = append(evs, m.GetEvent())
		}
		for i, ev := range evs {
			require.EqualValues(t, i+1, ev.GetSeq(), "%s: dense, no repeat", id)
		}
		require.NotNil(t, evs[len(evs)-1].GetRunFinished(), id)
		end := evs[len(evs)-1].GetRunFinished().GetState()
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, end.GetStatus(), "%s: %s", id, end.GetStatusReason())
		assert.Equal(t, "p2", end.GetWinner(), id)
		assert.Equal(t, "done", end.GetResult().GetText(), id)
		assert.Equal(t, 2, failCalls.forRun(id), "%s: p1's finished attempts are not called again", id)
		assert.Equal(t, 2, hangCalls.forRun(id), "%s: p2's interrupted attempt is retried once (idempotent), as a new attempt", id)
		assert.Equal(t, 1, unsafeCalls.forRun(id), "%s: p3's interrupted attempt is not retried (not idempotent)", id)
		assert.Equal(t, controls.Fold(evs).GetStatus(), end.GetStatus(), id)
		var resumed bool
		for _, ev := range evs {
			resumed = resumed || ev.GetRunResumed() != nil
		}
		assert.True(t, resumed, "%s was resumed", id)
	}
	for _, c := range []*calls{failCalls, hangCalls, unsafeCalls} {
		c.mu.Lock()
		for k, n := range c.n {
			assert.Equal(t, 1, n, "%s: no (run, attempt) is called twice", k)
		}
		c.mu.Unlock()
	}
}
