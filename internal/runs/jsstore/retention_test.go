package jsstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// embeddedJetStream opens a JetStream store of cfg on a new embedded
// server, and returns it with its connection.
func embeddedJetStream(t *testing.T, cfg JetStreamConfig) (*JetStream, *nats.Conn) {
	t.Helper()
	return openJetStream(t, startEmbedded(t), cfg)
}

// startEmbedded starts an embedded NATS server for the test.
func startEmbedded(t *testing.T) *Embedded {
	t.Helper()
	e, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	return e
}

// openJetStream opens a JetStream store of cfg on e, on a connection of its
// own (a server's view), and returns it with its connection.
func openJetStream(t *testing.T, e *Embedded, cfg JetStreamConfig) (*JetStream, *nats.Conn) {
	t.Helper()
	nc, err := nats.Connect("", nats.InProcessServer(e.Server))
	require.NoError(t, err)
	store, err := NewJetStream(runstest.Ctx(t), nc, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	return store, nc
}

// TestExpiredRunsAreGoneWhole: past the retention the janitor purges a
// finished run's events, state and owner entry, and the run is not found
// anywhere.
func TestExpiredRunsAreGoneWhole(t *testing.T) {
	store, nc := embeddedJetStream(t, JetStreamConfig{Retention: time.Second, Lease: time.Second})

	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {controlstest.OK("x")}})
	m := runstest.NewManager(t, d, runs.Config{Store: store, Lease: time.Second, MaxFinished: 1})
	st, err := runstest.Start(m, context.Background(), "brief", runstest.Chain("a"), nil)
	require.NoError(t, err)
	runstest.Final(t, runstest.WatchAll(t, m, st.GetRunId(), 0))
	// Later runs push the first out of the server's memory (it keeps the
	// last one retired: the first may retire after the second).
	for i := 0; m.Owns(st.GetRunId()); i++ {
		require.Less(t, i, 10, "the first run is still in memory")
		next, err := runstest.Start(m, context.Background(), "brief", runstest.Chain("a"), nil)
		require.NoError(t, err)
		runstest.Final(t, runstest.WatchAll(t, m, next.GetRunId(), 0))
	}

	require.Eventually(t, func() bool {
		_, err := store.State(runstest.Ctx(t), st.GetRunId())
		evs, eerr := store.Events(runstest.Ctx(t), st.GetRunId(), 0)
		return errors.Is(err, runs.ErrNotFound) && eerr == nil && len(evs) == 0
	}, 20*time.Second, 100*time.Millisecond, "state and events expire")
	_, err = m.Get(runstest.Ctx(t), st.GetRunId())
	assert.ErrorIs(t, err, runs.ErrNotFound)
	list, _, err := m.List(runstest.Ctx(t), stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED, 10, "")
	require.NoError(t, err)
	for _, r := range list {
		assert.NotEqual(t, st.GetRunId(), r.GetRunId())
	}
	// Its summary went with it from the listing index.
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	index, err := js.KeyValue(runstest.Ctx(t), "stubborn_index")
	require.NoError(t, err)
	keys, err := index.ListKeys(runstest.Ctx(t))
	require.NoError(t, err)
	for k := range keys.Keys() {
		assert.False(t, strings.HasSuffix(k, "."+st.GetRunId()), "its summary %s", k)
	}
}

// stateOf encodes a state with that id and status.
func stateOf(t *testing.T, id string, status stubbornv1.RunStatus) []byte {
	t.Helper()
	b, err := proto.Marshal(&stubbornv1.ControlState{RunId: id, Status: status})
	require.NoError(t, err)
	return b
}

// assertGone checks that no trace of run id is left in the store, and that
// a server that does not hold it in memory answers NotFound.
func assertGone(t *testing.T, reader *runs.Manager, store *JetStream, states jetstream.KeyValue, id string) {
	t.Helper()
	_, err := reader.Get(runstest.Ctx(t), id)
	assert.ErrorIs(t, err, runs.ErrNotFound, "run %s", id)
	evs, err := store.Events(runstest.Ctx(t), id, 0)
	require.NoError(t, err)
	assert.Empty(t, evs, "run %s: journal", id)
	assert.Nil(t, runstest.SavedState(t, states, id), "run %s: saved state", id)
}

