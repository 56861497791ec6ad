package controls_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// Effects are keyed by path and step: concurrent branches (a race's
// presets) replay from every cut of their journal, whatever order their
// goroutines run in, with no recorded call made again, no recorded step
// recorded twice, and a journal that folds to the final state. Each
// scenario runs several times, so that the branches interleave
// differently.

func idempotent(names ...string) map[string]controls.DelegateInfo {
	info := map[string]controls.DelegateInfo{}
	for _, n := range names {
		info[n] = controls.DelegateInfo{Idempotent: true}
	}
	return info
}

// A race of two retry presets: p's delegate keeps failing, q's answers.
// Their nested attempts interleave in the journal in whatever order the
// goroutines ran.
func TestReplayOfARaceOfPresets(t *testing.T) {
	for range 5 {
		checkEveryCut(t, world{
			spec:    race("p", "q"),
			presets: presetMap{"p": rvRetry("a", 3, stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL), "q": retryOf("b", 2)},
			d: func() *scriptedBy {
				return &scriptedBy{info: idempotent("a", "b"), byName: map[string]controlstest.Reply{"a": unavail, "b": controlstest.OK("b")}}
			},
		}, false)
	}
}

// A hedged race of presets (which the server used to refuse): p's
// attempts all fail, q starts when p has failed (its delay never passes
// by itself, so the presets wait for nothing either: a retry-with-learning
// and a chain) and answers.
func TestReplayOfAHedgedRaceOfPresets(t *testing.T) {
	learning := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_RetryWithLearning{RetryWithLearning: &stubbornv1.RetryWithLearningSpec{
		Target: "a", MaxRetries: ptr(int32(2))}}}
	chain := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"a", "b"}}}}
	checkEveryCut(t, world{
		spec:    hedged(100*time.Millisecond, "p", "q"),
		presets: presetMap{"p": learning, "q": chain},
		block:   true,
		d: func() *scriptedBy {
			return &scriptedBy{info: idempotent("a", "b"), byName: map[string]controlstest.Reply{"a": unavail, "b": controlstest.OK("b")}}
		},
	}, true)
}

// A preset that is a race, inside a chain: the race of a and b fails
// whole, and the chain's next delegate answers.
func TestReplayOfAPresetRacingInsideAChain(t *testing.T) {
	for range 5 {
		checkEveryCut(t, world{
			spec: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{
				Chain: []string{"both", "c"}}}},
			presets: presetMap{"both": race("p", "b"), "p": retryOf("a", 2)},
			d: func() *scriptedBy {
				return &scriptedBy{info: idempotent("a", "b", "c"), byName: map[string]controlstest.Reply{"a": unavail, "b": unavail, "c": controlstest.OK("c")}}
			},
		}, false)
	}
}

// The run-wide attempt number is the journal's, not the order of
// arrival: a race of presets resumed at a cut gives every replayed
// attempt the number it was recorded with, and the attempts it makes live
// numbers after all of the journal's.
func TestAReplayedRaceKeepsTheJournalsNumbers(t *testing.T) {
	w := world{
		spec:    race("p", "q"),
		presets: presetMap{"p": rvRetry("a", 3, stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL), "q": retryOf("b", 3)},
		d: func() *scriptedBy {
			return &scriptedBy{info: idempotent("a", "b"), byName: map[string]controlstest.Reply{"a": unavail, "b": unavail}}
		},
	}
	_, all, _ := w.run(nil, false)
	for cut := 1; cut < len(all); cut++ {
		journal := all[:cut]
		recorded := map[int32]*stubbornv1.Attempt{}
		var last int32
		for _, ev := range journal {
			if a := ev.GetAttemptStarted().GetAttempt(); a != nil {
				recorded[a.GetNumber()] = a
				last = max(last, a.GetNumber())
			}
		}
		_, fresh, _ := w.run(journal, true)
		end := fresh[len(fresh)-1].GetRunFinished().GetState()
		require.NotNil(t, end, "cut %d", cut)
		for i, a := range end.GetAttemptLog() {
			assert.EqualValues(t, i+1, a.GetNumber(), "cut %d: the log is in number order", cut)
			if r, ok := recorded[a.GetNumber()]; ok {
				assert.Equal(t, r.GetDelegate(), a.GetDelegate(), "cut %d: attempt %d", cut, a.GetNumber())
				assert.Equal(t, r.GetPath(), a.GetPath(), "cut %d: attempt %d", cut, a.GetNumber())
			}
		}
		for _, ev := range fresh {
			if a := ev.GetAttemptStarted().GetAttempt(); a != nil {
				assert.Greater(t, a.GetNumber(), last, "cut %d: a live attempt is numbered after the journal's", cut)
			}
		}
	}
}
