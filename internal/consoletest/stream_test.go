//go:build browser

package consoletest

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// feed is a run the test writes event by event: GetRun and WatchRun
// (Connect, as the console calls them) answer with it, so the test decides
// what the console receives and when, the pieces of streamed output
// included (a repeat, an overlap, a gap), whatever the delegates stream.
type feed struct {
	id    string
	state *stubbornv1.ControlState

	mu      sync.Mutex
	events  []*stubbornv1.RunEvent
	changed chan struct{} // closed and replaced when events or gen change
	gen     int           // drop() ends the streams of earlier gens
	after   []int64       // the after_seq of each WatchRun
}

func newFeed(id string, state *stubbornv1.ControlState) *feed {
	return &feed{id: id, state: state, changed: make(chan struct{})}
}

// add appends events, numbered on from the last one, timed now.
func (f *feed) add(evs ...*stubbornv1.RunEvent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ev := range evs {
		ev.RunId = f.id
		ev.Seq = int64(len(f.events)) + 1
		ev.Time = timestamppb.Now()
		if ev.Status == stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED {
			ev.Status = stubbornv1.RunStatus_RUN_STATUS_RUNNING
		}
		f.events = append(f.events, ev)
	}
	close(f.changed)
	f.changed = make(chan struct{})
}

// drop ends the WatchRun streams open now, as a lost connection would.
func (f *feed) drop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen++
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *feed) watches() []int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int64(nil), f.after...)
}

// pages are the two calls, for setup.pages.
func (f *feed) pages() map[string]http.Handler {
	const svc = "/stubborn.v1.ControlService/"
	return map[string]http.Handler{
		svc + "GetRun": connect.NewUnaryHandler(svc+"GetRun",
			func(_ context.Context, req *connect.Request[stubbornv1.GetRunRequest]) (*connect.Response[stubbornv1.GetRunResponse], error) {
				if req.Msg.GetRunId() != f.id {
					return nil, connect.NewError(connect.CodeNotFound, nil)
				}
				return connect.NewResponse(&stubbornv1.GetRunResponse{State: f.state}), nil
			}),
		svc + "WatchRun": connect.NewServerStreamHandler(svc+"WatchRun",
			func(ctx context.Context, req *connect.Request[stubbornv1.WatchRunRequest], stream *connect.ServerStream[stubbornv1.WatchRunResponse]) error {
				if req.Msg.GetRunId() != f.id {
					return connect.NewError(connect.CodeNotFound, nil)
				}
				after := req.Msg.GetAfterSeq()
				f.mu.Lock()
				gen := f.gen
				f.after = append(f.after, after)
				f.mu.Unlock()
				for {
					f.mu.Lock()
					evs, changed, dropped := f.events, f.changed, f.gen != gen
					f.mu.Unlock()
					if dropped {
						return nil
					}
					for _, ev := range evs {
						if ev.GetSeq() <= after {
							continue
						}
						if err := stream.Send(&stubbornv1.WatchRunResponse{Event: ev}); err != nil {
							return err
						}
						after = ev.GetSeq()
						if ev.GetRunFinished() != nil {
							return nil
						}
					}
					select {
					case <-changed:
					case <-ctx.Done():
						return ctx.Err()
					}
				}
			}),
	}
}

func output(n int32, offset int64, text string, provisional bool) *stubbornv1.RunEvent {
	return &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_AttemptOutput{AttemptOutput: &stubbornv1.AttemptOutput{
		Attempt: n, Offset: offset, Text: text, Provisional: provisional}}}
}

func attemptStarted(a *stubbornv1.Attempt) *stubbornv1.RunEvent {
	return &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_AttemptStarted{AttemptStarted: &stubbornv1.AttemptStarted{Attempt: a}}}
}

