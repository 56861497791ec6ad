package telemetry

import (
	"testing"

	"github.com/stretchr/testify/assert"
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
