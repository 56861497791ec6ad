package jsstore

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// TestAJournalStoredTwiceIsReadOnce (issue 29, finding 1): journals that
// a release before this one wrote twice in part — seqs 1 2 3 2 3, a write
// made again across a stream leader's change — are read with each seq
// once, the first stored: by Events (GetRun, a resume) and by Follow
// (WatchRun). And a write made again with the same message id is stored
// once (Nats-Msg-Id).
func TestAJournalStoredTwiceIsReadOnce(t *testing.T) {
	e, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := NewJetStream(ctx, e.Conn, JetStreamConfig{Memory: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	event := func(seq int64, kind *stubbornv1.RunEvent) store.Event {
		kind.RunId, kind.Seq = "run_x", seq
		ev, err := store.EncodeEvent(kind)
		require.NoError(t, err)
		return ev
	}
	resumed := func(seq int64, who string) store.Event {
		return event(seq, &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_RunResumed{RunResumed: &stubbornv1.RunResumed{Owner: who}}})
	}
	raw := func(ev store.Event) {
		_, err := s.js.PublishMsg(ctx, &nats.Msg{Subject: eventsSubject + "run_x", Data: ev.Data})
		require.NoError(t, err)
	}
	raw(event(1, &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_RunStarted{RunStarted: &stubbornv1.RunStarted{State: &stubbornv1.ControlState{RunId: "run_x"}}}}))
	raw(resumed(2, "first"))
	raw(resumed(3, "first"))
	raw(resumed(2, "again"))
	raw(resumed(3, "again"))
	raw(event(4, &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_RunFinished{RunFinished: &stubbornv1.RunFinished{State: &stubbornv1.ControlState{RunId: "run_x"}}}}))

	check := func(evs []store.Event) {
		t.Helper()
		var seqs []int64
		for _, ev := range evs {
			seqs = append(seqs, ev.Seq)
			if d, err := ev.Decode(); err == nil && d.GetRunResumed() != nil {
				assert.Equal(t, "first", d.GetRunResumed().GetOwner(), "the first stored is read")
			}
		}
		assert.Equal(t, []int64{1, 2, 3, 4}, seqs)
	}
	evs, err := s.Events(ctx, "run_x", 0)
	require.NoError(t, err)
	check(evs)
	var w store.Writer
	evs, err = s.JournalFrom(ctx, "run_x", &w)
	require.NoError(t, err)
	check(evs)
	evs = nil
	require.NoError(t, s.Follow(ctx, "run_x", 0, func(ev store.Event) error { evs = append(evs, ev); return nil }))
	check(evs)

	// The same write made again by a writer whose expected sequence
	// passes (a view that moved on: what stored journals twice before)
	// is stored once: its message id is the same.
	c := &store.Writer{}
	first := event(1, &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_RunStarted{RunStarted: &stubbornv1.RunStarted{State: &stubbornv1.ControlState{RunId: "run_y"}}}})
	first.RunID = "run_y"
	require.NoError(t, s.publish(ctx, c, []store.Event{first}))
	at := c.Cursor
	require.NoError(t, s.publish(ctx, c, []store.Event{first}))
	assert.Equal(t, at, c.Cursor, "the duplicate's ack names the message stored")
	seqs, err := s.events.Info(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 7, seqs.State.Msgs, "stored once")
}