// A fallback chain whose first model streams, stalls and is discarded, and
// whose second streams the answer, as the console follows it: each
// attempt's text grows live as attempt_output events come (a repeated
// piece and an overlap add nothing twice; a gap is marked, not fatal), the
// first's provisional until it fails, then struck out as discarded, with
// the stall shown; a reattached stream goes on after the last event seen;
// the second's text, accepted, is its result, shown once.
func TestConsoleStreamedOutput(t *testing.T) {
	const (
		id    = "streamed-run-1"
		stall = "stalled: no output for 5s after 3 chunks (idle_timeout)"
	)
	created := timestamppb.New(time.Now().Add(-time.Second))
	state := func(s stubbornv1.RunStatus) *stubbornv1.ControlState {
		return &stubbornv1.ControlState{
			RunId: id, Status: s, TaskBrief: "say hello",
			Control: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{
				Chain: []string{"model-a", "model-b"}, FailureCriteria: "the answer is rude"}}},
			CreateTime: created, UpdateTime: created,
		}
	}
	f := newFeed(id, state(stubbornv1.RunStatus_RUN_STATUS_RUNNING))
	s := startServer(t, setup{
		delegates: map[string]stubbornv1.DelegateServiceServer{"echo": demo.Echo{}},
		pages:     f.pages(),
	})
	attempt := func(n int32, delegate string) *stubbornv1.Attempt {
		return &stubbornv1.Attempt{Number: n, Delegate: delegate, Brief: "say hello", StartTime: timestamppb.Now()}
	}
	a1, a2 := attempt(1, "model-a"), attempt(2, "model-b")

	b := newBrowser(t)
	detail := func(n string) string { return `[data-testid=attempt-detail][data-attempt="` + n + `"]` }
	textOf := func(n string) string {
		return `(` + q(detail(n)+` [data-testid=output-text]`) + `?.textContent ?? null)`
	}

	f.add(&stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_RunStarted{RunStarted: &stubbornv1.RunStarted{State: f.state}}},
		attemptStarted(a1),
		output(1, 0, "Hello, ", true))
	b.do("opening the run", 30*time.Second,
		chromedp.Navigate(s.url+"/#/runs/"+id),
		chromedp.WaitVisible(chromedp.CSS(runPage+`[data-run-id="`+id+`"]`)))
	b.waitJS("attempt 1's first piece", textOf("1")+` === "Hello, "`, 10*time.Second)
	if !eval[bool](b, q(detail("1")+` [data-testid=output]`)+`.classList.contains('provisional')`) {
		t.Errorf("attempt 1's output is not shown as provisional")
	}

	// "ö" is two bytes: the offsets count bytes. A repeat of a piece adds
	// nothing; an overlap ("rld and" at byte 10) adds only what is new.
	f.add(output(1, 7, "wörld", true), output(1, 7, "wörld", true), output(1, 10, "rld and", true))
	b.waitJS("attempt 1's text to grow", textOf("1")+` === "Hello, wörld and"`, 10*time.Second)
	b.screenshot("console-streaming.png")

	// The stream drops; the console reattaches after the last event it saw.
	seen := int64(6)
	f.drop()
	f.add(output(1, 17, " more", true))
	b.waitJS("attempt 1's text after the reattach", textOf("1")+` === "Hello, wörld and more"`, 20*time.Second)
	if w := f.watches(); len(w) < 2 || w[0] != 0 || w[len(w)-1] != seen {
		t.Errorf("WatchRun was called with after_seq %v, want 0 then %d", w, seen)
	}

	// The model stalls: an ERROR, its output discarded.
	a1f := attempt(1, "model-a")
	a1f.StartTime = a1.StartTime
	a1f.EndTime = timestamppb.Now()
	a1f.Outcome = stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_ERROR
	a1f.Error = &stubbornv1.AttemptError{Code: 14, Message: stall}
	f.add(&stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_AttemptFinished{AttemptFinished: &stubbornv1.AttemptFinished{
		Attempt: a1f, OutputDiscarded: true, OutputBytes: 22}}},
		&stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_FailureAnalyzed{FailureAnalyzed: &stubbornv1.FailureAnalyzed{
			Failure: &stubbornv1.FailureRecord{Attempt: 1, Delegate: "model-a", Summary: "Error: " + stall, Reason: stall,
				Transient: true, Source: stubbornv1.FailureSource_FAILURE_SOURCE_ERROR},
			WillRetry: true}}})
	b.waitJS("attempt 1's output discarded", q(detail("1")+` [data-testid=output][data-state=discarded] [data-testid=discarded]`), 10*time.Second)
	b.waitJS("attempt 1's stall", q(detail("1")+` [data-testid=stalled]`), 10*time.Second)
	if got := eval[string](b, textOf("1")); got != "Hello, wörld and more" {
		t.Errorf("attempt 1's discarded output shows %q", got)
	}
	if got := eval[string](b, `getComputedStyle(`+q(detail("1")+` [data-testid=output-text]`)+`).textDecorationLine`); !strings.Contains(got, "line-through") {
		t.Errorf("attempt 1's discarded output has text-decoration-line %q, want it struck through", got)
	}
	if eval[bool](b, q(detail("1")+` [data-testid=output]`)+`.classList.contains('provisional')`) {
		t.Errorf("attempt 1's discarded output is still provisional")
	}
	if got := eval[string](b, q(detail("1"))+`.textContent`); !strings.Contains(got, stall) {
		t.Errorf("attempt 1 does not say why it stalled: %q", got)
	}
	if !eval[bool](b, q(attemptSel+`[data-attempt="1"][data-stalled]`)+` !== null`) {
		t.Errorf("attempt 1's bar does not show the stall")
	}

	// The next model streams, with a piece lost on the way (bytes 7 to 10,
	// " le"): the console shows what it has.
	f.add(attemptStarted(a2), output(2, 0, "Bonjour", false), output(2, 10, " monde", false))
	b.waitJS("attempt 2's text, with a gap", textOf("2")+`?.startsWith("Bonjour") && `+textOf("2")+`.endsWith(" monde") && `+
		q(detail("2")+` [data-testid=output-gap]`), 10*time.Second)
	if eval[bool](b, q(detail("2")+` [data-testid=output]`)+`.classList.contains('provisional')`) {
		t.Errorf("attempt 2's output is shown as provisional, though its pieces are not")
	}

	// It succeeds: its result is the text shown, once.
	const answer = "Bonjour le monde"
	a2f := attempt(2, "model-b")
	a2f.StartTime = a2.StartTime
	a2f.EndTime = timestamppb.Now()
	a2f.Outcome = stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED
	a2f.Result = &stubbornv1.Result{Text: answer}
	final := state(stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED)
	final.Result, final.Winner, final.Attempts = a2f.Result, "model-b", 2
	final.UpdateTime, final.EndTime = timestamppb.Now(), timestamppb.Now()
	f.add(&stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_AttemptFinished{AttemptFinished: &stubbornv1.AttemptFinished{
		Attempt: a2f, OutputBytes: int64(len(answer))}}},
		&stubbornv1.RunEvent{Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED,
			Kind: &stubbornv1.RunEvent_RunFinished{RunFinished: &stubbornv1.RunFinished{State: final}}})
	b.waitJS("the run to succeed", q(runPage+`[data-status=RUN_STATUS_SUCCEEDED]`), 10*time.Second)
	b.waitJS("attempt 2's output accepted", q(detail("2")+` [data-testid=output][data-state=accepted]`), 10*time.Second)
	if got := eval[string](b, textOf("2")); got != answer {
		t.Errorf("attempt 2's accepted output shows %q, want its result %q", got, answer)
	}
	if eval[bool](b, `!!`+q(detail("2")+` [data-testid=discarded]`)+` || !!`+q(detail("2")+` [data-testid=stalled]`)) {
		t.Errorf("attempt 2 is shown discarded or stalled")
	}
	b.do("opening attempt 2's brief and answer", 10*time.Second,
		chromedp.Evaluate[chromedp.Void](q(detail("2")+` details.more`)+`.open = true`))
	b.waitJS("attempt 2's brief", q(detail("2")+` details.more pre.brief`), 5*time.Second)
	if got := eval[int](b, q(detail("2"))+`.textContent.split(`+js(answer)+`).length - 1`); got != 1 {
		t.Errorf("attempt 2 shows its answer %d times, want once", got)
	}
	b.waitJS("the result", q(`[data-testid=result]`)+`?.textContent === `+js(answer), 5*time.Second)

	// The event log says what each output event was.
	b.do("opening the events", 10*time.Second,
		chromedp.Evaluate[chromedp.Void](q(`details.events-box`)+`.open = true`))
	b.waitJS("the output events in the log", qa(`ol.events li`)+`.some(li => li.textContent.includes('attempt 1 output at byte 7 (provisional): "wörld"'))`, 5*time.Second)

	b.do("scrolling to the attempts", 5*time.Second, chromedp.Evaluate[chromedp.Void](q(detail("1"))+`.scrollIntoView()`))
	b.screenshot("console-streamed.png")
	if ex := b.log.Exceptions(); len(ex) > 0 {
		t.Errorf("uncaught exceptions: %q", ex)
	}
}

