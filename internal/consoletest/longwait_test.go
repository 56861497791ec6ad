//go:build browser

package consoletest

import (
	"context"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// A run whose three quick attempts are followed by a long wait for a
// decision: the wait does not squeeze the attempts into a sliver. The
// axis cuts it (a mark saying how long it is), each bar shows its whole
// label, no bar covers another or the wait's label, and a click on each
// bar selects its attempt. Before, the three bars lay on each other at the
// axis' start ("#. #3 …ing decision").
func TestConsoleTimelineLongWait(t *testing.T) {
	s := startServer(t, setup{delegates: map[string]stubbornv1.DelegateServiceServer{"down": demo.Down{}}})
	ctx := testCtx(t)
	two := int32(2)
	res, err := s.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "wait for me", Retry: &stubbornv1.RetrySpec{
		Target: "down", Attempts: &two, BaseWait: durationpb.New(time.Millisecond), MaxWait: durationpb.New(2 * time.Millisecond),
		OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_ASK,
	}})
	if err != nil {
		t.Fatal(err)
	}
	id := res.GetRunId()
	s.waitStatus(t, ctx, id, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, 10*time.Second)
	awaiting := time.Now()

	b := newBrowser(t)
	b.do("opening the run", 30*time.Second,
		chromedp.Navigate(s.url+"/#/runs/"+id),
		chromedp.WaitVisible(chromedp.CSS(runPage+`[data-status=RUN_STATUS_AWAITING_DECISION]`)))
	b.waitJS("three attempts", qa(attemptSel)+`.length === 3`, 10*time.Second)
	b.waitJS("the wait", q(`[data-testid=await]`), 10*time.Second)
	// Three seconds of waiting against a few milliseconds of attempts.
	time.Sleep(time.Until(awaiting.Add(3 * time.Second)))
	b.waitJS("a few ticks", `new Promise(r => setTimeout(() => r(true), 300))`, 5*time.Second)
	readable(t, b, "awaiting")
	// The wait is cut: the axis says how long it is.
	if got := eval[string](b, qa(`[data-testid=cut]`)+`.map(e => e.textContent).join(' ')`); !regexp.MustCompile(`^\d+(\.\d+)?s$`).MatchString(got) {
		t.Errorf("the axis' cuts read %q, want one, a wait of seconds", got)
	}

	for _, n := range []string{"1", "2", "3"} {
		b.clickUntil("clicking bar "+n, attemptSel+`[data-attempt="`+n+`"]`,
			q(`[data-testid=attempt-detail][data-attempt="`+n+`"].selected`))
	}
	b.screenshot("console-timeline-cut.png")

	// Decided, the run ends; its timeline, drawn from its end, reads the same.
	if _, err := s.client.DecideRun(ctx, &stubbornv1.DecideRunRequest{RunId: id, Decision: stubbornv1.Decision_DECISION_FAIL}); err != nil {
		t.Fatal(err)
	}
	b.waitJS("the run failed", q(runPage+`[data-status=RUN_STATUS_FAILED]`), 10*time.Second)
	b.do("reloading the run", 30*time.Second,
		chromedp.Navigate(s.url+"/#/"),
		chromedp.Navigate(s.url+"/#/runs/"+id),
		chromedp.WaitVisible(chromedp.CSS(runPage+`[data-status=RUN_STATUS_FAILED]`)))
	b.waitJS("three attempts and the cut", qa(attemptSel)+`.length === 3 && `+q(`[data-testid=cut]`), 10*time.Second)
	readable(t, b, "finished")
	if ex := b.log.Exceptions(); len(ex) > 0 {
		t.Errorf("uncaught exceptions: %q", ex)
	}
}

// box is an element's place on the page and whether its text fits.
type box struct {
	Label string  `json:"label"`
	Left  float64 `json:"left"`
	Right float64 `json:"right"`
	Top   float64 `json:"top"`
	Bot   float64 `json:"bot"`
	Fits  bool    `json:"fits"`
	OnTop bool    `json:"onTop"`
}

// boxes measures the elements matching sel: each one's rectangle, whether
// its text fits it unclipped, and whether it is what a click at its
// centre reaches.
func boxes(b *tab, sel string) []box {
	return eval[[]box](b, qa(sel)+`.map(e => {
  const r = e.getBoundingClientRect();
  const hit = document.elementFromPoint((r.left + r.right) / 2, (r.top + r.bottom) / 2);
  return {label: e.textContent, left: r.left, right: r.right, top: r.top, bot: r.bottom,
    fits: e.scrollWidth <= e.clientWidth + 1, onTop: !!hit && (hit === e || e.contains(hit))};
})`)
}

