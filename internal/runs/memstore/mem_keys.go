package memstore

import (
	"context"
	"sync"
	"time"

	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// memoryKeys keeps a Memory store's idempotency keys.
type memoryKeys struct {
	mu      sync.Mutex
	entries map[string]store.KeyEntry
	rev     uint64
	pruned  time.Time // when the expired entries went last
}

// ReserveKey implements keyStore.
func (s *Memory) ReserveKey(_ context.Context, key string, e store.KeyEntry) (store.KeyEntry, bool, error) {
	k := &s.keys
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.entries == nil {
		k.entries = map[string]store.KeyEntry{}
	}
	now, window := s.clock(), s.keyWindow()
	if now.Sub(k.pruned) > time.Minute {
		// The expired go, a minute at a time: a map no larger than a
		// window's keys, and no scan a start.
		k.pruned = now
		for h, old := range k.entries {
			if now.Sub(old.At) > window {
				delete(k.entries, h)
			}
		}
	}
	if cur, ok := k.entries[key]; ok && now.Sub(cur.At) <= window {
		return cur, false, nil
	}
	k.rev++
	e.Rev = k.rev
	k.entries[key] = e
	return e, true, nil
}

// ReplaceKey implements keyStore.
func (s *Memory) ReplaceKey(_ context.Context, key string, old, e store.KeyEntry) (uint64, error) {
	k := &s.keys
	k.mu.Lock()
	defer k.mu.Unlock()
	if cur, ok := k.entries[key]; !ok || cur.Rev != old.Rev {
		return 0, nil
	}
	k.rev++
	e.Rev = k.rev
	k.entries[key] = e
	return e.Rev, nil
}

// DropKey implements keyStore.
func (s *Memory) DropKey(_ context.Context, key string, e store.KeyEntry) error {
	k := &s.keys
	k.mu.Lock()
	defer k.mu.Unlock()
	if cur, ok := k.entries[key]; ok && cur.Rev == e.Rev {
		delete(k.entries, key)
	}
	return nil
}
