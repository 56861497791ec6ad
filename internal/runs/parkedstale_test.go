package runs_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
	"github.com/stubbornhq/stubborn/internal/runs/memstore"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// deadTo is a store through which a server sees owner's heartbeats as
// expired while they still land: its view lags (the long fault suite's
// nats-sigstop, a replica whose beats were late at the moment another
// looked).
type deadTo struct {
	store.Store
	owner string
}

func (s deadTo) Live(ctx context.Context, fn func(owner string, gone bool)) error {
	return s.Store.Live(ctx, func(owner string, gone bool) {
		if owner != s.owner {
			fn(owner, gone)
		}
	})
}

func (s deadTo) Alive(ctx context.Context, owner string) (bool, error) {
	if owner == s.owner {
		return false, nil
	}
	return s.Store.Alive(ctx, owner)
}

// TestAParkedCopyTakenOverUnawaresIsNotServed (make chaos, nats-sigstop):
// a's run is parked awaiting a decision when b, seeing a's heartbeats
// late, takes it over, and it is decided through b. a's lease never
// lapsed, so nothing made it look at its parked copy again: GetRun
// through a kept answering AWAITING_DECISION, and WatchRun through a
// sent the journal up to the wait and then nothing, for good. A parked
// copy is now checked against the store before it is served.
func TestAParkedCopyTakenOverUnawaresIsNotServed(t *testing.T) {
	// On the memory store: a wrapper of the JetStream store hides the
	// interfaces the manager finds on it. The fault suite covers JetStream.
	const lease = 300 * time.Millisecond
	mem := memstore.NewMemory(lease)
	open := func() store.Store { return mem }
	d := runstest.NotSent()
	// On the real clock, so that the run parks for its decision.
	a := runstest.NewManager(t, d, runs.Config{Store: open(), Lease: lease, Owner: "a", Clock: controls.RealClock{}})
	id := runstest.AwaitingOn(t, a)
	b := runstest.NewManager(t, d, runs.Config{Store: deadTo{open(), "a"}, Lease: lease, Owner: "b", Clock: controls.RealClock{}})
	require.Eventually(t, func() bool { return b.Owns(id) }, 10*time.Second, 5*time.Millisecond, "b takes the run over")
	require.Eventually(t, func() bool {
		_, err := b.Decide(runstest.Ctx(t), id, stubbornv1.Decision_DECISION_FAIL, nil)
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "decided through b")
	reader := open()
	require.Eventually(t, func() bool {
		return runstest.JournalHas(t, reader, id, func(ev *stubbornv1.RunEvent) bool { return ev.GetRunFinished() != nil })
	}, 10*time.Second, 5*time.Millisecond, "the run ends on b")

	got, err := a.Get(runstest.Ctx(t), id)
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, got.GetStatus(), "GetRun through a")
	end := runstest.Final(t, watchToEnd(t, a, id)) // WatchRun through a ends

	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, end.GetStatus())
}
