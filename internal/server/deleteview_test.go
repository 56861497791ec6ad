package server_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
)

// TestADeletedRunIsGoneFromEveryViewAtOnce, over real gRPC on the
// embedded JetStream store and on the memory store: runs in every state
// (finished, in an attempt, backing off, awaiting a decision, racing a
// decision sent as it is deleted, streaming output) are deleted with
// DeleteRun(cancel), and listed right after each DeleteRun returns and
// for a while after the last: none is in either view of ListRuns, a
// WatchRuns stream opened before tells of each deletion, and sends no
// summary of a run after its deletion. Before, most runs deleted in
// flight came back in the summaries a moment later (their ends indexed
// after the purge), and WatchRuns could not tell of a deletion at all.
func TestADeletedRunIsGoneFromEveryViewAtOnce(t *testing.T) {
	for name, js := range map[string]bool{"jetstream": true, "memory": false} {
		t.Run(name, func(t *testing.T) { deletedRunsAreGone(t, js) })
	}
}

func deletedRunsAreGone(t *testing.T, js bool) {
	release := make(chan struct{})
	defer close(release)
	sse := gatedSSE(t, 4, release)
	e := startWith(t, setup{
		jetstream: js,
		entries: []delegates.Delegate{{
			Name: "model", OpenAI: &delegates.OpenAI{ModelAPI: delegates.ModelAPI{BaseURL: sse.URL, Model: "m"}},
			Timeout: delegates.Duration(time.Minute),
		}},
	})
	ctx := testCtx(t)

	wctx, stopWatching := context.WithCancel(ctx)
	defer stopWatching()
	feed, err := e.client.WatchRuns(wctx, &stubbornv1.WatchRunsRequest{})
	require.NoError(t, err)
	first, err := feed.Recv()
	require.NoError(t, err)
	require.Nil(t, first.GetRun(), "the stream follows")
	var (
		mu       sync.Mutex
		followed []*stubbornv1.WatchRunsResponse
	)
	received := make(chan struct{})
	go func() {
		defer close(received)
		for {
			m, err := feed.Recv()
			if err != nil {
				return
			}
			mu.Lock()
			followed = append(followed, m)
			mu.Unlock()
		}
	}()
	defer func() { stopWatching(); <-received }()

	start := func(req *stubbornv1.StartRunRequest) string {
		t.Helper()
		res, err := e.client.StartRun(ctx, req)
		require.NoError(t, err)
		return res.GetRunId()
	}
	one, three := int32(1), int32(3)
	zero := int32(0)
	hour := durationpb.New(time.Hour)
	ids := map[string]string{
		"finished": start(&stubbornv1.StartRunRequest{TaskBrief: "finished", Retry: &stubbornv1.RetrySpec{Target: "echo"}}),
		"running":  start(&stubbornv1.StartRunRequest{TaskBrief: "running", Retry: &stubbornv1.RetrySpec{Target: "gate", Attempts: &one}}),
		"backing off": start(&stubbornv1.StartRunRequest{TaskBrief: "backing off", Retry: &stubbornv1.RetrySpec{
			Target: "down", Attempts: &three, BaseWait: hour, MaxWait: hour,
		}}),
		"awaiting": start(&stubbornv1.StartRunRequest{TaskBrief: "awaiting", Retry: &stubbornv1.RetrySpec{
			Target: "down", Attempts: &zero, OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_ASK,
		}}),
		"racing a decision": start(&stubbornv1.StartRunRequest{TaskBrief: "racing", Retry: &stubbornv1.RetrySpec{
			Target: "down", Attempts: &zero, OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_ASK,
		}}),
		"streaming": start(&stubbornv1.StartRunRequest{TaskBrief: "streaming", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"model"}}}),
	}
	want := map[string]stubbornv1.RunStatus{
		"finished":          stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED,
		"running":           stubbornv1.RunStatus_RUN_STATUS_RUNNING,
		"backing off":       stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF,
		"awaiting":          stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION,
		"racing a decision": stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION,
		"streaming":         stubbornv1.RunStatus_RUN_STATUS_RUNNING,
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for what, id := range ids {
			res, err := e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
			if assert.NoError(c, err) {
				assert.Equal(c, want[what], res.GetState().GetStatus(), what)
			}
		}
		res, err := e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: ids["streaming"]})
		if assert.NoError(c, err) {
			assert.NotEmpty(c, res.GetState().GetAttemptLog(), "streaming")
		}
	}, 10*time.Second, 5*time.Millisecond, "runs in every state")
	// The streaming run is mid-answer: its first chunks are in its journal.
	require.Eventually(t, func() bool {
		w, err := e.client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: ids["streaming"]})
		if err != nil {
			return false
		}
		for {
			m, err := w.Recv()
			if err != nil {
				return false
			}
			if m.GetEvent().GetAttemptOutput() != nil {
				return true
			}
		}
	}, 10*time.Second, 10*time.Millisecond, "the streaming run streams")
	// Every run is listed before it is deleted (the index has them all).
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		res, err := e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{View: stubbornv1.RunView_RUN_VIEW_SUMMARY, PageSize: 100})
		if assert.NoError(c, err) {
			listed := map[string]bool{}
			for _, s := range res.GetSummaries() {
				listed[s.GetRunId()] = true
			}
			for what, id := range ids {
				assert.True(c, listed[id], what)
			}
		}
	}, 10*time.Second, 5*time.Millisecond)

	notListed := func(c assert.TestingT, what, id, when string) {
		sums, err := e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{View: stubbornv1.RunView_RUN_VIEW_SUMMARY, PageSize: 100})
		if assert.NoError(c, err) {
			for _, s := range sums.GetSummaries() {
				assert.NotEqual(c, id, s.GetRunId(), "%s: in the summaries %s", what, when)
			}
		}
		full, err := e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{View: stubbornv1.RunView_RUN_VIEW_FULL, PageSize: 100})
		if assert.NoError(c, err) {
			for _, st := range full.GetRuns() {
				assert.NotEqual(c, id, st.GetRunId(), "%s: in the full listing %s", what, when)
			}
		}
		_, err = e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
		assert.Equal(c, codes.NotFound, status.Code(err), "%s: GetRun %s", what, when)
	}
	for what, id := range ids {
		if what == "racing a decision" {
			decided := make(chan struct{})
			go func() {
				defer close(decided)
				_, _ = e.client.DecideRun(ctx, &stubbornv1.DecideRunRequest{RunId: id, Decision: stubbornv1.Decision_DECISION_RETRY})
			}()
			_, err := e.client.DeleteRun(ctx, &stubbornv1.DeleteRunRequest{RunId: id, Cancel: true})
			require.NoError(t, err, what)
			<-decided
		} else {
			_, err := e.client.DeleteRun(ctx, &stubbornv1.DeleteRunRequest{RunId: id, Cancel: true})
			require.NoError(t, err, what)
		}
		notListed(t, what, id, "right after its DeleteRun")
	}
	// A summary written late comes within a few of the indexer's delays.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		for what, id := range ids {
			notListed(t, what, id, "after its DeleteRun")
		}
		if t.Failed() {
			return
		}
	}

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		mu.Lock()
		defer mu.Unlock()
		for what, id := range ids {
			told := false
			for _, m := range followed {
				told = told || m.GetDeletedRunId() == id
			}
			assert.True(c, told, "WatchRuns tells of %s's deletion", what)
		}
	}, 10*time.Second, 5*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for what, id := range ids {
		deleted := false
		for _, m := range followed {
			assert.False(t, m.GetRun() != nil && m.GetDeletedRunId() != "", "a message is a run or a deletion, not both")
			switch {
			case m.GetDeletedRunId() == id:
				deleted = true
			case m.GetRun().GetRunId() == id:
				assert.False(t, deleted, "%s: a summary (%s) after its deletion", what, m.GetRun().GetStatus())
			}
		}
	}
}
