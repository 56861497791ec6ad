package runs_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"github.com/stubbornhq/stubborn/internal/runs/internal/jstest"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
	"github.com/stubbornhq/stubborn/internal/runs/jsstore"
)

// TestReleasedOwnersLeaveNothingBehind: a released run's owner entry goes
// from the owners bucket's stream, markers and all, within a few leases —
// not after the retention — so that a full takeover scan reads the live
// runs only, however many runs finished in the last days.
func TestReleasedOwnersLeaveNothingBehind(t *testing.T) {
	store, nc := jstest.Open(t, jsstore.JetStreamConfig{Lease: time.Second}) // retention: the default 7 days

	ctx := runstest.Ctx(t)
	for i := range 20 {
		id := fmt.Sprintf("run%d", i)
		require.NoError(t, store.Claim(ctx, id, "server-a", nil))
		if i%2 == 0 {
			require.NoError(t, store.Release(ctx, id))
		}
	}
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	owners, err := js.Stream(ctx, "KV_stubborn_owners")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := owners.Info(context.Background())
		return err == nil && info.State.Msgs == 10
	}, 15*time.Second, 100*time.Millisecond, "only the 10 unreleased runs' entries are left")
	n := 0
	require.NoError(t, store.Owners(ctx, func(runID, owner string) bool {
		n++
		require.Equal(t, "server-a", owner)
		return true
	}))
	require.Equal(t, 10, n)
}
