package controls_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// olderJournals holds runs recorded by b8318ca, before FailureRecord's
// not_retried_code and ControlState's status_reason_code (see the
// record_test.go beside them).
const olderJournals = "testdata/journals-b8318ca"

func readOlderJournal(t *testing.T, name string) []*stubbornv1.RunEvent {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(olderJournals, name+".jsonl"))
	require.NoError(t, err)
	return readJournalLines(t, b)
}

// readJournalLines reads a journal of protojson RunEvents, one a line.
func readJournalLines(t *testing.T, b []byte) []*stubbornv1.RunEvent {
	t.Helper()
	var evs []*stubbornv1.RunEvent
	for line := range bytes.Lines(b) {
		ev := &stubbornv1.RunEvent{}
		require.NoError(t, protojson.Unmarshal(line, ev))
		evs = append(evs, ev)
	}
	return evs
}

// resumeOlder resumes a run from journal as a server of this release
// does, over delegates that must not be called.
func resumeOlder(ctx context.Context, journal []*stubbornv1.RunEvent) (*controls.Tracker, *controlstest.Delegates, <-chan controls.Outcome) {
	st := proto.CloneOf(journal[0].GetRunStarted().GetState())
	tr := controls.NewReplayTracker(proto.CloneOf(st), controlstest.NewClock(), nil, journal)
	d := controlstest.NewDelegates(nil)
	done := make(chan controls.Outcome, 1)
	go func() {
		tr.Start()
		out := controls.Execute(ctx, &controls.Env{Delegates: d, Tracker: tr, Clock: controlstest.NewClock()}, st.GetTaskBrief(), st.GetControl())
		tr.Finish(out.Status, out.Result, out.Winner, out.Reason, out.Code)
		done <- out
	}()
	return tr, d, done
}

// A run recorded by b8318ca that a server of this release resumes just
// before its end (a takeover after its last failure was recorded) ends as
// it did, with the same words, now with a code: the journal's records have
// words only, and the retry control reads them (a round that ran out,
// "retries exhausted …") as that release did.
func TestOlderJournalsResumeToTheSameEnd(t *testing.T) {
	codes := map[string]stubbornv1.StatusReason{
		"retry_not_transient":  stubbornv1.StatusReason_STATUS_REASON_NOT_RETRIED,
		"retry_refused":        stubbornv1.StatusReason_STATUS_REASON_NOT_RETRIED,
		"retry_rejected":       stubbornv1.StatusReason_STATUS_REASON_NOT_RETRIED,
		"retry_not_idempotent": stubbornv1.StatusReason_STATUS_REASON_NOT_RETRIED,
		"retry_hint_no_retry":  stubbornv1.StatusReason_STATUS_REASON_NOT_RETRIED,
		"retry_hint_over_cap":  stubbornv1.StatusReason_STATUS_REASON_NOT_RETRIED,
		"retry_deadline":       stubbornv1.StatusReason_STATUS_REASON_NOT_RETRIED,
		"retry_budget":         stubbornv1.StatusReason_STATUS_REASON_NOT_RETRIED,
		"retry_exhausted_fail": stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED,
		"retry_decision_fail":  stubbornv1.StatusReason_STATUS_REASON_DECISION_FAIL,
		"retry_no_decision":    stubbornv1.StatusReason_STATUS_REASON_DECISION_TIMEOUT,
		"retry_run_timeout":    stubbornv1.StatusReason_STATUS_REASON_RUN_TIMEOUT,
		"fallback_all_failed":  stubbornv1.StatusReason_STATUS_REASON_ALL_FAILED,
		// Taken over again after its interrupted attempt was recorded: the
		// delegate is not called a second time.
		"learning_interrupted": stubbornv1.StatusReason_STATUS_REASON_NOT_RETRIED,
	}
	for name, code := range codes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			all := readOlderJournal(t, name)
			recorded := all[len(all)-1].GetRunFinished().GetState()
			require.NotNil(t, recorded, "the journal ends with run_finished")
			ctx := testCtx(t)
			if name == "retry_run_timeout" {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, time.Now().Add(-time.Second))
				defer cancel()
			}
			tr, d, done := resumeOlder(ctx, all[:len(all)-1])
			out := recv(t, done, "the resumed run to end")
			assert.Empty(t, d.Calls(), "every attempt comes from the journal")
			assert.Equal(t, recorded.GetStatus(), out.Status)
			assert.Equal(t, recorded.GetStatusReason(), out.Reason)
			assert.Equal(t, code, out.Code)
			st := tr.Snapshot()
			assert.Equal(t, code, st.GetStatusReasonCode())
			require.Len(t, st.GetFailureHistory(), len(recorded.GetFailureHistory()))
			for i, f := range st.GetFailureHistory() {
				assert.True(t, proto.Equal(recorded.GetFailureHistory()[i], f), "failure %d as recorded, words only", i+1)
			}
		})
	}
}

