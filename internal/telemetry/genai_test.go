package telemetry

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc/codes"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
)

// modelDelegates answers as a model would: each delegate's Result, after
// streaming its pieces to the call's Output (and a tool call's delta).
type modelDelegates struct {
	answers map[string]*stubbornv1.Result
	errs    map[string]error
	pieces  []string
	delta   bool // stream a tool call's delta before the pieces
	calls   []controls.Call
}

func (f *modelDelegates) Call(_ context.Context, c controls.Call) (*stubbornv1.Result, error) {
	f.calls = append(f.calls, c)
	if f.delta && c.Deltas != nil {
		c.Deltas([]*stubbornv1.OutputDelta{{Kind: &stubbornv1.OutputDelta_ToolCall{ToolCall: &stubbornv1.ToolCallDelta{Name: "f"}}}})
	}
	if c.Output != nil {
		for _, p := range f.pieces {
			time.Sleep(time.Millisecond)
			c.Output(p)
		}
	}
	if err := f.errs[c.Delegate]; err != nil {
		return nil, err
	}
	return f.answers[c.Delegate], nil
}
func (f *modelDelegates) Info(string) controls.DelegateInfo    { return controls.DelegateInfo{} }
func (f *modelDelegates) Serving(context.Context, string) bool { return true }

// models: "gpt" is an openai model, "claude" an anthropic one, "grpc" no
// model at all.
func models(name string) (Model, bool) {
	switch name {
	case "gpt":
		return Model{Provider: "openai", Name: "gpt-x"}, true
	case "claude":
		return Model{Provider: "anthropic", Name: "claude-x"}, true
	}
	return Model{}, false
}

func modelAnswer(model string, in, out int64, reasons ...stubbornv1.FinishReason) *stubbornv1.Result {
	r := &stubbornv1.Result{Text: "hi", Model: model, Usage: &stubbornv1.Usage{InputTokens: in, OutputTokens: out, TotalTokens: in + out}}
	for i, fr := range reasons {
		r.Choices = append(r.Choices, &stubbornv1.Choice{Index: int32(i), FinishReason: fr})
	}
	return r
}

func (r *recorder) collect(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// point returns the data point of a histogram with exactly kvs.
func point[N int64 | float64](t *testing.T, ms map[string]metricdata.Metrics, name string, kvs ...attribute.KeyValue) (metricdata.HistogramDataPoint[N], bool) {
	t.Helper()
	m, ok := ms[name]
	if !ok {
		return metricdata.HistogramDataPoint[N]{}, false
	}
	h, ok := m.Data.(metricdata.Histogram[N])
	require.True(t, ok, "%s is a %T", name, m.Data)
	for _, dp := range h.DataPoints {
		if dp.Attributes.Len() != len(kvs) {
			continue
		}
		all := true
		for _, kv := range kvs {
			if v, ok := dp.Attributes.Value(kv.Key); !ok || v != kv.Value {
				all = false
			}
		}
		if all {
			return dp, true
		}
	}
	return metricdata.HistogramDataPoint[N]{}, false
}

func spanAttrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		out[kv.Key] = kv.Value
	}
	return out
}

