//go:build browser

package consoletest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// chromiumPath returns the browser to drive: STUBBORN_CHROMIUM, else
// chromium (Debian's package) on PATH. Without one the test fails under CI
// (which installs it: .ci/run) and skips elsewhere.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("STUBBORN_CHROMIUM"); p != "" {
		path, err := exec.LookPath(p)
		if err != nil {
			t.Fatalf("STUBBORN_CHROMIUM=%s: %v", p, err)
		}
		return path
	}
	for _, name := range []string{"chromium", "/usr/bin/chromium", "chromium-browser"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	const msg = "no chromium on PATH: install Debian's package (apt-get install chromium) or set STUBBORN_CHROMIUM to a Chromium or Chrome binary"
	if os.Getenv("CI") != "" {
		t.Fatal(msg + "; CI must run the browser tests (.ci/run installs chromium)")
	}
	t.Skip(msg + "; skipped because CI is unset (under CI this fails)")
	return ""
}

// tab is a browser tab. Its actions fail the test, with a screenshot and
// the page's HTML saved as artifacts, when they do not succeed in time.
type tab struct {
	t    *testing.T
	ctx  context.Context
	name string
	log  *pageLog
}

// pageLog keeps what a tab's pages wrote to the console, and their uncaught
// exceptions, to print when the test ends (a goroutine may not log to a test
// that has ended).
type pageLog struct {
	mu         sync.Mutex
	lines      []string
	exceptions []string
}

func (l *pageLog) add(m chromedp.ConsoleMessage) {
	l.mu.Lock()
	defer l.mu.Unlock()
	line := fmt.Sprintf("console.%s %s:%d %s", m.Type, m.URL, m.Line+1, m.Text)
	l.lines = append(l.lines, line)
	if m.IsException() {
		l.exceptions = append(l.exceptions, line)
	}
}

// Exceptions returns the uncaught exceptions seen so far.
func (l *pageLog) Exceptions() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.exceptions...)
}

// watchScript runs first in every document the tabs load. It counts the
// tab's document loads in sessionStorage (so a test can tell a live update
// from a reload), and keeps in window.__seen what the DOM showed at any
// moment, even briefly (an element added and removed before the observer
// ran is still in the mutation records): whether a backoff, with its
// countdown, was shown; each attempt's outcomes in order; the run's
// statuses in order; and, for the performance figures, when (ms since the
// navigation started, performance.now()) the first run rows were in the
// DOM and when the attempts reached their latest count, each with the time
// of the next animation frame, when they were painted.
const watchScript = `(() => {
  if (location.protocol !== 'http:' && location.protocol !== 'https:') return; // about:blank
  const loads = Number(sessionStorage.getItem('__stubbornLoads') || 0) + 1;
  sessionStorage.setItem('__stubbornLoads', String(loads));
  const seen = window.__seen = {loads, backoff: false, countdown: false, attempts: {}, statuses: [],
    firstRowsMs: null, firstRowsFrameMs: null, firstRows: 0, attemptsMax: 0, attemptsMaxMs: null, attemptsMaxFrameMs: null};
  const backoff = (el) => {
    seen.backoff = true;
    if (el.querySelector('[data-testid=countdown]')) seen.countdown = true;
  };
  const scan = (records) => {
    for (const r of records || []) {
      for (const n of r.addedNodes) {
        if (n.nodeType !== 1) continue;
        if (n.matches('[data-testid=backoff]')) backoff(n);
        n.querySelectorAll('[data-testid=backoff]').forEach(backoff);
      }
    }
    document.querySelectorAll('[data-testid=backoff]').forEach(backoff);
    const attempts = document.querySelectorAll('[data-testid=attempt]');
    for (const a of attempts) {
      const k = a.getAttribute('data-attempt');
      const o = a.getAttribute('data-outcome');
      const list = seen.attempts[k] || (seen.attempts[k] = []);
      if (list[list.length - 1] !== o) list.push(o);
    }
    if (attempts.length > seen.attemptsMax) {
      const n = seen.attemptsMax = attempts.length;
      seen.attemptsMaxMs = performance.now();
      requestAnimationFrame(() => { if (seen.attemptsMax === n) seen.attemptsMaxFrameMs = performance.now(); });
    }
    if (seen.firstRowsMs === null) {
      const rows = document.querySelectorAll('[data-testid=run-row]').length;
      if (rows > 0) {
        seen.firstRowsMs = performance.now();
        seen.firstRows = rows;
        requestAnimationFrame(() => { seen.firstRowsFrameMs = performance.now(); });
      }
    }
    const run = document.querySelector('[data-testid=run]');
    const s = run && run.getAttribute('data-status');
    if (s && seen.statuses[seen.statuses.length - 1] !== s) seen.statuses.push(s);
  };
  new MutationObserver(scan).observe(document, {subtree: true, childList: true, attributes: true, characterData: true});
})();`

