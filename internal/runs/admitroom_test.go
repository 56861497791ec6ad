package runs_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/jstest"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
	"github.com/stubbornhq/stubborn/internal/runs/jsstore"
)

// TestAFullStoreOfFinishedRunsAdmitsAtOnce is issue 30's item 9: with
// -max-bytes 300000, two runs in flight, then 60 runs with 20 KB briefs one
// after the other, each is accepted at its first try: admission that finds
// the store full purges the oldest finished runs itself (the janitor's own
// pass is a minute away, and would not purge by size below 80 % anyway).
// A store that runs in flight fill still refuses, at once, and keeps them
// whole; once one of them finishes, there is room again.
func TestAFullStoreOfFinishedRunsAdmitsAtOnce(t *testing.T) {
	const maxBytes = 300000
	// PurgeEvery 0: the default, a minute (a tenth of the default
	// retention, at most a minute), as serve -max-bytes runs it.
	e := jstest.Start(t)
	// A lease no loaded machine lapses: with 1 s, reader once took m's
	// runs in flight over when m's heartbeats were late under -race; their
	// calls, not idempotent, were not made again, the runs ended, and
	// their room let a run in that the test expects refused.
	const lease = 10 * time.Second
	cfg := jsstore.JetStreamConfig{MaxBytes: maxBytes, Lease: lease}
	store, nc := jstest.OpenOn(t, e, cfg)
	g := runstest.NewGated(controls.DelegateInfo{})
	m := runstest.NewManager(t, g, runs.Config{Store: store, Lease: lease})
	// A server that holds none of the runs in memory reads them from the
	// store.
	readerStore, _ := jstest.OpenOn(t, e, cfg)
	reader := runstest.NewManager(t, g, runs.Config{Store: readerStore, Lease: lease})
	ctx := runstest.Ctx(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	events, err := js.Stream(ctx, "STUBBORN_EVENTS")
	require.NoError(t, err)

	live := func(brief string) (string, error) {
		t.Helper()
		st, err := runstest.Start(m, context.Background(), brief, runstest.Chain("d"), nil)
		if err != nil {
			return "", err
		}
		require.Eventually(t, func() bool { return g.Called(brief) == 1 }, 5*time.Second, time.Millisecond)
		return st.GetRunId(), nil
	}
	var inFlight []string
	for i := range 2 {
		id, err := live(fmt.Sprintf("in flight %d", i))
		require.NoError(t, err)
		inFlight = append(inFlight, id)
	}

	pad := strings.Repeat("x", 20<<10)
	var finished []string
	for i := range 60 {
		brief := fmt.Sprintf("finished %d %s", i, pad)
		begin := time.Now()
		st, err := runstest.Start(m, context.Background(), brief, runstest.Chain("d"), nil)
		require.NoError(t, err, "run %d, after %d finished runs", i, len(finished))
		assert.Less(t, time.Since(begin), 2500*time.Millisecond, "run %d was admitted, but late", i)
		g.Answer(brief, controlstest.OK("ok"))
		runstest.Final(t, runstest.WatchAll(t, m, st.GetRunId(), 0))
		finished = append(finished, st.GetRunId())
		info, err := events.Info(ctx)
		require.NoError(t, err)
		require.LessOrEqual(t, info.State.Bytes, uint64(maxBytes))
	}
	info, err := events.Info(ctx)
	require.NoError(t, err)
	assert.Less(t, info.State.NumSubjects, uint64(10), "finished runs were purged")
	_, err = reader.Get(ctx, finished[0])
	assert.ErrorIs(t, err, runs.ErrNotFound, "the oldest finished run is purged")

	// Runs in flight with 20 KB briefs until they fill the store: the
	// finished runs make room for them, then nothing can.
	var full error
	for i := 0; full == nil; i++ {
		require.Less(t, i, 10, "the store never filled up with runs in flight")
		begin := time.Now()
		id, err := live(fmt.Sprintf("big in flight %d %s", i, pad))
		if errors.Is(err, runs.ErrStoreFull) {
			full = err
			assert.Less(t, time.Since(begin), 2500*time.Millisecond, "refused, but late")
			break
		}
		require.NoError(t, err)
		inFlight = append(inFlight, id)
	}
	require.Greater(t, len(inFlight), 2, "a run in flight was admitted after the finished runs")
	assert.Contains(t, full.Error(), "-max-bytes 300000")
	assert.Contains(t, full.Error(), "runs in flight fill it")
	for _, id := range finished {
		_, err := reader.Get(ctx, id)
		assert.ErrorIs(t, err, runs.ErrNotFound, "finished run %s is purged", id)
	}
	// Refused again, at once: a store of runs in flight is not read
	// through on every request.
	for range 20 {
		begin := time.Now()
		_, err := runstest.Start(m, context.Background(), "refused "+pad, runstest.Chain("d"), nil)
		require.ErrorIs(t, err, runs.ErrStoreFull)
		assert.Less(t, time.Since(begin), 500*time.Millisecond)
	}
	for _, id := range inFlight {
		st, err := reader.Get(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_RUNNING, st.GetStatus())
	}

	// A run in flight finishes: room again, within a second (admission
	// looked through the store of runs in flight less than a second ago).
	last := inFlight[len(inFlight)-1]
	g.Answer(fmt.Sprintf("big in flight %d %s", len(inFlight)-3, pad), controlstest.OK("ok"))
	runstest.Final(t, runstest.WatchAll(t, m, last, 0))
	require.Eventually(t, func() bool {
		owner, err := store.Driver(ctx, last)
		return err == nil && owner == ""
	}, 5*time.Second, time.Millisecond, "the finished run is let go of")
	// Two more: the first fits beside the finished run, the second only
	// once it is purged.
	for i := range 2 {
		brief := fmt.Sprintf("again %d %s", i, pad)
		var again *stubbornv1.ControlState
		require.Eventually(t, func() bool {
			again, err = runstest.Start(m, context.Background(), brief, runstest.Chain("d"), nil)
			return err == nil
		}, 3*time.Second, 50*time.Millisecond, "no room made: %v", err)
		g.Answer(brief, controlstest.OK("ok"))
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, runstest.Final(t, runstest.WatchAll(t, m, again.GetRunId(), 0)).GetStatus())
	}
	_, err = reader.Get(ctx, last)
	assert.ErrorIs(t, err, runs.ErrNotFound, "the run that finished made the room")
	for _, id := range inFlight[:len(inFlight)-1] {
		st, err := reader.Get(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_RUNNING, st.GetStatus())
	}
}

