package telemetry

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// olderJournals is where the journals recorded by b8318ca, a release
// before not_retried_code and reason_code, are kept (see the record_test.go
// beside them).
const olderJournals = "../controls/testdata/journals-b8318ca"

// readJournal reads one of olderJournals: a protojson RunEvent a line.
func readJournal(t *testing.T, path string) []*stubbornv1.RunEvent {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var evs []*stubbornv1.RunEvent
	for line := range bytes.Lines(b) {
		ev := &stubbornv1.RunEvent{}
		require.NoError(t, protojson.Unmarshal(line, ev), path)
		evs = append(evs, ev)
	}
	return evs
}

// suppressedBy is, per delegate and reason, the stubborn.retries.suppressed
// points recorded.
func (r *recorder) suppressedBy(t *testing.T) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.reader.Collect(context.Background(), &rm))
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "stubborn.retries.suppressed" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				d, _ := dp.Attributes.Value(delegateKey)
				reason, _ := dp.Attributes.Value(reasonKey)
				out[d.AsString()+"/"+reason.AsString()] += dp.Value
			}
		}
	}
	return out
}

// decisionReasons are the stubborn.reason of every decision_requested span
// event recorded.
func (r *recorder) decisionReasons() []string {
	var out []string
	for _, s := range r.spans.Ended() {
		for _, ev := range s.Events() {
			if ev.Name != "stubborn.decision_requested" {
				continue
			}
			for _, kv := range ev.Attributes {
				if kv.Key == reasonKey {
					out = append(out, kv.Value.AsString())
				}
			}
		}
	}
	return out
}

// observeJournal runs a journal's events through a new recorder, as a
// server that resumes the run, or a watcher's replay, sees them.
func observeJournal(t *testing.T, evs []*stubbornv1.RunEvent) *recorder {
	t.Helper()
	r := newRecorder(t)
	st := proto.CloneOf(evs[0].GetRunStarted().GetState())
	_, observe := r.tel.ObserveRun(context.Background(), context.Background(), st, true)
	for _, ev := range evs {
		observe(ev)
	}
	if evs[len(evs)-1].GetRunFinished() == nil {
		// Waiting for a decision: end the run so its span is recorded.
		observe(runFinished(&stubbornv1.ControlState{RunId: st.GetRunId(), Control: st.GetControl(), Status: stubbornv1.RunStatus_RUN_STATUS_CANCELLED}))
	}
	return r
}