// seen is window.__seen.
type seen struct {
	Loads              int                 `json:"loads"`
	Backoff            bool                `json:"backoff"`
	Countdown          bool                `json:"countdown"`
	Attempts           map[string][]string `json:"attempts"`
	Statuses           []string            `json:"statuses"`
	FirstRowsMs        *float64            `json:"firstRowsMs"`
	FirstRowsFrameMs   *float64            `json:"firstRowsFrameMs"`
	FirstRows          int                 `json:"firstRows"`
	AttemptsMax        int                 `json:"attemptsMax"`
	AttemptsMaxMs      *float64            `json:"attemptsMaxMs"`
	AttemptsMaxFrameMs *float64            `json:"attemptsMaxFrameMs"`
}

// seen returns what the watch script saw in the tab's current document.
func (tb *tab) seen() seen {
	tb.t.Helper()
	return eval[seen](tb, `window.__seen`)
}

// allocatorOptions are chromium's flags: headless, no sandbox (the tests
// run as root in CI, where chromium's sandbox refuses to start; the browser
// only ever opens this test's loopback server), a fixed window, and no
// network but loopback: every host name but 127.0.0.1 fails to resolve, and
// the background services (component updates, pings) are off.
func allocatorOptions(path string) []chromedp.ExecAllocatorOption {
	return append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox,
		chromedp.WindowSize(1280, 900),
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-domain-reliability", true),
		chromedp.Flag("no-pings", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.Flag("mute-audio", true),
	)
}

// newBrowser starts chromium for the test and returns its first tab. The
// browser ends with the test, before the servers the test started later
// (cleanups run last first).
func newBrowser(t *testing.T) *tab {
	t.Helper()
	path := chromiumPath(t)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), allocatorOptions(path)...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	start := time.Now()
	// The first action starts the browser, its life bound to ctx.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting %s: %v", path, err)
	}
	t.Logf("browser: %s started in %v", path, time.Since(start).Round(time.Millisecond))
	return initTab(t, ctx, "tab1")
}

// newTab opens another tab in b's browser; incognito gives it storage of
// its own (a new browser context), as another person's browser would have.
func (b *tab) newTab(name string, incognito bool) *tab {
	b.t.Helper()
	var opts []chromedp.ContextOption
	if incognito {
		opts = append(opts, chromedp.WithNewBrowserContext())
	}
	ctx, cancel := chromedp.NewContext(b.ctx, opts...)
	b.t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil {
		b.t.Fatalf("opening %s: %v", name, err)
	}
	return initTab(b.t, ctx, name)
}

func initTab(t *testing.T, ctx context.Context, name string) *tab {
	t.Helper()
	tb := &tab{t: t, ctx: ctx, name: name, log: &pageLog{}}
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			tb.log.add(m)
		}
	}()
	if _, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument,
		page.AddScriptToEvaluateOnNewDocumentParams{Source: watchScript}); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(func() {
		tb.log.mu.Lock()
		defer tb.log.mu.Unlock()
		for _, l := range tb.log.lines {
			t.Logf("%s: %s", name, l)
		}
	})
	return tb
}

// do runs actions, failing the test if they fail or take longer than d.
func (tb *tab) do(what string, d time.Duration, actions ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, d)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		tb.fail(what, err)
	}
}

// fail saves what the tab shows and fails the test.
func (tb *tab) fail(what string, err error) {
	tb.t.Helper()
	tb.snapshot("failed")
	tb.t.Fatalf("%s: %s: %v", tb.name, what, err)
}

