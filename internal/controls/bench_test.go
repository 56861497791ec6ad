package controls_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// benchDelegates fails every attempt numbered at most failFirst with
// UNAVAILABLE and answers the others. Unlike controlstest.Delegates it keeps
// no record of the calls, so that a benchmark's memory does not grow with
// b.N.
type benchDelegates struct {
	failFirst int32
	result    *stubbornv1.Result
}

func (d *benchDelegates) Call(_ context.Context, c controls.Call) (*stubbornv1.Result, error) {
	if c.Attempt <= d.failFirst {
		return nil, &controls.CallError{Code: codes.Unavailable, Message: "try later"}
	}
	return d.result, nil
}

func (*benchDelegates) Info(string) controls.DelegateInfo {
	return controls.DelegateInfo{Idempotent: true}
}

func (*benchDelegates) Serving(context.Context, string) bool { return true }

// benchRun runs spec from start to finish as the runs layer does: a new
// state and tracker, Start, Execute, Finish. Each run gets a fresh fake clock
// (one allocation), since the fake clock records every wait.
func benchRun(b *testing.B, d controls.Delegates, spec *stubbornv1.ControlSpec, want stubbornv1.RunStatus) {
	b.Helper()
	ctx := b.Context()
	events := 0
	// A recorder, as the runs layer has: it reads each event during the
	// call, so the tracker copies nothing for it.
	rec := func(*stubbornv1.RunEvent, *stubbornv1.ControlState) { events++ }
	b.ReportAllocs()
	for b.Loop() {
		clock := controlstest.NewClock()
		st := &stubbornv1.ControlState{RunId: "run_bench", TaskBrief: taskBrief, Control: spec, Status: stubbornv1.RunStatus_RUN_STATUS_PENDING}
		tr := controls.NewReplayTracker(st, clock, rec, nil)
		tr.Start()
		env := &controls.Env{Delegates: d, Tracker: tr, Clock: clock}
		out := controls.Execute(ctx, env, taskBrief, spec)
		tr.Finish(out.Status, out.Result, out.Winner, out.Reason, out.Code)
		if out.Status != want {
			b.Fatalf("run ended %s: %s", out.Status, out.Reason)
		}
	}
	b.ReportMetric(float64(events)/float64(b.N), "events/op")
}

// BenchmarkFallbackOneAttempt is a whole run of a fallback chain whose first
// delegate answers: four events.
func BenchmarkFallbackOneAttempt(b *testing.B) {
	spec := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{
		FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}},
	}}
	benchRun(b, &benchDelegates{result: &stubbornv1.Result{Text: "echo: " + taskBrief}}, spec, succeeded)
}

// BenchmarkRetryThreeAttemptsZeroWait is a whole retry run whose first two
// attempts fail UNAVAILABLE, with zero waits: twelve events.
func BenchmarkRetryThreeAttemptsZeroWait(b *testing.B) {
	attempts := int32(2)
	spec := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
		Target:   "flaky",
		Attempts: &attempts,
		BaseWait: durationpb.New(0),
	}}}
	benchRun(b, &benchDelegates{failFirst: 2, result: &stubbornv1.Result{Text: "ok"}}, spec, succeeded)
}

// BenchmarkEnrichBrief builds the brief of a fourth attempt: three failure
// records with 200-character summaries.
func BenchmarkEnrichBrief(b *testing.B) {
	var failures []*stubbornv1.FailureRecord
	for i := range 3 {
		failures = append(failures, &stubbornv1.FailureRecord{
			Attempt: int32(i + 1), Delegate: "writer",
			Summary: strings.Repeat("x", 200),
			Reason:  fmt.Sprintf("the answer cites %d sources, three are required", i),
		})
	}
	b.ReportAllocs()
	for b.Loop() {
		if controls.EnrichBrief(taskBrief, failures) == "" {
			b.Fatal("empty brief")
		}
	}
}

// BenchmarkBackoff draws full-jitter waits for retries 1 to 10.
func BenchmarkBackoff(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		n = n%10 + 1
		if w, bound := controls.Backoff(r, n, time.Second, time.Minute); w > bound {
			b.Fatalf("wait %v over bound %v", w, bound)
		}
	}
}
