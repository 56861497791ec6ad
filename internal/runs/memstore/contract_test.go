package memstore_test

import (
	"testing"
	"time"

	"github.com/stubbornhq/stubborn/internal/runs/memstore"
	"github.com/stubbornhq/stubborn/internal/runs/store"
	"github.com/stubbornhq/stubborn/internal/runs/store/storetest"
)

// TestContract holds the memory store to the Store contract. Every
// server of a process shares one Memory: each view is the same store.
func TestContract(t *testing.T) {
	storetest.Run(t, func(_ *testing.T, lease time.Duration) func() store.Store {
		m := memstore.NewMemory(lease)
		return func() store.Store { return m }
	})
}