// Journals recorded before the codes (b8318ca) are classified by their
// words, and the codes this release records for the same failures classify
// them the same: a metric counts a reason the same, whichever release
// recorded the failure.
func TestOlderJournalsClassifyAsTheirCodesWould(t *testing.T) {
	// Per journal: the reason of its not-retried failure, and the code
	// this release records for it.
	tests := map[string]struct {
		reason string
		code   stubbornv1.NotRetried
	}{
		"retry_not_transient":  {reasonNotTransient, stubbornv1.NotRetried_NOT_RETRIED_NOT_TRANSIENT},
		"retry_refused":        {reasonNotTransient, stubbornv1.NotRetried_NOT_RETRIED_REFUSED},
		"retry_rejected":       {reasonRejected, stubbornv1.NotRetried_NOT_RETRIED_REJECTED},
		"retry_not_idempotent": {reasonNotIdempotent, stubbornv1.NotRetried_NOT_RETRIED_NOT_IDEMPOTENT},
		"retry_hint_no_retry":  {reasonHintNoRetry, stubbornv1.NotRetried_NOT_RETRIED_HINT_NO_RETRY},
		"retry_hint_over_cap":  {reasonHintOverCap, stubbornv1.NotRetried_NOT_RETRIED_HINT_OVER_CAP},
		"retry_exhausted_fail": {reasonExhausted, stubbornv1.NotRetried_NOT_RETRIED_EXHAUSTED},
		"retry_exhausted_ask":  {reasonExhausted, stubbornv1.NotRetried_NOT_RETRIED_EXHAUSTED},
		"retry_decision_fail":  {reasonExhausted, stubbornv1.NotRetried_NOT_RETRIED_EXHAUSTED},
		"retry_no_decision":    {reasonExhausted, stubbornv1.NotRetried_NOT_RETRIED_EXHAUSTED},
		"retry_deadline":       {reasonDeadline, stubbornv1.NotRetried_NOT_RETRIED_DEADLINE},
		"retry_budget":         {reasonBudget, stubbornv1.NotRetried_NOT_RETRIED_BUDGET},
		"learning_interrupted": {reasonNotIdempotent, stubbornv1.NotRetried_NOT_RETRIED_INTERRUPTED_NOT_IDEMPOTENT},
		"retry_run_timeout":    {}, // no failure: stopped before any attempt
		"fallback_all_failed":  {}, // a chain does not retry
	}
	files, err := filepath.Glob(filepath.Join(olderJournals, "*.jsonl"))
	require.NoError(t, err)
	require.Len(t, files, len(tests), "a row per journal")
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".jsonl")
		tt, ok := tests[name]
		require.True(t, ok, "no row for %s", name)
		t.Run(name, func(t *testing.T) {
			evs := readJournal(t, file)
			want := map[string]int64{}
			asks := 0
			for _, ev := range evs {
				f := ev.GetFailureAnalyzed().GetFailure()
				require.Equal(t, stubbornv1.NotRetried_NOT_RETRIED_UNSPECIFIED, f.GetNotRetriedCode(), "recorded without codes")
				if f.GetNotRetriedReason() != "" {
					want[f.GetDelegate()+"/"+tt.reason]++
				}
				if ev.GetDecisionRequested() != nil {
					require.Equal(t, stubbornv1.StatusReason_STATUS_REASON_UNSPECIFIED, ev.GetDecisionRequested().GetReasonCode())
					asks++
				}
			}
			if tt.reason == "" {
				assert.Empty(t, want)
			} else {
				assert.Len(t, want, 1, "one failure not retried")
			}

			// Recorded without codes: classified by the words.
			older := observeJournal(t, evs)
			assert.Equal(t, want, older.suppressedBy(t))
			assert.Len(t, older.decisionReasons(), asks)
			for _, got := range older.decisionReasons() {
				assert.Equal(t, reasonExhausted, got)
			}

			// The same failures with this release's codes, and words that
			// cannot be read: classified by the codes, the same.
			coded := make([]*stubbornv1.RunEvent, len(evs))
			for i, ev := range evs {
				ev = proto.CloneOf(ev)
				if f := ev.GetFailureAnalyzed().GetFailure(); f.GetNotRetriedReason() != "" {
					f.NotRetriedCode, f.NotRetriedReason = tt.code, "?"
				}
				if req := ev.GetDecisionRequested(); req != nil {
					req.ReasonCode, req.Reason = stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED, "?"
				}
				coded[i] = ev
			}
			current := observeJournal(t, coded)
			assert.Equal(t, want, current.suppressedBy(t))
			assert.Equal(t, older.decisionReasons(), current.decisionReasons())
		})
	}
}

// The reason a failure event carries on the run span comes from the code.
func TestFailureEventCarriesTheCodesReason(t *testing.T) {
	r := newRecorder(t)
	st := &stubbornv1.ControlState{RunId: "run_1", Control: chain("a")}
	_, observe := r.tel.ObserveRun(context.Background(), context.Background(), st, false)
	observe(runStarted)
	observe(&stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_FailureAnalyzed{FailureAnalyzed: &stubbornv1.FailureAnalyzed{
		Failure: &stubbornv1.FailureRecord{
			Attempt: 1, Delegate: "a", NotRetriedReason: "retry budget exhausted",
			NotRetriedCode: stubbornv1.NotRetried_NOT_RETRIED_BUDGET,
		},
	}}})
	observe(runFinished(&stubbornv1.ControlState{RunId: "run_1", Control: chain("a"), Status: stubbornv1.RunStatus_RUN_STATUS_FAILED}))
	assert.Equal(t, map[string]int64{"a/" + reasonBudget: 1}, r.suppressedBy(t))
	var attrs []attribute.KeyValue
	for _, s := range r.spans.Ended() {
		for _, ev := range s.Events() {
			if ev.Name == "stubborn.failure" {
				attrs = ev.Attributes
			}
		}
	}
	assert.Contains(t, attrs, reasonKey.String(reasonBudget))
}