// assertWhole checks that run id's journal is the events it had (a
// prefix) and goes on from there densely, from run_started.
func assertWhole(t *testing.T, store *JetStream, id string, had []runs.Event) []*stubbornv1.RunEvent {
	t.Helper()
	recorded, err := store.Events(runstest.Ctx(t), id, 0)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(recorded), len(had), "run %s lost events", id)
	for i := range had {
		assert.Equal(t, had[i].Data, recorded[i].Data, "run %s: event %d changed", id, i+1)
	}
	journal := runstest.DecodeAll(t, recorded)
	require.NotEmpty(t, journal)
	assert.NotNil(t, journal[0].GetRunStarted(), "run %s starts with run_started", id)
	for i, ev := range journal {
		assert.EqualValues(t, i+1, ev.GetSeq(), "run %s: dense", id)
		assert.Nil(t, ev.GetRunResumed(), "run %s was never rebuilt", id)
	}
	return journal
}

// TestRetentionPurgesFinishedRunsOnly: past the retention, a finished run
// goes whole, and so does the saved state of a run that never recorded its
// start; a run awaiting a decision and a run in an attempt, however old,
// keep their journal, state and owner, and later finish with their whole
// history, their delegate called once.
func TestRetentionPurgesFinishedRunsOnly(t *testing.T) {
	e := startEmbedded(t)
	// SaveFinalStates: a finished run has a saved state for the janitor
	// to purge too. The janitor's passes are the test's own.
	cfg := JetStreamConfig{Retention: time.Hour, Lease: time.Second, PurgeEvery: -1, SaveFinalStates: true}
	store, nc := openJetStream(t, e, cfg)
	states := runstest.StatesBucket(t, nc)
	g := runstest.NewGated(controls.DelegateInfo{Idempotent: true}) // retried: it may ask for a decision
	m := runstest.NewManager(t, g, runs.Config{Store: store, Lease: time.Second})
	// Another server's view: no run in its memory.
	readerStore, _ := openJetStream(t, e, cfg)
	reader := runstest.NewManager(t, g, runs.Config{Store: readerStore, Lease: time.Second})
	ctx := runstest.Ctx(t)

	done, err := runstest.Start(m, context.Background(), "done", runstest.Chain("d"), nil)
	require.NoError(t, err)
	g.Answer("done", controlstest.OK("ok"))
	runstest.Final(t, runstest.WatchAll(t, m, done.GetRunId(), 0))
	require.Eventually(t, func() bool {
		owner, err := store.Driver(ctx, done.GetRunId())
		return err == nil && owner == "" && runstest.SavedState(t, states, done.GetRunId()) != nil
	}, 5*time.Second, time.Millisecond, "the finished run is let go of")
	asking := runstest.StartAsking(t, m, g, states, "asking")
	going, err := runstest.Start(m, context.Background(), "going", runstest.Chain("d"), nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return g.Called("going") == 1 }, 5*time.Second, time.Millisecond)
	// Saved states without a journal: one of a run that could not record
	// its start (FAILED), one of a run in flight.
	require.NoError(t, store.PutState(ctx, "unstarted", stateOf(t, "unstarted", stubbornv1.RunStatus_RUN_STATUS_FAILED)))
	require.NoError(t, store.PutState(ctx, "inflight", stateOf(t, "inflight", stubbornv1.RunStatus_RUN_STATUS_RUNNING)))
	had := map[string][]runs.Event{}
	for _, id := range []string{asking, going.GetRunId()} {
		had[id], err = store.Events(ctx, id, 0)
		require.NoError(t, err)
		require.NotEmpty(t, had[id])
	}

	n, err := store.PurgeForTest(ctx, time.Now())
	require.NoError(t, err)
	assert.Zero(t, n, "nothing is older than the retention yet")
	st, err := reader.Get(ctx, done.GetRunId())
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus())

	// A month later, for the janitor.
	n, err = store.PurgeForTest(ctx, time.Now().Add(30*24*time.Hour))
	require.NoError(t, err)
	assert.GreaterOrEqual(t, n, 2, "the finished run and the unstarted one's state")
	assertGone(t, reader, store, states, done.GetRunId())
	_, err = store.State(ctx, "unstarted")
	assert.ErrorIs(t, err, runs.ErrNotFound)
	st, err = store.State(ctx, "inflight")
	require.NoError(t, err, "a state of a run in flight stays")
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_RUNNING, st.GetStatus())
	for id, status := range map[string]stubbornv1.RunStatus{
		asking:           stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION,
		going.GetRunId(): stubbornv1.RunStatus_RUN_STATUS_RUNNING,
	} {
		st, err := reader.Get(ctx, id)
		require.NoError(t, err, "run %s", id)
		assert.Equal(t, status, st.GetStatus(), "run %s", id)
		owner, err := store.Driver(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, m.Owner(), owner, "run %s keeps its owner", id)
		assertWhole(t, store, id, had[id])
	}
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, runstest.SavedState(t, states, asking).GetStatus())

	// They finish, with their whole history and no second call.
	_, err = m.Decide(ctx, asking, stubbornv1.Decision_DECISION_FAIL, nil)
	require.NoError(t, err)
	g.Answer("going", controlstest.OK("ok"))
	for _, id := range []string{asking, going.GetRunId()} {
		runstest.Final(t, runstest.WatchAll(t, reader, id, 0))
		journal := assertWhole(t, store, id, had[id])
		assert.NotNil(t, journal[len(journal)-1].GetRunFinished())
	}
	assert.Equal(t, 1, g.Called("asking"))
	assert.Equal(t, 1, g.Called("going"))

	// Once let go of, they go by age too.
	require.Eventually(t, func() bool {
		a, err1 := store.Driver(ctx, asking)
		b, err2 := store.Driver(ctx, going.GetRunId())
		return err1 == nil && err2 == nil && a == "" && b == ""
	}, 5*time.Second, time.Millisecond)
	_, err = store.PurgeForTest(ctx, time.Now().Add(30*24*time.Hour))
	require.NoError(t, err)
	assertGone(t, reader, store, states, asking)
	assertGone(t, reader, store, states, going.GetRunId())
}

