package fleetguard_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/internal/fleetguard"
	"github.com/stubbornhq/stubborn/internal/fleetguard/fleetguardtest"
)

// Two replicas race to change one breaker record: every change is made
// once, on the latest record (compare-and-set), and the watch brings each
// replica the other's.
func TestChangeBreakerRace(t *testing.T) {
	n := fleetguardtest.StartNATS(t)
	f1, f2 := n.Fleet(t, "r1", nil), n.Fleet(t, "r2", nil)
	ctx := context.Background()
	_, wrote, err := f1.ChangeBreaker(ctx, "d", func(fleetguard.Breaker) (fleetguard.Breaker, bool) {
		return fleetguard.Breaker{State: fleetguard.StateHalfOpen, ProbesLeft: 5, Epoch: 1}, true
	})
	require.NoError(t, err)
	require.True(t, wrote)
	var taken atomic.Int32
	var wg sync.WaitGroup
	for i := range 20 {
		f := f1
		if i%2 == 1 {
			f = f2
		}
		wg.Go(func() {
			_, took, err := f.ChangeBreaker(ctx, "d", func(cur fleetguard.Breaker) (fleetguard.Breaker, bool) {
				if cur.ProbesLeft <= 0 {
					return cur, false
				}
				cur.ProbesLeft--
				return cur, true
			})
			assert.NoError(t, err)
			if took {
				taken.Add(1)
			}
		})
	}
	wg.Wait()
	assert.EqualValues(t, 5, taken.Load(), "probes taken in all")
	require.Eventually(t, func() bool {
		a, _ := f1.Breaker("d")
		b, _ := f2.Breaker("d")
		return a.ProbesLeft == 0 && b.ProbesLeft == 0
	}, 2*time.Second, 10*time.Millisecond)
}

// The watch tells a replica of the records another one wrote, not its own.
func TestOnBreakerSeesOthersWrites(t *testing.T) {
	n := fleetguardtest.StartNATS(t)
	f1, f2 := n.Fleet(t, "r1", nil), n.Fleet(t, "r2", nil)
	seen := make(chan fleetguard.Breaker, 4)
	f1.SetOnBreaker(func(name string, _, rec fleetguard.Breaker) { seen <- rec })
	_, _, err := f2.ChangeBreaker(context.Background(), "d", func(fleetguard.Breaker) (fleetguard.Breaker, bool) {
		return fleetguard.Breaker{State: fleetguard.StateOpen, OpenedBy: "r2", Reason: "down"}, true
	})
	require.NoError(t, err)
	select {
	case rec := <-seen:
		assert.Equal(t, "r2", rec.OpenedBy)
		assert.Equal(t, fleetguard.StateOpen, rec.State)
	case <-time.After(time.Second):
		t.Fatal("the other replica's open breaker did not reach r1 within 1s")
	}
	_, _, err = f1.ChangeBreaker(context.Background(), "d", func(fleetguard.Breaker) (fleetguard.Breaker, bool) {
		return fleetguard.Breaker{}, true
	})
	require.NoError(t, err)
	select {
	case rec := <-seen:
		t.Fatalf("r1 was told of its own write: %+v", rec)
	case <-time.After(200 * time.Millisecond):
	}
}

// Replicas leasing at once from one ledger are granted the limit in all,
// not more; a lease's unused calls given back are granted again; grants
// age out after the window.
func TestLeaseRace(t *testing.T) {
	n := fleetguardtest.StartNATS(t)
	fs := []*fleetguard.Fleet{n.Fleet(t, "r1", nil), n.Fleet(t, "r2", nil), n.Fleet(t, "r3", nil)}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ctx := context.Background()
	var granted atomic.Int64
	var wg sync.WaitGroup
	for i := range 30 {
		wg.Go(func() {
			n, _, err := fs[i%3].Lease(ctx, "d", now, 3, 50, 0, fleetguard.Unused{})
			assert.NoError(t, err)
			granted.Add(n)
		})
	}
	wg.Wait()
	assert.EqualValues(t, 50, granted.Load())
	n0, wait, err := fs[0].Lease(ctx, "d", now.Add(30*time.Second), 3, 50, 0, fleetguard.Unused{})
	require.NoError(t, err)
	assert.Zero(t, n0, "the budget is spent")
	assert.Equal(t, 32*time.Second, wait, "until the grants of second 0 age out (61 s + the lease's life)")
	// r1 gives back 2 it did not use: granted again.
	n1, _, err := fs[0].Lease(ctx, "d", now.Add(30*time.Second), 3, 50, 0, fleetguard.Unused{Sec: now.Unix(), N: 2})
	require.NoError(t, err)
	assert.EqualValues(t, 2, n1)
	reqs, _, err := fs[1].Usage(ctx, "d", now.Add(30*time.Second))
	require.NoError(t, err)
	assert.EqualValues(t, 50, reqs)
	n2, _, err := fs[1].Lease(ctx, "d", now.Add(62*time.Second), 3, 50, 0, fleetguard.Unused{})
	require.NoError(t, err)
	assert.EqualValues(t, 3, n2, "second 0's grants aged out")
}

