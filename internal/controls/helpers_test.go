package controls_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc/codes"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// taskBrief is the original brief every test run starts from.
const taskBrief = "Find three peer-reviewed sources on urban heat islands."

// patience bounds every wait of a test for something that must happen: it
// turns a hang into a failure, it does not measure speed.
const patience = 2 * time.Second

// Shorthands for the scripted replies.
var (
	ok   = controlstest.OK
	fail = controlstest.Fail
)

var (
	hang        = controlstest.Reply{Hang: true}
	hangForever = controlstest.Reply{HangForever: true}
)

// testCtx is a run context that cannot outlive the test.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// returned is one delegate call that came back, with what its context said
// at that moment.
type returned struct {
	call   controls.Call
	err    error // what the call returned
	ctxErr error // ctx.Err() when it returned
	cause  error // context.Cause(ctx) when it returned
}

// observed wraps the scripted fakes: it reports every call as it starts and
// as it returns (with the state of the call's context), and holds the calls
// to gated delegates until the test opens their gate.
type observed struct {
	*controlstest.Delegates
	gates    map[string]chan struct{} // set before the run, read-only during it
	started  chan controls.Call
	returned chan returned
}

// Call reports the call, waits for its gate (or its context), then answers
// from the script.
func (o *observed) Call(ctx context.Context, c controls.Call) (*stubbornv1.Result, error) {
	o.started <- c
	if gate, gated := o.gates[c.Delegate]; gated {
		select {
		case <-gate:
		case <-ctx.Done():
		}
	}
	res, err := o.Delegates.Call(ctx, c)
	o.returned <- returned{call: c, err: err, ctxErr: ctx.Err(), cause: context.Cause(ctx)}
	return res, err
}

// fixture is the world of one run: scripted delegates behind an observer, a
// fake clock, and a tracker whose events are recorded.
type fixture struct {
	fakes  *controlstest.Delegates
	obs    *observed
	events controlstest.Events
	env    *controls.Env
	// onEvent, when set before the run, sees every event as it is emitted,
	// inline (with the tracker locked): a test may block in it to hold the
	// control still.
	onEvent func(ev *stubbornv1.RunEvent)
	evs     chan *stubbornv1.RunEvent // every event, as emitted

	// Only the test goroutine touches these.
	started map[string][]controls.Call
	back    map[string][]returned
}

func newFixture(script map[string][]controlstest.Reply) *fixture {
	return newFixtureWith(script, controlstest.NewClock())
}

// newFixtureWith is newFixture with its clock: a ManualClock for a test
// that moves time itself.
func newFixtureWith(script map[string][]controlstest.Reply, clock controls.Clock) *fixture {
	f := &fixture{
		fakes:   controlstest.NewDelegates(script),
		started: map[string][]controls.Call{},
		back:    map[string][]returned{},
		evs:     make(chan *stubbornv1.RunEvent, 1024),
	}
	f.obs = &observed{
		Delegates: f.fakes,
		gates:     map[string]chan struct{}{},
		started:   make(chan controls.Call, 1024),
		returned:  make(chan returned, 1024),
	}
	st := &stubbornv1.ControlState{RunId: "run-test", TaskBrief: taskBrief, Status: stubbornv1.RunStatus_RUN_STATUS_PENDING}
	f.env = &controls.Env{
		Delegates: f.obs,
		Tracker: controls.NewTracker(st, clock, func(ev *stubbornv1.RunEvent) {
			f.events.Sink(ev)
			f.evs <- ev
			if f.onEvent != nil {
				f.onEvent(ev)
			}
		}),
		Clock: clock,
	}
	return f
}

