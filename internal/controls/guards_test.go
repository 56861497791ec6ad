package controls_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// refusing is a controls.Guards that refuses the calls to some delegates,
// each with its guard, and counts what it was asked.
type refusing struct {
	mu     sync.Mutex
	by     map[string]stubbornv1.RefusedBy
	asked  []string
	done   int
	noteOn string // the delegate whose answer's note the guard writes
}

func (g *refusing) Admit(_ context.Context, name string) (func(*stubbornv1.Result, error) string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.asked = append(g.asked, name)
	if by, ok := g.by[name]; ok {
		return nil, &controls.CallError{Code: codes.Unavailable, Message: "refused by " + by.String(), NotSent: true, Refused: true, RefusedBy: by}
	}
	return func(*stubbornv1.Result, error) string {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.done++
		if name == g.noteOn {
			return "circuit breaker closed → open: 1 transient failures in a row"
		}
		return ""
	}, nil
}

func (g *refusing) askedFor() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.asked...)
}

// How each control reacts to a call its delegate's guard refused: never
// sent, recorded SKIPPED with the guard's failure source; the retry
// control and retry-with-learning fail the run (not retried), a fallback
// chain goes on, a race leaves the candidate out.
func TestGuardRefusals(t *testing.T) {
	breaker := stubbornv1.RefusedBy_REFUSED_BY_CIRCUIT_BREAKER
	for _, tc := range []struct {
		name   string
		spec   *stubbornv1.ControlSpec
		script map[string][]controlstest.Reply
		by     map[string]stubbornv1.RefusedBy
		status stubbornv1.RunStatus
		winner string
		source stubbornv1.FailureSource
		calls  []string
	}{
		{
			name: "retry: not retried, the run fails",
			spec: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: retrySpec(5, stubbornv1.OnExhausted_ON_EXHAUSTED_ASK)}},
			by:   map[string]stubbornv1.RefusedBy{"d": breaker}, status: stubbornv1.RunStatus_RUN_STATUS_FAILED,
			source: stubbornv1.FailureSource_FAILURE_SOURCE_CIRCUIT_BREAKER,
		},
		{
			name: "retry-with-learning: not retried, the run fails",
			spec: learning(proto.Int32(4)),
			by:   map[string]stubbornv1.RefusedBy{"target": stubbornv1.RefusedBy_REFUSED_BY_BULKHEAD}, status: stubbornv1.RunStatus_RUN_STATUS_FAILED,
			source: stubbornv1.FailureSource_FAILURE_SOURCE_BULKHEAD,
		},
		{
			name:   "fallback chain: skipped, the next one answers",
			spec:   chain("primary", "secondary"),
			script: map[string][]controlstest.Reply{"secondary": {ok("from secondary")}},
			by:     map[string]stubbornv1.RefusedBy{"primary": stubbornv1.RefusedBy_REFUSED_BY_RATE_LIMIT}, status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED,
			winner: "secondary", source: stubbornv1.FailureSource_FAILURE_SOURCE_RATE_LIMIT, calls: []string{"secondary"},
		},
		{
			name:   "race: left out, the other wins",
			spec:   race("a", "b"),
			script: map[string][]controlstest.Reply{"b": {ok("from b")}},
			by:     map[string]stubbornv1.RefusedBy{"a": breaker}, status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED,
			winner: "b", source: stubbornv1.FailureSource_FAILURE_SOURCE_CIRCUIT_BREAKER, calls: []string{"b"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(tc.script)
			g := &refusing{by: tc.by}
			f.env.Guards = g
			var r ran
			if tc.spec.GetRace() != nil {
				// b answers once a's refusal is recorded.
				open := f.gate("b")
				done := f.start(testCtx(t), tc.spec)
				f.waitFailureOf(t, "a")
				open()
				r = f.end(t, done)
			} else {
				r = f.run(t, testCtx(t), tc.spec)
			}
			require.Equal(t, tc.status, r.state.GetStatus(), r.state.GetStatusReason())
			assert.Equal(t, tc.winner, r.state.GetWinner())
			var called []string
			for _, c := range r.calls {
				called = append(called, c.Delegate)
			}
			assert.Equal(t, tc.calls, called, "a refused call is never sent")
			g.mu.Lock()
			assert.Equal(t, len(tc.calls), g.done, "each call sent told its guard how it went, once")
			g.mu.Unlock()
			require.NotEmpty(t, r.state.GetFailureHistory())
			rec := r.state.GetFailureHistory()[0]
			assert.Equal(t, tc.source, rec.GetSource())
			first := r.state.GetAttemptLog()[0]
			assert.Equal(t, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SKIPPED, first.GetOutcome())
			assert.Equal(t, tc.by[first.GetDelegate()], first.GetError().GetRefusedBy())
			assert.True(t, first.GetError().GetRefused())
			if tc.status == stubbornv1.RunStatus_RUN_STATUS_FAILED {
				assert.Len(t, r.state.GetAttemptLog(), 1, "not retried")
				assert.Equal(t, stubbornv1.NotRetried_NOT_RETRIED_REFUSED, rec.GetNotRetriedCode())
				assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_NOT_RETRIED, r.state.GetStatusReasonCode())
				assert.Contains(t, r.state.GetStatusReason(), "refused by REFUSED_BY_", "the guard's own words")
			}
		})
	}
}

