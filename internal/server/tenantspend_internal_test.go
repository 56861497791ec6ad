package server

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/spend"
)

// flakyLedger refuses its first fails Adds, and counts the Adds.
type flakyLedger struct {
	spend.Ledger
	mu    sync.Mutex
	fails int
	adds  int
	gate  chan struct{} // when set, an Add waits for it
}

func (l *flakyLedger) Add(ctx context.Context, tenant, period string, cost float64) error {
	if l.gate != nil {
		<-l.gate
	}
	l.mu.Lock()
	l.adds++
	fail := l.fails > 0
	if fail {
		l.fails--
	}
	l.mu.Unlock()
	if fail {
		return errors.New("store down")
	}
	return l.Ledger.Add(ctx, tenant, period, cost)
}

func attemptCost(c float64, judges ...float64) *stubbornv1.RunEvent {
	af := &stubbornv1.AttemptFinished{Attempt: &stubbornv1.Attempt{Cost: c}}
	for _, j := range judges {
		af.Calls = append(af.Calls, &stubbornv1.CallCost{Cost: j})
	}
	return &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_AttemptFinished{AttemptFinished: af}}
}

func TestEventCostCountsAttemptsJudgesAndAnalysts(t *testing.T) {
	assert.Equal(t, 1.5, eventCost(attemptCost(1, 0.25, 0.25)))
	assert.Equal(t, 0.5, eventCost(&stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_FailureAnalyzed{FailureAnalyzed: &stubbornv1.FailureAnalyzed{
		AnalysisCost: &stubbornv1.CallCost{Cost: 0.5}}}}))
	assert.Zero(t, eventCost(&stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_AttemptStarted{AttemptStarted: &stubbornv1.AttemptStarted{
		Attempt: &stubbornv1.Attempt{Cost: 9}}}}), "an attempt in flight has not cost anything yet")
	assert.Zero(t, eventCost(nil))
	assert.Zero(t, eventCost(attemptCost(-3)))
	assert.Equal(t, spend.MaxCost, eventCost(attemptCost(1e300)))
}

// Adds the store refuses are written once it takes them again: none is
// lost, none counted twice; adds made meanwhile are summed into one write
// per tenant and period.
func TestSpendRefusedByTheStoreIsWrittenLaterAndCoalesced(t *testing.T) {
	now := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	mem := spend.NewMemory(func() time.Time { return now })
	l := &flakyLedger{Ledger: mem, fails: 2, gate: make(chan struct{})}
	ts := newTenantSpend(l, func() time.Time { return now }, slog.New(slog.DiscardHandler))
	see := func() func(*stubbornv1.RunEvent) {
		_, see := ts.observer(nil).ObserveRun(context.Background(), context.Background(), &stubbornv1.ControlState{Tenant: "acme"}, false)
		return see
	}()
	see(attemptCost(1)) // the writer takes it and waits at the gate
	for range 100 {
		see(attemptCost(0.25)) // meanwhile: summed
	}
	assert.Equal(t, 26.0, ts.spent(context.Background(), "acme", "day.2026-12-05"), "this server's own spend counts before it is written")
	close(l.gate)
	require.Eventually(t, func() bool {
		got, _ := mem.Spent(context.Background(), "acme", "day.2026-12-05")
		return got == 26
	}, 10*time.Second, 10*time.Millisecond)
	ts.close()
	for _, k := range []string{"day.2026-12-05", "month.2026-12"} {
		got, err := mem.Spent(context.Background(), "acme", k)
		require.NoError(t, err)
		assert.Equal(t, 26.0, got, k)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	assert.LessOrEqual(t, l.adds, 8, "a few writes, not one per event")
}

// An event is seen with the run's lock held: a store that does not answer
// never holds it up.
func TestChargingNeverWaitsForTheStore(t *testing.T) {
	now := func() time.Time { return time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC) }
	l := &flakyLedger{Ledger: spend.NewMemory(now), gate: make(chan struct{})}
	ts := newTenantSpend(l, now, slog.New(slog.DiscardHandler))
	_, see := ts.observer(nil).ObserveRun(context.Background(), context.Background(), &stubbornv1.ControlState{Tenant: "acme"}, false)
	done := make(chan struct{})
	go func() {
		for range 10000 {
			see(attemptCost(0.001))
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("charging waited for the store")
	}
	close(l.gate)
	ts.close()
}
