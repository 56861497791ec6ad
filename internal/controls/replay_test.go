package controls_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// byAttempt answers each call by its run-wide attempt number, so a replayed
// run meets the same answers as the original, and records the calls.
type byAttempt struct {
	mu      sync.Mutex
	answers map[int32]controlstest.Reply
	calls   []int32
	info    controls.DelegateInfo
}

func (b *byAttempt) Call(_ context.Context, c controls.Call) (*stubbornv1.Result, error) {
	b.mu.Lock()
	b.calls = append(b.calls, c.Attempt)
	r := b.answers[c.Attempt]
	b.mu.Unlock()
	for _, chunk := range r.Chunks {
		if c.Output != nil {
			c.Output(chunk)
		}
	}
	if r.Err != nil {
		return nil, r.Err
	}
	return &stubbornv1.Result{Text: r.Text}, nil
}
func (b *byAttempt) Info(string) controls.DelegateInfo    { return b.info }
func (b *byAttempt) Serving(context.Context, string) bool { return true }

func (b *byAttempt) called() []int32 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int32(nil), b.calls...)
}

// runOnce runs spec with a tracker replaying journal and returns the
// outcome, the new events and the calls made.
func runOnce(t *testing.T, spec *stubbornv1.ControlSpec, d *byAttempt, journal []*stubbornv1.RunEvent) (controls.Outcome, []*stubbornv1.RunEvent) {
	t.Helper()
	st, rec, recorded := resumeFrom(spec, journal)
	clock := controlstest.NewClock()
	tr := controls.NewReplayTracker(st, clock, rec, journal)
	tr.Start()
	env := &controls.Env{Delegates: d, Tracker: tr, Clock: clock}
	out := controls.Execute(context.Background(), env, "task", spec)
	tr.Finish(out.Status, out.Result, out.Winner, out.Reason, out.Code)
	return out, recorded()
}

// resumeFrom returns the state a run of spec resumed from journal starts
// with (its run_started's; a new run's when journal is empty), and a
// recorder that numbers new events after the journal's, with the events it
// recorded.
func resumeFrom(spec *stubbornv1.ControlSpec, journal []*stubbornv1.RunEvent) (*stubbornv1.ControlState, controls.Recorder, func() []*stubbornv1.RunEvent) {
	st := &stubbornv1.ControlState{RunId: "r", TaskBrief: "task", Control: spec}
	if len(journal) > 0 {
		st = proto.CloneOf(journal[0].GetRunStarted().GetState())
	}
	var mu sync.Mutex
	var evs []*stubbornv1.RunEvent
	seq := int64(len(journal))
	rec := func(ev *stubbornv1.RunEvent, _ *stubbornv1.ControlState) {
		mu.Lock()
		defer mu.Unlock()
		seq++
		ev = proto.CloneOf(ev) // ev is only the tracker's during the call
		ev.Seq = seq
		evs = append(evs, ev)
	}
	return st, rec, func() []*stubbornv1.RunEvent {
		mu.Lock()
		defer mu.Unlock()
		return evs
	}
}

func kinds(evs []*stubbornv1.RunEvent) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, controlstest.Kind(ev))
	}
	return out
}

