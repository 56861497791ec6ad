package telemetry

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"
)

// An HTTP delegate's request carries the attempt's trace, and (when spans
// are recorded) is a client span of its own under it.
func TestHTTPTransportPassesTheTraceOn(t *testing.T) {
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Traceparent")
	}))
	t.Cleanup(srv.Close)

	r := newRecorder(t)
	off, err := New(Config{})
	require.NoError(t, err)
	for name, tel := range map[string]*Telemetry{"recording": r.tel, "off": off} {
		t.Run(name, func(t *testing.T) {
			ctx, span := r.tp.Tracer("test").Start(context.Background(), "attempt")
			defer span.End()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
			require.NoError(t, err)
			client := &http.Client{Transport: tel.HTTPTransport(http.DefaultTransport)}
			resp, err := client.Do(req)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			tp := <-got
			sc := parseTraceparent(tp)
			require.True(t, sc.IsValid(), "traceparent %q", tp)
			assert.Equal(t, span.SpanContext().TraceID(), sc.TraceID())
			assert.Empty(t, req.Header.Get("Traceparent"), "the caller's request is not changed")
			if name == "recording" {
				assert.NotEqual(t, span.SpanContext().SpanID(), sc.SpanID(), "the request has a client span of its own")
				var client trace.SpanKind
				for _, s := range r.spans.Ended() {
					if s.SpanContext().SpanID() == sc.SpanID() {
						client = s.SpanKind()
					}
				}
				assert.Equal(t, trace.SpanKindClient, client)
			} else {
				assert.Equal(t, span.SpanContext().SpanID(), sc.SpanID())
			}
		})
	}
	// Without a trace, nothing is added.
	req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	resp, err := (&http.Client{Transport: off.HTTPTransport(http.DefaultTransport)}).Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Empty(t, <-got)
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
}