// TestAFullStoreRefusesNewRunsAndFinishesThoseAccepted: with a small
// MaxBytes, runs in flight are never dropped to make room: new runs are
// refused with ErrStoreFull once the store is full; the janitor purges the
// finished runs, oldest first, but not the runs in flight, older still;
// then new runs are accepted again, and the runs in flight finish with
// their whole journal.
func TestAFullStoreRefusesNewRunsAndFinishesThoseAccepted(t *testing.T) {
	e := startEmbedded(t)
	const maxBytes = 64 << 10
	cfg := JetStreamConfig{MaxBytes: maxBytes, Lease: time.Second, PurgeEvery: -1}
	store, nc := openJetStream(t, e, cfg)
	states := runstest.StatesBucket(t, nc)
	g := runstest.NewGated(controls.DelegateInfo{})
	m := runstest.NewManager(t, g, runs.Config{Store: store, Lease: time.Second})
	readerStore, _ := openJetStream(t, e, cfg)
	reader := runstest.NewManager(t, g, runs.Config{Store: readerStore, Lease: time.Second})
	ctx := runstest.Ctx(t)
	pad := strings.Repeat("x", 500)

	// Runs in flight, the oldest in the store: each waits in its attempt.
	var inFlight []string
	had := map[string][]runs.Event{}
	for i := range 3 {
		brief := fmt.Sprintf("in flight %d %s", i, pad)
		st, err := runstest.Start(m, context.Background(), brief, runstest.Chain("d"), nil)
		require.NoError(t, err)
		require.Eventually(t, func() bool { return g.Called(brief) == 1 }, 5*time.Second, time.Millisecond)
		inFlight = append(inFlight, st.GetRunId())
	}
	// Finished runs until the store is full.
	var finished []string
	var full error
	for i := 0; full == nil; i++ {
		require.Less(t, i, 100, "the store never filled up")
		brief := fmt.Sprintf("finished %d %s", i, pad)
		st, err := runstest.Start(m, context.Background(), brief, runstest.Chain("d"), nil)
		if errors.Is(err, runs.ErrStoreFull) {
			full = err
			break
		}
		require.NoError(t, err)
		g.Answer(brief, controlstest.OK("ok"))
		runstest.Final(t, runstest.WatchAll(t, m, st.GetRunId(), 0))
		finished = append(finished, st.GetRunId())
	}
	require.GreaterOrEqual(t, len(finished), 3)
	assert.Contains(t, full.Error(), "-max-bytes 65536")
	_, err := runstest.Start(m, context.Background(), "refused", runstest.Chain("d"), nil)
	assert.ErrorIs(t, err, runs.ErrStoreFull, "still full")
	for _, id := range inFlight {
		had[id], err = store.Events(ctx, id, 0)
		require.NoError(t, err)
		assertWhole(t, store, id, nil)
	}
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	events, err := js.Stream(ctx, "STUBBORN_EVENTS")
	require.NoError(t, err)
	info, err := events.Info(ctx)
	require.NoError(t, err)
	assert.LessOrEqual(t, info.State.Bytes, uint64(maxBytes))
	assert.Equal(t, jetstream.DiscardNew, info.Config.Discard)
	require.Eventually(t, func() bool {
		for _, id := range finished {
			if owner, err := store.Driver(ctx, id); err != nil || owner != "" {
				return false
			}
		}
		return true
	}, 5*time.Second, time.Millisecond, "the finished runs are let go of")

	// A pass by size: the oldest finished runs go, the runs in flight stay.
	n, err := store.PurgeForTest(ctx, time.Now())
	require.NoError(t, err)
	assert.Positive(t, n)
	assertGone(t, reader, store, states, finished[0])
	st, err := reader.Get(ctx, finished[len(finished)-1])
	require.NoError(t, err, "the newest finished run is kept")
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus())
	after, err := events.Info(ctx)
	require.NoError(t, err)
	assert.Less(t, after.State.Bytes, info.State.Bytes)
	for _, id := range inFlight {
		st, err := reader.Get(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_RUNNING, st.GetStatus())
		assertWhole(t, store, id, had[id])
	}

	// Room again: a new run is accepted and finishes; so do the runs in
	// flight, whole, their delegate called once.
	again, err := runstest.Start(m, context.Background(), "again", runstest.Chain("d"), nil)
	require.NoError(t, err)
	g.Answer("again", controlstest.OK("ok"))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, runstest.Final(t, runstest.WatchAll(t, m, again.GetRunId(), 0)).GetStatus())
	for i, id := range inFlight {
		brief := fmt.Sprintf("in flight %d %s", i, pad)
		g.Answer(brief, controlstest.OK("ok"))
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, runstest.Final(t, runstest.WatchAll(t, reader, id, 0)).GetStatus())
		journal := assertWhole(t, store, id, had[id])
		assert.NotNil(t, journal[len(journal)-1].GetRunFinished())
		assert.Equal(t, 1, g.Called(brief))
	}
}

