package telemetry

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// SetupOptions add to what the environment configures.
type SetupOptions struct {
	// Prometheus adds a Prometheus exporter whose scrape handler is
	// SDK.MetricsHandler.
	Prometheus bool
	// ServiceName is the default service.name; OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES override it. Empty means "stubborn".
	ServiceName string
}

// SDK is the OpenTelemetry SDK as the environment configured it. Shut it
// down to flush what it holds.
type SDK struct {
	// TracerProvider exports spans; nil when traces are off.
	TracerProvider *sdktrace.TracerProvider
	// MeterProvider exports metrics; nil when metrics are off.
	MeterProvider *sdkmetric.MeterProvider
	// MetricsHandler serves the Prometheus text format; nil unless
	// SetupOptions.Prometheus.
	MetricsHandler http.Handler
}

// Setup builds the SDK from the standard OTEL_* environment variables, with
// go.opentelemetry.io/contrib/exporters/autoexport choosing the exporters.
// Each signal is off unless the environment asks for it:
//
//   - traces are on when OTEL_TRACES_EXPORTER is set (otlp, console; none
//     turns them off), or when it is unset and OTEL_EXPORTER_OTLP_ENDPOINT or
//     OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (then: otlp);
//   - metrics likewise with OTEL_METRICS_EXPORTER (otlp, console,
//     prometheus, none) and OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, plus the
//     Prometheus handler when opts.Prometheus;
//   - OTEL_SDK_DISABLED=true turns both off (the Prometheus handler stays).
//
// The OTLP exporters read the rest themselves: OTEL_EXPORTER_OTLP_PROTOCOL
// (http/protobuf by default, or grpc), the endpoints, headers, timeouts,
// compression and certificates; the SDK reads OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER(_ARG), OTEL_BSP_* and
// OTEL_METRIC_EXPORT_INTERVAL.
func Setup(ctx context.Context, opts SetupOptions) (*SDK, error) {
	name := opts.ServiceName
	if name == "" {
		name = "stubborn"
	}
	// Later detectors win: the environment overrides the default name.
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", name)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(),
	)
	if err != nil && res == nil {
		return nil, err
	}
	s := &SDK{}
	disabled := strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true")

	if !disabled && signalWanted("TRACES") {
		exp, err := autoexport.NewSpanExporter(ctx)
		if err != nil {
			return nil, err
		}
		if !autoexport.IsNoneSpanExporter(exp) {
			s.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
		}
	}

	var readers []sdkmetric.Reader
	if !disabled && signalWanted("METRICS") {
		r, err := autoexport.NewMetricReader(ctx)
		if err != nil {
			_ = s.Shutdown(ctx)
			return nil, err
		}
		if autoexport.IsNoneMetricReader(r) {
			_ = r.Shutdown(ctx)
		} else {
			readers = append(readers, r)
		}
	}
	if opts.Prometheus {
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		exp, err := otelprom.New(otelprom.WithRegisterer(reg))
		if err != nil {
			for _, r := range readers {
				_ = r.Shutdown(ctx)
			}
			_ = s.Shutdown(ctx)
			return nil, err
		}
		readers = append(readers, exp)
		s.MetricsHandler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	}
	if len(readers) > 0 {
		mopts := []sdkmetric.Option{sdkmetric.WithResource(res)}
		for _, r := range readers {
			mopts = append(mopts, sdkmetric.WithReader(r))
		}
		s.MeterProvider = sdkmetric.NewMeterProvider(mopts...)
	}
	return s, nil
}

// signalWanted reports whether the environment asks for a signal ("TRACES"
// or "METRICS"): its OTEL_<SIGNAL>_EXPORTER is set and not "none", or it is
// unset and an OTLP endpoint is.
func signalWanted(signal string) bool {
	if v := strings.TrimSpace(os.Getenv("OTEL_" + signal + "_EXPORTER")); v != "" {
		return v != "none"
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_"+signal+"_ENDPOINT") != ""
}

// Config returns the telemetry configuration over the SDK's providers, with
// logger for the run logs.
func (s *SDK) Config(logger *slog.Logger) Config {
	c := Config{Logger: logger}
	if s.TracerProvider != nil {
		c.TracerProvider = s.TracerProvider
	}
	if s.MeterProvider != nil {
		c.MeterProvider = s.MeterProvider
	}
	return c
}

// Describe says in words which signals go where, for a log line.
func (s *SDK) Describe() (traces, metrics string) {
	traces, metrics = "off", "off"
	if s.TracerProvider != nil {
		traces = exporterName("TRACES")
	}
	var m []string
	if s.MeterProvider != nil && !strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") && signalWanted("METRICS") {
		m = append(m, exporterName("METRICS"))
	}
	if s.MetricsHandler != nil {
		m = append(m, "prometheus scrape")
	}
	if len(m) > 0 {
		metrics = strings.Join(m, ", ")
	}
	return traces, metrics
}

func exporterName(signal string) string {
	if v := strings.TrimSpace(os.Getenv("OTEL_" + signal + "_EXPORTER")); v != "" {
		return v
	}
	return "otlp"
}

// Shutdown flushes and stops the providers. It is safe on a nil SDK.
func (s *SDK) Shutdown(ctx context.Context) error {
	if s == nil {
		return nil
	}
	var errs []error
	if s.TracerProvider != nil {
		errs = append(errs, s.TracerProvider.Shutdown(ctx))
	}
	if s.MeterProvider != nil {
		errs = append(errs, s.MeterProvider.Shutdown(ctx))
	}
	return errors.Join(errs...)
}
