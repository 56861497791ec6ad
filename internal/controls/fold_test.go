package controls_test

import (
	"maps"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
)

// The run's status machine: every event kind from every status.
func TestNextStatusOfEveryKindFromEveryStatus(t *testing.T) {
	const (
		running  = stubbornv1.RunStatus_RUN_STATUS_RUNNING
		backing  = stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF
		awaiting = stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION
	)
	finished := func(s stubbornv1.RunStatus) *stubbornv1.RunEvent {
		return &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_RunFinished{RunFinished: &stubbornv1.RunFinished{
			State: &stubbornv1.ControlState{Status: s}}}}
	}
	kinds := []struct {
		name string
		ev   *stubbornv1.RunEvent
		want stubbornv1.RunStatus // UNSPECIFIED: the status before it
	}{
		{"run_started", &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_RunStarted{RunStarted: &stubbornv1.RunStarted{}}}, running},
		{"attempt_started", &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_AttemptStarted{AttemptStarted: &stubbornv1.AttemptStarted{}}}, running},
		{"attempt_finished", &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_AttemptFinished{AttemptFinished: &stubbornv1.AttemptFinished{}}}, 0},
		{"failure_analyzed", &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_FailureAnalyzed{FailureAnalyzed: &stubbornv1.FailureAnalyzed{}}}, 0},
		{"backoff_scheduled", &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_BackoffScheduled{BackoffScheduled: &stubbornv1.BackoffScheduled{}}}, backing},
		{"decision_requested", &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_DecisionRequested{DecisionRequested: &stubbornv1.DecisionRequested{}}}, awaiting},
		{"decision_received", &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_DecisionReceived{DecisionReceived: &stubbornv1.DecisionReceived{}}}, running},
		{"run_resumed", &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_RunResumed{RunResumed: &stubbornv1.RunResumed{}}}, 0},
		{"attempt_output", &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_AttemptOutput{AttemptOutput: &stubbornv1.AttemptOutput{}}}, 0},
		{"run_finished SUCCEEDED", finished(stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED), stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED},
		{"run_finished EXHAUSTED", finished(stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED), stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED},
		{"run_finished FAILED", finished(stubbornv1.RunStatus_RUN_STATUS_FAILED), stubbornv1.RunStatus_RUN_STATUS_FAILED},
		{"run_finished CANCELLED", finished(stubbornv1.RunStatus_RUN_STATUS_CANCELLED), stubbornv1.RunStatus_RUN_STATUS_CANCELLED},
		{"run_finished without a state", &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_RunFinished{RunFinished: &stubbornv1.RunFinished{}}}, 0},
	}
	// Every kind the API has is in the table.
	oneof := (&stubbornv1.RunEvent{}).ProtoReflect().Descriptor().Oneofs().ByName("kind")
	names := map[string]bool{}
	for _, k := range kinds {
		names[string(k.ev.ProtoReflect().WhichOneof(oneof).Name())] = true
	}
	assert.Len(t, names, oneof.Fields().Len(), "every kind of RunEvent")

	for v := range stubbornv1.RunStatus_name {
		prev := stubbornv1.RunStatus(v)
		for _, k := range kinds {
			want := k.want
			if want == stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED {
				want = prev
			}
			assert.Equal(t, want, controls.NextStatus(prev, k.ev), "%s after %s", k.name, prev)
			// A status the event carries wins over the kind's, for the
			// readers (StatusAfter), not for the machine (NextStatus).
			carried := proto.CloneOf(k.ev)
			carried.Status = stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, controls.StatusAfter(prev, carried), "%s after %s, carried", k.name, prev)
			assert.Equal(t, want, controls.StatusAfter(prev, k.ev), "%s after %s, not carried", k.name, prev)
		}
	}
}

