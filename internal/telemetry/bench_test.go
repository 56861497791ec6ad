package telemetry_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
	"github.com/stubbornhq/stubborn/internal/telemetry"
)

// BenchmarkSingleAttemptRun measures a whole single-attempt run over gRPC
// (client → Stubborn → delegate → back, the stream read to its end) with
// telemetry off (no providers: trace context is still passed on) and on
// (SDK tracer provider exporting every span through a batch processor to a
// no-op exporter, SDK meter provider with a reader, and run logs at info
// level to io.Discard), side by side in one process:
//
//	go test -run '^$' -bench SingleAttemptRun -benchtime 3s -count 6 ./telemetry/
func BenchmarkSingleAttemptRun(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "off"
		if on {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			addr := benchDelegate(b)
			reg := &delegates.Config{Delegates: []delegates.Delegate{{Name: "echo", Target: addr, Idempotent: true}}}
			tc := telemetry.Config{Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))}
			if on {
				tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
				mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
				b.Cleanup(func() {
					_ = tp.Shutdown(context.Background())
					_ = mp.Shutdown(context.Background())
				})
				tc.TracerProvider, tc.MeterProvider = tp, mp
			}
			s := startStubborn(b, reg, tc)
			req := &stubbornv1.RunRequest{TaskBrief: "hello", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				stream, err := s.client.Run(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				for {
					if _, err := stream.Recv(); err != nil {
						if !errors.Is(err, io.EOF) {
							b.Fatal(err)
						}
						break
					}
				}
			}
		})
	}
}

func benchDelegate(b *testing.B) string {
	b.Helper()
	return serveDelegate(b, demo.Echo{})
}