// TestAFullStoreMakesRoomByItself: admission that finds the store full
// purges finished runs itself (the janitor's own pass is an hour away):
// no run is refused, and the store never holds more than MaxBytes.
func TestAFullStoreMakesRoomByItself(t *testing.T) {
	const maxBytes, total = 24 << 10, 12 // room for 5-6 runs of 3-4 KB
	// The janitor's own period is far off: only refusals ask for passes.
	store, nc := embeddedJetStream(t, JetStreamConfig{MaxBytes: maxBytes, Lease: time.Second, PurgeEvery: time.Hour})
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {controlstest.OK("ok")}})
	m := runstest.NewManager(t, d, runs.Config{Store: store, Lease: time.Second})
	pad := strings.Repeat("x", 500)
	refused := 0
	for i := range total {
		deadline := time.Now().Add(10 * time.Second)
		st, err := runstest.Start(m, context.Background(), fmt.Sprintf("%d %s", i, pad), runstest.Chain("a"), nil)
		for errors.Is(err, runs.ErrStoreFull) {
			refused++
			require.True(t, time.Now().Before(deadline), "run %d is never accepted", i)
			time.Sleep(50 * time.Millisecond)
			st, err = runstest.Start(m, context.Background(), fmt.Sprintf("%d %s", i, pad), runstest.Chain("a"), nil)
		}
		require.NoError(t, err)
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, runstest.Final(t, runstest.WatchAll(t, m, st.GetRunId(), 0)).GetStatus())
	}
	assert.Zero(t, refused, "a store of finished runs refused a run")
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	events, err := js.Stream(runstest.Ctx(t), "STUBBORN_EVENTS")
	require.NoError(t, err)
	info, err := events.Info(runstest.Ctx(t))
	require.NoError(t, err)
	assert.LessOrEqual(t, info.State.Bytes, uint64(maxBytes))
	assert.Less(t, info.State.NumSubjects, uint64(total), "finished runs were purged")
}

