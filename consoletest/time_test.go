//go:build browser

package consoletest

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/stubbornhq/stubborn/delegates/demo"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// A run that has awaited a decision for two minutes when the page opens
// (the server's clock moved on two minutes after the run asked: as if it
// had waited that long) is drawn so: the wait's bar and the time axis span
// those two minutes (on the server's clock, which GetRun tells), not the
// moments the page has been open; the runs page says the run is two
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
	// --d is the wait's drawn length, --span the axis', both in ms.
	wait := q(`[data-testid=await]`) + `.style.getPropertyValue('--d')`
	span := q(`[data-testid=timeline]`) + `.style.getPropertyValue('--span')`
	b.waitJS("the wait drawn two minutes long", `Number(`+wait+`) >= `+ms(float64(waited.Milliseconds())), 10*time.Second)
	gotWait, gotSpan := eval[float64](b, `Number(`+wait+`)`), eval[float64](b, `Number(`+span+`)`)
	// At most: the two minutes, the time since the run began, and a second
	// for the clock's estimate (half a GetRun's round trip).
	most := float64((waited + time.Since(began) + time.Second).Milliseconds())
	if gotWait > most || gotSpan < gotWait || gotSpan > most {
		t.Errorf("the wait is drawn %.0fms long on an axis of %.0fms, want both between %v and %.0fms", gotWait, gotSpan, waited, most)
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
