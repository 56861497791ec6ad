package telemetry_test

import (
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/fakemodel"
	"github.com/stubbornhq/stubborn/internal/telemetry"
)

// TestGenAIOverAFakeModel: a server whose delegates are the fake model,
// over Chat Completions (streamed and not, the latter also the judge) and
// Messages, records the GenAI conventions on their attempts and calls.
func TestGenAIOverAFakeModel(t *testing.T) {
	model := httptest.NewServer(fakemodel.New(fakemodel.Streams, time.Millisecond))
	t.Cleanup(model.Close)
	api := func(name string) delegates.ModelAPI {
		base := model.URL + "/v1"
		if name == "claude" {
			base = model.URL
		}
		return delegates.ModelAPI{BaseURL: base, Model: name + "-model"}
	}
	// The fake model reports 3 tokens in and 4 out: a call costs 3 + 8.
	price := &delegates.Price{InputPerMTok: 1e6, OutputPerMTok: 2e6}
	reg := &delegates.Config{Judge: "gpt", Delegates: []delegates.Delegate{
		{Name: "gpt", OpenAI: &delegates.OpenAI{ModelAPI: api("gpt")}, Stream: "off", ReadOnly: true, Price: price},
		{Name: "gpt-stream", OpenAI: &delegates.OpenAI{ModelAPI: api("gpt-stream")}, Stream: "on", ReadOnly: true, Price: price},
		{Name: "claude", Anthropic: &delegates.Anthropic{ModelAPI: api("claude")}, Stream: "off", ReadOnly: true},
	}}
	p := newProviders()
	s := startStubborn(t, reg, p.config(slog.New(slog.DiscardHandler)))
	evs := runToEnd(t, testCtx(t), s.client, &stubbornv1.RunRequest{
		TaskBrief:     "say something",
		FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"gpt-stream"}, FailureCriteria: "the answer is empty"},
	})
	require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, evs[len(evs)-1].GetRunFinished().GetState().GetStatus())
	tenant := evs[len(evs)-1].GetRunFinished().GetState().GetTenant()
	evs = runToEnd(t, testCtx(t), s.client, &stubbornv1.RunRequest{
		TaskBrief:     "say something",
		FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"claude"}},
	})
	require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, evs[len(evs)-1].GetRunFinished().GetState().GetStatus())
	s.stop()

	genai := func(s sdktrace.ReadOnlySpan) map[string]attribute.Value {
		out := map[string]attribute.Value{}
		for _, kv := range s.Attributes() {
			out[string(kv.Key)] = kv.Value
		}
		return out
	}
	streamed := spansNamed(p.spans.Ended(), "stubborn.attempt gpt-stream")
	require.Len(t, streamed, 1)
	a := genai(streamed[0])
	assert.Equal(t, "chat", a["gen_ai.operation.name"].AsString())
	assert.Equal(t, "openai", a["gen_ai.provider.name"].AsString())
	assert.Equal(t, "gpt-stream-model", a["gen_ai.request.model"].AsString())
	assert.Equal(t, "gpt-stream-model", a["gen_ai.response.model"].AsString())
	assert.Equal(t, []string{"stop"}, a["gen_ai.response.finish_reasons"].AsStringSlice())
	assert.EqualValues(t, 3, a["gen_ai.usage.input_tokens"].AsInt64(), "the stream's usage")
	assert.EqualValues(t, 4, a["gen_ai.usage.output_tokens"].AsInt64())
	assert.Positive(t, a["gen_ai.response.time_to_first_chunk"].AsFloat64())

	judge := spansNamed(p.spans.Ended(), "chat gpt-model")
	require.Len(t, judge, 1, "the judge's call has a GenAI span of its own")
	assert.Equal(t, streamed[0].SpanContext().SpanID(), judge[0].Parent().SpanID())
	assert.EqualValues(t, 3, genai(judge[0])["gen_ai.usage.input_tokens"].AsInt64())

	claude := spansNamed(p.spans.Ended(), "stubborn.attempt claude")
	require.Len(t, claude, 1)
	a = genai(claude[0])
	assert.Equal(t, "anthropic", a["gen_ai.provider.name"].AsString())
	assert.Equal(t, "claude-model", a["gen_ai.request.model"].AsString())
	assert.EqualValues(t, 4, a["gen_ai.usage.output_tokens"].AsInt64())
	_, ok := a["gen_ai.response.time_to_first_chunk"]
	assert.False(t, ok, "stream: off")

	ms := p.metrics(t)
	usage, ok := ms["gen_ai.client.token.usage"].Data.(metricdata.Histogram[int64])
	require.True(t, ok)
	var in, out int64
	for _, dp := range usage.DataPoints {
		typ, _ := dp.Attributes.Value("gen_ai.token.type")
		switch typ.AsString() {
		case "input":
			in += dp.Sum
		case "output":
			out += dp.Sum
		}
	}
	assert.EqualValues(t, 3*3, in, "three calls: two attempts and a judge")
	assert.EqualValues(t, 3*4, out)
	first := []attribute.KeyValue{
		attribute.String("gen_ai.operation.name", "chat"), attribute.String("gen_ai.provider.name", "openai"),
		attribute.String("gen_ai.request.model", "gpt-stream-model"), attribute.String("gen_ai.response.model", "gpt-stream-model"),
	}
	assert.EqualValues(t, 1, count(t, ms, "gen_ai.client.operation.time_to_first_chunk", first...))
	assert.EqualValues(t, 1, count(t, ms, "gen_ai.client.operation.duration", first...))

	cost, ok := ms["stubborn.run.cost"].Data.(metricdata.Sum[float64])
	require.True(t, ok, "stubborn.run.cost is recorded")
	got := map[string]float64{}
	for _, dp := range cost.DataPoints {
		v, _ := dp.Attributes.Value(telemetry.TenantKey)
		assert.Equal(t, tenant, v.AsString())
		d, _ := dp.Attributes.Value(telemetry.DelegateKey)
		got[d.AsString()] += dp.Value
	}
	assert.Equal(t, map[string]float64{"gpt-stream": 11, "gpt": 11}, got, "the attempt and its judge, priced; claude has no price")
}
