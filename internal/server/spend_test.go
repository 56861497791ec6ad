package server_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/fakemodel"
)

// pricedModel is a registry entry for an OpenAI-shaped model at url with a
// price of 0.1 an input token and 1 an output token.
func pricedModel(name, url string) delegates.Delegate {
	return delegates.Delegate{
		Name: name, OpenAI: &delegates.OpenAI{ModelAPI: delegates.ModelAPI{BaseURL: url + "/v1", Model: "m"}},
		ReadOnly: true, Timeout: delegates.Duration(time.Minute),
		Price: &delegates.Price{InputPerMTok: 100_000, OutputPerMTok: 1_000_000},
	}
}

// cutModel streams a piece of an answer, then cuts the stream before its
// usage.
func cutModel(t *testing.T) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = fmt.Fprint(w, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"eight by"},"finish_reason":null}]}`+"\n\n")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the connection is cut
	}))
	t.Cleanup(s.Close)
	return s
}

func TestCostOverModelsStreamedOrNotJudgesIncluded(t *testing.T) {
	model := httptest.NewServer(fakemodel.New(fakemodel.Streams, 0))
	t.Cleanup(model.Close)
	cut := cutModel(t)
	e := startWith(t, setup{entries: []delegates.Delegate{
		pricedModel("model", model.URL), pricedModel("judge", model.URL), pricedModel("cut", cut.URL),
	}})
	ctx := testCtx(t)
	run := func(req *stubbornv1.RunRequest) *stubbornv1.ControlState {
		stream, err := e.client.Run(ctx, req)
		require.NoError(t, err)
		return lastState(t, collect(t, stream))
	}
	// The fake model reports 3 tokens in and 4 out: 0.3 + 4 a call,
	// streamed (its stream's last event has the usage) or not.
	perCall := 3*0.1 + 4*1.0
	st := run(&stubbornv1.RunRequest{TaskBrief: "go", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"model"}}})
	require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus(), st.GetStatusReason())
	assert.InDelta(t, perCall, st.GetCost().GetTotal(), 1e-9)
	assert.False(t, st.GetCost().GetEstimated())
	assert.EqualValues(t, 7, st.GetCost().GetTotalTokens())

	// With a judge: its call costs as much, under its own name.
	st = run(&stubbornv1.RunRequest{TaskBrief: "go", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"model"}, FailureCriteria: "must answer"},
		Options: &stubbornv1.RunOptions{Judge: "judge"}})
	require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus(), st.GetStatusReason())
	assert.InDelta(t, 2*perCall, st.GetCost().GetTotal(), 1e-9)
	assert.InDelta(t, perCall, st.GetCost().GetByDelegate()["judge"], 1e-9)

	// A stream cut before its usage: estimated from what was sent and
	// what it streamed, never zero.
	st = run(&stubbornv1.RunRequest{TaskBrief: "go", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"cut"}}})
	require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED, st.GetStatus())
	a := st.GetAttemptLog()[0]
	assert.True(t, a.GetCostEstimated())
	assert.GreaterOrEqual(t, a.GetCost(), 0.1+2*1.0, "at least the brief's token in and the 8 streamed bytes (2 tokens) out")
	assert.True(t, st.GetCost().GetEstimated())
}

// busyTwice is a model at 1 a call that answers 503 twice, then as the
// fake model does; calls counts the requests it had.
func busyTwice(t *testing.T) (delegates.Delegate, *atomic.Int32) {
	calls := &atomic.Int32{}
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= 2 {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = fmt.Fprint(w, `{"error": {"message": "busy", "type": "server_error"}}`)
			return
		}
		fakemodel.New(fakemodel.Streams, 0).ServeHTTP(w, r)
	}))
	t.Cleanup(model.Close)
	m := pricedModel("model", model.URL)
	m.Price = &delegates.Price{PerCall: 1}
	return m, calls
}

func TestASpendLimitAsksAndARaisedLimitLetsTheRunGoOn(t *testing.T) {
	m, calls := busyTwice(t)
	e := startWith(t, setup{entries: []delegates.Delegate{m}})
	ctx := testCtx(t)

	start, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "go",
		RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "model"},
		Options:           &stubbornv1.RunOptions{SpendLimit: &stubbornv1.SpendLimit{MaxCost: 1.5}}})
	require.NoError(t, err)
	id := start.GetRunId()
	var st *stubbornv1.ControlState
	require.Eventually(t, func() bool {
		g, err := e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
		st = g.GetState()
		return err == nil && st.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION
	}, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_SPEND_LIMIT_REACHED, st.GetStatusReasonCode())
	assert.Len(t, st.GetAttemptLog(), 1, "one call at 1 fits in 1.5; the second would not")
	assert.EqualValues(t, 1, calls.Load())

	_, err = e.client.DecideRun(ctx, &stubbornv1.DecideRunRequest{RunId: id, Decision: stubbornv1.Decision_DECISION_RETRY})
	assert.Equal(t, codes.FailedPrecondition, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "spend_limit")
	_, err = e.client.DecideRun(ctx, &stubbornv1.DecideRunRequest{RunId: id, Decision: stubbornv1.Decision_DECISION_RETRY, SpendLimit: &stubbornv1.SpendLimit{MaxCost: 1.2}})
	assert.Equal(t, codes.FailedPrecondition, status.Code(err), "1.2 does not raise 1.5")
	_, err = e.client.DecideRun(ctx, &stubbornv1.DecideRunRequest{RunId: id, Decision: stubbornv1.Decision_DECISION_RETRY, SpendLimit: &stubbornv1.SpendLimit{MaxCost: -1}})
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "spend_limit.max_cost")

	_, err = e.client.DecideRun(ctx, &stubbornv1.DecideRunRequest{RunId: id, Decision: stubbornv1.Decision_DECISION_RETRY, SpendLimit: &stubbornv1.SpendLimit{MaxCost: 10}})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		g, err := e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
		st = g.GetState()
		return err == nil && st.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED
	}, 10*time.Second, 10*time.Millisecond, "the run goes on: %v", st.GetStatusReason())
	assert.InDelta(t, 10, st.GetOptions().GetSpendLimit().GetMaxCost(), 0)
	assert.InDelta(t, 3, st.GetCost().GetTotal(), 1e-9, "three calls at 1")
}

func TestSpendLimitBoundsAreCheckedAtTheStart(t *testing.T) {
	e := start(t, delegates.Limits{})
	ctx := testCtx(t)
	for _, l := range []*stubbornv1.SpendLimit{
		{MaxCost: -1}, {MaxCost: 2e12}, {MaxTotalTokens: -5}, {MaxTotalTokens: 2e15}, {MaxCost: 1, OnExhausted: 7},
	} {
		_, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "go", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}},
			Options: &stubbornv1.RunOptions{SpendLimit: l}})
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", l)
		assert.Contains(t, status.Convert(err).Message(), "options.spend_limit.", "%v", l)
	}
	res, err := e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{})
	require.NoError(t, err)
	assert.Empty(t, res.GetRuns(), "nothing half-started")
}

// A preset's spend limit is the default of a run whose control names it.
func TestAPresetsSpendLimitIsItsRunsDefault(t *testing.T) {
	e := startWith(t, setup{presets: []delegates.Preset{{
		Name: "guarded", Spec: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}}},
		SpendLimit: &delegates.SpendLimit{MaxCost: 5, OnExhausted: "fail"},
	}}})
	ctx := testCtx(t)
	run := func(o *stubbornv1.RunOptions) *stubbornv1.ControlState {
		stream, err := e.client.Run(ctx, &stubbornv1.RunRequest{TaskBrief: "go", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"guarded"}}, Options: o})
		require.NoError(t, err)
		return lastState(t, collect(t, stream))
	}
	st := run(nil)
	assert.InDelta(t, 5, st.GetOptions().GetSpendLimit().GetMaxCost(), 0)
	assert.Equal(t, stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL, st.GetOptions().GetSpendLimit().GetOnExhausted())
	st = run(&stubbornv1.RunOptions{SpendLimit: &stubbornv1.SpendLimit{MaxCost: 7}})
	assert.InDelta(t, 7, st.GetOptions().GetSpendLimit().GetMaxCost(), 0, "the run's own wins")
	reg, err := e.client.ListDelegates(ctx, &stubbornv1.ListDelegatesRequest{})
	require.NoError(t, err)
	require.Len(t, reg.GetPresets(), 1)
	assert.InDelta(t, 5, reg.GetPresets()[0].GetSpendLimit().GetMaxCost(), 0)
}

// The whole flow: a retry-with-learning run over a priced model stops
// before the call that would pass its limit and waits; the webhook gets a
// signed notice with its cost within a second; GET of the link changes
// nothing; POST with a raised limit lets the run go on; the link works
// once.
func TestASpendLimitedRunIsNotifiedAndRaisedByLink(t *testing.T) {
	m, calls := busyTwice(t)
	hook := newHookReceiver(t)
	e := startNotifying(t, hook.URL, setup{entries: []delegates.Delegate{m}})
	ctx := testCtx(t)

	res, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "go",
		RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "model", MaxRetries: ptr(int32(5))},
		Options:           &stubbornv1.RunOptions{SpendLimit: &stubbornv1.SpendLimit{MaxCost: 1.5}}})
	require.NoError(t, err)
	id := res.GetRunId()

	n := awaitNotice(t, hook, time.Second)
	assert.Zero(t, hook.bad.Load(), "signed")
	assert.Equal(t, id, n.RunID)
	assert.Equal(t, "STATUS_REASON_SPEND_LIMIT_REACHED", n.ReasonCode)
	require.NotNil(t, n.Cost)
	assert.InDelta(t, 1, n.Cost.Total, 1e-9, "one call at 1 before the limit")
	assert.EqualValues(t, 1, calls.Load(), "the call that would pass 1.5 was not made")

	code, _ := get(t, n.Decision.RetryURL)
	assert.Equal(t, http.StatusOK, code)
	st, err := e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, st.GetState().GetStatus(), "a GET decides nothing")

	code, body := post(t, n.Decision.RetryURL, url.Values{"max_cost": {"10"}})
	require.Equal(t, http.StatusOK, code, body)
	require.Eventually(t, func() bool {
		g, err := e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
		return err == nil && g.GetState().GetStatus() == stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED
	}, 10*time.Second, 10*time.Millisecond, "a raised limit lets the run go on")
	g, err := e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
	require.NoError(t, err)
	assert.InDelta(t, 10, g.GetState().GetOptions().GetSpendLimit().GetMaxCost(), 0)
	assert.InDelta(t, 3, g.GetState().GetCost().GetTotal(), 1e-9)

	code, _ = post(t, n.Decision.RetryURL, url.Values{"max_cost": {"20"}})
	assert.Equal(t, http.StatusConflict, code, "the link works once")
}
