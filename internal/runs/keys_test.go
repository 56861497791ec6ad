package runs_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	runstore "github.com/stubbornhq/stubborn/internal/runs/store"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/jstest"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
	"github.com/stubbornhq/stubborn/internal/runs/jsstore"
)

func keyed(key string, metadata map[string]string) *stubbornv1.RunOptions {
	return &stubbornv1.RunOptions{IdempotencyKey: key, Metadata: metadata}
}

// TestAnIdempotencyKeyStartsOneRun, on each store: a second start with the
// key gets the first run (metadata aside), another request with it is a
// conflict naming that run, another tenant's key is its own, and a key
// without a run (a start that died) is taken over.
func TestAnIdempotencyKeyStartsOneRun(t *testing.T) {
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			store := newStore(t, time.Second)()
			d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {controlstest.OK("x")}})
			m := runstest.NewManager(t, d, runs.Config{Store: store, Lease: time.Second})
			ctx := runs.WithTenant(runstest.Ctx(t), "acme")

			first, existing, err := m.Start(ctx, runs.Task{Brief: "brief"}, runstest.Chain("a"), keyed("order-42", map[string]string{"try": "1"}))
			require.NoError(t, err)
			assert.False(t, existing)
			again, existing, err := m.Start(ctx, runs.Task{Brief: "brief"}, runstest.Chain("a"), keyed("order-42", map[string]string{"try": "2"}))
			require.NoError(t, err)
			assert.True(t, existing)
			assert.Equal(t, first.GetRunId(), again.GetRunId(), "metadata aside, the same request: the same run")

			_, _, err = m.Start(ctx, runs.Task{Brief: "another brief"}, runstest.Chain("a"), keyed("order-42", nil))
			var conflict *runs.KeyConflictError
			require.ErrorAs(t, err, &conflict)
			assert.Equal(t, first.GetRunId(), conflict.RunID)
			assert.ErrorIs(t, err, runs.ErrKeyConflict)

			theirs, existing, err := m.Start(runs.WithTenant(runstest.Ctx(t), "other"), runs.Task{Brief: "brief"}, runstest.Chain("a"), keyed("order-42", nil))
			require.NoError(t, err)
			assert.False(t, existing, "another tenant's key is its own")
			assert.NotEqual(t, first.GetRunId(), theirs.GetRunId())

			// A start that recorded its key and died: after the grace,
			// the next start with the key starts the run.
			ks, ok := store.(interface {
				ReserveKey(context.Context, string, runstore.KeyEntry) (runstore.KeyEntry, bool, error)
			})
			require.True(t, ok)
			_, reserved, err := ks.ReserveKey(ctx, runs.KeyHash("acme", "order-43"), runstore.KeyEntry{RunID: "run_died", Request: "x", At: time.Now().Add(-time.Minute)})
			require.NoError(t, err)
			require.True(t, reserved)
			// (Its request hash is not this request's: the dead start's
			// entry is replaced, not compared.)
			fresh, existing, err := m.Start(ctx, runs.Task{Brief: "brief"}, runstest.Chain("a"), keyed("order-43", nil))
			require.NoError(t, err)
			assert.False(t, existing)
			assert.NotEqual(t, "run_died", fresh.GetRunId())
			again, existing, err = m.Start(ctx, runs.Task{Brief: "brief"}, runstest.Chain("a"), keyed("order-43", nil))
			require.NoError(t, err)
			assert.True(t, existing)
			assert.Equal(t, fresh.GetRunId(), again.GetRunId())
		})
	}
}

// TestConcurrentStartsWithAKeyMakeOneRun: 50 identical starts at once, on
// two servers sharing a JetStream store, make exactly one run, and every
// one of them gets it.
func TestConcurrentStartsWithAKeyMakeOneRun(t *testing.T) {
	e := jstest.Start(t)
	storeA, _ := jstest.OpenOn(t, e, jsstore.JetStreamConfig{Lease: time.Second})
	storeB, _ := jstest.OpenOn(t, e, jsstore.JetStreamConfig{Lease: time.Second})
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {controlstest.OK("x")}})
	mA := runstest.NewManager(t, d, runs.Config{Store: storeA, Lease: time.Second, Owner: "a"})
	mB := runstest.NewManager(t, d, runs.Config{Store: storeB, Lease: time.Second, Owner: "b"})
	ctx := runstest.Ctx(t)

	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		ids   = map[string]int{}
		fresh int
		errs  []error
	)
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := []*runs.Manager{mA, mB}[i%2]
			st, existing, err := m.Start(ctx, runs.Task{Brief: "brief"}, runstest.Chain("a"), keyed("order-42", nil))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			ids[st.GetRunId()]++
			if !existing {
				fresh++
			}
		}()
	}
	wg.Wait()
	require.Empty(t, errors.Join(errs...))
	assert.Len(t, ids, 1, "one run: %v", ids)
	assert.Equal(t, 1, fresh, "started once")
	for id := range ids {
		runstest.Final(t, runstest.WatchAll(t, mA, id, 0))
	}
	assert.Len(t, d.CallsTo("a"), 1, "one delegate call")
}
