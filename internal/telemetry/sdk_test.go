package telemetry_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
	"github.com/stubbornhq/stubborn/internal/telemetry"
)

// otelEnv are the variables Setup looks at; each test starts with none.
var otelEnv = []string{
	"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER",
	"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
	"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
	"OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
}

// clearEnv unsets the OTEL_* variables for the test (restored after it),
// then sets kv.
func clearEnv(t *testing.T, kv ...string) {
	t.Helper()
	for _, k := range otelEnv {
		t.Setenv(k, "")
		require.NoError(t, os.Unsetenv(k))
	}
	for i := 0; i+1 < len(kv); i += 2 {
		t.Setenv(kv[i], kv[i+1])
	}
}

// shutdown stops the SDK without waiting for exports that cannot succeed.
func shutdown(t *testing.T, sdk *telemetry.SDK) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_ = sdk.Shutdown(ctx)
}

func TestSetupIsOffUnlessTheEnvironmentAsks(t *testing.T) {
	for _, c := range []struct {
		name            string
		env             []string
		traces, metrics bool
	}{
		{"nothing set", nil, false, false},
		{"endpoint", []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1"}, true, true},
		{"traces endpoint only", []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:1/v1/traces"}, true, false},
		{"exporter none", []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER", "none"}, false, true},
		{"exporter named", []string{"OTEL_METRICS_EXPORTER", "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://127.0.0.1:1"}, false, true},
		{"sdk disabled", []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1", "OTEL_SDK_DISABLED", "true"}, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			clearEnv(t, c.env...)
			sdk, err := telemetry.Setup(context.Background(), telemetry.SetupOptions{})
			require.NoError(t, err)
			defer shutdown(t, sdk)
			assert.Equal(t, c.traces, sdk.TracerProvider != nil, "traces")
			assert.Equal(t, c.metrics, sdk.MeterProvider != nil, "metrics")
			assert.Nil(t, sdk.MetricsHandler)
			cfg := sdk.Config(nil)
			assert.Equal(t, c.traces, cfg.TracerProvider != nil)
			assert.Equal(t, c.metrics, cfg.MeterProvider != nil)
		})
	}
	t.Run("bad protocol", func(t *testing.T) {
		clearEnv(t, "OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
		_, err := telemetry.Setup(context.Background(), telemetry.SetupOptions{})
		assert.Error(t, err)
	})
}

// TestSetupExportsOTLP: with only OTEL_EXPORTER_OTLP_ENDPOINT set, spans and
// metrics reach an OTLP/HTTP collector (a fake one on loopback) by the time
// the SDK is shut down.
func TestSetupExportsOTLP(t *testing.T) {
	var (
		mu   sync.Mutex
		got  = map[string]int{}
		svcs []string
	)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got[r.URL.Path]++
		svcs = append(svcs, string(body))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	defer collector.Close()
	clearEnv(t, "OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL, "OTEL_SERVICE_NAME", "stubborn-under-test")

	sdk, err := telemetry.Setup(context.Background(), telemetry.SetupOptions{})
	require.NoError(t, err)
	require.NotNil(t, sdk.TracerProvider)
	require.NotNil(t, sdk.MeterProvider)
	_, span := sdk.TracerProvider.Tracer("test").Start(context.Background(), "exported")
	span.End()
	c, err := sdk.MeterProvider.Meter("test").Int64Counter("test.exported")
	require.NoError(t, err)
	c.Add(context.Background(), 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, sdk.Shutdown(ctx))
	collector.CloseClientConnections()

	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, 1, got["/v1/traces"], "spans exported")
	assert.Equal(t, 1, got["/v1/metrics"], "metrics exported")
	require.NotEmpty(t, svcs)
	assert.Contains(t, svcs[0], "stubborn-under-test", "OTEL_SERVICE_NAME names the service")
}

// TestPrometheusScrapeAfterARun: the scrape handler shows the stubborn.*
// metrics after a run, as `curl ADDR/metrics` would.
func TestPrometheusScrapeAfterARun(t *testing.T) {
	clearEnv(t)
	sdk, err := telemetry.Setup(context.Background(), telemetry.SetupOptions{Prometheus: true})
	require.NoError(t, err)
	defer shutdown(t, sdk)
	require.NotNil(t, sdk.MetricsHandler)
	require.Nil(t, sdk.TracerProvider, "no trace exporter without the environment")

	reg := &delegates.Config{Delegates: []delegates.Delegate{
		{Name: "broken", Target: serveDelegate(t, failWith(codes.Internal, "broken")), Idempotent: true},
		{Name: "echo", Target: serveDelegate(t, demo.Echo{}), Idempotent: true},
	}}
	s := startStubborn(t, reg, sdk.Config(slog.New(slog.DiscardHandler)))
	runToEnd(t, testCtx(t), s.client, &stubbornv1.RunRequest{
		TaskBrief: "find it", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"broken", "echo"}},
	})
	s.stop()

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", sdk.MetricsHandler)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, resp.Body.Close())
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	text := string(body)
	for _, want := range []string{
		`stubborn_runs_started_total{`,
		`stubborn_control="fallback_chain"`,
		`stubborn_runs_finished_total{`,
		`stubborn_run_status="succeeded"`,
		`stubborn_attempts_total{`,
		`stubborn_attempt_outcome="error",stubborn_delegate="broken"`,
		`stubborn_attempt_duration_seconds_bucket{`,
		`stubborn_runs_active{`,
		`rpc_server_call_duration_seconds_bucket{`,
		`go_goroutines `,
	} {
		assert.Contains(t, text, want)
	}
}