// gate holds every call to the named delegates until the returned function
// is called. Call it before the run starts.
func (f *fixture) gate(names ...string) (open func()) {
	ch := make(chan struct{})
	for _, n := range names {
		f.obs.gates[n] = ch
	}
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

// ran is what a run came to.
type ran struct {
	out   controls.Outcome
	state *stubbornv1.ControlState // after Finish, as the runs layer keeps it
	calls []controls.Call          // every delegate call, in order
}

// start runs spec the way the runs layer does (Start, Execute, Finish) in
// its own goroutine.
func (f *fixture) start(ctx context.Context, spec *stubbornv1.ControlSpec) <-chan ran {
	done := make(chan ran, 1)
	go func() {
		f.env.Tracker.Start()
		out := controls.Execute(ctx, f.env, taskBrief, spec)
		f.env.Tracker.Finish(out.Status, out.Result, out.Winner, out.Reason, out.Code)
		state := f.env.Tracker.Snapshot()
		done <- ran{out: out, state: state, calls: f.fakes.Calls()}
	}()
	return done
}

// end waits for a run started with start, and checks its codes
// (checkCodes).
func (f *fixture) end(t *testing.T, done <-chan ran) ran {
	t.Helper()
	r := recv(t, done, "the control to return")
	checkCodes(t, r.out, r.state)
	checkAdded(t, r.calls)
	return r
}

// checkAdded checks that every task call's brief is the run's brief
// followed by what the control added (Call.Added), which a model delegate
// adds to the conversation.
func checkAdded(t *testing.T, calls []controls.Call) {
	t.Helper()
	for _, c := range calls {
		if c.Task {
			assert.Equal(t, c.Brief, taskBrief+c.Added, "attempt %d to %s: Brief is the task brief followed by Added", c.Attempt, c.Delegate)
		} else {
			assert.Empty(t, c.Added, "call %d to %s is not a task call", c.Attempt, c.Delegate)
		}
	}
}

// endCodes are the codes (Outcome.Code, ControlState.status_reason_code)
// that each way for a run to end may have.
var endCodes = map[stubbornv1.RunStatus][]stubbornv1.StatusReason{
	succeeded: {stubbornv1.StatusReason_STATUS_REASON_UNSPECIFIED},
	exhausted: {stubbornv1.StatusReason_STATUS_REASON_ALL_FAILED},
	cancelled: {stubbornv1.StatusReason_STATUS_REASON_CANCELLED},
	failed: {
		stubbornv1.StatusReason_STATUS_REASON_NOT_RETRIED, stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED,
		stubbornv1.StatusReason_STATUS_REASON_RETRY_PAST_DEADLINE, stubbornv1.StatusReason_STATUS_REASON_DECISION_FAIL,
		stubbornv1.StatusReason_STATUS_REASON_DECISION_TIMEOUT, stubbornv1.StatusReason_STATUS_REASON_RUN_TIMEOUT,
		stubbornv1.StatusReason_STATUS_REASON_NO_CONTROL, stubbornv1.StatusReason_STATUS_REASON_SPEND_LIMIT_REACHED,
	},
}

// checkCodes checks that a run that ended has a code for why exactly when
// it has words for it, one that its status may have, the same in its
// outcome and its state; and that each failure record has a
// not_retried_code exactly when it has a not_retried_reason.
func checkCodes(t *testing.T, out controls.Outcome, st *stubbornv1.ControlState) {
	t.Helper()
	if (out.Reason == "") != (out.Code == stubbornv1.StatusReason_STATUS_REASON_UNSPECIFIED) {
		t.Errorf("outcome %v: reason %q with code %v", out.Status, out.Reason, out.Code)
	}
	if !slices.Contains(endCodes[out.Status], out.Code) {
		t.Errorf("outcome %v with code %v, want one of %v", out.Status, out.Code, endCodes[out.Status])
	}
	if st.GetStatusReasonCode() != out.Code || st.GetStatusReason() != out.Reason {
		t.Errorf("state: status_reason %q, code %v; the outcome's: %q, %v", st.GetStatusReason(), st.GetStatusReasonCode(), out.Reason, out.Code)
	}
	for _, f := range st.GetFailureHistory() {
		if (f.GetNotRetriedReason() == "") != (f.GetNotRetriedCode() == stubbornv1.NotRetried_NOT_RETRIED_UNSPECIFIED) {
			t.Errorf("failure %d: not_retried_reason %q with not_retried_code %v", f.GetAttempt(), f.GetNotRetriedReason(), f.GetNotRetriedCode())
		}
	}
}

// run runs spec to its end.
func (f *fixture) run(t *testing.T, ctx context.Context, spec *stubbornv1.ControlSpec) ran {
	t.Helper()
	return f.end(t, f.start(ctx, spec))
}

// waitStarted waits until a call to each named delegate has started.
func (f *fixture) waitStarted(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		for len(f.started[n]) == 0 {
			c := recv(t, f.obs.started, "a call to "+n+" to start")
			f.started[c.Delegate] = append(f.started[c.Delegate], c)
		}
	}
}

// waitReturned waits until a call to each named delegate has returned and
// gives the first return of each.
func (f *fixture) waitReturned(t *testing.T, names ...string) map[string]returned {
	t.Helper()
	out := map[string]returned{}
	for _, n := range names {
		for len(f.back[n]) == 0 {
			r := recv(t, f.obs.returned, "a call to "+n+" to return")
			f.back[r.call.Delegate] = append(f.back[r.call.Delegate], r)
		}
		out[n] = f.back[n][0]
	}
	return out
}

