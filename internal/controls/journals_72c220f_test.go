package controls_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// Runs recorded by 72c220f, the release before effects were keyed by
// path (attempt numbers handed out in arrival order, races of presets
// among them; no RunEvent.status, no ControlState.presets), resumed by
// this one just before their end, as a takeover after their last step
// would: every recorded step is found where it happened, no delegate is
// called, and each ends as it did, with a journal that folds to its final
// state.
func TestJournalsOf72c220fResumeToTheSameEnd(t *testing.T) {
	const dir = "testdata/journals-72c220f"
	retryOf := func(target string) *stubbornv1.ControlSpec {
		return &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
			Target: target, Attempts: ptr(int32(2)), BaseWait: durationpb.New(time.Second), OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL}}}
	}
	presets := presetMap{"p": retryOf("a"), "q": retryOf("b")} // as recorded (record_test.go)
	files, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	require.NoError(t, err)
	require.Len(t, files, 17)
	finished := 0
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".jsonl")
		t.Run(name, func(t *testing.T) {
			b, err := os.ReadFile(f)
			require.NoError(t, err)
			all := readJournalLines(t, b)
			recorded := all[len(all)-1].GetRunFinished().GetState()
			if recorded == nil {
				return // recorded waiting (retry_exhausted_ask): TestOlderJournalAwaitingADecisionStillWaits's case
			}
			finished++
			for _, ev := range all {
				require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED, ev.GetStatus(), "recorded before RunEvent.status")
			}
			ctx := testCtx(t)
			if name == "retry_run_timeout" {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, time.Now().Add(-time.Second))
				defer cancel()
			}
			journal := all[:len(all)-1]
			st, rec, fresh := resumeFrom(nil, journal)
			tr := controls.NewReplayTracker(st, controlstest.NewClock(), rec, journal)
			d := controlstest.NewDelegates(nil)
			tr.Start()
			out := controls.Execute(ctx, &controls.Env{Delegates: d, Tracker: tr, Clock: controlstest.NewClock(), Presets: presets}, st.GetTaskBrief(), st.GetControl())
			tr.Finish(out.Status, out.Result, out.Winner, out.Reason, out.Code)
			assert.Empty(t, d.Calls(), "every attempt comes from the journal")
			assert.Equal(t, recorded.GetStatus(), out.Status, out.Reason)
			assert.Equal(t, recorded.GetStatusReason(), out.Reason)
			assert.Equal(t, recorded.GetStatusReasonCode(), out.Code)
			assert.Equal(t, recorded.GetWinner(), out.Winner)
			assert.True(t, proto.Equal(recorded.GetResult(), out.Result))
			evs := fresh()
			require.Len(t, evs, 1, "only run_finished is new")
			end := evs[0].GetRunFinished().GetState()
			require.NotNil(t, end)
			assert.Len(t, end.GetAttemptLog(), len(recorded.GetAttemptLog()))
			for i, a := range end.GetAttemptLog() {
				assert.Equal(t, recorded.GetAttemptLog()[i].GetDelegate(), a.GetDelegate(), "attempt %d", i+1)
				assert.Equal(t, recorded.GetAttemptLog()[i].GetOutcome(), a.GetOutcome(), "attempt %d", i+1)
			}
			assert.True(t, proto.Equal(end, controls.Fold(append(journal[:len(journal):len(journal)], evs...))), "the journal folds to the final state")
		})
	}
	assert.Equal(t, 16, finished)
}
