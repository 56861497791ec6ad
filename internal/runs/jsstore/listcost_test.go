package jsstore

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
)

// TestAListingCostsWhatItReturns (issue 30 item 2): tenant A holds runs
// with large results; tenant B, which has none, lists the full view with
// page_size 1. B's listing decodes no state at all (none of A's) and
// allocates far less than A's results, on the index and before it is
// ready; A's full view pages through every run of A, newest first, one
// state at a time.
func TestAListingCostsWhatItReturns(t *testing.T) {
	const n, resultBytes = 30, 200 << 10
	store, _ := embeddedJetStream(t, JetStreamConfig{Lease: time.Second})
	require.Eventually(t, store.IndexReady, 10*time.Second, 10*time.Millisecond)
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {controlstest.OK(strings.Repeat("x", resultBytes))}})
	m := runstest.NewManager(t, d, runs.Config{Store: store, Lease: time.Second})
	// Thirty runs of 200 KB and sixty listings take more than Ctx's 10 s
	// on a loaded machine under -race: a minute for the whole test.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := runs.WithTenant(ctx, "a")
	b := runs.WithTenant(ctx, "b")
	var ids []string
	for range n {
		st, err := runstest.Start(m, a, "brief", runstest.Chain("a"), nil)
		require.NoError(t, err)
		require.NoError(t, m.Watch(a, st.GetRunId(), 0, func(runs.Event) error { return nil }))
		ids = append(ids, st.GetRunId())
	}
	// The index has every run of A finished: nothing left to index.
	require.Eventually(t, func() bool {
		sums, _, err := m.ListSummaries(a, runs.Filter{}, 100, "")
		if err != nil || len(sums) != n {
			return false
		}
		for _, s := range sums {
			if s.GetStatus() != stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond)
	time.Sleep(100 * time.Millisecond)

	var ms runtime.MemStats
	cost := func() (decodes int64, bytes uint64) {
		runtime.ReadMemStats(&ms)
		d0, b0 := stateDecodes(), ms.TotalAlloc
		list, next, err := m.ListWhere(b, runs.Filter{}, 1, "")
		require.NoError(t, err)
		assert.Empty(t, list)
		assert.Empty(t, next)
		runtime.ReadMemStats(&ms)
		return stateDecodes() - d0, ms.TotalAlloc - b0
	}
	decodes, bytes := cost()
	assert.Zero(t, decodes, "B's listing decodes none of A's states")
	assert.Less(t, bytes, uint64(4*resultBytes), "B's listing allocates a small part of A's results (%d bytes): %d bytes", n*resultBytes, bytes)

	// A's full view, a page of 1 at a time: every run once, newest first,
	// each page one state read.
	var got []string
	token := ""
	for range n + 1 {
		d0 := stateDecodes()
		list, next, err := m.ListWhere(a, runs.Filter{}, 1, token)
		require.NoError(t, err)
		require.Len(t, list, 1)
		assert.LessOrEqual(t, stateDecodes()-d0, int64(1), "a page of 1 reads one state")
		assert.Len(t, list[0].GetResult().GetText(), resultBytes)
		got = append(got, list[0].GetRunId())
		if token = next; token == "" {
			break
		}
	}
	want := make([]string, n)
	for i, id := range ids {
		want[n-1-i] = id
	}
	assert.Equal(t, want, got)

	// Pages of 5: the same runs in the same order.
	got, token = nil, ""
	for range n {
		list, next, err := m.ListWhere(a, runs.Filter{}, 5, token)
		require.NoError(t, err)
		require.LessOrEqual(t, len(list), 5)
		for _, st := range list {
			got = append(got, st.GetRunId())
		}
		if token = next; token == "" {
			break
		}
	}
	assert.Equal(t, want, got)
}
