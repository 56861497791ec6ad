package controls_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// outputs returns the attempt_output events of evs.
func outputs(evs []*stubbornv1.RunEvent) []*stubbornv1.AttemptOutput {
	var out []*stubbornv1.AttemptOutput
	for _, ev := range evs {
		if o := ev.GetAttemptOutput(); o != nil {
			out = append(out, o)
		}
	}
	return out
}

// finishedOf returns attempt n's attempt_finished of evs.
func finishedOf(t *testing.T, evs []*stubbornv1.RunEvent, n int32) *stubbornv1.AttemptFinished {
	t.Helper()
	for _, ev := range evs {
		if f := ev.GetAttemptFinished(); f != nil && f.GetAttempt().GetNumber() == n {
			return f
		}
	}
	t.Fatalf("no attempt_finished for attempt %d", n)
	return nil
}

// TestAChainStreamsEachAttemptAndDiscardsAFailedOnesOutput: a streaming
// delegate that fails after its first chunks, then one that answers. The
// first attempt's pieces are in the run, its end says they are discarded,
// and the second attempt's pieces follow, with offsets from 0, accepted.
func TestAChainStreamsEachAttemptAndDiscardsAFailedOnesOutput(t *testing.T) {
	t.Parallel()
	stalled := controlstest.Fail(codes.DeadlineExceeded, "stalled: no output for 5s after 2 chunks (idle_timeout)")
	stalled.Chunks = []string{"Once ", "upon "}
	f := newFixture(map[string][]controlstest.Reply{
		"first":  {stalled},
		"second": {{Chunks: []string{"The ", "end."}}},
	})
	r := f.run(t, testCtx(t), chain("first", "second"))
	require.Equal(t, succeeded, r.out.Status, r.out.Reason)
	assert.Equal(t, "The end.", r.out.Result.GetText())

	evs := f.events.All()
	assert.Equal(t, []string{
		"run_started",
		"attempt_started", "attempt_output", "attempt_output", "attempt_finished", "failure_analyzed",
		"attempt_started", "attempt_output", "attempt_output", "attempt_finished",
		"run_finished",
	}, f.events.Kinds())
	type piece struct {
		attempt int32
		text    string
		offset  int64
	}
	var got []piece
	for _, o := range outputs(evs) {
		got = append(got, piece{o.GetAttempt(), o.GetText(), o.GetOffset()})
		assert.False(t, o.GetProvisional(), "no failure criteria: nothing is provisional")
	}
	assert.Equal(t, []piece{{1, "Once ", 0}, {1, "upon ", 5}, {2, "The ", 0}, {2, "end.", 4}}, got)

	first := finishedOf(t, evs, 1)
	assert.True(t, first.GetOutputDiscarded(), "the failed attempt's output is discarded")
	assert.EqualValues(t, 10, first.GetOutputBytes())
	second := finishedOf(t, evs, 2)
	assert.False(t, second.GetOutputDiscarded())
	assert.EqualValues(t, 8, second.GetOutputBytes())
	assert.Equal(t, "Error: stalled: no output for 5s after 2 chunks (idle_timeout)", r.state.GetFailureHistory()[0].GetSummary(),
		"the failure's summary stays Error: <message>")
	for _, ev := range evs {
		if ev.GetAttemptOutput() != nil {
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_RUNNING, ev.GetStatus(), "output leaves the status as it is")
		}
	}
	assert.Equal(t, r.state.GetAttemptLog(), controls.Fold(evs).GetAttemptLog(), "the fold of the events, output included, is the state")
}

// TestOutputIsProvisionalWhileCriteriaHaveToRule: with failure criteria,
// every piece is provisional, and a rejected answer's output is
// discarded.
func TestOutputIsProvisionalWhileCriteriaHaveToRule(t *testing.T) {
	t.Parallel()
	f := newFixture(map[string][]controlstest.Reply{
		"first":  {{Chunks: []string{"I cannot ", "help."}}},
		"second": {{Chunks: []string{"Sure."}}},
	})
	f.env.Criteria = rejectTexts{"I cannot help.": "a refusal"}
	r := f.run(t, testCtx(t), chain("first", "second"))
	require.Equal(t, succeeded, r.out.Status, r.out.Reason)
	evs := f.events.All()
	require.Len(t, outputs(evs), 3)
	for _, o := range outputs(evs) {
		assert.True(t, o.GetProvisional())
	}
	assert.Equal(t, attemptRejected, finishedOf(t, evs, 1).GetAttempt().GetOutcome())
	assert.True(t, finishedOf(t, evs, 1).GetOutputDiscarded())
	assert.False(t, finishedOf(t, evs, 2).GetOutputDiscarded())
}

