package controls

import (
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// A run's state is one fold over its events: apply(state, event), in seq
// order, from the run_started event's state. The tracker folds every event
// it emits or replays with apply, and stamps the status the fold reached on
// the event (RunEvent.status), so every reader of a run's events (the
// server's run feed, the console, a client in any language) reads the
// status there rather than working it out again. NextStatus is the run's
// status machine, the only one.

// NextStatus returns the run's status after ev, given its status before
// it: RUNNING when the run starts, an attempt starts or a decision is
// received; BACKING_OFF when a backoff is scheduled; AWAITING_DECISION
// when a decision is requested; the final state's status when the run
// finishes; otherwise (an attempt's end, a failure's analysis, a takeover)
// unchanged. A status the event carries is not consulted: NextStatus is
// how that status is computed.
func NextStatus(prev stubbornv1.RunStatus, ev *stubbornv1.RunEvent) stubbornv1.RunStatus {
	switch k := ev.GetKind().(type) {
	case *stubbornv1.RunEvent_RunStarted, *stubbornv1.RunEvent_AttemptStarted, *stubbornv1.RunEvent_DecisionReceived:
		return stubbornv1.RunStatus_RUN_STATUS_RUNNING
	case *stubbornv1.RunEvent_BackoffScheduled:
		return stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF
	case *stubbornv1.RunEvent_DecisionRequested:
		return stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION
	case *stubbornv1.RunEvent_RunFinished:
		if s := k.RunFinished.GetState().GetStatus(); s != stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED {
			return s
		}
	}
	return prev
}

// StatusAfter returns the run's status after ev: the status ev carries,
// or, for an event recorded before events carried one, NextStatus.
func StatusAfter(prev stubbornv1.RunStatus, ev *stubbornv1.RunEvent) stubbornv1.RunStatus {
	if s := ev.GetStatus(); s != stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED {
		return s
	}
	return NextStatus(prev, ev)
}

// apply folds ev, the run's next event, into st, the state the run's
// events before it folded to (for run_started, an empty state or the
// state it carries). st takes ev's messages (an attempt, a failure
// record) as they are: clone ev first when it must not change with st.
//
// What each event changes:
//   - every event: update_time (the event's time) and status (StatusAfter);
//   - run_started: the whole state, when st is not already its state;
//   - attempt_started: the attempt joins the attempt log, and attempts
//     counts it when it is the run's own control's (path "");
//   - attempt_finished: the attempt replaces its entry in the log;
//   - failure_analyzed: the failure joins the failure history;
//   - decision_requested: status_reason and its code are the request's;
//   - decision_received: status_reason and its code are cleared;
//   - attempt_output: nothing else (the text is the attempt's result once
//     it succeeds);
//   - run_finished: result, winner, status_reason and its code, end_time
//     and attempts are the final state's (its attempt log and failure
//     history are what the events before it folded to, uncut).
func apply(st *stubbornv1.ControlState, ev *stubbornv1.RunEvent) {
	switch k := ev.GetKind().(type) {
	case *stubbornv1.RunEvent_RunStarted:
		if from := k.RunStarted.GetState(); from != nil && from != st {
			proto.Reset(st)
			proto.Merge(st, from)
		}
	case *stubbornv1.RunEvent_AttemptStarted:
		a := k.AttemptStarted.GetAttempt()
		if a.GetPath() == "" {
			// attempts counts the run's own control's attempts; a nested
			// preset's are in the log under their path.
			st.Attempts++
		}
		placeAttempt(st, a)
	case *stubbornv1.RunEvent_AttemptFinished:
		a := k.AttemptFinished.GetAttempt()
		if i := int(a.GetNumber()) - 1; i >= 0 && i < len(st.AttemptLog) {
			st.AttemptLog[i] = a
		}
		addAttemptCost(st, k.AttemptFinished)
	case *stubbornv1.RunEvent_FailureAnalyzed:
		st.FailureHistory = append(st.FailureHistory, k.FailureAnalyzed.GetFailure())
		addCallCost(st, k.FailureAnalyzed.GetAnalysisCost())
	case *stubbornv1.RunEvent_DecisionRequested:
		st.StatusReason, st.StatusReasonCode = k.DecisionRequested.GetReason(), k.DecisionRequested.GetReasonCode()
	case *stubbornv1.RunEvent_DecisionReceived:
		st.StatusReason, st.StatusReasonCode = "", stubbornv1.StatusReason_STATUS_REASON_UNSPECIFIED
		setLimit(st, k.DecisionReceived.GetSpendLimit())
	case *stubbornv1.RunEvent_RunFinished:
		if end := k.RunFinished.GetState(); end != nil && end != st {
			st.Result, st.Winner = end.GetResult(), end.GetWinner()
			st.StatusReason, st.StatusReasonCode = end.GetStatusReason(), end.GetStatusReasonCode()
			st.EndTime, st.Attempts = copyTime(end.GetEndTime()), end.GetAttempts()
		}
	}
	st.Status = StatusAfter(st.GetStatus(), ev)
	if ev.GetTime() != nil {
		st.UpdateTime = ev.GetTime() // st takes ev's messages
	}
}

// placeAttempt puts attempt a, just started, in st's log in its place by
// number: a replay of concurrent branches may reach a later attempt before
// an earlier one, whose place waits for it (a journal, in seq order, has
// them in order).
func placeAttempt(st *stubbornv1.ControlState, a *stubbornv1.Attempt) {
	i := int(a.GetNumber()) - 1
	switch {
	case i < 0 || i == len(st.AttemptLog):
		st.AttemptLog = append(st.AttemptLog, a)
	case i < len(st.AttemptLog):
		st.AttemptLog[i] = a
	default:
		for len(st.AttemptLog) < i {
			st.AttemptLog = append(st.AttemptLog, &stubbornv1.Attempt{Number: int32(len(st.AttemptLog)) + 1})
		}
		st.AttemptLog = append(st.AttemptLog, a)
	}
}

// setLimit makes l (nil: none) the run's spend limit from then on.
func setLimit(st *stubbornv1.ControlState, l *stubbornv1.SpendLimit) {
	if l == nil {
		return
	}
	if st.Options == nil {
		st.Options = &stubbornv1.RunOptions{}
	}
	st.Options.SpendLimit = l
}

// Fold returns the state a run's events fold to, in seq order from its
// run_started event, without changing them (each is cloned): what a reader
// of a whole journal (a client, a test) sees, and what the tracker's state
// is after the same events.
func Fold(events []*stubbornv1.RunEvent) *stubbornv1.ControlState {
	st := &stubbornv1.ControlState{}
	for _, ev := range events {
		apply(st, proto.CloneOf(ev))
	}
	return st
}
