package runs

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/runs/memstore"
)

// A Manager with the default Config keeps defaultMaxFinished finished runs
// in memory, not more (each is marked by every garbage collection: the
// shipped server's CPU a run depends on it), and a run that finished
// before them is read from the store, whole.
func TestTheDefaultKeepsAThousandFinishedRuns(t *testing.T) {
	m, err := New(Config{Store: memstore.NewMemory(DefaultLease), Delegates: failFirst{}})
	require.NoError(t, err)
	defer m.Close()
	spec := runsToEnd()[0].spec
	var first string
	for i := range defaultMaxFinished + 10 {
		st, _, err := m.Start(t.Context(), Task{Brief: "find it"}, spec, nil)
		require.NoError(t, err)
		if i == 0 {
			first = st.GetRunId()
		}
		require.NoError(t, m.Watch(t.Context(), st.GetRunId(), 0, func(Event) error { return nil }))
	}
	// A watch ends with the run's last event; its driver counts the run
	// finished a moment after.
	assert.Equal(t, 1_000, defaultMaxFinished)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		m.mu.Lock()
		kept, finished := len(m.runs), len(m.finished)
		_, firstKept := m.runs[first]
		m.mu.Unlock()
		assert.Equal(c, defaultMaxFinished, finished)
		assert.Equal(c, defaultMaxFinished, kept)
		assert.False(c, firstKept, "the oldest finished run is not kept in memory")
	}, 10*time.Second, time.Millisecond)

	st, err := m.Get(t.Context(), first)
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus())
	var seen int
	require.NoError(t, m.Watch(t.Context(), first, 0, func(Event) error { seen++; return nil }))
	assert.Equal(t, 4, seen, "its whole journal, from the store")
}