// An attempt that streams more than the console keeps (1 MiB, the default
// max_result_bytes): the first MiB is shown, and says so; what comes after
// is counted, not kept; discarded, it stays as it was.
func TestConsoleStreamedOutputCap(t *testing.T) {
	const id = "streamed-run-2"
	created := timestamppb.New(time.Now().Add(-time.Second))
	st := &stubbornv1.ControlState{
		RunId: id, Status: stubbornv1.RunStatus_RUN_STATUS_RUNNING, TaskBrief: "say a lot",
		Control: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{
			Chain: []string{"model-a"}}}},
		CreateTime: created, UpdateTime: created,
	}
	f := newFeed(id, st)
	s := startServer(t, setup{
		delegates: map[string]stubbornv1.DelegateServiceServer{"echo": demo.Echo{}},
		pages:     f.pages(),
	})
	a := &stubbornv1.Attempt{Number: 1, Delegate: "model-a", Brief: "say a lot", StartTime: timestamppb.Now()}
	const piece = 400 << 10
	f.add(&stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_RunStarted{RunStarted: &stubbornv1.RunStarted{State: st}}},
		attemptStarted(a))
	for i := range 4 {
		f.add(output(1, int64(i*piece), strings.Repeat(string(rune('a'+i)), piece), false))
	}

	b := newBrowser(t)
	out := `[data-testid=attempt-detail][data-attempt="1"] [data-testid=output]`
	b.do("opening the run", 30*time.Second,
		chromedp.Navigate(s.url+"/#/runs/"+id),
		chromedp.WaitVisible(chromedp.CSS(runPage+`[data-run-id="`+id+`"]`)))
	b.waitJS("the capped output", q(out+` [data-testid=output-label]`)+`?.textContent.includes('only the first 1.0 MiB shown')`, 20*time.Second)
	if n := eval[int](b, q(out+` [data-testid=output-text]`)+`.textContent.length`); n != 1<<20 {
		t.Errorf("the output holds %d characters, want %d", n, 1<<20)
	}

	done := &stubbornv1.Attempt{Number: 1, Delegate: "model-a", Brief: "say a lot", StartTime: a.StartTime,
		EndTime: timestamppb.Now(), Outcome: stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_ERROR,
		Error: &stubbornv1.AttemptError{Code: 8, Message: "answer over max_result_bytes"}}
	final := proto.CloneOf(st)
	final.Status, final.UpdateTime, final.EndTime = stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED, timestamppb.Now(), timestamppb.Now()
	f.add(&stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_AttemptFinished{AttemptFinished: &stubbornv1.AttemptFinished{
		Attempt: done, OutputDiscarded: true, OutputBytes: 4 * piece}}},
		&stubbornv1.RunEvent{Status: stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED,
			Kind: &stubbornv1.RunEvent_RunFinished{RunFinished: &stubbornv1.RunFinished{State: final}}})
	b.waitJS("the run to end", q(runPage+`[data-status=RUN_STATUS_EXHAUSTED]`), 10*time.Second)
	b.waitJS("the output discarded", q(out+`[data-state=discarded] [data-testid=discarded]`), 5*time.Second)
	if got := eval[string](b, q(out+` [data-testid=output-label]`)+`.textContent`); !strings.Contains(got, "1.6 MiB streamed") || !strings.Contains(got, "only the first 1.0 MiB shown") {
		t.Errorf("the discarded output's label says %q", got)
	}
	if n := eval[int](b, q(out+` [data-testid=output-text]`)+`.textContent.length`); n != 1<<20 {
		t.Errorf("the discarded output holds %d characters, want %d", n, 1<<20)
	}
	if ex := b.log.Exceptions(); len(ex) > 0 {
		t.Errorf("uncaught exceptions: %q", ex)
	}
}
