//go:build browser

package consoletest

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// A run that has awaited a decision for two minutes when the page opens
// (the server's clock moved on two minutes after the run asked: as if it
// had waited that long) is drawn so: the wait's bar spans the axis' cut
// of those two minutes (on the server's clock, which GetRun tells), not
// the moments the page has been open; the runs page says the run is two
// minutes old.
func TestConsoleWaitOlderThanThePage(t *testing.T) {
	const waited = 2 * time.Minute
	clock := &skewClock{}
	s := startServer(t, setup{
		delegates: map[string]stubbornv1.DelegateServiceServer{"down": demo.Down{}},
		clock:     clock,
	})
	ctx := testCtx(t)
	began := time.Now()
	res, err := s.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "wait for me",
		Retry: &stubbornv1.RetrySpec{Target: "down", Attempts: new(int32)}})
	if err != nil {
		t.Fatal(err)
	}
	id := res.GetRunId()
	s.waitStatus(t, ctx, id, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, 10*time.Second)
	clock.skew.Store(int64(waited))

	b := newBrowser(t)
	b.do("opening the run", 30*time.Second,
		chromedp.Navigate(s.url+"/#/runs/"+id),
		chromedp.WaitVisible(chromedp.CSS(runPage+`[data-status=RUN_STATUS_AWAITING_DECISION]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid=await]`)))
	// Two minutes of waiting after an attempt of a few milliseconds: the
	// axis cuts the wait, and its mark says how long it is, on the
	// server's clock. The wait's bar spans the cut.
	cut := q(`[data-testid=cut]`)
	b.waitJS("the wait drawn two minutes long", cut+`?.textContent.startsWith('2m')`, 10*time.Second)
	type edges struct {
		Left  float64 `json:"left"`
		Right float64 `json:"right"`
	}
	rect := func(sel string) edges {
		return eval[edges](b, `(() => { const r = `+q(sel)+`.getBoundingClientRect(); return {left: r.left, right: r.right}; })()`)
	}
	w, c := rect(`[data-testid=await]`), rect(`[data-testid=cut]`)
	if w.Left > c.Left+2 || w.Right < c.Right-2 || w.Right > c.Right+2 {
		t.Errorf("the wait is drawn from %.0f to %.0fpx, the cut of its two minutes from %.0f to %.0fpx", w.Left, w.Right, c.Left, c.Right)
	}
	// At most: the two minutes, the time since the run began, and a second
	// for the clock's estimate (half a GetRun's round trip).
	most := waited + time.Since(began) + time.Second
	got, err := time.ParseDuration(eval[string](b, cut+`.textContent`))
	if err != nil || got < waited || got > most {
		t.Errorf("the cut reads %v (%v), want between %v and %v", got, err, waited, most)
	}
	b.screenshot("console-long-wait.png")

	b.do("opening the runs page", 30*time.Second,
		chromedp.Navigate(s.url+"/#/"),
		chromedp.WaitVisible(chromedp.CSS(runsTable+` `+runRow+`[data-run-id="`+id+`"]`)))
	age := q(runRow+`[data-run-id="`+id+`"] time`) + `.textContent`
	b.waitJS("the run's age", age+`.startsWith('2m')`, 5*time.Second)
	if got := eval[string](b, age); !strings.HasPrefix(got, "2m") {
		t.Errorf("the runs page says the run is %s old, want 2m…", got)
	}
	if ex := b.log.Exceptions(); len(ex) > 0 {
		t.Errorf("uncaught exceptions: %q", ex)
	}
}
