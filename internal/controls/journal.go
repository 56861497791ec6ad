package controls

import (
	"google.golang.org/grpc/codes"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// journal indexes a run's recorded events for replay. Every event is used
// at most once.
//
// An attempt's start, and the backoff before it, are keyed by where they
// happened: the path of the control that made the attempt (Attempt.path:
// "" for the run's own control, "chain[0]", "candidates[1]/target", …) and
// the attempt's step within that path (1 for the first attempt made
// there). Within one path, steps happen one after another; concurrent
// branches (a race's candidates, the presets they run) have paths of
// their own. So a replay finds each branch's record wherever the branches'
// goroutines happened to run, and the run-wide attempt number (public:
// Attempt.number, ExecuteRequest.attempt, CEL's attempt) is read from the
// record, never used to find one. What follows an attempt's start (its
// end, its failure's analysis) is keyed by that number. A person's
// decisions are taken in order per path. Journals recorded before this
// keying (numbers handed out in arrival order) read the same way: within
// a path, their order is the order the steps happened in.
type journal struct {
	runStarted *stubbornv1.RunEvent
	startedAt  map[stepKey]*stubbornv1.RunEvent  // attempt_started by path and step
	backoffAt  map[stepKey]*stubbornv1.RunEvent  // backoff_scheduled by the step that follows
	started    map[int32]*stubbornv1.RunEvent    // attempt_started by attempt number
	finished   map[int32]*stubbornv1.RunEvent    // attempt_finished by attempt number
	failures   map[int32]*stubbornv1.RunEvent    // failure_analyzed by attempt number
	requests   map[string][]*stubbornv1.RunEvent // decision_requested by path, in order
	answers    map[string][]*stubbornv1.RunEvent // decision_received by path, in order
	used       map[*stubbornv1.RunEvent]bool
	status     stubbornv1.RunStatus   // what the whole journal folds to
	events     []*stubbornv1.RunEvent // all of them, in seq order
	last       int32                  // the highest attempt number it holds
}

// stepKey is where an attempt happened: its control's path, and its step
// within that path (from 1).
type stepKey struct {
	path string
	step int32
}

func newJournal(evs []*stubbornv1.RunEvent) *journal {
	j := &journal{
		startedAt: map[stepKey]*stubbornv1.RunEvent{},
		backoffAt: map[stepKey]*stubbornv1.RunEvent{},
		started:   map[int32]*stubbornv1.RunEvent{},
		finished:  map[int32]*stubbornv1.RunEvent{},
		failures:  map[int32]*stubbornv1.RunEvent{},
		requests:  map[string][]*stubbornv1.RunEvent{},
		answers:   map[string][]*stubbornv1.RunEvent{},
		used:      map[*stubbornv1.RunEvent]bool{},
		events:    evs,
	}
	steps := map[string]int32{} // attempts started so far, by path
	for _, ev := range evs {
		j.status = StatusAfter(j.status, ev)
		switch k := ev.GetKind().(type) {
		case *stubbornv1.RunEvent_RunStarted:
			j.runStarted = ev
		case *stubbornv1.RunEvent_AttemptStarted:
			a := k.AttemptStarted.GetAttempt()
			steps[a.GetPath()]++
			j.startedAt[stepKey{a.GetPath(), steps[a.GetPath()]}] = ev
			j.started[a.GetNumber()] = ev
			j.last = max(j.last, a.GetNumber())
		case *stubbornv1.RunEvent_AttemptFinished:
			j.finished[k.AttemptFinished.GetAttempt().GetNumber()] = ev
		case *stubbornv1.RunEvent_FailureAnalyzed:
			j.failures[k.FailureAnalyzed.GetFailure().GetAttempt()] = ev
		case *stubbornv1.RunEvent_BackoffScheduled:
			j.backoffAt[stepKey{ev.GetPath(), steps[ev.GetPath()] + 1}] = ev
		case *stubbornv1.RunEvent_DecisionRequested:
			j.requests[ev.GetPath()] = append(j.requests[ev.GetPath()], ev)
		case *stubbornv1.RunEvent_DecisionReceived:
			j.answers[ev.GetPath()] = append(j.answers[ev.GetPath()], ev)
		}
	}
	return j
}

// noJournal is the empty journal of a run that is not being replayed. Its
// nil maps read as empty and it is never written.
var noJournal = &journal{}

// take marks ev used and returns it; nil when there is no such event, or it
// was used already.
func (j *journal) take(ev *stubbornv1.RunEvent) *stubbornv1.RunEvent {
	if ev == nil || j.used[ev] {
		return nil
	}
	j.used[ev] = true
	return ev
}

// next returns the first unused event of list.
func (j *journal) next(list []*stubbornv1.RunEvent) *stubbornv1.RunEvent {
	for _, ev := range list {
		if !j.used[ev] {
			return ev
		}
	}
	return nil
}

// The recorded effects: what the journal says a control met, for the
// environment to feed back (see effects.go). Each reads the journal without
// taking its events; the tracker's steps take them.

// nextNumber returns the run-wide number the next live attempt gets: the
// one after the highest in the log and in the journal. Callers hold t.mu.
func (t *Tracker) nextNumber() int32 {
	return max(int32(len(t.state.GetAttemptLog())), t.journal.last) + 1
}

// nextStep returns where the next attempt at path happens. Callers hold
// t.mu.
func (t *Tracker) nextStep(path string) stepKey {
	if path == "" {
		return stepKey{path, t.ownSteps + 1}
	}
	return stepKey{path, t.steps[path] + 1}
}

// nextAttempt is nextNumber, for a backoff's announcement of the attempt
// that follows it.
func (t *Tracker) nextAttempt() int32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.nextNumber()
}