// Runs that find the store full at the same time share admission's purge
// (one at a time, the others waiting for it): all of them are accepted
// while finished runs are left to purge.
func TestConcurrentRunsInAFullStoreAreAdmitted(t *testing.T) {
	const maxBytes = 300000
	store, _ := jstest.Open(t, jsstore.JetStreamConfig{MaxBytes: maxBytes, Lease: time.Second})
	g := runstest.NewGated(controls.DelegateInfo{})
	m := runstest.NewManager(t, g, runs.Config{Store: store, Lease: time.Second})
	pad := strings.Repeat("x", 20<<10)
	for i := range 6 {
		brief := fmt.Sprintf("finished %d %s", i, pad)
		st, err := runstest.Start(m, context.Background(), brief, runstest.Chain("d"), nil)
		require.NoError(t, err, "run %d", i)
		g.Answer(brief, controlstest.OK("ok"))
		runstest.Final(t, runstest.WatchAll(t, m, st.GetRunId(), 0))
	}
	small := strings.Repeat("y", 4<<10)
	type started struct {
		brief, id string
		err       error
	}
	out := make(chan started, 8)
	for i := range cap(out) {
		go func() {
			brief := fmt.Sprintf("concurrent %d %s", i, small)
			st, err := runstest.Start(m, context.Background(), brief, runstest.Chain("d"), nil)
			out <- started{brief, st.GetRunId(), err}
		}()
	}
	for range cap(out) {
		r := <-out
		if !assert.NoError(t, r.err) {
			continue
		}
		g.Answer(r.brief, controlstest.OK("ok"))
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, runstest.Final(t, runstest.WatchAll(t, m, r.id, 0)).GetStatus())
	}
}
