package runs

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs/memstore"
)

// A DecideRun that found the run parked for a decision, but came late
// (another decided it meanwhile, and the run now waits parked in its
// backoff), does not wake that other wait.
func TestALateDecisionDoesNotWakeAnotherWait(t *testing.T) {
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"d": {controlstest.Fail(codes.Unavailable, "down")}})
	d.SetInfo("d", controls.DelegateInfo{Idempotent: true})
	m, err := New(Config{Store: memstore.NewMemory(DefaultLease), Delegates: d, ParkAfter: time.Millisecond})
	require.NoError(t, err)
	defer m.Close()
	spec := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
		Target: "d", Attempts: new(int32), BaseWait: durationpb.New(time.Hour), MaxWait: durationpb.New(time.Hour),
	}}}
	st, _, err := m.Start(context.Background(), Task{Brief: "brief"}, spec, nil)
	require.NoError(t, err)
	r := m.local(st.GetRunId())
	parkedBy := func() *parking {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.parking
	}
	require.Eventually(t, func() bool { p := parkedBy(); return p != nil && p.decision }, 5*time.Second, time.Millisecond)
	first := parkedBy().tracker

	_, err = m.Decide(context.Background(), st.GetRunId(), stubbornv1.Decision_DECISION_RETRY, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { p := parkedBy(); return p != nil && !p.decision }, 5*time.Second, time.Millisecond, "parked in the backoff")

	st2, err := m.decide(context.Background(), r, first, stubbornv1.Decision_DECISION_FAIL, nil)
	assert.Nil(t, st2)
	assert.ErrorIs(t, err, ErrNotAwaitingDecision, "the decision it came for is taken")
	assert.Equal(t, 1, m.Parked(), "the backoff still waits")
	assert.Len(t, d.Calls(), 1)
}