// TestAnAttemptWithoutOutputDiscardsNothing: a delegate that does not
// stream fails as before, with no output fields set.
func TestAnAttemptWithoutOutputDiscardsNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(map[string][]controlstest.Reply{"first": {unavailable("down")}, "second": {ok("fine")}})
	r := f.run(t, testCtx(t), chain("first", "second"))
	require.Equal(t, succeeded, r.out.Status)
	evs := f.events.All()
	assert.Empty(t, outputs(evs))
	assert.False(t, finishedOf(t, evs, 1).GetOutputDiscarded())
	assert.Zero(t, finishedOf(t, evs, 1).GetOutputBytes())
}

// TestOutputOfAnEndedAttemptIsDropped: a piece that arrives after its
// attempt ended (a race's loser, cancelled with a piece on its way) makes
// no event, and nothing after run_finished does.
func TestOutputOfAnEndedAttemptIsDropped(t *testing.T) {
	t.Parallel()
	var events controlstest.Events
	tr := controls.NewTracker(&stubbornv1.ControlState{RunId: "r"}, controlstest.NewClock(), events.Sink)
	tr.Start()
	n := tr.BeginAttempt("", "d", "brief", 0)
	tr.Output(n, "a", false)
	tr.Output(n, "", false) // empty: nothing
	tr.EndAttempt(n, attemptCancelled, nil, nil, "")
	tr.Output(n, "late", false)
	tr.Output(n+1, "never begun", false)
	tr.Finish(cancelled, nil, "", "cancelled", stubbornv1.StatusReason_STATUS_REASON_UNSPECIFIED)
	tr.Output(n, "after the end", false)
	assert.Equal(t, []string{"run_started", "attempt_started", "attempt_output", "attempt_finished", "run_finished"}, events.Kinds())
	assert.True(t, finishedOf(t, events.All(), n).GetOutputDiscarded())
}

// TestAResumedRunDiscardsTheOutputOfItsInterruptedAttempt: a journal cut
// while an attempt streamed: the resumed run ends that attempt
// interrupted with its output discarded (its bytes counted from the
// journal), and the next attempt streams from offset 0.
func TestAResumedRunDiscardsTheOutputOfItsInterruptedAttempt(t *testing.T) {
	t.Parallel()
	spec := chain("a", "b")
	answers := map[int32]controlstest.Reply{1: {Chunks: []string{"par", "tial"}}, 2: {Chunks: []string{"whole"}, Text: "whole"}}
	live := &byAttempt{answers: answers, info: controls.DelegateInfo{Idempotent: true}}
	_, all := runOnce(t, spec, live, nil)
	cut := 0
	for i, ev := range all {
		if o := ev.GetAttemptOutput(); o != nil && o.GetAttempt() == 1 {
			cut = i + 1 // after the first attempt's pieces
		}
	}
	require.Equal(t, []string{"run_started", "attempt_started", "attempt_output", "attempt_output"}, kinds(all[:cut]))

	d := &byAttempt{answers: answers, info: controls.DelegateInfo{Idempotent: true}}
	out, fresh := runOnce(t, spec, d, all[:cut])
	require.Equal(t, succeeded, out.Status, out.Reason)
	end := fresh[0].GetAttemptFinished()
	require.NotNil(t, end)
	assert.Equal(t, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_INTERRUPTED, end.GetAttempt().GetOutcome())
	assert.True(t, end.GetOutputDiscarded())
	assert.EqualValues(t, 7, end.GetOutputBytes())
	o := outputs(fresh)
	require.Len(t, o, 1)
	assert.Equal(t, int32(2), o[0].GetAttempt())
	assert.Zero(t, o[0].GetOffset())
	assert.Equal(t, "whole", out.Result.GetText())
}