// A resumed run replays a guard's decision from its journal: it asks the
// guards again only for the calls it makes live.
func TestGuardDecisionsReplay(t *testing.T) {
	spec := chain("a", "b", "c")
	live := &byAttempt{answers: map[int32]controlstest.Reply{2: controlstest.Fail(codes.Unavailable, "b down"), 3: controlstest.OK("c")}}
	st, rec, recorded := resumeFrom(spec, nil)
	clock := controlstest.NewClock()
	tr := controls.NewReplayTracker(st, clock, rec, nil)
	tr.Start()
	g := &refusing{by: map[string]stubbornv1.RefusedBy{"a": stubbornv1.RefusedBy_REFUSED_BY_CIRCUIT_BREAKER}, noteOn: "b"}
	out := controls.Execute(context.Background(), &controls.Env{Delegates: live, Tracker: tr, Clock: clock, Guards: g}, "task", spec)
	tr.Finish(out.Status, out.Result, out.Winner, out.Reason, out.Code)
	require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, out.Status)
	all := recorded()
	var notes []string
	for _, ev := range all {
		if n := ev.GetAttemptFinished().GetNote(); n != "" {
			notes = append(notes, n)
		}
	}
	assert.Equal(t, []string{"circuit breaker closed → open: 1 transient failures in a row"}, notes, "the transition is in the run's events")

	// Cut after b's attempt ended: a and b are replayed, c is asked live.
	cut := 0
	for i, ev := range all {
		if ev.GetAttemptFinished().GetAttempt().GetNumber() == 2 {
			cut = i + 1
		}
	}
	require.NotZero(t, cut)
	again := &refusing{}
	resumed := &byAttempt{answers: live.answers}
	st2, rec2, _ := resumeFrom(spec, all[:cut])
	tr2 := controls.NewReplayTracker(st2, clock, rec2, all[:cut])
	tr2.Start()
	out2 := controls.Execute(context.Background(), &controls.Env{Delegates: resumed, Tracker: tr2, Clock: clock, Guards: again}, "task", spec)
	require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, out2.Status)
	assert.Equal(t, []string{"c"}, again.askedFor(), "a's refusal and b's admission come from the journal")
	assert.Equal(t, []int32{3}, resumed.called())
	st3 := tr2.Snapshot()
	assert.Equal(t, stubbornv1.FailureSource_FAILURE_SOURCE_CIRCUIT_BREAKER, st3.GetFailureHistory()[0].GetSource())
}

// retry_on: the run's list, else the delegate's, decides what is retried.
func TestRetryOn(t *testing.T) {
	http404 := &controls.CallError{Code: codes.Unknown, HTTPStatus: 404}
	for _, tc := range []struct {
		name      string
		ce        *controls.CallError
		on        *stubbornv1.RetryOn
		transient bool
		reason    string
	}{
		{"default rules", &controls.CallError{Code: codes.Unavailable}, nil, true, ""},
		{"a code listed", &controls.CallError{Code: codes.Internal}, &stubbornv1.RetryOn{GrpcCodes: []string{"internal"}}, true, ""},
		{"a code not listed", &controls.CallError{Code: codes.Unavailable}, &stubbornv1.RetryOn{GrpcCodes: []string{"INTERNAL"}}, false, "not transient: UNAVAILABLE is not in retry_on.grpc_codes"},
		{"an HTTP status listed", http404, &stubbornv1.RetryOn{HttpStatuses: []int32{404}}, true, ""},
		{"an HTTP status is judged by the statuses alone", http404, &stubbornv1.RetryOn{GrpcCodes: []string{"UNKNOWN"}}, false, "not transient: HTTP 404 is not in retry_on.http_statuses"},
		{"a refusal never is", &controls.CallError{Code: codes.Unavailable, Refused: true}, &stubbornv1.RetryOn{GrpcCodes: []string{"UNAVAILABLE"}}, false, "not transient: refused by Stubborn's own middleware"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, reason := controls.TransientOn(tc.ce, tc.on)
			assert.Equal(t, tc.transient, got)
			assert.Equal(t, tc.reason, reason)
		})
	}

	// The retry control: the delegate's list applies, and the run's
	// replaces it.
	internal := controlstest.Fail(codes.Internal, "oops")
	for _, tc := range []struct {
		name     string
		delegate *stubbornv1.RetryOn
		run      *stubbornv1.RetryOn
		calls    int
	}{
		{"default: INTERNAL is not retried", nil, nil, 1},
		{"the delegate's retry_on retries it", &stubbornv1.RetryOn{GrpcCodes: []string{"INTERNAL"}}, nil, 3},
		{"the run's retry_on overrides the delegate's", &stubbornv1.RetryOn{GrpcCodes: []string{"INTERNAL"}}, &stubbornv1.RetryOn{GrpcCodes: []string{"UNAVAILABLE"}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(map[string][]controlstest.Reply{"d": {internal, internal, internal}})
			f.fakes.SetInfo("d", controls.DelegateInfo{Idempotent: true, RetryOn: tc.delegate})
			spec := retrySpec(2, stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL)
			spec.RetryOn = tc.run
			r := f.run(t, testCtx(t), &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: spec}})
			assert.Len(t, r.calls, tc.calls)
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, r.state.GetStatus())
		})
	}
}