// Apply: what each event kind changes in the state.
func TestApplyFoldsEachKind(t *testing.T) {
	at := func(s int64) *timestamppb.Timestamp { return &timestamppb.Timestamp{Seconds: s} }
	st := &stubbornv1.ControlState{}
	controls.Apply(st, &stubbornv1.RunEvent{Time: at(1), Kind: &stubbornv1.RunEvent_RunStarted{RunStarted: &stubbornv1.RunStarted{
		State: &stubbornv1.ControlState{RunId: "r", TaskBrief: "task", Tenant: "t"}}}})
	assert.Equal(t, "r", st.GetRunId())
	assert.Equal(t, "task", st.GetTaskBrief())
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_RUNNING, st.GetStatus())
	assert.Equal(t, int64(1), st.GetUpdateTime().GetSeconds())

	controls.Apply(st, &stubbornv1.RunEvent{Time: at(2), Kind: &stubbornv1.RunEvent_AttemptStarted{AttemptStarted: &stubbornv1.AttemptStarted{
		Attempt: &stubbornv1.Attempt{Number: 1, Delegate: "a"}}}})
	controls.Apply(st, &stubbornv1.RunEvent{Time: at(3), Path: "chain[0]", Kind: &stubbornv1.RunEvent_AttemptStarted{AttemptStarted: &stubbornv1.AttemptStarted{
		Attempt: &stubbornv1.Attempt{Number: 2, Delegate: "b", Path: "chain[0]"}}}})
	assert.Equal(t, int32(1), st.GetAttempts(), "a nested attempt is in the log, not in attempts")
	require.Len(t, st.GetAttemptLog(), 2)

	controls.Apply(st, &stubbornv1.RunEvent{Time: at(4), Kind: &stubbornv1.RunEvent_AttemptFinished{AttemptFinished: &stubbornv1.AttemptFinished{
		Attempt: &stubbornv1.Attempt{Number: 1, Delegate: "a", Outcome: stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_ERROR}}}})
	assert.Equal(t, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_ERROR, st.GetAttemptLog()[0].GetOutcome())
	// An attempt the log does not have is no panic, and changes no entry.
	controls.Apply(st, &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_AttemptFinished{AttemptFinished: &stubbornv1.AttemptFinished{
		Attempt: &stubbornv1.Attempt{Number: 9}}}})
	controls.Apply(st, &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_AttemptFinished{AttemptFinished: &stubbornv1.AttemptFinished{}}})
	require.Len(t, st.GetAttemptLog(), 2)

	controls.Apply(st, &stubbornv1.RunEvent{Time: at(5), Kind: &stubbornv1.RunEvent_FailureAnalyzed{FailureAnalyzed: &stubbornv1.FailureAnalyzed{
		Failure: &stubbornv1.FailureRecord{Attempt: 1, Reason: "busy"}}}})
	require.Len(t, st.GetFailureHistory(), 1)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_RUNNING, st.GetStatus())

	controls.Apply(st, &stubbornv1.RunEvent{Time: at(6), Kind: &stubbornv1.RunEvent_BackoffScheduled{BackoffScheduled: &stubbornv1.BackoffScheduled{NextAttempt: 3}}})
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF, st.GetStatus())

	controls.Apply(st, &stubbornv1.RunEvent{Time: at(7), Kind: &stubbornv1.RunEvent_DecisionRequested{DecisionRequested: &stubbornv1.DecisionRequested{
		Reason: "retries exhausted", ReasonCode: stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED}}})
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, st.GetStatus())
	assert.Equal(t, "retries exhausted", st.GetStatusReason())
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED, st.GetStatusReasonCode())

	// A takeover changes nothing but the time, unless it carries a status.
	controls.Apply(st, &stubbornv1.RunEvent{Time: at(8), Kind: &stubbornv1.RunEvent_RunResumed{RunResumed: &stubbornv1.RunResumed{Owner: "b"}}})
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, st.GetStatus())
	assert.Equal(t, int64(8), st.GetUpdateTime().GetSeconds())

	controls.Apply(st, &stubbornv1.RunEvent{Time: at(9), Kind: &stubbornv1.RunEvent_DecisionReceived{DecisionReceived: &stubbornv1.DecisionReceived{
		Decision: stubbornv1.Decision_DECISION_RETRY}}})
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_RUNNING, st.GetStatus())
	assert.Empty(t, st.GetStatusReason())
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_UNSPECIFIED, st.GetStatusReasonCode())

	end := &stubbornv1.ControlState{Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, Result: &stubbornv1.Result{Text: "ok"},
		Winner: "a", Attempts: 1, EndTime: at(10)}
	controls.Apply(st, &stubbornv1.RunEvent{Time: at(10), Kind: &stubbornv1.RunEvent_RunFinished{RunFinished: &stubbornv1.RunFinished{State: end}}})
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus())
	assert.Equal(t, "ok", st.GetResult().GetText())
	assert.Equal(t, "a", st.GetWinner())
	assert.Equal(t, int64(10), st.GetEndTime().GetSeconds())
	assert.Len(t, st.GetAttemptLog(), 2, "the log is the fold's, not the final state's")
	assert.Equal(t, "task", st.GetTaskBrief(), "run_finished keeps what run_started set")
}

// ExpandPresets: the presets a control reaches, through presets too, once
// each, and nothing for a control that names none.
func TestExpandPresetsFollowsTheTree(t *testing.T) {
	chain := func(names ...string) *stubbornv1.ControlSpec {
		return &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: names}}}
	}
	presets := controls.PresetMap{"outer": chain("inner", "a"), "inner": chain("b", "loop"), "loop": chain("outer"), "unused": chain("c")}
	got := controls.ExpandPresets(chain("outer", "a", "outer"), presets)
	assert.Equal(t, []string{"inner", "loop", "outer"}, slices.Sorted(maps.Keys(got)))
	assert.True(t, proto.Equal(presets["inner"], got["inner"]))
	assert.Nil(t, controls.ExpandPresets(chain("a", "b"), presets))
	assert.Nil(t, controls.ExpandPresets(chain("outer"), nil))
}
