package controls

import stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"

// The events every run records are made in one allocation each: the
// event, the wrapper of its kind and its message (and, for
// attempt_started, the attempt) side by side, built in place (protobuf
// messages are never copied once made).

type runStartedEvent struct {
	ev   stubbornv1.RunEvent
	kind stubbornv1.RunEvent_RunStarted
	msg  stubbornv1.RunStarted
}

// newRunStarted returns a run_started event of state st.
func newRunStarted(st *stubbornv1.ControlState) *stubbornv1.RunEvent {
	e := &runStartedEvent{}
	e.msg.State = st
	e.kind.RunStarted = &e.msg
	e.ev.Kind = &e.kind
	return &e.ev
}

type attemptStartedEvent struct {
	ev      stubbornv1.RunEvent
	kind    stubbornv1.RunEvent_AttemptStarted
	msg     stubbornv1.AttemptStarted
	attempt stubbornv1.Attempt
}

// newAttemptStarted returns an attempt_started event and its attempt, for
// the caller to fill in.
func newAttemptStarted() (*stubbornv1.RunEvent, *stubbornv1.Attempt) {
	e := &attemptStartedEvent{}
	e.msg.Attempt = &e.attempt
	e.kind.AttemptStarted = &e.msg
	e.ev.Kind = &e.kind
	return &e.ev, &e.attempt
}

type attemptFinishedEvent struct {
	ev   stubbornv1.RunEvent
	kind stubbornv1.RunEvent_AttemptFinished
	msg  stubbornv1.AttemptFinished
}

// newAttemptFinished returns an attempt_finished event and its message,
// for the caller to fill in.
func newAttemptFinished() (*stubbornv1.RunEvent, *stubbornv1.AttemptFinished) {
	e := &attemptFinishedEvent{}
	e.kind.AttemptFinished = &e.msg
	e.ev.Kind = &e.kind
	return &e.ev, &e.msg
}

type runFinishedEvent struct {
	ev   stubbornv1.RunEvent
	kind stubbornv1.RunEvent_RunFinished
	msg  stubbornv1.RunFinished
}

// newRunFinished returns a run_finished event of state st.
func newRunFinished(st *stubbornv1.ControlState) *stubbornv1.RunEvent {
	e := &runFinishedEvent{}
	e.msg.State = st
	e.kind.RunFinished = &e.msg
	e.ev.Kind = &e.kind
	return &e.ev
}