// A run recorded by b8318ca while it waited for a decision is resumed
// waiting, not ended: the round that ran out is read from its words. It
// waits with this release's code, and the decision ends it.
func TestOlderJournalAwaitingADecisionStillWaits(t *testing.T) {
	all := readOlderJournal(t, "retry_exhausted_ask")
	require.NotNil(t, all[len(all)-1].GetDecisionRequested(), "recorded waiting")
	last := failureEvents(all)[len(failureEvents(all))-1].GetFailure()
	require.Equal(t, stubbornv1.NotRetried_NOT_RETRIED_UNSPECIFIED, last.GetNotRetriedCode())
	require.True(t, strings.HasPrefix(last.GetNotRetriedReason(), "retries exhausted"), last.GetNotRetriedReason())

	tr, d, done := resumeOlder(testCtx(t), all)
	// Awaiting from the start (the journal folds to it); the code once the
	// control has replayed up to the wait.
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, tr.Status())
	require.Eventually(t, func() bool {
		return tr.Snapshot().GetStatusReasonCode() == stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED
	}, patience, time.Millisecond)
	st := tr.Snapshot()
	assert.Equal(t, "retries exhausted (1 of 1)", st.GetStatusReason())
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED, st.GetStatusReasonCode())
	require.Eventually(t, func() bool { return tr.Decide(stubbornv1.Decision_DECISION_FAIL, nil) == nil }, patience, time.Millisecond)
	out := recv(t, done, "the resumed run to end")
	assert.Equal(t, failed, out.Status)
	assert.Equal(t, "decision: FAIL", out.Reason)
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_DECISION_FAIL, out.Code)
	assert.Empty(t, d.Calls())
}

// retry-with-learning does not call a delegate that is neither idempotent
// nor read_only again after an attempt the server stopped during: the
// failure is not retried, NOT_RETRIED_INTERRUPTED_NOT_IDEMPOTENT, and the
// run ends FAILED, NOT_RETRIED.
func TestLearningInterruptedAttemptOfANonIdempotentDelegate(t *testing.T) {
	all := readOlderJournal(t, "learning_interrupted")
	require.NotNil(t, all[1].GetAttemptStarted(), "attempt 1 started, never finished")
	tr, d, done := resumeOlder(testCtx(t), all[:2])
	out := recv(t, done, "the resumed run to end")
	assert.Empty(t, d.Calls())
	assert.Equal(t, failed, out.Status)
	assert.Equal(t, `attempt 1 was interrupted and delegate "d" is neither idempotent nor read_only`, out.Reason)
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_NOT_RETRIED, out.Code)
	st := tr.Snapshot()
	require.Len(t, st.GetFailureHistory(), 1)
	f := st.GetFailureHistory()[0]
	assert.Equal(t, out.Reason, f.GetNotRetriedReason())
	assert.Equal(t, stubbornv1.NotRetried_NOT_RETRIED_INTERRUPTED_NOT_IDEMPOTENT, f.GetNotRetriedCode())
	checkCodes(t, out, st)
}
