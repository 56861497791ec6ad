package jsstore

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
)

// garbage is no protobuf message at all (a field tag of wire type 7).
var garbage = []byte{0x0f, 0xff, 0xff, 0xff, 0xff, 0x01, 0x02}

// damage writes garbage over run id's saved state and appends garbage to
// its journal, straight through JetStream: neither decodes any more.
func damage(t *testing.T, nc *nats.Conn, id string) {
	t.Helper()
	ctx := runstest.Ctx(t)
	_, err := runstest.StatesBucket(t, nc).Put(ctx, id, garbage)
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.Publish(ctx, "stubborn.events."+id, garbage)
	require.NoError(t, err)
}

// TestAnUnreadableRunCostsOnlyThatRun: of a store's runs, one whose saved
// state and journal no longer decode (issue 30: one such run made every
// listing of every tenant INTERNAL, for good). A server that starts on the
// store (its index reconciled from the states) lists every other run of
// each tenant, in both views, and logs an ERROR naming the damaged one;
// GetRun of it is ErrUnreadable naming it; it is not another tenant's to
// delete, and its own tenant deletes it. A run whose saved state alone is
// damaged is read from its journal.
func TestAnUnreadableRunCostsOnlyThatRun(t *testing.T) {
	e := startEmbedded(t)
	storeA, ncA := openJetStream(t, e, JetStreamConfig{Lease: time.Second, SaveFinalStates: true})
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{
		"a": {controlstest.OK("1"), controlstest.OK("2"), controlstest.OK("3"), controlstest.OK("4")},
	})
	mA := runstest.NewManager(t, d, runs.Config{Store: storeA, Lease: time.Second, Owner: "a"})
	ctx := runstest.Ctx(t)
	ctxA, ctxB := runs.WithTenant(ctx, "tenant-a"), runs.WithTenant(ctx, "tenant-b")
	<-storeA.IndexReconciled()

	run := func(ctx context.Context, key string) string {
		st, _, err := mA.Start(ctx, runs.Task{Brief: "brief"}, runstest.Chain("a"), &stubbornv1.RunOptions{IdempotencyKey: key})
		require.NoError(t, err)
		require.NoError(t, mA.Watch(ctx, st.GetRunId(), 0, func(runs.Event) error { return nil }))
		return st.GetRunId()
	}
	bad, good, stale := run(ctxA, "bad-key"), run(ctxA, ""), run(ctxA, "")
	other := run(ctxB, "")
	require.Eventually(t, func() bool { // indexed (in the store, not only in a's memory)
		found := false
		_, err := storeA.Summaries(ctx, "tenant-a", func(s *stubbornv1.RunSummary) bool {
			found = found || s.GetRunId() == bad
			return true
		})
		return err == nil && found
	}, 10*time.Second, 10*time.Millisecond)
	damage(t, ncA, bad)
	_, err := runstest.StatesBucket(t, ncA).Put(ctx, stale, garbage)
	require.NoError(t, err)

	logs, logger := runstest.NewCapturedLogs()
	storeB, _ := openJetStream(t, e, JetStreamConfig{Lease: time.Second, Logger: logger})
	mB := runstest.NewManager(t, d, runs.Config{Store: storeB, Lease: time.Second, Owner: "b", Logger: logger})
	<-storeB.IndexReconciled()
	require.True(t, storeB.IndexReady(), "the index was reconciled, the damaged run aside")

	ids := func(list []*stubbornv1.ControlState) []string {
		var out []string
		for _, st := range list {
			out = append(out, st.GetRunId())
		}
		return out
	}
	full, _, err := mB.List(ctxA, stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED, 100, "")
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{good, stale}, ids(full), "every run of a but the damaged one")
	full, _, err = mB.List(ctxB, stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED, 100, "")
	require.NoError(t, err)
	assert.Equal(t, []string{other}, ids(full))
	assert.Contains(t, runstest.Summaries(t, ctxA, mB), good)
	assert.Contains(t, runstest.Summaries(t, ctxB, mB), other)
	named := false
	for _, l := range logs.Lines(slog.LevelError) {
		named = named || l.Attrs["run_id"] == bad
	}
	assert.True(t, named, "an ERROR names the damaged run: %v", logs.Lines(slog.LevelError))

	_, err = mB.Get(ctxA, bad)
	require.ErrorIs(t, err, runs.ErrUnreadable)
	assert.Contains(t, err.Error(), bad)
	st, err := mB.Get(ctxA, stale)
	require.NoError(t, err, "a damaged saved state: the journal's end is read")
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus())

	assert.ErrorIs(t, mB.Delete(ctxB, bad, false), runs.ErrNotFound, "the index says it is a's")
	require.NoError(t, mB.Delete(ctxA, bad, false))
	for _, m := range []*runs.Manager{mA, mB} {
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			_, err := m.Get(ctxA, bad)
			assert.ErrorIs(c, err, runs.ErrNotFound)
		}, 10*time.Second, 10*time.Millisecond)
	}
	assert.NotContains(t, runstest.Summaries(t, ctxA, mB), bad)
	again, existing, err := mB.Start(ctxA, runs.Task{Brief: "brief"}, runstest.Chain("a"), &stubbornv1.RunOptions{IdempotencyKey: "bad-key"})
	require.NoError(t, err)
	assert.False(t, existing, "its idempotency key was forgotten with it")
	assert.NotEqual(t, bad, again.GetRunId())
}