// waitFailureOf waits until the failure of the named delegate has been
// recorded.
func (f *fixture) waitFailureOf(t *testing.T, name string) {
	t.Helper()
	for {
		ev := recv(t, f.evs, "the failure of "+name+" to be recorded")
		if ev.GetFailureAnalyzed().GetFailure().GetDelegate() == name {
			return
		}
	}
}

// recv receives from ch, or fails the test after patience.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	timer := time.NewTimer(patience)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("timed out after %v waiting for %s", patience, what)
	}
	panic("unreachable")
}

// Control specs.

func learning(maxRetries *int32) *stubbornv1.ControlSpec {
	return &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_RetryWithLearning{
		RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "target", MaxRetries: maxRetries},
	}}
}

func chain(names ...string) *stubbornv1.ControlSpec {
	return &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{
		FallbackChain: &stubbornv1.FallbackChainSpec{Chain: names},
	}}
}

func race(names ...string) *stubbornv1.ControlSpec {
	return &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Race{
		Race: &stubbornv1.RaceSpec{Candidates: names},
	}}
}

// rejectTexts is failure criteria that reject the result texts it holds,
// each with its reason, and accept every other result.
type rejectTexts map[string]string

func (m rejectTexts) Check(_ context.Context, _ int32, _ string, r *stubbornv1.Result) (controls.Verdict, error) {
	if reason, found := m[r.GetText()]; found {
		return controls.Verdict{Failed: true, Reason: reason}, nil
	}
	return controls.Verdict{}, nil
}

// brokenJudge is failure criteria whose judging itself fails.
type brokenJudge struct{ err error }

func (b brokenJudge) Check(context.Context, int32, string, *stubbornv1.Result) (controls.Verdict, error) {
	return controls.Verdict{}, b.err
}

// enriched writes the reference format by hand, as the reference code's
// template literals do: the brief, the header, then one paragraph per
// failure given as {summary, reason}.
func enriched(brief string, failures ...[2]string) string {
	s := brief + "\n\nPrior attempts failed. You MUST try a different approach.\n"
	for i, f := range failures {
		s += fmt.Sprintf("\nAttempt %d: %s\nFailure reason: %s\n", i+1, f[0], f[1])
	}
	return s
}

// rec is a FailureRecord's contract fields, for readable comparisons.
type rec struct {
	Attempt  int32
	Delegate string
	Summary  string
	Reason   string
}

func recs(fs []*stubbornv1.FailureRecord) []rec {
	out := []rec{}
	for _, f := range fs {
		out = append(out, rec{f.GetAttempt(), f.GetDelegate(), f.GetSummary(), f.GetReason()})
	}
	return out
}

func briefs(calls []controls.Call) []string {
	var out []string
	for _, c := range calls {
		out = append(out, c.Brief)
	}
	return out
}

func delegatesOf(calls []controls.Call) []string {
	var out []string
	for _, c := range calls {
		out = append(out, c.Delegate)
	}
	return out
}

func outcomes(log []*stubbornv1.Attempt) []stubbornv1.AttemptOutcome {
	var out []stubbornv1.AttemptOutcome
	for _, a := range log {
		out = append(out, a.GetOutcome())
	}
	return out
}

// failureEvents returns the failure_analyzed events, in order.
func failureEvents(evs []*stubbornv1.RunEvent) []*stubbornv1.FailureAnalyzed {
	var out []*stubbornv1.FailureAnalyzed
	for _, ev := range evs {
		if fa := ev.GetFailureAnalyzed(); fa != nil {
			out = append(out, fa)
		}
	}
	return out
}

// unavailable is a delegate error as the delegates layer classifies it.
func unavailable(msg string) controlstest.Reply { return fail(codes.Unavailable, msg) }

// Outcome and status names, shorter.
const (
	succeeded = stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED
	exhausted = stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED
	failed    = stubbornv1.RunStatus_RUN_STATUS_FAILED
	cancelled = stubbornv1.RunStatus_RUN_STATUS_CANCELLED

	attemptSucceeded = stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED
	attemptError     = stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_ERROR
	attemptRejected  = stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_REJECTED
	attemptCancelled = stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_CANCELLED
	attemptSkipped   = stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SKIPPED
)
