package memstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

func TestMemoryKeepsFinishedRunsWithinItsLimits(t *testing.T) {
	ctx := context.Background()
	s := NewMemory(time.Second)
	now := time.Unix(1_800_000_000, 0)
	s.clock = func() time.Time { return now }
	s.SetLimits(2, time.Hour)

	appendEvent := func(id string, seq int64, finished bool) {
		t.Helper()
		ev := &stubbornv1.RunEvent{RunId: id, Seq: seq, Kind: &stubbornv1.RunEvent_RunStarted{RunStarted: &stubbornv1.RunStarted{}}}
		if finished {
			ev.Kind = &stubbornv1.RunEvent_RunFinished{RunFinished: &stubbornv1.RunFinished{}}
		}
		enc, err := store.EncodeEvent(ev)
		require.NoError(t, err)
		require.NoError(t, s.Append(ctx, nil, enc))
		state, err := proto.Marshal(&stubbornv1.ControlState{RunId: id})
		require.NoError(t, err)
		require.NoError(t, s.PutState(ctx, id, state))
	}
	kept := func(id string) bool {
		t.Helper()
		evs, err := s.Events(ctx, id, 0)
		require.NoError(t, err)
		_, serr := s.State(ctx, id)
		assert.Equal(t, len(evs) == 0, serr != nil, "run %s: events and state go together", id)
		return len(evs) > 0
	}
	run := func(id string) {
		t.Helper()
		appendEvent(id, 1, false)
		appendEvent(id, 2, true)
	}

	run("a")
	run("b")
	run("c")
	assert.False(t, kept("a"), "the oldest finished run goes beyond 2")
	assert.True(t, kept("b"))
	assert.True(t, kept("c"))
	// Its final state, saved a moment after its run_finished, does not
	// bring it back; following it ends at once.
	state, err := proto.Marshal(&stubbornv1.ControlState{RunId: "a"})
	require.NoError(t, err)
	require.NoError(t, s.PutState(ctx, "a", state))
	assert.False(t, kept("a"), "a late state of a pruned run is dropped")
	assert.ErrorIs(t, s.Follow(ctx, "a", 0, func(store.Event) error { return nil }), store.ErrNotFound)

	now = now.Add(2 * time.Hour)
	appendEvent("d", 1, false) // in flight: never counted, never dropped
	run("e")
	assert.False(t, kept("b"), "finished more than an hour ago")
	assert.False(t, kept("c"), "finished more than an hour ago")
	assert.True(t, kept("d"))
	assert.True(t, kept("e"))
	appendEvent("d", 2, true)
	run("f")
	assert.True(t, kept("d"))
	assert.True(t, kept("f"))
	assert.False(t, kept("e"), "two newer finished runs")
}

// TestMemoryNeverPrunesARunInFlight: however old a run in flight is (one
// awaiting a decision may wait for weeks), and however many runs finish
// after it, the memory store keeps its events and state: its limits count
// and age finished runs only.
func TestMemoryNeverPrunesARunInFlight(t *testing.T) {
	ctx := context.Background()
	s := NewMemory(time.Second)
	now := time.Unix(1_800_000_000, 0)
	s.clock = func() time.Time { return now }
	s.SetLimits(1, time.Hour)
	record := func(id string, seq int64, finished bool) {
		t.Helper()
		ev := &stubbornv1.RunEvent{RunId: id, Seq: seq, Kind: &stubbornv1.RunEvent_RunStarted{RunStarted: &stubbornv1.RunStarted{}}}
		if finished {
			ev.Kind = &stubbornv1.RunEvent_RunFinished{RunFinished: &stubbornv1.RunFinished{}}
		}
		enc, err := store.EncodeEvent(ev)
		require.NoError(t, err)
		require.NoError(t, s.Append(ctx, nil, enc))
	}
	record("waiting", 1, false)
	state, err := proto.Marshal(&stubbornv1.ControlState{RunId: "waiting", Status: stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION})
	require.NoError(t, err)
	require.NoError(t, s.PutState(ctx, "waiting", state))
	for i := range 5 {
		now = now.Add(30 * 24 * time.Hour)
		id := fmt.Sprintf("done%d", i)
		record(id, 1, false)
		record(id, 2, true)
		s.SetLimits(1, time.Hour)
	}
	evs, err := s.Events(ctx, "waiting", 0)
	require.NoError(t, err)
	assert.Len(t, evs, 1)
	st, err := s.State(ctx, "waiting")
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, st.GetStatus())
	evs, err = s.Events(ctx, "done3", 0)
	require.NoError(t, err)
	assert.Empty(t, evs, "a finished run beyond the limits goes")
}