// TestReplayResumesFromEveryEvent cuts a recorded run after each of its
// events, as a crash would, and resumes it from that journal: the resumed
// run makes no call the journal already answered, emits exactly the events
// that were missing, and ends the same way. A cut inside an attempt makes
// that attempt interrupted, retried only because the delegate is
// idempotent.
func TestReplayResumesFromEveryEvent(t *testing.T) {
	unavailable := controlstest.Fail(codes.Unavailable, "busy")
	specs := map[string]*stubbornv1.ControlSpec{
		"retry": {Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
			Target: "d", BaseWait: durationpb.New(1e9), OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL,
		}}},
		"retry_with_learning": {Kind: &stubbornv1.ControlSpec_RetryWithLearning{RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "d", MaxRetries: ptr(int32(5))}}},
		"fallback_chain":      {Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"a", "b", "c", "d"}}}},
	}
	for name, spec := range specs {
		t.Run(name, func(t *testing.T) {
			answers := map[int32]controlstest.Reply{1: unavailable, 2: unavailable, 3: controlstest.OK("done"), 4: controlstest.OK("later")}
			idem := controls.DelegateInfo{Idempotent: true}
			live := &byAttempt{answers: answers, info: idem}
			want, all := runOnce(t, spec, live, nil)
			require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, want.Status, want.Reason)
			liveFinal := all[len(all)-1].GetRunFinished().GetState()

			for cut := 1; cut < len(all); cut++ {
				journal := all[:cut]
				d := &byAttempt{answers: answers, info: idem}
				out, fresh := runOnce(t, spec, d, journal)

				finished := map[int32]bool{}
				var inFlight int32
				for _, ev := range journal {
					if a := ev.GetAttemptStarted(); a != nil {
						inFlight = a.GetAttempt().GetNumber()
					}
					if a := ev.GetAttemptFinished(); a != nil {
						finished[a.GetAttempt().GetNumber()] = true
						inFlight = 0
					}
				}
				for _, n := range d.called() {
					assert.False(t, finished[n], "cut %d: attempt %d was answered in the journal but called again", cut, n)
				}
				for i, ev := range fresh {
					assert.EqualValues(t, cut+i+1, ev.GetSeq(), "cut %d: seq continues densely", cut)
				}
				if inFlight == 0 {
					// A clean cut: the resumed run emits exactly what is missing.
					assert.Equal(t, want, out, "cut %d", cut)
					assert.Equal(t, kinds(all[cut:]), kinds(fresh), "cut %d", cut)
					final := fresh[len(fresh)-1].GetRunFinished().GetState()
					assert.Equal(t, liveFinal.GetAttempts(), final.GetAttempts(), "cut %d", cut)
					assert.Equal(t, len(liveFinal.GetFailureHistory()), len(final.GetFailureHistory()), "cut %d", cut)
					continue
				}
				// A cut inside attempt n: it comes back interrupted.
				require.NotEmpty(t, fresh)
				first := fresh[0].GetAttemptFinished()
				require.NotNil(t, first, "cut %d: the first new event ends the interrupted attempt", cut)
				assert.Equal(t, inFlight, first.GetAttempt().GetNumber())
				assert.Equal(t, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_INTERRUPTED, first.GetAttempt().GetOutcome())
				assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, out.Status, "cut %d: %s", cut, out.Reason)
			}
		})
	}
}

func TestReplayKeepsWaitingForADecisionAndResumesABackoff(t *testing.T) {
	spec := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
		Target: "d", Attempts: ptr(int32(1)), BaseWait: durationpb.New(1e9),
	}}}
	fail := controlstest.Fail(codes.Unavailable, "busy")
	answers := map[int32]controlstest.Reply{1: fail, 2: fail, 3: controlstest.OK("ok")}
	d := &byAttempt{answers: answers, info: controls.DelegateInfo{ReadOnly: true}}

	// Record up to the decision request.
	st := &stubbornv1.ControlState{RunId: "r", TaskBrief: "task", Control: spec}
	var mu sync.Mutex
	var journal []*stubbornv1.RunEvent
	requested := make(chan struct{})
	rec := func(ev *stubbornv1.RunEvent, _ *stubbornv1.ControlState) {
		mu.Lock()
		journal = append(journal, proto.CloneOf(ev))
		mu.Unlock()
		if ev.GetDecisionRequested() != nil {
			close(requested)
		}
	}
	ctx, crash := context.WithCancel(context.Background())
	tr := controls.NewReplayTracker(st, controlstest.NewClock(), rec, nil)
	tr.Start()
	done := make(chan struct{})
	go func() {
		defer close(done)
		controls.Execute(ctx, &controls.Env{Delegates: d, Tracker: tr, Clock: controlstest.NewClock()}, "task", spec)
	}()
	<-requested
	crash() // the owner dies while the run waits for a person
	<-done

	mu.Lock()
	recorded := append([]*stubbornv1.RunEvent(nil), journal...)
	mu.Unlock()
	d2 := &byAttempt{answers: answers, info: controls.DelegateInfo{ReadOnly: true}}
	clock := controlstest.NewClock()
	var fresh []*stubbornv1.RunEvent
	tr2 := controls.NewReplayTracker(proto.CloneOf(recorded[0].GetRunStarted().GetState()), clock, func(ev *stubbornv1.RunEvent, _ *stubbornv1.ControlState) {
		fresh = append(fresh, proto.CloneOf(ev))
	}, recorded)
	tr2.Start()
	out := make(chan controls.Outcome, 1)
	go func() {
		out <- controls.Execute(context.Background(), &controls.Env{Delegates: d2, Tracker: tr2, Clock: clock}, "task", spec)
	}()
	// The resumed run is waiting again, without asking twice.
	require.Eventually(t, func() bool { return tr2.Decide(stubbornv1.Decision_DECISION_RETRY, nil) == nil }, 5e9, 1e6)
	o := <-out
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, o.Status, o.Reason)
	assert.Equal(t, []int32{3}, d2.called(), "attempts 1 and 2 come from the journal")
	assert.Equal(t, []string{"decision_received", "backoff_scheduled", "attempt_started", "attempt_finished"}, kinds(fresh))
}

func ptr[T any](v T) *T { return &v }