func endedNamed(r *recorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range r.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func TestModelAttemptsCarryTheGenAIConventions(t *testing.T) {
	r := newRecorder(t)
	fake := &modelDelegates{answers: map[string]*stubbornv1.Result{
		"gpt":    modelAnswer("gpt-x-2025", 12, 34, stubbornv1.FinishReason_FINISH_REASON_STOP, stubbornv1.FinishReason_FINISH_REASON_LENGTH),
		"claude": modelAnswer("", 5, 0, stubbornv1.FinishReason_FINISH_REASON_TOOL_CALLS),
		"grpc":   {Text: "plain"},
	}}
	d := r.tel.Delegates(fake, ModelsFrom(models))
	ctx, observe := r.tel.ObserveRun(context.Background(), context.Background(), &stubbornv1.ControlState{RunId: "run_1", Control: chain("gpt", "claude", "grpc")}, false)
	for i, name := range []string{"gpt", "claude", "grpc"} {
		n := int32(i + 1)
		observe(started(n, name, ""))
		_, err := d.Call(ctx, controls.Call{RunID: "run_1", Delegate: name, Attempt: n})
		require.NoError(t, err)
		observe(finished(n, name, "", stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED, nil))
	}
	observe(runFinished(&stubbornv1.ControlState{RunId: "run_1", Control: chain("gpt"), Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED}))

	gpt := endedNamed(r, "stubborn.attempt gpt")
	require.Len(t, gpt, 1)
	a := spanAttrs(gpt[0])
	assert.Equal(t, "chat", a["gen_ai.operation.name"].AsString())
	assert.Equal(t, "openai", a["gen_ai.provider.name"].AsString())
	assert.Equal(t, "gpt-x", a["gen_ai.request.model"].AsString())
	assert.Equal(t, "gpt-x-2025", a["gen_ai.response.model"].AsString())
	assert.Equal(t, []string{"stop", "length"}, a["gen_ai.response.finish_reasons"].AsStringSlice())
	assert.EqualValues(t, 12, a["gen_ai.usage.input_tokens"].AsInt64())
	assert.EqualValues(t, 34, a["gen_ai.usage.output_tokens"].AsInt64())
	_, streamed := a["gen_ai.response.time_to_first_chunk"]
	assert.False(t, streamed, "an answer that did not stream has no time to first chunk")

	claude := endedNamed(r, "stubborn.attempt claude")
	require.Len(t, claude, 1)
	a = spanAttrs(claude[0])
	assert.Equal(t, "anthropic", a["gen_ai.provider.name"].AsString())
	assert.Equal(t, "claude-x", a["gen_ai.request.model"].AsString())
	assert.Equal(t, []string{"tool_call"}, a["gen_ai.response.finish_reasons"].AsStringSlice())
	_, ok := a["gen_ai.response.model"]
	assert.False(t, ok, "no response model when the model said none")
	_, ok = a["gen_ai.usage.output_tokens"]
	assert.False(t, ok, "0 tokens is usage not reported")

	grpc := endedNamed(r, "stubborn.attempt grpc")
	require.Len(t, grpc, 1)
	for k := range spanAttrs(grpc[0]) {
		assert.NotContains(t, string(k), "gen_ai.", "a delegate that is no model keeps today's attributes")
	}

	ms := r.collect(t)
	gptAttrs := []attribute.KeyValue{
		attribute.String("gen_ai.operation.name", "chat"), attribute.String("gen_ai.provider.name", "openai"),
		attribute.String("gen_ai.request.model", "gpt-x"), attribute.String("gen_ai.response.model", "gpt-x-2025"),
	}
	in, ok := point[int64](t, ms, "gen_ai.client.token.usage", append(gptAttrs, attribute.String("gen_ai.token.type", "input"))...)
	require.True(t, ok, "input tokens recorded")
	assert.EqualValues(t, 1, in.Count)
	assert.EqualValues(t, 12, in.Sum)
	out, ok := point[int64](t, ms, "gen_ai.client.token.usage", append(gptAttrs, attribute.String("gen_ai.token.type", "output"))...)
	require.True(t, ok, "output tokens recorded")
	assert.EqualValues(t, 34, out.Sum)
	assert.Equal(t, "{token}", ms["gen_ai.client.token.usage"].Unit)
	dur, ok := point[float64](t, ms, "gen_ai.client.operation.duration", gptAttrs...)
	require.True(t, ok)
	assert.EqualValues(t, 1, dur.Count)
	assert.Equal(t, "s", ms["gen_ai.client.operation.duration"].Unit)
	claudeAttrs := []attribute.KeyValue{
		attribute.String("gen_ai.operation.name", "chat"), attribute.String("gen_ai.provider.name", "anthropic"),
		attribute.String("gen_ai.request.model", "claude-x"),
	}
	in, ok = point[int64](t, ms, "gen_ai.client.token.usage", append(claudeAttrs, attribute.String("gen_ai.token.type", "input"))...)
	require.True(t, ok)
	assert.EqualValues(t, 5, in.Sum)
	_, ok = point[int64](t, ms, "gen_ai.client.token.usage", append(claudeAttrs, attribute.String("gen_ai.token.type", "output"))...)
	assert.False(t, ok, "unreported output tokens are not recorded as 0")
	_, ok = ms["gen_ai.client.operation.time_to_first_chunk"]
	assert.False(t, ok, "nothing streamed")
	// Only the two model calls: the gRPC delegate's is not a GenAI operation.
	assert.Len(t, ms["gen_ai.client.operation.duration"].Data.(metricdata.Histogram[float64]).DataPoints, 2)
}

func TestStreamedModelAttemptRecordsTimeToFirstChunk(t *testing.T) {
	r := newRecorder(t)
	fake := &modelDelegates{answers: map[string]*stubbornv1.Result{"gpt": modelAnswer("gpt-x", 1, 2, stubbornv1.FinishReason_FINISH_REASON_STOP)}, pieces: []string{"a", "b"}, delta: true}
	d := r.tel.Delegates(fake, ModelsFrom(models))
	ctx, observe := r.tel.ObserveRun(context.Background(), context.Background(), &stubbornv1.ControlState{RunId: "run_1", Control: chain("gpt")}, false)
	observe(started(1, "gpt", ""))
	var got []string
	start := time.Now()
	_, err := d.Call(ctx, controls.Call{RunID: "run_1", Delegate: "gpt", Attempt: 1,
		Output: func(s string) { got = append(got, s) }, Deltas: func([]*stubbornv1.OutputDelta) {}})
	took := time.Since(start)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b"}, got, "the output passes through")
	observe(finished(1, "gpt", "", stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED, nil))
	observe(runFinished(&stubbornv1.ControlState{RunId: "run_1", Control: chain("gpt"), Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED}))

	spans := endedNamed(r, "stubborn.attempt gpt")
	require.Len(t, spans, 1)
	first, ok := spanAttrs(spans[0])["gen_ai.response.time_to_first_chunk"]
	require.True(t, ok)
	// The tool call's delta came first, before the text's pauses.
	assert.Less(t, first.AsFloat64(), 0.001+took.Seconds()/2)
	ms := r.collect(t)
	attrs := []attribute.KeyValue{
		attribute.String("gen_ai.operation.name", "chat"), attribute.String("gen_ai.provider.name", "openai"),
		attribute.String("gen_ai.request.model", "gpt-x"), attribute.String("gen_ai.response.model", "gpt-x"),
	}
	p, ok := point[float64](t, ms, "gen_ai.client.operation.time_to_first_chunk", attrs...)
	require.True(t, ok)
	assert.EqualValues(t, 1, p.Count)
	assert.InDelta(t, first.AsFloat64(), p.Sum, 1e-9, "the span and the metric say the same")
	dur, ok := point[float64](t, ms, "gen_ai.client.operation.duration", attrs...)
	require.True(t, ok)
	assert.GreaterOrEqual(t, dur.Sum, p.Sum, "the whole call takes longer than its first chunk")
}

func TestJudgeModelCallGetsASpanOfItsOwn(t *testing.T) {
	r := newRecorder(t)
	fake := &modelDelegates{
		answers: map[string]*stubbornv1.Result{"grpc": {Text: "x"}},
		errs:    map[string]error{"claude": &controls.CallError{Code: codes.Unavailable, Message: "overloaded"}},
	}
	d := r.tel.Delegates(fake, ModelsFrom(models))
	ctx, observe := r.tel.ObserveRun(context.Background(), context.Background(), &stubbornv1.ControlState{RunId: "run_1", Control: chain("grpc")}, false)
	observe(started(1, "grpc", ""))
	_, err := d.Call(ctx, controls.Call{RunID: "run_1", Delegate: "grpc", Attempt: 1})
	require.NoError(t, err)
	_, err = d.Call(ctx, controls.Call{RunID: "run_1", Delegate: "claude", Attempt: 1}) // its judge
	require.Error(t, err)
	observe(finished(1, "grpc", "", stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_ERROR, &stubbornv1.AttemptError{Code: int32(codes.Unavailable)}))
	observe(runFinished(&stubbornv1.ControlState{RunId: "run_1", Control: chain("grpc"), Status: stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED}))

	attempt := endedNamed(r, "stubborn.attempt grpc")
	require.Len(t, attempt, 1)
	judge := endedNamed(r, "chat claude-x")
	require.Len(t, judge, 1)
	assert.Equal(t, attempt[0].SpanContext().SpanID(), judge[0].Parent().SpanID(), "under the attempt it judged")
	a := spanAttrs(judge[0])
	assert.Equal(t, "anthropic", a["gen_ai.provider.name"].AsString())
	assert.Equal(t, "UNAVAILABLE", a["error.type"].AsString())
	assert.Equal(t, "claude", a[delegateKey].AsString())
	for k := range spanAttrs(attempt[0]) {
		assert.NotContains(t, string(k), "gen_ai.", "the judge's attributes are not the attempt's")
	}
	ms := r.collect(t)
	dur, ok := point[float64](t, ms, "gen_ai.client.operation.duration",
		attribute.String("gen_ai.operation.name", "chat"), attribute.String("gen_ai.provider.name", "anthropic"),
		attribute.String("gen_ai.request.model", "claude-x"), attribute.String("error.type", "UNAVAILABLE"))
	require.True(t, ok, "a failed call's duration says its error.type")
	assert.EqualValues(t, 1, dur.Count)
}

func TestRunCostByTenantAndDelegate(t *testing.T) {
	r := newRecorder(t)
	_, observe := r.tel.ObserveRun(context.Background(), context.Background(), &stubbornv1.ControlState{RunId: "run_1", Tenant: "acme", Control: chain("gpt")}, false)
	observe(started(1, "gpt", ""))
	f := finished(1, "gpt", "", stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_REJECTED, nil)
	f.GetAttemptFinished().Attempt.Cost = 0.25
	f.GetAttemptFinished().Calls = []*stubbornv1.CallCost{{Delegate: "judge", Cost: 0.01}, {Delegate: "judge", Cost: 0.02}}
	observe(f)
	observe(&stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_FailureAnalyzed{FailureAnalyzed: &stubbornv1.FailureAnalyzed{
		Failure:      &stubbornv1.FailureRecord{Attempt: 1, Delegate: "gpt"},
		WillRetry:    true,
		AnalysisCost: &stubbornv1.CallCost{Delegate: "analyst", Cost: 0.5, Estimated: true},
	}}})
	observe(started(2, "gpt", ""))
	f = finished(2, "gpt", "", stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED, nil)
	f.GetAttemptFinished().Attempt.Cost = 0.5
	observe(f)
	observe(started(3, "free", ""))
	observe(finished(3, "free", "", stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED, nil))
	observe(runFinished(&stubbornv1.ControlState{RunId: "run_1", Tenant: "acme", Control: chain("gpt"), Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED}))

	// Another tenant's run (the default tenant's) counts apart.
	_, observe = r.tel.ObserveRun(context.Background(), context.Background(), &stubbornv1.ControlState{RunId: "run_2", Control: chain("gpt")}, false)
	f = finished(1, "gpt", "", stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED, nil)
	f.GetAttemptFinished().Attempt.Cost = 1
	observe(f)
	observe(runFinished(&stubbornv1.ControlState{RunId: "run_2", Control: chain("gpt"), Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED}))

	ms := r.collect(t)
	m, ok := ms["stubborn.run.cost"]
	require.True(t, ok)
	assert.Equal(t, "{cost}", m.Unit)
	s := m.Data.(metricdata.Sum[float64])
	assert.True(t, s.IsMonotonic)
	got := map[[2]string]float64{}
	for _, dp := range s.DataPoints {
		require.Equal(t, 2, dp.Attributes.Len(), "tenant and delegate only")
		tenant, _ := dp.Attributes.Value(tenantKey)
		delegate, _ := dp.Attributes.Value(delegateKey)
		got[[2]string{tenant.AsString(), delegate.AsString()}] += dp.Value
	}
	assert.Len(t, got, 4, "no point for a call that cost nothing: %v", got)
	assert.InDelta(t, 0.75, got[[2]string{"acme", "gpt"}], 1e-9)
	assert.InDelta(t, 0.03, got[[2]string{"acme", "judge"}], 1e-9)
	assert.InDelta(t, 0.5, got[[2]string{"acme", "analyst"}], 1e-9)
	assert.InDelta(t, 1, got[[2]string{"", "gpt"}], 1e-9)

	spans := endedNamed(r, "stubborn.attempt gpt")
	require.Len(t, spans, 3)
	assert.InDelta(t, 0.25, spanAttrs(spans[0])[attemptCostKey].AsFloat64(), 1e-9)
	_, ok = spanAttrs(endedNamed(r, "stubborn.attempt free")[0])[attemptCostKey]
	assert.False(t, ok, "an attempt that cost nothing has no cost attribute")
}

