//go:build browser

package consoletest

import (
	"net/http"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// harnessPage is a page of the test's own, standing for the console: a
// form whose button calls the API (ListRuns, Connect JSON, as the console
// does) and shows, for a moment only, a backoff.
const harnessPage = `<!doctype html>
<html><head><meta charset="utf-8"><title>harness</title>
<style>body{font-family:sans-serif;margin:2em} [data-testid=backoff]{color:#a60}</style></head>
<body>
<h1>Harness</h1>
<form data-testid="start-form" onsubmit="return false">
  <select name="control"><option value="retry">retry</option><option value="race">race</option></select>
  <input name="delegates">
  <button type="button" data-testid="start">Start</button>
</form>
<div data-testid="run" data-status="RUN_STATUS_RUNNING"><ol data-testid="timeline"></ol></div>
<p data-testid="result"></p>
<script>
document.querySelector('[data-testid=start]').addEventListener('click', async () => {
  const form = document.querySelector('[data-testid=start-form]');
  const res = await fetch('/stubborn.v1.ControlService/ListRuns', {method: 'POST',
    headers: {'Content-Type': 'application/json', 'Connect-Protocol-Version': '1'},
    body: JSON.stringify({view: 'RUN_VIEW_SUMMARY'})});
  const body = await res.json();
  const tl = document.querySelector('[data-testid=timeline]');
  tl.insertAdjacentHTML('beforeend', '<li data-testid="attempt" data-attempt="1" data-delegate="flaky" data-outcome="running">1</li>');
  tl.insertAdjacentHTML('beforeend', '<li data-testid="backoff">waiting <span data-testid="countdown">0.1s</span></li>');
  setTimeout(() => {
    tl.querySelector('[data-testid=backoff]').remove();
    tl.querySelector('[data-testid=attempt]').setAttribute('data-outcome', 'ATTEMPT_OUTCOME_SUCCEEDED');
    document.querySelector('[data-testid=run]').setAttribute('data-status', 'RUN_STATUS_SUCCEEDED');
    document.querySelector('[data-testid=result]').textContent =
      form.control.value + ' ' + form.delegates.value + ': ' + body.summaries.length + ' run ' + body.summaries[0].status;
    location.hash = '#/runs/' + body.summaries[0].runId;
  }, 50);
});
</script></body></html>`

// The harness alone, without the console: chromium starts, a page on the
// test server loads and calls the API, the form helpers type and choose,
// the watch script sees an element that was there for 50ms only, a hash
// change is not a load, and a screenshot is a PNG.
func TestBrowserHarness(t *testing.T) {
	s := startServer(t, setup{
		delegates: map[string]stubbornv1.DelegateServiceServer{"echo": demo.Echo{}},
		pages: map[string]http.Handler{"/harness.html": http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = w.Write([]byte(harnessPage))
		})},
	})
	ctx := testCtx(t)
	res, err := s.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "hi",
		FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}})
	if err != nil {
		t.Fatal(err)
	}
	s.waitStatus(t, ctx, res.GetRunId(), stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, 10*time.Second)

	b := newBrowser(t)
	b.do("opening the page", 20*time.Second,
		chromedp.Navigate(s.url+"/harness.html"),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid=start-form]`)))
	b.setSelect(`select[name=control]`, "race")
	b.typeInto(`input[name=delegates]`, "echo, flaky")
	b.do("starting", 10*time.Second, chromedp.Click(chromedp.CSS(`[data-testid=start]`)))
	b.waitJS("the run to succeed", `document.querySelector('[data-testid=run][data-status=RUN_STATUS_SUCCEEDED]')`, 10*time.Second)
	b.waitJS("the hash route", `location.hash === '#/runs/`+res.GetRunId()+`'`, 5*time.Second)

	if got, want := eval[string](b, `document.querySelector('[data-testid=result]').textContent`),
		"race echo, flaky: 1 run RUN_STATUS_SUCCEEDED"; got != want {
		t.Errorf("result %q, want %q", got, want)
	}
	got := b.seen()
	if got.Loads != 1 || !got.Backoff || !got.Countdown ||
		len(got.Attempts["1"]) != 2 || got.Attempts["1"][1] != "ATTEMPT_OUTCOME_SUCCEEDED" ||
		len(got.Statuses) != 2 || got.Statuses[1] != "RUN_STATUS_SUCCEEDED" {
		t.Errorf("the watch script saw %+v", got)
	}
	png := b.screenshot("harness.png")
	if len(png) < 8 || string(png[1:4]) != "PNG" {
		t.Errorf("screenshot is not a PNG: % x", png[:min(8, len(png))])
	}
	if ex := b.log.Exceptions(); len(ex) > 0 {
		t.Errorf("uncaught exceptions: %q", ex)
	}
}
