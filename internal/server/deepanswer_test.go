package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
	"github.com/stubbornhq/stubborn/internal/runs/jsstore"
)

// nestedJSON is {"a":{"a":…1…}} n objects deep.
func nestedJSON(n int) string { return strings.Repeat(`{"a":`, n) + "1" + strings.Repeat("}", n) }

// deepModel is a Chat Completions endpoint whose answers are fine but for
// their usage, nested depth objects deep.
func deepModel(t *testing.T, depth int) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"model":"fake","choices":[{"message":{"role":"assistant","content":"the answer"},"finish_reason":"stop"}],"usage":`+nestedJSON(depth)+`}`)
	}))
	t.Cleanup(s.Close)
	return s
}

// TestDeepDelegateAnswersKeepEveryListingWorking (issue 30 finding 1): an
// http delegate answering JSON 3,400 objects deep (17 KB, inside every
// size limit), an openai one whose usage is as deep, and a gRPC delegate
// whose Result.data is nearly as deep as gRPC will decode. Each run
// succeeds with its text whole and its data bounded to MaxDataDepth, the
// deeper part kept as JSON text. Then, for each of two tenants, ListRuns
// in both views lists every run, on the server that drove them and on
// one that starts on the store afterwards (its index reconciled from the
// states); GetRun answers each run; DeleteRun removes it. Before, the
// full view was INTERNAL for everyone ("proto: exceeded maximum recursion
// depth"), and so were GetRun and DeleteRun of the run, and the restarted
// server's index.
func TestDeepDelegateAnswersKeepEveryListingWorking(t *testing.T) {
	const depth = 3400
	body := nestedJSON(depth)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(api.Close)
	model := deepModel(t, depth)
	grpcData := &structpb.Value{}
	require.NoError(t, protojson.Unmarshal([]byte(nestedJSON(3000)), grpcData)) // ~9,000 messages deep: gRPC still decodes it
	deepGRPC := demo.NewScripted(func(context.Context, *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		return &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{Text: "from grpc", Data: grpcData}}, nil
	})

	ns, err := jsstore.StartEmbedded(jsstore.EmbeddedConfig{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(ns.Close)
	newStore := func() *jsstore.JetStream {
		nc, err := nats.Connect("", nats.InProcessServer(ns.Server))
		require.NoError(t, err)
		store, err := jsstore.NewJetStream(testCtx(t), nc, jsstore.JetStreamConfig{})
		require.NoError(t, err)
		t.Cleanup(func() { _ = store.Close() })
		return store
	}
	su := setup{
		tenants: twoTenants(delegates.Limits{}, delegates.Limits{}),
		extra:   map[string]stubbornv1.DelegateServiceServer{"deepgrpc": deepGRPC},
		entries: []delegates.Delegate{
			{Name: "deephttp", HTTP: &delegates.HTTP{URL: api.URL}},
			{Name: "deepmodel", OpenAI: &delegates.OpenAI{ModelAPI: delegates.ModelAPI{BaseURL: model.URL + "/v1", Model: "m"}}},
		},
		store: newStore(),
	}
	e := startWith(t, su)
	ctx := testCtx(t)
	ctxA, ctxB := as(ctx, tokenA), as(ctx, tokenB)

	run := func(ctx context.Context, delegate string) *stubbornv1.ControlState {
		stream, err := e.client.Run(ctx, &stubbornv1.RunRequest{TaskBrief: "go", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{delegate}}})
		require.NoError(t, err)
		st := lastState(t, collect(t, stream))
		require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus(), delegate)
		assert.LessOrEqual(t, controls.DataDepth(st.GetResult().GetData()), controls.MaxDataDepth, delegate)
		return st
	}
	deepHTTP, deepModelRun, deepGRPCRun := run(ctxA, "deephttp"), run(ctxA, "deepmodel"), run(ctxA, "deepgrpc")
	plainA, plainB := run(ctxA, "echo"), run(ctxB, "echo")

	// The answers are whole: the text as it came, the data's deep part as
	// its JSON.
	assert.Equal(t, body, deepHTTP.GetResult().GetText())
	assert.Equal(t, "from grpc", deepGRPCRun.GetResult().GetText())
	m := deepModelRun.GetResult()
	assert.Equal(t, "the answer", m.GetText())
	fields := m.GetData().GetStructValue().GetFields()
	assert.Equal(t, "stop", fields["finish_reason"].GetStringValue(), "the shallow fields stay where they were")
	v := fields["usage"]
	for range controls.MaxDataDepth - 1 {
		v = v.GetStructValue().GetFields()["a"]
	}
	var rest any
	require.NoError(t, json.Unmarshal([]byte(v.GetStringValue()), &rest), "past the bound, the usage's JSON text")

	byTenant := map[string]struct {
		ctx  context.Context
		want []string
	}{
		"a": {ctxA, []string{deepHTTP.GetRunId(), deepModelRun.GetRunId(), deepGRPCRun.GetRunId(), plainA.GetRunId()}},
		"b": {ctxB, []string{plainB.GetRunId()}},
	}
	listsEveryRun := func(t *testing.T, client stubbornv1.ControlServiceClient) {
		t.Helper()
		for name, tc := range byTenant {
			full, err := client.ListRuns(tc.ctx, &stubbornv1.ListRunsRequest{})
			require.NoError(t, err, "tenant %s, full view", name)
			var ids []string
			for _, st := range full.GetRuns() {
				ids = append(ids, st.GetRunId())
			}
			assert.ElementsMatch(t, tc.want, ids, "tenant %s, full view", name)
			require.EventuallyWithT(t, func(c *assert.CollectT) {
				sums, err := client.ListRuns(tc.ctx, &stubbornv1.ListRunsRequest{View: stubbornv1.RunView_RUN_VIEW_SUMMARY})
				if !assert.NoError(c, err, "tenant %s, summary view", name) {
					return
				}
				var ids []string
				for _, s := range sums.GetSummaries() {
					ids = append(ids, s.GetRunId())
				}
				assert.ElementsMatch(c, tc.want, ids, "tenant %s, summary view", name)
			}, 10*time.Second, 10*time.Millisecond)
			for _, id := range tc.want {
				got, err := client.GetRun(tc.ctx, &stubbornv1.GetRunRequest{RunId: id})
				require.NoError(t, err, "tenant %s, GetRun %s", name, id)
				assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, got.GetState().GetStatus())
			}
		}
	}
	t.Run("the server that drove them", func(t *testing.T) { listsEveryRun(t, e.client) })

	// A server that starts on the store afterwards: its index is rebuilt
	// from the runs' states.
	su.store = newStore()
	restarted := startWith(t, su)
	<-su.store.(*jsstore.JetStream).IndexReconciled()
	t.Run("a server started afterwards", func(t *testing.T) { listsEveryRun(t, restarted.client) })

	for _, st := range []*stubbornv1.ControlState{deepHTTP, deepModelRun, deepGRPCRun} {
		_, err := restarted.client.DeleteRun(ctxA, &stubbornv1.DeleteRunRequest{RunId: st.GetRunId()})
		require.NoError(t, err)
		_, err = restarted.client.GetRun(ctxA, &stubbornv1.GetRunRequest{RunId: st.GetRunId()})
		assert.Equal(t, codes.NotFound, status.Code(err))
	}
	full, err := e.client.ListRuns(ctxA, &stubbornv1.ListRunsRequest{})
	require.NoError(t, err)
	require.Len(t, full.GetRuns(), 1)
	assert.Equal(t, plainA.GetRunId(), full.GetRuns()[0].GetRunId())
}
