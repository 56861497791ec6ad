package telemetry

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// The guards' metrics: breaker transitions and refusals, counted.
func TestGuardMetrics(t *testing.T) {
	r := newRecorder(t)
	r.tel.BreakerChanged("d", "closed", "open", "5 transient failures in a row")
	r.tel.BreakerChanged("d", "open", "half-open", "cooldown over")
	r.tel.Refused("d", "circuit_breaker")
	n, ok := r.total(t, "stubborn.delegate.breaker.transitions")
	assert.True(t, ok)
	assert.EqualValues(t, 2, n)
	n, ok = r.total(t, "stubborn.delegate.refused")
	assert.True(t, ok)
	assert.EqualValues(t, 1, n)
}

// A transition of the fleet's breaker carries scope fleet and the replica
// that opened it (bounded); this server's own carries neither.
func TestBreakerTransitionNamesWhoOpenedIt(t *testing.T) {
	r := newRecorder(t)
	r.tel.BreakerChanged("own", "closed", "open", "3 transient failures in a row")
	r.tel.BreakerTransition(BreakerChange{Delegate: "east", From: "closed", To: "open", Why: "3 transient failures in a row (opened by replica stubborn-abc)", Fleet: true, OpenedBy: "stubborn-abc"})
	r.tel.BreakerTransition(BreakerChange{Delegate: "east", From: "open", To: "half-open", Why: "cooldown of 4s over", Fleet: true, OpenedBy: "stubborn-abc"})
	r.tel.BreakerTransition(BreakerChange{Delegate: "east", From: "half-open", To: "open", Why: "a probe call failed", Fleet: true, OpenedBy: strings.Repeat("x", 500)})

	got := map[string]int64{}
	for _, dp := range sumPoints(t, r.reader, "stubborn.delegate.breaker.transitions") {
		got[attrString(dp.Attributes)] += dp.Value
	}
	assert.Equal(t, map[string]int64{
		"stubborn.breaker.state=open,stubborn.delegate=own":                                                                                                      1,
		"stubborn.breaker.opened_by=stubborn-abc,stubborn.breaker.scope=fleet,stubborn.breaker.state=open,stubborn.delegate=east":                                1,
		"stubborn.breaker.opened_by=stubborn-abc,stubborn.breaker.scope=fleet,stubborn.breaker.state=half-open,stubborn.delegate=east":                           1,
		"stubborn.breaker.opened_by=" + strings.Repeat("x", maxReplicaName) + ",stubborn.breaker.scope=fleet,stubborn.breaker.state=open,stubborn.delegate=east": 1,
	}, got)
}

// The log line of a fleet transition says so, and who opened it.
func TestBreakerTransitionLogsWhoOpenedIt(t *testing.T) {
	var buf bytes.Buffer
	tel, err := New(Config{Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	require.NoError(t, err)
	tel.BreakerTransition(BreakerChange{Delegate: "east", From: "closed", To: "open", Why: "3 transient failures in a row", Fleet: true, OpenedBy: "stubborn-abc"})
	tel.BreakerChanged("own", "closed", "open", "why")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 2)
	assert.Contains(t, lines[0], "level=WARN")
	assert.Contains(t, lines[0], "scope=fleet opened_by=stubborn-abc")
	assert.NotContains(t, lines[1], "scope=")
	assert.NotContains(t, lines[1], "opened_by")
}

// The state gauge: 1 for each delegate's current state, 0 for the others,
// after its first transition; the latest transition wins.
func TestBreakerStateGauge(t *testing.T) {
	r := newRecorder(t)
	assert.Empty(t, gaugePoints(t, r.reader, "stubborn.delegate.breaker.state"), "no delegate before a transition")
	r.tel.BreakerTransition(BreakerChange{Delegate: "east", From: "closed", To: "open", Fleet: true, OpenedBy: "stubborn-abc"})
	r.tel.BreakerChanged("west", "closed", "open", "")
	r.tel.BreakerChanged("west", "open", "half-open", "")
	got := map[string]int64{}
	for _, dp := range gaugePoints(t, r.reader, "stubborn.delegate.breaker.state") {
		got[attrString(dp.Attributes)] = dp.Value
	}
	assert.Equal(t, map[string]int64{
		"stubborn.breaker.state=closed,stubborn.delegate=east":    0,
		"stubborn.breaker.state=open,stubborn.delegate=east":      1,
		"stubborn.breaker.state=half-open,stubborn.delegate=east": 0,
		"stubborn.breaker.state=closed,stubborn.delegate=west":    0,
		"stubborn.breaker.state=open,stubborn.delegate=west":      0,
		"stubborn.breaker.state=half-open,stubborn.delegate=west": 1,
	}, got)

	r.tel.BreakerTransition(BreakerChange{Delegate: "east", From: "half-open", To: "closed", Fleet: true, OpenedBy: "stubborn-abc"})
	for _, dp := range gaugePoints(t, r.reader, "stubborn.delegate.breaker.state") {
		if v, _ := dp.Attributes.Value(delegateKey); v.AsString() == "east" {
			st, _ := dp.Attributes.Value(breakerStateKey)
			assert.Equal(t, st.AsString() == "closed", dp.Value == 1, "east %s: %d", st.AsString(), dp.Value)
		}
	}
}

// The gauge keeps at most maxBreakers delegates.
func TestBreakerStatesBounded(t *testing.T) {
	var b breakerStates
	for i := range maxBreakers + 10 {
		b.set(fmt.Sprint("d", i), "open")
	}
	assert.Len(t, b.by, maxBreakers)
	b.set("d0", "closed")
	assert.Equal(t, "closed", b.by["d0"], "a known delegate still changes")
}

func collect(t *testing.T, reader *sdkmetric.ManualReader, name string) (metricdata.Aggregation, bool) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m.Data, true
			}
		}
	}
	return nil, false
}

func sumPoints(t *testing.T, reader *sdkmetric.ManualReader, name string) []metricdata.DataPoint[int64] {
	t.Helper()
	data, ok := collect(t, reader, name)
	require.True(t, ok, "%s recorded", name)
	return data.(metricdata.Sum[int64]).DataPoints
}

func gaugePoints(t *testing.T, reader *sdkmetric.ManualReader, name string) []metricdata.DataPoint[int64] {
	t.Helper()
	data, ok := collect(t, reader, name)
	if !ok {
		return nil
	}
	return data.(metricdata.Gauge[int64]).DataPoints
}

// attrString is a set's attributes as k=v, in the set's (sorted) order.
func attrString(s attribute.Set) string {
	var parts []string
	for _, kv := range s.ToSlice() {
		parts = append(parts, string(kv.Key)+"="+kv.Value.Emit())
	}
	return strings.Join(parts, ",")
}
