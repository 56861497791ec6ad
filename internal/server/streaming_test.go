package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// secondAnswer is what the OpenAI-shaped fake streams, a word a chunk.
var secondAnswer = strings.SplitAfter("The second model answers in full, word by word, to the very end.", " ")

// gatedSSE is a Chat Completions endpoint that streams secondAnswer: the
// first held chunks, then nothing until release is closed, then the rest.
func gatedSSE(t *testing.T, held int, release <-chan struct{}) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i, word := range secondAnswer {
			if i == held {
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
			}
			if i > held {
				time.Sleep(5 * time.Millisecond) // a model's pace: several events
			}
			_, _ = fmt.Fprintf(w, "data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", word)
			w.(http.Flusher).Flush()
		}
		_, _ = io.WriteString(w, "data: {\"model\":\"m\",\"choices\":[],\"usage\":{\"total_tokens\":13}}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv
}

// outputText joins the text of attempt n's attempt_output events of evs,
// checking each follows the one before with no gap and no repeat from
// offset from.
func outputText(t *testing.T, evs []*stubbornv1.RunEvent, n int32, from int64) string {
	t.Helper()
	var b strings.Builder
	for _, ev := range evs {
		o := ev.GetAttemptOutput()
		if o == nil || o.GetAttempt() != n {
			continue
		}
		require.Equal(t, from+int64(b.Len()), o.GetOffset(), "seq %d: attempt %d's text follows on", ev.GetSeq(), n)
		b.WriteString(o.GetText())
	}
	return b.String()
}

// TestAChainFailsOverMidAnswerAndAWatcherReattachesMidStream is issue
// 33's acceptance: a fallback chain over a streaming model that stalls
// after 3 chunks and an OpenAI-shaped one (SSE, a local fake) that
// answers, on the embedded JetStream store, over real gRPC. One Run
// stream shows the first model's chunks, its stall as a transient failure
// naming the timeout, its output discarded, and the second model's chunks
// and result; a WatchRun that reattaches in the middle of the second
// answer gets every later delta exactly once.
func TestAChainFailsOverMidAnswerAndAWatcherReattachesMidStream(t *testing.T) {
	release := make(chan struct{})
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	const held = 4
	sse := gatedSSE(t, held, release)
	stalls := &demo.Storyteller{Story: "Once upon a time, in a model that stalls", Pace: time.Millisecond, StallFirst: 1 << 30, StallAfter: 3}
	e := startWith(t, setup{
		jetstream: true,
		extra:     map[string]stubbornv1.DelegateServiceServer{"model-a": stalls},
		entries: []delegates.Delegate{{
			Name: "model-b", OpenAI: &delegates.OpenAI{ModelAPI: delegates.ModelAPI{BaseURL: sse.URL, Model: "m"}},
			Timeout: delegates.Duration(time.Minute),
		}},
		configure: func(cfg *delegates.Config) {
			for i := range cfg.Delegates {
				if cfg.Delegates[i].Name == "model-a" {
					cfg.Delegates[i].IdleTimeout = delegates.Duration(200 * time.Millisecond)
				}
			}
		},
	})
	ctx := testCtx(t)
	streamCtx, dropStream := context.WithCancel(ctx)
	defer dropStream()
	stream, err := e.client.Run(streamCtx, &stubbornv1.RunRequest{
		TaskBrief:     "tell me",
		FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"model-a", "model-b"}},
	})
	require.NoError(t, err)

	// Read until the second model's held chunks are all in.
	heldText := strings.Join(secondAnswer[:held], "")
	var seen []*stubbornv1.RunEvent
	for outputText(t, seen, 2, 0) != heldText {
		m, err := stream.Recv()
		require.NoError(t, err, "the run stream ended before the second answer's first chunks")
		seen = append(seen, m.GetEvent())
	}
	k := seen[len(seen)-1].GetSeq()
	runID := seen[0].GetRunId()
	dropStream() // the client goes away mid-answer; the run goes on

	w, err := e.client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: runID, AfterSeq: k})
	require.NoError(t, err)
	close(release)
	released = true
	rest := collect(t, w)
	assertDense(t, rest, k+1)
	assert.Equal(t, strings.Join(secondAnswer[held:], ""), outputText(t, rest, 2, int64(len(heldText))),
		"every later delta exactly once, from where the watcher left")
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, lastState(t, rest).GetStatus())

	all, err := e.client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: runID})
	require.NoError(t, err)
	full := collect(t, all)
	require.Len(t, full, len(seen)+len(rest))
	for i, ev := range append(seen, rest...) {
		assert.True(t, proto.Equal(full[i], ev), "event %d differs between the live streams and the journal", i+1)
	}
	assertDense(t, full, 1)

	// The first model: its chunks, its stall, its output discarded.
	assert.Equal(t, "Once upon a ", outputText(t, full, 1, 0))
	var first, second *stubbornv1.AttemptFinished
	var failure *stubbornv1.FailureAnalyzed
	for _, ev := range full {
		if f := ev.GetAttemptFinished(); f != nil && f.GetAttempt().GetNumber() == 1 {
			first = f
		}
		if f := ev.GetAttemptFinished(); f != nil && f.GetAttempt().GetNumber() == 2 {
			second = f
		}
		if f := ev.GetFailureAnalyzed(); f != nil {
			failure = f
		}
	}
	require.NotNil(t, first)
	assert.Equal(t, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_ERROR, first.GetAttempt().GetOutcome())
	assert.Equal(t, `stalled: no output for 200ms after 3 chunks (idle_timeout); the output began "Once upon a "`, first.GetAttempt().GetError().GetMessage())
	assert.True(t, first.GetOutputDiscarded())
	assert.EqualValues(t, len("Once upon a "), first.GetOutputBytes())
	require.NotNil(t, failure)
	assert.True(t, failure.GetWillRetry(), "the chain moves on")

	// The second model: its chunks, then its result, accepted.
	answer := strings.Join(secondAnswer, "")
	assert.Equal(t, answer, outputText(t, full, 2, 0))
	require.NotNil(t, second)
	assert.Equal(t, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED, second.GetAttempt().GetOutcome())
	assert.False(t, second.GetOutputDiscarded())
	assert.Equal(t, answer, second.GetAttempt().GetResult().GetText())
	final := lastState(t, full)
	assert.Equal(t, answer, final.GetResult().GetText())
	assert.Equal(t, "model-b", final.GetWinner())
	assert.True(t, proto.Equal(final, controls.Fold(full)), "the stream, output included, folds to the final state")

	// Coalesced: fewer events than chunks, the first chunk on its own.
	outputs := 0
	for _, ev := range full {
		if o := ev.GetAttemptOutput(); o != nil && o.GetAttempt() == 2 {
			outputs++
		}
	}
	assert.LessOrEqual(t, outputs, len(secondAnswer))
}