// Tokens counted reach the ledger within the flush interval; a ledger
// over tokens_per_minute grants nothing.
func TestTokensPerMinute(t *testing.T) {
	n := fleetguardtest.StartNATS(t)
	f1, f2 := n.Fleet(t, "r1", nil), n.Fleet(t, "r2", nil)
	now := time.Now()
	f1.CountTokens("d", now.Unix(), 700)
	f1.CountTokens("d", now.Unix(), 400)
	require.Eventually(t, func() bool {
		_, tokens, err := f2.Usage(context.Background(), "d", now)
		return err == nil && tokens == 1100
	}, 3*time.Second, 20*time.Millisecond)
	got, wait, err := f2.Lease(context.Background(), "d", now, 10, 0, 1000, fleetguard.Unused{})
	require.NoError(t, err)
	assert.Zero(t, got)
	assert.Positive(t, wait)
}

// Cut off from its NATS server, a replica says so (Scope) and comes back
// to the fleet's state once the server is back.
func TestScopeFallsBackAndRejoins(t *testing.T) {
	n := fleetguardtest.StartNATS(t)
	f1 := n.Fleet(t, "r1", nil)
	n.Shutdown()
	require.Eventually(t, func() bool { up, _ := f1.Scope(); return !up }, 5*time.Second, 20*time.Millisecond)
	_, why := f1.Scope()
	assert.NotEmpty(t, why)
	_, _, err := f1.ChangeBreaker(context.Background(), "d", func(fleetguard.Breaker) (fleetguard.Breaker, bool) {
		return fleetguard.Breaker{State: fleetguard.StateOpen}, true
	})
	assert.Error(t, err)
	n.Restart(t)
	f2 := n.Fleet(t, "r2", nil)
	_, _, err = f2.ChangeBreaker(context.Background(), "d", func(fleetguard.Breaker) (fleetguard.Breaker, bool) {
		return fleetguard.Breaker{State: fleetguard.StateOpen, OpenedBy: "r2"}, true
	})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		up, _ := f1.Scope()
		rec, _ := f1.Breaker("d")
		return up && rec.OpenedBy == "r2"
	}, 15*time.Second, 50*time.Millisecond, "r1 rejoins and reads the record r2 wrote meanwhile")
}

// A watch whose consumer dies while the replica's connection lives (its
// stream's leader killed, in a cluster) is made again within a couple of
// seconds, not after nats.go's missed heartbeats: the replica sees the
// records written meanwhile.
func TestWatchWhoseConsumerDiedIsMadeAgain(t *testing.T) {
	n := fleetguardtest.StartNATS(t)
	f1, f2 := n.Fleet(t, "r1", nil), n.Fleet(t, "r2", nil)
	nc, err := nats.Connect(n.ClientURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := context.Background()
	stream, err := js.Stream(ctx, "KV_stubborn_guard_breakers")
	require.NoError(t, err)
	var killed int
	for name := range stream.ConsumerNames(ctx).Name() {
		require.NoError(t, stream.DeleteConsumer(ctx, name))
		killed++
	}
	require.Equal(t, 2, killed, "one watch a replica")
	_, _, err = f2.ChangeBreaker(ctx, "d", func(fleetguard.Breaker) (fleetguard.Breaker, bool) {
		return fleetguard.Breaker{State: fleetguard.StateOpen, OpenedBy: "r2"}, true
	})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		rec, _ := f1.Breaker("d")
		return rec.OpenedBy == "r2"
	}, 4*time.Second, 20*time.Millisecond, "r1 sees r2's opening though its watch's consumer died")
}

// A stream whose last sequence is gone (its tail purged) leaves nothing a
// watch can bring: the watch is not made again and again.
func TestWatchOfAPurgedTailStands(t *testing.T) {
	n := fleetguardtest.StartNATS(t)
	f1 := n.Fleet(t, "r1", nil)
	ctx := context.Background()
	_, _, err := f1.ChangeBreaker(ctx, "d", func(fleetguard.Breaker) (fleetguard.Breaker, bool) {
		return fleetguard.Breaker{State: fleetguard.StateOpen, OpenedBy: "r1"}, true
	})
	require.NoError(t, err)
	nc, err := nats.Connect(n.ClientURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	stream, err := js.Stream(ctx, "KV_stubborn_guard_breakers")
	require.NoError(t, err)
	require.NoError(t, stream.Purge(ctx))
	f2 := n.Fleet(t, "r2", nil) // watches the purged stream from the start
	for deadline := time.Now().Add(4 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for _, f := range []*fleetguard.Fleet{f1, f2} {
			up, why := f.Scope()
			require.True(t, up, "%s's watch is not made again over a purged tail: %s", f.Replica(), why)
		}
	}
}
