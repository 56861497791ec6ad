package runs_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
	"github.com/stubbornhq/stubborn/internal/runs/memstore"
)

// dying is criteria whose evaluation never returns: the process runs out
// of memory in it, as issue 17's did.
type dying chan struct{}

func (d dying) Check(ctx context.Context, _ int32, _ string, _ *stubbornv1.Result) (controls.Verdict, error) {
	close(d)
	<-ctx.Done()
	return controls.Verdict{}, ctx.Err()
}

// TestACELExpressionThatKilledItsServerIsNotEvaluatedOnResume is issue
// 17's crash loop. A run accepted before CEL expressions were bounded in
// memory, whose failure_when builds 200 MB over this answer (7 GB over a
// 60 KB one), killed its server while evaluating it; the server that
// resumes the run compiles the expression again, refuses it, and does not
// evaluate it: the next attempt fails with the reason, and the run ends.
// Not parallel: it measures allocations.
func TestACELExpressionThatKilledItsServerIsNotEvaluatedOnResume(t *testing.T) {
	const lease = 200 * time.Millisecond
	store := memstore.NewMemory(lease)
	g := runstest.NewGated(controls.DelegateInfo{Idempotent: true})
	answer := controlstest.OK(strings.Repeat("a", 10_000))
	g.Answer("x", answer)
	g.Answer("x", answer)
	spec := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{
		Chain:       []string{"first", "second"},
		FailureWhen: `result.text.replace("", result.text + result.text).size() < 0`,
	}}}

	evaluating := make(dying)
	a, err := runs.New(runs.Config{Delegates: g, Store: store, Lease: lease, Owner: "a",
		Criteria: func(*stubbornv1.ControlState) controls.Criteria { return evaluating }})
	require.NoError(t, err)
	st, err := runstest.Start(a, runstest.Ctx(t), "x", spec, nil)
	require.NoError(t, err)
	select {
	case <-evaluating:
	case <-time.After(5 * time.Second):
		t.Fatal("the first answer was never judged")
	}
	a.Kill()

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b := runstest.NewManager(t, g, runs.Config{Store: store, Lease: lease, Owner: "b", SoleOwner: true,
		Criteria: func(st *stubbornv1.ControlState) controls.Criteria {
			return controls.NewCriteria(st.GetControl(), "", g)
		}})
	end := runstest.Final(t, runstest.WatchAll(t, b, st.GetRunId(), 0))
	runtime.ReadMemStats(&after)

	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED, end.GetStatus())
	assert.Equal(t, 2, g.Called("x"), "each delegate was called once")
	require.Len(t, end.GetFailureHistory(), 2)
	assert.Equal(t, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_INTERRUPTED, end.GetAttemptLog()[0].GetOutcome(), "the attempt the server died in")
	second := end.GetFailureHistory()[1]
	assert.Equal(t, "second", second.GetDelegate())
	assert.Equal(t, stubbornv1.FailureSource_FAILURE_SOURCE_CEL, second.GetSource())
	assert.Contains(t, second.GetReason(), "failure_when does not compile: replace may build a value of up to")
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(64<<20), "the expression was not evaluated")
}
