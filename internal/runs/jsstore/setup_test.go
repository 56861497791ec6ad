package jsstore

import (
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
)

// TestStoresOpenedTogetherConverge opens eight stores at the same moment
// on one fresh embedded server, each on a connection of its own, as
// replicas started together do: every one creates or binds to the same
// stream and buckets, and what one writes the others read (issue 29, item
// 7).
func TestStoresOpenedTogetherConverge(t *testing.T) {
	e := startEmbedded(t)
	const n = 8
	stores := make([]*JetStream, n)
	errs := make([]error, n)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		nc, err := nats.Connect("", nats.InProcessServer(e.Server))
		require.NoError(t, err)
		wg.Go(func() {
			<-gate
			stores[i], errs[i] = NewJetStream(runstest.Ctx(t), nc, JetStreamConfig{Lease: time.Second})
			if errs[i] != nil {
				nc.Close()
			}
		})
	}
	close(gate)
	wg.Wait()
	for i, s := range stores {
		require.NoError(t, errs[i], "store %d", i)
		t.Cleanup(func() { _ = s.Close() })
	}
	ctx := runstest.Ctx(t)
	for i, s := range stores {
		run := "run_together" + string(rune('a'+i))
		require.NoError(t, s.Claim(ctx, run, "owner", nil))
		driver, err := stores[(i+1)%n].Driver(ctx, run)
		require.NoError(t, err)
		assert.Equal(t, "owner", driver, "store %d's claim, read through the next", i)
	}
}
