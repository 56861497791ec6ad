package runs_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
	"github.com/stubbornhq/stubborn/internal/runs/memstore"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// slowAppends is a store whose journal write of a decision_requested waits
// until released: a store in an outage.
type slowAppends struct {
	store.Store
	once    sync.Once
	waiting chan struct{} // closed when the write waits
	release chan struct{}
}

func (s *slowAppends) Append(ctx context.Context, w *store.Writer, evs ...store.Event) error {
	for _, e := range evs {
		if ev, err := e.Decode(); err == nil && ev.GetDecisionRequested() != nil {
			s.once.Do(func() { close(s.waiting) })
			<-s.release
		}
	}
	return s.Store.Append(ctx, w, evs...)
}

// TestNoStoreWriteUnderTheTrackersLock: while a run's write waits on the
// store (an outage, made again for up to the lease), GetRun and a watcher
// of its written events answer at once: the tracker's lock is not held
// across the write. Before, the write of decision_requested was made under
// the tracker's lock, and GetRun waited for it.
func TestNoStoreWriteUnderTheTrackersLock(t *testing.T) {
	store := &slowAppends{Store: memstore.NewMemory(time.Second), waiting: make(chan struct{}), release: make(chan struct{})}
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"d": {{Err: &controls.CallError{Code: codes.Unavailable, Message: "refused", NotSent: true}}}})
	m := runstest.NewManager(t, d, runs.Config{Store: store, ParkAfter: -1})
	zero := int32(0)
	spec := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
		Target: "d", Attempts: &zero, OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_ASK,
	}}}
	st, err := runstest.Start(m, runstest.Ctx(t), "brief", spec, nil)
	require.NoError(t, err)
	select {
	case <-store.waiting:
	case <-time.After(5 * time.Second):
		t.Fatal("decision_requested was never written")
	}

	type answer struct {
		st  *stubbornv1.ControlState
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		got, err := m.Get(runstest.Ctx(t), st.GetRunId())
		answered <- answer{got, err}
	}()
	select {
	case a := <-answered:
		require.NoError(t, a.err)
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, a.st.GetStatus())
	case <-time.After(2 * time.Second):
		close(store.release)
		<-answered
		t.Fatal("GetRun waited for the store's write")
	}

	close(store.release)
	_, err = m.Decide(runstest.Ctx(t), st.GetRunId(), stubbornv1.Decision_DECISION_FAIL, nil)
	require.NoError(t, err)
	fin := runstest.Final(t, runstest.WatchAll(t, m, st.GetRunId(), 0))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, fin.GetStatus())
}