// TestGenAICostsNothingWhenNothingRecords: with no tracer and no meter
// provider, a model delegate's call is not even looked up as a model, and
// its output is handed on unwrapped (in a run that is logged, too).
func TestGenAICostsNothingWhenNothingRecords(t *testing.T) {
	for _, logged := range []bool{false, true} {
		logger := slog.New(slog.DiscardHandler)
		if logged {
			logger = slog.New(slog.NewTextHandler(discard{}, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
		tel, err := New(Config{Logger: logger})
		require.NoError(t, err)
		var lookups atomic.Int64
		fake := &modelDelegates{answers: map[string]*stubbornv1.Result{"gpt": modelAnswer("gpt-x", 1, 2, stubbornv1.FinishReason_FINISH_REASON_STOP)}}
		d := tel.Delegates(fake, ModelsFrom(func(name string) (Model, bool) { lookups.Add(1); return models(name) }))
		ctx, observe := tel.ObserveRun(context.Background(), context.Background(), &stubbornv1.ControlState{RunId: "run_1", Control: chain("gpt")}, false)
		if observe != nil {
			observe(started(1, "gpt", ""))
		}
		_, err = d.Call(ctx, controls.Call{RunID: "run_1", Delegate: "gpt", Attempt: 1})
		require.NoError(t, err)
		assert.Zero(t, lookups.Load(), "logged %v: no model lookup", logged)
		if observe != nil {
			observe(runFinished(&stubbornv1.ControlState{RunId: "run_1", Control: chain("gpt"), Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED}))
		}
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func TestFinishReasons(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   *stubbornv1.Choice
		want string
	}{
		{&stubbornv1.Choice{FinishReason: stubbornv1.FinishReason_FINISH_REASON_STOP}, "stop"},
		{&stubbornv1.Choice{FinishReason: stubbornv1.FinishReason_FINISH_REASON_STOP_SEQUENCE, NativeFinishReason: "stop_sequence"}, "stop"},
		{&stubbornv1.Choice{FinishReason: stubbornv1.FinishReason_FINISH_REASON_LENGTH, NativeFinishReason: "max_tokens"}, "length"},
		{&stubbornv1.Choice{FinishReason: stubbornv1.FinishReason_FINISH_REASON_TOOL_CALLS, NativeFinishReason: "tool_use"}, "tool_call"},
		{&stubbornv1.Choice{FinishReason: stubbornv1.FinishReason_FINISH_REASON_CONTENT_FILTER, NativeFinishReason: "refusal"}, "content_filter"},
		{&stubbornv1.Choice{FinishReason: stubbornv1.FinishReason_FINISH_REASON_PAUSE, NativeFinishReason: "pause_turn"}, "pause_turn"},
		{&stubbornv1.Choice{NativeFinishReason: "brand_new"}, "brand_new"},
		{&stubbornv1.Choice{NativeFinishReason: string(make([]byte, 1000))}, string(make([]byte, maxNativeFinishReason))},
		{&stubbornv1.Choice{NativeFinishReason: "ééééééééééééééééééééééééééééééééé"}, "éééééééééééééééééééééééééééééééé"}, // cut between characters
		{&stubbornv1.Choice{}, ""},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, finishReason(c.in), "%v", c.in)
	}
	assert.Equal(t, []string{"stop", "length"}, finishReasons([]*stubbornv1.Choice{
		{FinishReason: stubbornv1.FinishReason_FINISH_REASON_STOP}, {}, {FinishReason: stubbornv1.FinishReason_FINISH_REASON_LENGTH},
	}), "a choice with no reason is left out")
	assert.Nil(t, finishReasons(nil))
}
