package spend_test

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/internal/fleetguard/fleetguardtest"
	"github.com/stubbornhq/stubborn/internal/spend"
)

func TestPeriodKeysAndResets(t *testing.T) {
	at := time.Date(2026, 12, 5, 23, 59, 59, 0, time.FixedZone("x", -3*3600)) // 2026-12-06T02:59:59Z
	assert.Equal(t, "day.2026-12-06", spend.PeriodKey(spend.Day, at))
	assert.Equal(t, "month.2026-12", spend.PeriodKey(spend.Month, at))
	assert.Equal(t, time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC), spend.Resets(spend.Day, at))
	assert.Equal(t, time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), spend.Resets(spend.Month, at))
	// The last instant of a period is in it; its reset is the next one's first.
	end := time.Date(2026, 2, 28, 23, 59, 59, 999999999, time.UTC)
	assert.Equal(t, "day.2026-02-28", spend.PeriodKey(spend.Day, end))
	assert.Equal(t, "day.2026-03-01", spend.PeriodKey(spend.Day, spend.Resets(spend.Day, end)))
	assert.Equal(t, "month.2026-03", spend.PeriodKey(spend.Month, spend.Resets(spend.Month, end)))
}

// ledgers are the implementations each contract test runs on.
func ledgers(t *testing.T) map[string]func(t *testing.T) spend.Ledger {
	return map[string]func(t *testing.T) spend.Ledger{
		"memory": func(t *testing.T) spend.Ledger { return spend.NewMemory(nil) },
		"jetstream": func(t *testing.T) spend.Ledger {
			n := fleetguardtest.StartNATS(t)
			return openKV(t, n.ClientURL())
		},
	}
}

func openKV(t *testing.T, url string) *spend.KV {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	l, err := spend.OpenKV(context.Background(), nc, spend.KVConfig{})
	require.NoError(t, err)
	return l
}

func TestLedgerAddsAndKeepsTenantsAndPeriodsApart(t *testing.T) {
	for name, open := range ledgers(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			l := open(t)
			got, err := l.Spent(ctx, "acme", "day.2026-12-05")
			require.NoError(t, err)
			assert.Zero(t, got, "no entry is 0")
			require.NoError(t, l.Add(ctx, "acme", "day.2026-12-05", 1.5))
			require.NoError(t, l.Add(ctx, "acme", "day.2026-12-05", 0.25))
			require.NoError(t, l.Add(ctx, "acme", "day.2026-12-06", 7))
			require.NoError(t, l.Add(ctx, "a.cme", "day.2026-12-05", 3))
			require.NoError(t, l.Add(ctx, "acme.", "day.2026-12-05", 5))
			require.NoError(t, l.Add(ctx, "", "day.2026-12-05", 11))
			for _, c := range []struct {
				tenant, key string
				want        float64
			}{
				{"acme", "day.2026-12-05", 1.75},
				{"acme", "day.2026-12-06", 7},
				{"acme", "month.2026-12", 0},
				{"a.cme", "day.2026-12-05", 3},
				{"acme.", "day.2026-12-05", 5},
				{"", "day.2026-12-05", 11},
			} {
				got, err := l.Spent(ctx, c.tenant, c.key)
				require.NoError(t, err)
				assert.Equal(t, c.want, got, "%q %s", c.tenant, c.key)
			}
		})
	}
}

func TestLedgerRefusesWhatIsNotATenantPeriodOrCost(t *testing.T) {
	for name, open := range ledgers(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			l := open(t)
			for _, tenant := range []string{"_default", ".a", "a b", "a*", "a>", string(make([]byte, 65))} {
				assert.ErrorIs(t, l.Add(ctx, tenant, "day.2026-12-05", 1), spend.ErrTenant, "%q", tenant)
				_, err := l.Spent(ctx, tenant, "day.2026-12-05")
				assert.ErrorIs(t, err, spend.ErrTenant, "%q", tenant)
			}
			for _, key := range []string{"", "day", "week.2026-12", "day.2026-12", "month.2026-12-05", "day.2026-12-05.x"} {
				assert.ErrorIs(t, l.Add(ctx, "acme", key, 1), spend.ErrPeriodKey, "%q", key)
			}
			for _, cost := range []float64{-1, math.NaN(), math.Inf(1), 2e12} {
				assert.ErrorIs(t, l.Add(ctx, "acme", "day.2026-12-05", cost), spend.ErrCost, "%v", cost)
			}
		})
	}
}

func TestLedgerConcurrentAddsSumExactly(t *testing.T) {
	for name, open := range ledgers(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			l := open(t)
			const workers, each = 8, 10
			var wg sync.WaitGroup
			for range workers {
				wg.Go(func() {
					for range each {
						assert.NoError(t, l.Add(ctx, "acme", "month.2026-12", 0.125))
					}
				})
			}
			wg.Wait()
			got, err := l.Spent(ctx, "acme", "month.2026-12")
			require.NoError(t, err)
			assert.Equal(t, workers*each*0.125, got)
		})
	}
}

func TestKVTwoReplicasAddingAtOnceGiveTheSumAndARestartKeepsIt(t *testing.T) {
	n := fleetguardtest.StartNATS(t)
	a, b := openKV(t, n.ClientURL()), openKV(t, n.ClientURL()) // two connections: two replicas
	ctx := context.Background()
	const each = 40
	var wg sync.WaitGroup
	for _, l := range []*spend.KV{a, b} {
		wg.Go(func() {
			for range each {
				assert.NoError(t, l.Add(ctx, "acme", "day.2026-12-05", 0.5))
			}
		})
	}
	wg.Wait()
	for _, l := range []*spend.KV{a, b} {
		got, err := l.Spent(ctx, "acme", "day.2026-12-05")
		require.NoError(t, err)
		assert.Equal(t, 2*each*0.5, got)
	}

	n.Shutdown()
	n.WaitForShutdown()
	n.Restart(t)
	c := openKV(t, n.ClientURL())
	got, err := c.Spent(ctx, "acme", "day.2026-12-05")
	require.NoError(t, err)
	assert.Equal(t, 2*each*0.5, got, "kept across a restart of the store")
	require.NoError(t, c.Add(ctx, "acme", "day.2026-12-05", 1))
	got, err = a.Spent(ctx, "acme", "day.2026-12-05") // the first replica, reconnected
	require.NoError(t, err)
	assert.Equal(t, 2*each*0.5+1, got)
}

func TestMemoryEntriesExpire(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	m := spend.NewMemory(func() time.Time { return now })
	ctx := context.Background()
	require.NoError(t, m.Add(ctx, "acme", "month.2026-12", 4))
	now = now.Add(spend.TTL - time.Second)
	got, _ := m.Spent(ctx, "acme", "month.2026-12")
	assert.Equal(t, 4.0, got)
	now = now.Add(time.Second)
	got, _ = m.Spent(ctx, "acme", "month.2026-12")
	assert.Zero(t, got, "gone TTL after its last change")
}

func TestLedgerTotalIsBounded(t *testing.T) {
	m := spend.NewMemory(nil)
	ctx := context.Background()
	for range 2000 {
		require.NoError(t, m.Add(ctx, "acme", "day.2026-12-05", spend.MaxCost))
	}
	got, _ := m.Spent(ctx, "acme", "day.2026-12-05")
	assert.Equal(t, spend.MaxTotal, got)
}
