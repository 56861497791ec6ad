package memstore

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// journal returns the encoded events of a run of n events, the last its
// run_finished; briefs of 0, 1, 127, 128 and 70,000 bytes take every
// length of a varint up to three bytes.
func journal(t *testing.T, id string, n int) []store.Event {
	t.Helper()
	sizes := []int{0, 1, 127, 128, 70_000}
	evs := make([]store.Event, 0, n)
	for i := 1; i <= n; i++ {
		ev := &stubbornv1.RunEvent{RunId: id, Seq: int64(i), Kind: &stubbornv1.RunEvent_RunStarted{RunStarted: &stubbornv1.RunStarted{
			State: &stubbornv1.ControlState{TaskBrief: string(make([]byte, sizes[i%len(sizes)]))},
		}}}
		if i == n {
			ev.Kind = &stubbornv1.RunEvent_RunFinished{RunFinished: &stubbornv1.RunFinished{State: &stubbornv1.ControlState{RunId: id}}}
		}
		enc, err := store.EncodeEvent(ev)
		require.NoError(t, err)
		evs = append(evs, enc)
	}
	return evs
}

// TestAFinishedJournalReadsAsItWasWritten: a run's journal, packed at its
// run_finished, reads back event for event (run, seq, bytes, and
// run_finished last) from any seq, whether it came in one append or
// several; a follower reads it to its end and returns.
func TestAFinishedJournalReadsAsItWasWritten(t *testing.T) {
	ctx := context.Background()
	for _, n := range []int{1, 2, 6} {
		for _, split := range []int{0, n / 2, n - 1} {
			s := NewMemory(time.Second)
			want := journal(t, "run_a", n)
			w := &store.Writer{}
			if split > 0 {
				require.NoError(t, s.Append(ctx, w, want[:split]...))
			}
			require.NoError(t, s.Append(ctx, w, want[split:]...))
			assert.Equal(t, uint64(n), w.Cursor)
			require.Contains(t, s.journals, "run_a", "packed at its run_finished")
			assert.NotContains(t, s.events, "run_a")
			for after := range n + 2 {
				got, err := s.Events(ctx, "run_a", int64(after))
				require.NoError(t, err)
				if after >= n {
					assert.Empty(t, got, "n %d, after %d", n, after)
					continue
				}
				assert.Equal(t, want[after:], got, "n %d, split %d, after %d", n, split, after)
			}
			var followed []store.Event
			require.NoError(t, s.Follow(ctx, "run_a", 0, func(ev store.Event) error {
				followed = append(followed, ev)
				return nil
			}))
			assert.Equal(t, want, followed)
			require.NoError(t, s.Follow(ctx, "run_a", int64(n), func(store.Event) error {
				t.Fatal("nothing follows a finished run's last event")
				return nil
			}))
			got, err := s.JournalFrom(ctx, "run_a", w)
			require.NoError(t, err)
			assert.Equal(t, want, got)
			assert.Equal(t, uint64(n), w.Cursor)
			// Its next seq is the one after its last, as in any journal.
			assert.ErrorIs(t, s.Append(ctx, nil, journal(t, "run_a", n)[0]), store.ErrConflict)
		}
	}
}

// TestAFinishedJournalGoesWithItsRun: a packed journal goes when its run
// is deleted or pruned, as any journal.
func TestAFinishedJournalGoesWithItsRun(t *testing.T) {
	ctx := context.Background()
	s := NewMemory(time.Second)
	s.SetLimits(1, 0)
	require.NoError(t, s.Append(ctx, nil, journal(t, "run_a", 3)...))
	require.NoError(t, s.Append(ctx, nil, journal(t, "run_b", 3)...))
	assert.NotContains(t, s.journals, "run_a", "pruned beyond one finished run")
	require.NoError(t, s.DeleteRun(ctx, "run_b"))
	assert.Empty(t, s.journals)
	assert.Empty(t, s.events)
}

// TestAFinishedRunsStateSharesItsPackedJournal: the final state the
// Manager saves, a part of run_finished's encoding, is kept as the same
// bytes of the packed journal (the run's encoding slab goes); any other
// state is kept as it came.
func TestAFinishedRunsStateSharesItsPackedJournal(t *testing.T) {
	ctx := context.Background()
	s := NewMemory(time.Second)
	evs := journal(t, "run_a", 3)
	_, ev, err := store.DecodeEvent(evs[2].Data)
	require.NoError(t, err)
	final, err := proto.Marshal(ev.GetRunFinished().GetState())
	require.NoError(t, err)
	require.NoError(t, s.Append(ctx, nil, evs...))

	shares := func(state []byte) bool {
		p := s.journals["run_a"]
		for i := range p {
			if &p[i] == &state[0] {
				return true
			}
		}
		return false
	}
	require.NoError(t, s.PutState(ctx, "run_a", final))
	assert.True(t, shares(s.states["run_a"]))
	assert.Equal(t, final, s.states["run_a"])
	st, err := s.State(ctx, "run_a")
	require.NoError(t, err)
	assert.Equal(t, "run_a", st.GetRunId())

	other, err := proto.Marshal(&stubbornv1.ControlState{RunId: "run_a", StatusReason: "not in the journal"})
	require.NoError(t, err)
	require.NoError(t, s.PutState(ctx, "run_a", other))
	assert.False(t, shares(s.states["run_a"]))
	assert.Equal(t, other, s.states["run_a"])
}
