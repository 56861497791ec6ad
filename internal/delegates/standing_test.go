package delegates

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// Standing reads the breaker and the rate limits without changing them:
// open within the cooldown, the tightest limit's share left, all of it
// without a guard.
func TestStandingReadsTheGuards(t *testing.T) {
	ctx := context.Background()
	clock := controlstest.NewClock()
	zero := Duration(0)
	g := NewGuards(clock)
	g.Configure(&Config{Delegates: []Delegate{
		{Name: "br", CircuitBreaker: &CircuitBreaker{ConsecutiveFailures: 1, Cooldown: Duration(10 * time.Second), Probes: 1}},
		{Name: "rpm", RequestsPerMinute: 4, MaxQueueWait: &zero},
		{Name: "free"},
	}})
	s := StandingGuards{Guards: g}
	assert.Equal(t, controls.Standing{Room: 1}, s.Standing("br"))
	assert.Equal(t, controls.Standing{Room: 1}, s.Standing("free"))
	assert.Equal(t, controls.Standing{Room: 1}, s.Standing("unknown"))

	done, err := g.Admit(ctx, "br")
	require.NoError(t, err)
	done(nil, transientErr)
	assert.True(t, s.Standing("br").Open, "open after its failure")
	assert.True(t, s.Standing("br").Open, "reading it changes nothing")
	require.NoError(t, clock.Sleep(ctx, 10*time.Second))
	assert.False(t, s.Standing("br").Open, "past its cooldown the guards decide (half-open)")

	for i := range 4 {
		assert.InDelta(t, 1-float64(i)/4, s.Standing("rpm").Room, 1e-9, "after %d calls", i)
		done, err := g.Admit(ctx, "rpm")
		require.NoError(t, err)
		done(nil, nil)
	}
	assert.Zero(t, s.Standing("rpm").Room, "spent")
	_, err = g.Admit(ctx, "rpm")
	require.Error(t, err, "the guards agree: spent")
	require.NoError(t, clock.Sleep(ctx, 61*time.Second))
	assert.Equal(t, 1.0, s.Standing("rpm").Room, "the minute's calls aged out")
}

// Traffic counts calls in flight until they end, and keeps a moving
// average of the latencies measured.
func TestTrafficCountsAndAverages(t *testing.T) {
	tr := NewTraffic()
	s := StandingGuards{Traffic: tr}
	call1, call2 := tr.begin("d"), tr.begin("d")
	assert.Equal(t, controls.Standing{InFlight: 2, Room: 1}, s.Standing("d"))
	call1.end(100*time.Millisecond, true)
	call1.end(time.Hour, true) // a second end counts for nothing
	assert.Equal(t, controls.Standing{InFlight: 1, Latency: 100 * time.Millisecond, Room: 1}, s.Standing("d"))
	call2.end(time.Second, false) // not measured: a fast failure
	assert.Equal(t, controls.Standing{Latency: 100 * time.Millisecond, Room: 1}, s.Standing("d"))
	call3 := tr.begin("d")
	call3.end(500*time.Millisecond, true)
	assert.Equal(t, 200*time.Millisecond, s.Standing("d").Latency, "three quarters of the old, a quarter of the new")
	assert.Equal(t, controls.Standing{Room: 1}, s.Standing("other"))
}
