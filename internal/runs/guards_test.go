package runs_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
)

// oneSlot is a bulkhead of one call, taken for good, that waits for as
// long as it must.
type oneSlot struct {
	slot    chan struct{}
	waiting atomic.Int32
}

func (o *oneSlot) Admit(ctx context.Context, _ string) (func(*stubbornv1.Result, error) string, error) {
	o.waiting.Add(1)
	defer o.waiting.Add(-1)
	select {
	case o.slot <- struct{}{}:
		if err := ctx.Err(); err != nil { // as delegates.Guards: a call whose run ended does not go
			<-o.slot
			return nil, err
		}
		// The slot is never given back: Kill stops the runs one by one,
		// and the call in flight, ended by it, must not let the queued
		// one through before that one is stopped too (a crash would not).
		return func(*stubbornv1.Result, error) string { return "" }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// A call still waiting behind a delegate's bulkhead when its server dies
// was never sent, and left no attempt on record: the server that resumes
// the run makes it, though the delegate is neither idempotent nor
// read_only. The call that was in flight is interrupted, and not made
// again.
func TestAQueuedCallWasNeverSent(t *testing.T) {
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			const lease = 200 * time.Millisecond
			open := newStore(t, lease)
			g := runstest.NewGated(controls.DelegateInfo{}) // neither idempotent nor read_only
			slot := &oneSlot{slot: make(chan struct{}, 1)}
			a, err := runs.New(runs.Config{Store: open(), Lease: lease, Owner: "a",
				Bind: func(context.Context) (runs.Deps, func()) { return runs.Deps{Delegates: g, Guards: slot}, nil }})
			require.NoError(t, err)
			inFlight, err := runstest.Start(a, context.Background(), "x", runstest.RetrySpec(2), nil)
			require.NoError(t, err)
			require.Eventually(t, func() bool { return g.Called("x") == 1 }, 5*time.Second, time.Millisecond)
			queued, err := runstest.Start(a, context.Background(), "y", runstest.RetrySpec(2), nil)
			require.NoError(t, err)
			require.Eventually(t, func() bool { return slot.waiting.Load() == 1 }, 5*time.Second, time.Millisecond)
			a.Kill()

			b := runstest.NewManager(t, g, runs.Config{Store: open(), Lease: lease, Owner: "b", SoleOwner: true})
			g.Answer("y", controlstest.OK("done"))
			queuedEnd := runstest.Final(t, runstest.WatchAll(t, b, queued.GetRunId(), 0))
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, queuedEnd.GetStatus(), "%v", queuedEnd)
			assert.Len(t, queuedEnd.GetAttemptLog(), 1, "one attempt: the one b made")
			assert.Equal(t, 1, g.Called("y"))

			inFlightEnd := runstest.Final(t, runstest.WatchAll(t, b, inFlight.GetRunId(), 0))
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, inFlightEnd.GetStatus())
			assert.Equal(t, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_INTERRUPTED, inFlightEnd.GetAttemptLog()[0].GetOutcome())
			assert.Equal(t, 1, g.Called("x"), "the interrupted call, maybe done, is not made again")
		})
	}
}