// TestOlderStoresAreUpdatedInPlace: a store made by a version whose stream
// dropped its oldest messages past MaxBytes and MaxAge, and whose buckets
// expired their entries, is updated in place: nothing is dropped by the
// store's limits any more, and what it held is still there.
func TestOlderStoresAreUpdatedInPlace(t *testing.T) {
	e := startEmbedded(t)
	ctx := runstest.Ctx(t)
	js, err := jetstream.New(e.Conn)
	require.NoError(t, err)
	// As versions before this one made them.
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "STUBBORN_EVENTS", Subjects: []string{"stubborn.events.*"}, Storage: jetstream.FileStorage,
		MaxAge: 7 * 24 * time.Hour, MaxBytes: 1 << 20, Discard: jetstream.DiscardOld, AllowDirect: true,
	})
	require.NoError(t, err)
	for _, b := range []jetstream.KeyValueConfig{
		{Bucket: "stubborn_runs", TTL: 7 * 24 * time.Hour, History: 1},
		{Bucket: "stubborn_owners", TTL: 7 * 24 * time.Hour, History: 1, LimitMarkerTTL: time.Second},
	} {
		_, err := js.CreateKeyValue(ctx, b)
		require.NoError(t, err)
	}
	ev, err := store.EncodeEvent(&stubbornv1.RunEvent{RunId: "old", Seq: 1, Kind: &stubbornv1.RunEvent_RunStarted{RunStarted: &stubbornv1.RunStarted{
		State: &stubbornv1.ControlState{RunId: "old", Status: stubbornv1.RunStatus_RUN_STATUS_RUNNING},
	}}})
	require.NoError(t, err)
	_, err = js.Publish(ctx, "stubborn.events.old", ev.Data)
	require.NoError(t, err)

	store, _ := openJetStream(t, e, JetStreamConfig{MaxBytes: 1 << 20, Lease: time.Second})
	events, err := js.Stream(ctx, "STUBBORN_EVENTS")
	require.NoError(t, err)
	info, err := events.Info(ctx)
	require.NoError(t, err)
	assert.Equal(t, jetstream.DiscardNew, info.Config.Discard)
	assert.Zero(t, info.Config.MaxAge)
	assert.EqualValues(t, 1<<20, info.Config.MaxBytes)
	for _, name := range []string{"KV_stubborn_runs", "KV_stubborn_owners"} {
		s, err := js.Stream(ctx, name)
		require.NoError(t, err)
		info, err := s.Info(ctx)
		require.NoError(t, err)
		assert.Zero(t, info.Config.MaxAge, name)
	}
	owners, err := js.Stream(ctx, "KV_stubborn_owners")
	require.NoError(t, err)
	info, err = owners.Info(ctx)
	require.NoError(t, err)
	assert.True(t, info.Config.AllowMsgTTL, "owners' purge markers still expire")
	assert.Equal(t, time.Second, info.Config.SubjectDeleteMarkerTTL)
	evs, err := store.Events(ctx, "old", 0)
	require.NoError(t, err)
	assert.Len(t, evs, 1)
}
