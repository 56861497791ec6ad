package telemetry

import (
	"context"
	"errors"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	// v1.41.0 is the newest semantic conventions otel-go ships with the
	// gen_ai namespace (v1.42.0 dropped it): the names of the GenAI
	// client spans and metrics come from it, pinned.
	semconvgenai "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/semconv/v1.41.0/genaiconv"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
)

// Model is what the registry says of a model delegate (the openai and
// anthropic kinds), for OpenTelemetry's GenAI conventions
// (https://opentelemetry.io/docs/specs/semconv/gen-ai/).
type Model struct {
	// Provider is gen_ai.provider.name: "openai" or "anthropic", from the
	// delegate's kind.
	Provider string
	// Name is gen_ai.request.model: the model the delegate is configured
	// to ask for.
	Name string
}

// DelegatesOption configures what [Telemetry.Delegates] records.
type DelegatesOption func(*tracedDelegates)

// ModelsFrom says which delegates are models: of returns the Model of a
// delegate's registry name, and false for a delegate that is not a model
// (gRPC, HTTP) or an unknown name. A model delegate's calls carry the GenAI
// conventions' attributes and metrics (gen_ai.*). Without this option no
// delegate is taken for a model.
func ModelsFrom(of func(delegate string) (Model, bool)) DelegatesOption {
	return func(d *tracedDelegates) { d.models = of }
}

// Buckets the GenAI conventions advise for their histograms.
var (
	genaiDurationBuckets = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	genaiTokenBuckets    = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
)

// genaiInstruments are the GenAI conventions' client metrics.
type genaiInstruments struct {
	tokens     genaiconv.ClientTokenUsage
	duration   genaiconv.ClientOperationDuration
	firstChunk genaiconv.ClientOperationTimeToFirstChunk
}

func newGenAIInstruments(m metric.Meter) (genaiInstruments, error) {
	tokens, err1 := genaiconv.NewClientTokenUsage(m, metric.WithExplicitBucketBoundaries(genaiTokenBuckets...))
	duration, err2 := genaiconv.NewClientOperationDuration(m, metric.WithExplicitBucketBoundaries(genaiDurationBuckets...))
	first, err3 := genaiconv.NewClientOperationTimeToFirstChunk(m, metric.WithExplicitBucketBoundaries(genaiDurationBuckets...))
	return genaiInstruments{tokens: tokens, duration: duration, firstChunk: first}, errors.Join(err1, err2, err3)
}

// modelCall is what one model delegate call left to record.
type modelCall struct {
	model Model
	res   *stubbornv1.Result
	err   error
	took  time.Duration
	// first is the time to the first chunk of a streamed answer; negative
	// when the answer did not stream.
	first time.Duration
}

// baseAttrs are the attributes every GenAI metric point of the call
// carries: operation, provider, request model and, when the model said
// it, response model.
func (c *modelCall) baseAttrs() []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 8)
	attrs = append(attrs,
		semconvgenai.GenAIOperationNameChat,
		semconvgenai.GenAIProviderNameKey.String(c.model.Provider),
		semconvgenai.GenAIRequestModel(c.model.Name))
	if m := c.res.GetModel(); m != "" {
		attrs = append(attrs, semconvgenai.GenAIResponseModel(m))
	}
	return attrs
}

