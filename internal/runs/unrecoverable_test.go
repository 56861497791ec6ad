package runs_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
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
	"github.com/stubbornhq/stubborn/internal/runs/jsstore"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// awaiting starts a run on a that awaits a decision after one failed call
// of d, then kills a (it writes nothing more).
func awaiting(t *testing.T, store store.Store, d *controlstest.Delegates) string {
	t.Helper()
	a, err := runs.New(runs.Config{Store: store, Delegates: d, Lease: time.Second, Owner: "a", Clock: controlstest.NewClock()})
	require.NoError(t, err)
	st, err := runstest.Start(a, runstest.Ctx(t), "brief", runstest.AskSpec(), nil)
	require.NoError(t, err)
	// Awaiting in the store, not only in a's memory: its journal ends with
	// decision_requested, and the state saved after it says so.
	require.Eventually(t, func() bool {
		got, err := store.State(runstest.Ctx(t), st.GetRunId())
		if err != nil || got.GetStatus() != stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION {
			return false
		}
		evs, err := store.Events(runstest.Ctx(t), st.GetRunId(), 0)
		if err != nil || len(evs) == 0 {
			return false
		}
		last, err := evs[len(evs)-1].Decode()
		return err == nil && last.GetDecisionRequested() != nil
	}, 10*time.Second, 5*time.Millisecond)
	a.Kill()
	return st.GetRunId()
}

// endsUnrecovered waits until run id, resumed by a new server on store,
// has ended FAILED as unrecoverable, and checks that its delegate was not
// called again and an ERROR names it.
func endsUnrecovered(t *testing.T, store store.Store, d *controlstest.Delegates, id, why string) {
	t.Helper()
	h, logger := runstest.NewCapturedLogs()
	b := runstest.NewManager(t, d, runs.Config{Store: store, Lease: time.Second, Owner: "b", SoleOwner: true, Logger: logger})
	var got *stubbornv1.ControlState
	require.Eventually(t, func() bool {
		st, err := b.Get(runstest.Ctx(t), id)
		got = st
		return err == nil && st.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_FAILED
	}, 15*time.Second, 10*time.Millisecond, "the run ends FAILED")
	assert.Contains(t, got.GetStatusReason(), "could not be recovered")
	assert.Contains(t, got.GetStatusReason(), why)
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_UNRECOVERABLE, got.GetStatusReasonCode())
	assert.Len(t, d.Calls(), 1, "its delegate is not called again")
	l, ok := h.Find(slog.LevelError, "run cannot be recovered")
	require.True(t, ok, "an ERROR names the run: %v", h.Lines(slog.LevelWarn))
	assert.Equal(t, id, l.Attrs["run_id"])
	require.Eventually(t, func() bool {
		owner, err := store.Driver(runstest.Ctx(t), id)
		return err == nil && owner == ""
	}, 10*time.Second, 10*time.Millisecond, "its claim is released")
}

// awaitingOnEmbedded starts a run awaiting a decision on a fresh embedded
// server (awaiting, with notSent's delegate), and returns the server, the
// delegate, the run's id and the events stream, to damage its journal.
func awaitingOnEmbedded(t *testing.T) (*jsstore.Embedded, *controlstest.Delegates, string, jetstream.Stream) {
	t.Helper()
	e, err := jsstore.StartEmbedded(jsstore.EmbeddedConfig{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	d := runstest.NotSent()
	id := awaiting(t, openOn(t, e), d)
	js, err := jetstream.New(e.Conn)
	require.NoError(t, err)
	stream, err := js.Stream(runstest.Ctx(t), "STUBBORN_EVENTS")
	require.NoError(t, err)
	return e, d, id, stream
}

// TestALostJournalIsNotReplayedFromTheClaim: a run awaiting a decision
// whose journal is gone (purged, or a store that lost it) is not resumed
// from the state its claim carries, which would call its delegate again
// without any decision: it ends FAILED, saying why. Before, the new server
// replayed it from scratch.
func TestALostJournalIsNotReplayedFromTheClaim(t *testing.T) {
	e, d, id, stream := awaitingOnEmbedded(t)
	require.NoError(t, stream.Purge(runstest.Ctx(t), jetstream.WithPurgeSubject("stubborn.events."+id)))

	endsUnrecovered(t, openOn(t, e), d, id, "saved a state")
}

// TestAJournalWithAHoleIsNotReplayed: a journal whose first message is
// gone (a damaged block) does not start at event 1: the run ends FAILED.
func TestAJournalWithAHoleIsNotReplayed(t *testing.T) {
	e, d, id, stream := awaitingOnEmbedded(t)
	var first uint64
	for seq := uint64(1); first == 0; seq++ {
		m, err := stream.GetMsg(runstest.Ctx(t), seq)
		require.NoError(t, err)
		if m.Subject == "stubborn.events."+id {
			first = seq
		}
	}
	require.NoError(t, stream.DeleteMsg(runstest.Ctx(t), first))

	endsUnrecovered(t, openOn(t, e), d, id, "events are missing")
}

// TestADamagedStoreFileLosesNoCallAndSaysSo: the events stream's block
// file is damaged while the server is down; on restart the embedded
// server's damage is an ERROR, and the run awaiting a decision whose
// journal was in that block ends FAILED instead of calling its delegate
// (not idempotent) again. Before, nothing was logged and the run was
// replayed from scratch.
func TestADamagedStoreFileLosesNoCallAndSaysSo(t *testing.T) {
	dir := t.TempDir()
	e, err := jsstore.StartEmbedded(jsstore.EmbeddedConfig{DataDir: dir, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	store := openOn(t, e)
	d := runstest.NotSent()
	id := awaiting(t, store, d)
	_ = store.Close()
	e.Close()
	require.NoError(t, os.Remove(filepath.Join(dir, "jetstream", "$G", "streams", "STUBBORN_EVENTS", "msgs", "1.blk")))

	h, logger := runstest.NewCapturedLogs()
	e, err = jsstore.StartEmbedded(jsstore.EmbeddedConfig{DataDir: dir, Logger: logger})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	s := openOn(t, e)
	s.Damage(runstest.Ctx(t), logger)
	if e.Damaged() {
		s.MarkDamaged()
	}
	_, ok := h.Find(slog.LevelError, "store damaged: stream STUBBORN_EVENTS")
	assert.True(t, ok, "an ERROR names the damaged stream: %v", h.Lines(slog.LevelWarn))
	endsUnrecovered(t, s, d, id, "journal is empty")
}

// openOn opens a JetStream store on e's server, closed when the test ends.
func openOn(t *testing.T, e *jsstore.Embedded) *jsstore.JetStream {
	t.Helper()
	nc, err := nats.Connect("", nats.InProcessServer(e.Server))
	require.NoError(t, err)
	s, err := jsstore.NewJetStream(context.Background(), nc, jsstore.JetStreamConfig{Lease: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}
