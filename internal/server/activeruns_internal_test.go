package server

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// A StartRun's reservation is found by its run's observer through a plain
// number in the request's context, counted once, and forgotten when
// released, whether by the run's end or by the start failing.
func TestActiveRunsReservationIsCountedOnce(t *testing.T) {
	a := newActiveRuns()
	obs := a.Observer(nil)
	p := &policy{tenant: "t", maxConcurrent: 2}
	st := &stubbornv1.ControlState{RunId: "r1", Tenant: "t"}

	slot, err := a.reserve(p, 0)
	require.NoError(t, err)
	reqCtx := withReservation(context.Background(), slot)
	_, see := obs.ObserveRun(context.Background(), reqCtx, st, false)
	assert.Equal(t, 1, a.InProgress("t"), "the observer took the reserved slot over, not a second one")

	// A second start fails before its run is observed: its slot goes back.
	other, err := a.reserve(p, 0)
	require.NoError(t, err)
	assert.Equal(t, 2, a.InProgress("t"))
	_, err = a.reserve(p, 0)
	require.Error(t, err, "the tenant's limit counts reservations")
	other.release()
	assert.Equal(t, 1, a.InProgress("t"))

	see(&stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_RunFinished{RunFinished: &stubbornv1.RunFinished{}}})
	slot.release() // the start's own release after the run ended: no second uncount
	assert.Equal(t, 0, a.InProgress("t"))
	assert.Empty(t, a.reserved, "no reservation is kept after its release")

	// A resumed run (no request) is counted whatever the limits.
	_, see = obs.ObserveRun(context.Background(), reqCtx, st, true)
	assert.Equal(t, 1, a.InProgress("t"))
	see(nil)
	assert.Equal(t, 0, a.InProgress("t"))
}