// recordModelCall puts the GenAI attributes of call on span (the attempt's
// span, or a judge's or analyst's call's own) and records the gen_ai.client.*
// metrics. Only called when something records them.
func (t *Telemetry) recordModelCall(ctx context.Context, span trace.Span, call *modelCall) {
	base := call.baseAttrs()
	spanAttrs := append(make([]attribute.KeyValue, 0, len(base)+4), base...)
	if rs := finishReasons(call.res.GetChoices()); len(rs) > 0 {
		spanAttrs = append(spanAttrs, semconvgenai.GenAIResponseFinishReasons(rs...))
	}
	u := call.res.GetUsage()
	if n := u.GetInputTokens(); n > 0 {
		spanAttrs = append(spanAttrs, semconvgenai.GenAIUsageInputTokensKey.Int64(n))
	}
	if n := u.GetOutputTokens(); n > 0 {
		spanAttrs = append(spanAttrs, semconvgenai.GenAIUsageOutputTokensKey.Int64(n))
	}
	if call.first >= 0 {
		spanAttrs = append(spanAttrs, semconvgenai.GenAIResponseTimeToFirstChunkKey.Float64(call.first.Seconds()))
	}
	span.SetAttributes(spanAttrs...)

	g := &t.m.genai
	if call.first >= 0 {
		g.firstChunk.RecordSet(ctx, call.first.Seconds(), attribute.NewSet(base...))
	}
	if n := u.GetInputTokens(); n > 0 {
		g.tokens.RecordSet(ctx, n, attribute.NewSet(append(base, semconvgenai.GenAITokenTypeInput)...))
	}
	if n := u.GetOutputTokens(); n > 0 {
		g.tokens.RecordSet(ctx, n, attribute.NewSet(append(base, semconvgenai.GenAITokenTypeOutput)...))
	}
	if call.err != nil {
		base = append(base, semconvgenai.ErrorTypeKey.String(callErrorType(call.err)))
	}
	g.duration.RecordSet(ctx, call.took.Seconds(), attribute.NewSet(base...))
}

// startModelSpan starts the span of a model call that is not an attempt's
// own (a judge's, an analyst's), named as the GenAI conventions name a
// client span ("chat <model>"), under the span in ctx.
func (t *Telemetry) startModelSpan(ctx context.Context, m Model, delegate string) (context.Context, trace.Span) {
	return t.tracer.Start(ctx, "chat "+m.Name, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(delegateKey.String(delegate)))
}

// endModelSpan ends a span startModelSpan started, with the call's error.
func endModelSpan(span trace.Span, err error) {
	if err != nil {
		n := callErrorType(err)
		span.SetAttributes(semconvgenai.ErrorTypeKey.String(n))
		span.SetStatus(otelcodes.Error, n)
	}
	span.End()
}

// callErrorType is a failed call's error.type: the gRPC code's name
// (DEADLINE_EXCEEDED, UNAVAILABLE, …) as the attempt spans carry it.
func callErrorType(err error) string {
	if ce, ok := errors.AsType[*controls.CallError](err); ok {
		return codeName(ce.Code)
	}
	switch {
	case errors.Is(err, context.Canceled):
		return codeName(codes.Canceled)
	case errors.Is(err, context.DeadlineExceeded):
		return codeName(codes.DeadlineExceeded)
	}
	return "_OTHER" // the conventions' value for an error of no known type
}

// finishReasons are the choices' finish reasons, one per choice in order,
// as the GenAI conventions' output messages name them (stop, length,
// content_filter, tool_call); a reason they have no name for is the one
// the model's API said. A choice with neither is left out.
func finishReasons(choices []*stubbornv1.Choice) []string {
	if len(choices) == 0 {
		return nil
	}
	out := make([]string, 0, len(choices))
	for _, c := range choices {
		if r := finishReason(c); r != "" {
			out = append(out, r)
		}
	}
	return out
}

func finishReason(c *stubbornv1.Choice) string {
	switch c.GetFinishReason() {
	case stubbornv1.FinishReason_FINISH_REASON_STOP, stubbornv1.FinishReason_FINISH_REASON_STOP_SEQUENCE:
		return "stop"
	case stubbornv1.FinishReason_FINISH_REASON_LENGTH:
		return "length"
	case stubbornv1.FinishReason_FINISH_REASON_TOOL_CALLS:
		return "tool_call"
	case stubbornv1.FinishReason_FINISH_REASON_CONTENT_FILTER:
		return "content_filter"
	}
	// PAUSE (Anthropic's pause_turn), or none: what the API said, bounded
	// as the delegate's answer bounds it.
	r := c.GetNativeFinishReason()
	if len(r) > maxNativeFinishReason {
		r = strings.ToValidUTF8(r[:maxNativeFinishReason], "")
	}
	return r
}

// maxNativeFinishReason bounds a finish reason taken as the model's API
// said it (it comes from outside).
const maxNativeFinishReason = 64
