package spend

import (
	"context"
	"sync"
	"time"
)

// Memory is a Ledger in this process's memory (serve -memory): lost when
// the process ends, as the runs are.
type Memory struct {
	now func() time.Time

	mu      sync.Mutex
	entries map[string]memEntry // by entryKey
	pruned  time.Time           // the last prune
}

type memEntry struct {
	total   float64
	changed time.Time
}

// NewMemory returns an empty ledger whose entries go TTL after their last
// change, by the clock now (nil: the wall clock).
func NewMemory(now func() time.Time) *Memory {
	if now == nil {
		now = time.Now
	}
	return &Memory{now: now, entries: map[string]memEntry{}}
}

// Add implements Ledger.
func (m *Memory) Add(_ context.Context, tenant, periodKey string, cost float64) error {
	key, err := entryKey(tenant, periodKey)
	if err != nil {
		return err
	}
	if err := checkCost(cost); err != nil {
		return err
	}
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pruneLocked(now)
	e := m.entries[key]
	m.entries[key] = memEntry{total: sum(e.total, cost), changed: now}
	return nil
}

// Spent implements Ledger.
func (m *Memory) Spent(_ context.Context, tenant, periodKey string) (float64, error) {
	key, err := entryKey(tenant, periodKey)
	if err != nil {
		return 0, err
	}
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[key]
	if !ok || now.Sub(e.changed) >= TTL {
		return 0, nil
	}
	return e.total, nil
}

// pruneLocked drops the entries past TTL, once a day at most: the map
// holds a tenant's last 35 days or so, not every day since the start.
func (m *Memory) pruneLocked(now time.Time) {
	if now.Sub(m.pruned) < 24*time.Hour {
		return
	}
	m.pruned = now
	for k, e := range m.entries {
		if now.Sub(e.changed) >= TTL {
			delete(m.entries, k)
		}
	}
}
