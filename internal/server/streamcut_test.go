package server_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
)

// A model whose stream is cut in the middle of a line is retried where it
// may be: a retry preset with 2 retries over a read_only model that cuts
// its first two answers makes 3 calls and the third answers the app.
func TestAModelStreamCutMidLineIsRetriedThroughAPreset(t *testing.T) {
	var calls atomic.Int32
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Stream bool `json:"stream"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		n := calls.Add(1)
		if !req.Stream {
			http.Error(w, `{"error":{"message":"the test expects a streamed call"}}`, http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"The answer \"}}]}\n\n")
		if n < 3 {
			_, _ = io.WriteString(w, `data: {"model":"m","choices":[{"index":0,"del`) // and the connection closes
			return
		}
		_, _ = fmt.Fprintf(w, "data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"is 42.\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(model.Close)
	tiny := durationpb.New(time.Millisecond)
	e, base := frontDoorEnv(t, setup{
		entries: []delegates.Delegate{{Name: "cut", OpenAI: &delegates.OpenAI{ModelAPI: delegates.ModelAPI{BaseURL: model.URL, Model: "m"}}, ReadOnly: true}},
		presets: []delegates.Preset{{Name: "patient", Spec: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
			Target: "cut", Attempts: new(int32(2)), BaseWait: tiny, MaxWait: tiny}}}}},
	})
	resp := postChat(t, base, "", `{"model": "patient", "messages": [{"role": "user", "content": "What is it?"}]}`)
	body, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	var c struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	require.NoError(t, json.Unmarshal(body, &c))
	require.Len(t, c.Choices, 1)
	assert.Equal(t, "The answer is 42.", c.Choices[0].Message.Content)
	assert.EqualValues(t, 3, calls.Load(), "two cut answers retried, the third taken")

	got, err := e.client.GetRun(testCtx(t), &stubbornv1.GetRunRequest{RunId: resp.Header.Get("Stubborn-Run-Id")})
	require.NoError(t, err)
	st := got.GetState()
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus())
	require.Len(t, st.GetFailureHistory(), 2)
	for _, f := range st.GetFailureHistory() {
		assert.True(t, f.GetTransient(), f.GetReason())
		assert.Contains(t, f.GetReason(), "cut short")
	}
}