// snapshot saves the tab's screenshot and HTML as artifacts named after
// the test, tab and label.
func (tb *tab) snapshot(label string) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 10*time.Second)
	defer cancel()
	base := strings.NewReplacer("/", "_", " ", "_").Replace(tb.t.Name() + "-" + tb.name + "-" + label)
	if html, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.documentElement.outerHTML`)); err == nil {
		writeArtifact(tb.t, base+".html", []byte(html))
	}
	if png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)); err == nil {
		writeArtifact(tb.t, base+".png", png)
	}
	if u, err := chromedp.Run(ctx, chromedp.Location()); err == nil {
		tb.t.Logf("%s at %s", tb.name, u)
	}
}

// screenshot saves a full-page PNG of the tab as the artifact name and
// returns it.
func (tb *tab) screenshot(name string) []byte {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		tb.t.Fatalf("%s: screenshot %s: %v", tb.name, name, err)
	}
	writeArtifact(tb.t, name, png)
	return png
}

// clickUntil clicks sel until the JavaScript expression done is truthy:
// at most 3 clicks, each given 2 s. A click lands at the element's place
// when it was measured, and a page still laying out what it just received
// (a timeline, a notice) may move the element meanwhile: the click then
// lands beside it, which is the browser doing as told, not the console
// losing a click.
func (tb *tab) clickUntil(what, sel, done string) {
	tb.t.Helper()
	var err error
	for range 3 {
		tb.do(what, 10*time.Second, chromedp.Click(chromedp.CSS(sel)))
		ctx, cancel := context.WithTimeout(tb.ctx, 7*time.Second)
		_, err = chromedp.Run(ctx, chromedp.Poll[chromedp.Void](done,
			chromedp.WithPollingInterval(20*time.Millisecond), chromedp.WithPollingTimeout(2*time.Second)))
		cancel()
		if err == nil {
			return
		}
	}
	tb.fail(what, err)
}

// waitJS waits until the JavaScript expression is truthy, failing the test
// after d. It polls every 20ms.
func (tb *tab) waitJS(what, expr string, d time.Duration) {
	tb.t.Helper()
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithDeadline(tb.ctx, deadline.Add(5*time.Second))
		_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr,
			chromedp.WithPollingInterval(20*time.Millisecond), chromedp.WithPollingTimeout(time.Until(deadline))))
		cancel()
		// Right after a navigation, chromedp may still poll in the previous
		// document's execution context, which the browser no longer knows:
		// poll again in the new one.
		if err != nil && strings.Contains(err.Error(), "Cannot find context with specified id") && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if err != nil {
			tb.fail("waiting for "+what+" ("+expr+")", err)
		}
		return
	}
}

// eval evaluates a JavaScript expression in the tab and decodes its value.
func eval[T any](tb *tab, expr string) T {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		tb.fail("evaluating "+expr, err)
	}
	return v
}

// js quotes s as a JavaScript string.
func js(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// setValueJS defines setValue(el, v): the value through the element
// class's own setter, which frameworks that track values (React) see as a
// change, as they would a person's input.
const setValueJS = `const setValue = (el, v) => Object.getOwnPropertyDescriptor(Object.getPrototypeOf(el), 'value').set.call(el, v);`

// setSelect chooses value in a select as a person would: the value, then
// the input and change events.
func (tb *tab) setSelect(sel, value string) {
	tb.t.Helper()
	ok := eval[bool](tb, `(() => {
  `+setValueJS+`
  const el = document.querySelector(`+js(sel)+`);
  if (!el) return false;
  if (![...el.options].some(o => o.value === `+js(value)+`)) return false;
  setValue(el, `+js(value)+`);
  el.dispatchEvent(new Event('input', {bubbles: true}));
  el.dispatchEvent(new Event('change', {bubbles: true}));
  return true;
})()`)
	if !ok {
		tb.fail("choosing "+value+" in "+sel, fmt.Errorf("no such select or option"))
	}
}

// typeInto replaces the text of an input or textarea by typing value.
func (tb *tab) typeInto(sel, value string) {
	tb.t.Helper()
	ok := eval[bool](tb, `(() => {
  `+setValueJS+`
  const el = document.querySelector(`+js(sel)+`);
  if (!el) return false;
  el.focus();
  setValue(el, '');
  el.dispatchEvent(new Event('input', {bubbles: true}));
  return true;
})()`)
	if !ok {
		tb.fail("clearing "+sel, fmt.Errorf("no such element"))
	}
	tb.do("typing into "+sel, 10*time.Second, chromedp.SendKeys(chromedp.CSS(sel), value))
	if got := eval[string](tb, `document.querySelector(`+js(sel)+`).value`); got != value {
		tb.fail("typing into "+sel, fmt.Errorf("value is %q, want %q", got, value))
	}
}

// artifactsDir is where screenshots go: STUBBORN_ARTIFACTS, else the
// package's testdata/artifacts (ignored by git).
func artifactsDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("STUBBORN_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join("testdata", "artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func writeArtifact(t *testing.T, name string, b []byte) {
	t.Helper()
	path := filepath.Join(artifactsDir(t), name)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs(path)
	t.Logf("artifact: %s (%d bytes)", abs, len(b))
}

// perf logs a figure as "PERF name=value race=BOOL" (race: whether the
// race detector was on, which slows the server: figures to publish come
// from a run without it) and appends the line to the file
// STUBBORN_PERF_OUT names, if any.
func perf(t *testing.T, name string, value any) {
	t.Helper()
	line := fmt.Sprintf("PERF %s=%v race=%v", name, value, raceEnabled)
	t.Log(line)
	out := os.Getenv("STUBBORN_PERF_OUT")
	if out == "" {
		return
	}
	f, err := os.OpenFile(out, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := fmt.Fprintln(f, line); err != nil {
		t.Fatal(err)
	}
}