// recordedAnswer returns how attempt n ended according to the journal, as
// its attempt's end and, if it failed, its failure record had it. An
// attempt that started but never finished comes back interrupted (as
// errInterrupted): the delegate may or may not have done it. ok is false
// when the journal does not know the attempt's end, and the attempt must be
// made.
func (t *Tracker) recordedAnswer(n int32) (attemptResult, bool) {
	if t.journal == noJournal {
		return attemptResult{}, false // not replaying: no need for the lock
	}
	t.mu.Lock()
	j := t.journal
	fin, started := j.finished[n], j.started[n]
	var rec *stubbornv1.FailureRecord
	if f := j.failures[n]; f != nil {
		rec = f.GetFailureAnalyzed().GetFailure()
	}
	interrupted := fin == nil && started != nil && j.used[started]
	t.mu.Unlock()
	switch {
	case interrupted:
		return attemptResult{
			outcome: stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_INTERRUPTED,
			err:     errInterrupted, failed: true,
			reason: errInterrupted.Message, summary: "Error: " + errInterrupted.Message,
		}, true
	case fin == nil:
		return attemptResult{}, false
	}
	a := fin.GetAttemptFinished().GetAttempt()
	r := attemptResult{outcome: a.GetOutcome(), result: a.GetResult()}
	if e := a.GetError(); e != nil {
		ce := &CallError{
			Code: codes.Code(e.GetCode()), Message: e.GetMessage(), HTTPStatus: int(e.GetHttpStatus()),
			NotSent: e.GetNotSent(), Refused: e.GetRefused(), RefusedBy: e.GetRefusedBy(),
		}
		if h := e.GetRetryHint(); h != nil {
			ce.HasHint, ce.RetryHint = true, h.AsDuration()
		}
		r.err = ce
	}
	if a.GetOutcome() != stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED {
		r.failed = true
		r.reason, r.summary = rec.GetReason(), rec.GetSummary()
		if rec == nil && r.err != nil {
			r.reason, r.summary = Message(r.err), "Error: "+Message(r.err)
		}
	}
	return r, true
}

// nextStartedAs reports whether the journal holds the start of the attempt
// that comes next at path, as an attempt of delegate: a hedged race whose
// next candidate it is started that candidate at this point.
func (t *Tracker) nextStartedAs(path, delegate string) bool {
	if t.journal == noJournal {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	ev := t.journal.startedAt[t.nextStep(path)]
	return ev != nil && !t.journal.used[ev] && ev.GetAttemptStarted().GetAttempt().GetDelegate() == delegate
}

// nextPick returns the delegate the journal shows the attempt that comes
// next at path went to, when it holds that attempt's start and it was not
// replayed yet: a balance takes its pick from there instead of picking
// again.
func (t *Tracker) nextPick(path string) (string, bool) {
	if t.journal == noJournal {
		return "", false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	ev := t.journal.startedAt[t.nextStep(path)]
	if ev == nil || t.journal.used[ev] {
		return "", false
	}
	return ev.GetAttemptStarted().GetAttempt().GetDelegate(), true
}

// answered reports whether the journal has attempt n's end: the attempt was
// made, and counted wherever attempts are counted, before the run changed
// hands.
func (t *Tracker) answered(n int32) bool {
	if t.journal == noJournal {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.journal.finished[n] != nil
}

// nextAnswer is recordedAnswer for the attempt that comes next at path,
// before it starts.
func (t *Tracker) nextAnswer(path string) (attemptResult, bool) {
	if t.journal == noJournal {
		return attemptResult{}, false
	}
	t.mu.Lock()
	ev := t.journal.startedAt[t.nextStep(path)]
	t.mu.Unlock()
	if ev == nil {
		return attemptResult{}, false
	}
	return t.recordedAnswer(ev.GetAttemptStarted().GetAttempt().GetNumber())
}

// nextScheduled reports whether the journal holds the backoff before the
// attempt that comes next at path: its wait was scheduled, so it ended
// before the run's deadline.
func (t *Tracker) nextScheduled(path string) bool {
	if t.journal == noJournal {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.journal.backoffAt[t.nextStep(path)] != nil
}

// recordedFailure returns the journal's analysis of attempt n's failure and
// whether a retry followed, when the journal holds it and Failure has not
// replayed it yet.
func (t *Tracker) recordedFailure(n int32) (rec *stubbornv1.FailureRecord, willRetry, ok bool) {
	if t.journal == noJournal {
		return nil, false, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	ev := t.journal.failures[n]
	if ev == nil || t.journal.used[ev] {
		return nil, false, false
	}
	f := ev.GetFailureAnalyzed()
	return f.GetFailure(), f.GetWillRetry(), true
}