// readable checks the timeline's bars and the wait: each fits its label,
// inside the timeline, reachable by a click, none overlapping another.
func readable(t *testing.T, b *tab, when string) {
	t.Helper()
	tl := boxes(b, `[data-testid=timeline]`)[0]
	bars := boxes(b, attemptSel)
	for i, br := range bars {
		if !br.Fits {
			t.Errorf("%s: bar %q does not fit its label (%.0fpx wide)", when, br.Label, br.Right-br.Left)
		}
		if !br.OnTop {
			t.Errorf("%s: bar %q is covered: a click at its centre reaches something else", when, br.Label)
		}
		if br.Left < tl.Left || br.Right > tl.Right {
			t.Errorf("%s: bar %q spans %.0f–%.0fpx, out of the timeline's %.0f–%.0fpx", when, br.Label, br.Left, br.Right, tl.Left, tl.Right)
		}
		if !strings.HasPrefix(br.Label, "#") || strings.Contains(br.Label, "…") {
			t.Errorf("%s: bar label %q", when, br.Label)
		}
		for _, o := range bars[i+1:] {
			if br.Left < o.Right && o.Left < br.Right && br.Top < o.Bot && o.Top < br.Bot {
				t.Errorf("%s: bars %q (%.0f–%.0fpx) and %q (%.0f–%.0fpx) overlap", when, br.Label, br.Left, br.Right, o.Label, o.Left, o.Right)
			}
		}
	}
	for _, w := range boxes(b, `[data-testid=await]`) {
		if !w.Fits || !w.OnTop {
			t.Errorf("%s: the wait's label %q fits %v, is on top %v (%.0fpx wide)", when, w.Label, w.Fits, w.OnTop, w.Right-w.Left)
		}
	}
}

// Attempts back to back after a long one (a retry at once) would be drawn
// on each other, each as wide as its label: they are stacked on rows of
// their lane, each readable and clickable.
func TestConsoleTimelineStacksOverlappingBars(t *testing.T) {
	var calls atomic.Int32
	slowThenQuick := demo.NewScripted(func(ctx context.Context, _ *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		if calls.Add(1) == 1 {
			select {
			case <-time.After(800 * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return nil, status.Error(codes.Unavailable, "busy")
	})
	s := startServer(t, setup{delegates: map[string]stubbornv1.DelegateServiceServer{"busy": slowThenQuick}})
	ctx := testCtx(t)
	three := int32(3)
	res, err := s.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "at once", Retry: &stubbornv1.RetrySpec{
		Target: "busy", Attempts: &three, BaseWait: durationpb.New(0), OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL,
	}})
	if err != nil {
		t.Fatal(err)
	}
	id := res.GetRunId()
	s.waitStatus(t, ctx, id, stubbornv1.RunStatus_RUN_STATUS_FAILED, 10*time.Second)

	b := newBrowser(t)
	b.do("opening the run", 30*time.Second,
		chromedp.Navigate(s.url+"/#/runs/"+id),
		chromedp.WaitVisible(chromedp.CSS(runPage+`[data-status=RUN_STATUS_FAILED]`)))
	b.waitJS("four attempts", qa(attemptSel)+`.length === 4`, 10*time.Second)
	b.waitJS("a few frames", `new Promise(r => setTimeout(() => r(true), 300))`, 5*time.Second)
	readable(t, b, "finished")
	if rows := eval[int](b, `new Set(`+qa(attemptSel)+`.map(e => e.getBoundingClientRect().top)).size`); rows < 2 {
		t.Errorf("the attempts lie on %d row, want the quick ones stacked", rows)
	}
	for _, n := range []string{"1", "2", "3", "4"} {
		b.clickUntil("clicking bar "+n, attemptSel+`[data-attempt="`+n+`"]`,
			q(`[data-testid=attempt-detail][data-attempt="`+n+`"].selected`))
	}
	b.screenshot("console-stacked.png")
	if ex := b.log.Exceptions(); len(ex) > 0 {
		t.Errorf("uncaught exceptions: %q", ex)
	}
}
