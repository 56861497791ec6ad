package controls_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// A preset changed between a crash and the takeover (a config reload
// made "p" retry x instead of a): the resumed run's control asks for
// attempt 2 to x where the journal recorded it to a. At every cut that
// holds that attempt, the run ends FAILED, NONDETERMINISTIC_REPLAY, its
// reason naming both, calls no delegate, and its journal still folds to
// its final state. A cut before it resumes on the new preset as a run
// that had not reached it would.
func TestAReplayThatGoesAnotherWayEndsTheRun(t *testing.T) {
	chain := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"p", "b"}}}}
	idem := map[string]controls.DelegateInfo{"a": {Idempotent: true}, "x": {Idempotent: true}, "b": {Idempotent: true}}
	before := world{
		spec:    chain,
		presets: presetMap{"p": retryOf("a", 2)},
		d: func() *scriptedBy {
			return &scriptedBy{info: idem, byName: map[string]controlstest.Reply{"a": unavail, "x": controlstest.OK("x"), "b": controlstest.OK("b")}}
		},
	}
	want, all, _ := before.run(nil, false)
	require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, want.Status, want.Reason)
	require.Equal(t, "b", want.Winner)

	after := before
	after.presets = presetMap{"p": retryOf("x", 2)}
	first := -1 // the index of attempt 2's start (a, at chain[0])
	for i, ev := range all {
		if a := ev.GetAttemptStarted().GetAttempt(); a.GetNumber() == 2 {
			require.Equal(t, "a", a.GetDelegate())
			require.Equal(t, "chain[0]", a.GetPath())
			first = i
			break
		}
	}
	require.Positive(t, first)
	for cut := 1; cut < len(all); cut++ {
		journal := all[:cut]
		out, fresh, d := after.run(journal, true)
		require.NotEmpty(t, fresh, "cut %d", cut)
		checkFold(t, append(journal[:cut:cut], fresh...), "cut")
		if cut <= first {
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, out.Status, "cut %d: the journal had not reached the preset's attempt", cut)
			assert.Equal(t, "p", out.Winner, "cut %d", cut)
			continue
		}
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, out.Status, "cut %d", cut)
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_NONDETERMINISTIC_REPLAY, out.Code, "cut %d", cut)
		assert.Equal(t, `nondeterministic replay: the journal's attempt 2 went to "a" at chain[0], the control now asks for "x" at chain[0]`, out.Reason, "cut %d", cut)
		assert.Empty(t, d.made(), "cut %d: no call, to the new delegate or any other", cut)
		end := fresh[len(fresh)-1].GetRunFinished().GetState()
		require.NotNil(t, end, "cut %d: the run ends", cut)
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, end.GetStatus(), "cut %d", cut)
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_NONDETERMINISTIC_REPLAY, end.GetStatusReasonCode(), "cut %d", cut)
		assert.Equal(t, out.Reason, end.GetStatusReason(), "cut %d", cut)
		for _, ev := range fresh[:len(fresh)-1] {
			assert.Nil(t, ev.GetAttemptStarted(), "cut %d: nothing is started after the journal: %s", cut, what(ev))
		}
	}
}
