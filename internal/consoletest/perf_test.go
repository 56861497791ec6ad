//go:build browser

package consoletest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// Performance figures, measured and logged (PERF lines), never asserted:
// how long the console takes to show the first page of runs with 10,000
// runs in the store, and a run's timeline of 100 attempts. Each is the
// median of fresh loads of the page (a new document each, the browser's
// cache warm after the first), from the start of the navigation
// (performance.now() in the page) to the animation frame after the rows or
// attempts were in the DOM.

// loads is how many fresh loads each figure is the median of.
const loads = 5

// timeLoads loads url afresh n times and returns, for each load, what the
// watch script saw once ready(seen) held.
func (tb *tab) timeLoads(url string, n int, what string, ready string) []seen {
	tb.t.Helper()
	var out []seen
	for range n {
		tb.do("leaving the page", 10*time.Second, chromedp.Navigate("about:blank"))
		start := time.Now()
		tb.do("loading "+url, 60*time.Second, chromedp.Navigate(url))
		tb.waitJS(what, `window.__seen && `+ready, 60*time.Second)
		w := tb.seen()
		tb.t.Logf("load: %s in %v (wall clock, polled); %s", what, time.Since(start).Round(time.Millisecond),
			eval[string](tb, pageTimings))
		out = append(out, w)
	}
	return out
}

// pageTimings tells where a load's time went: the document's
// DOMContentLoaded, and each API call's start and end, in ms since the
// navigation started.
const pageTimings = `(() => {
  const f = (v) => Math.round(v);
  const nav = performance.getEntriesByType('navigation')[0];
  const calls = performance.getEntriesByType('resource').filter(e => e.name.includes('/stubborn.v1.'))
    .map(e => e.name.replace(/^.*\//, '') + ' ' + f(e.startTime) + '-' + f(e.responseEnd));
  return 'DOMContentLoaded at ' + f(nav.domContentLoadedEventEnd) + 'ms; API calls (ms): ' + calls.join(', ');
})()`

func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	return s[len(s)/2]
}

func ms(v float64) string { return fmt.Sprintf("%d", int(math.Round(v))) }

func TestConsolePerfRunsPage10000(t *testing.T) {
	const total = 10000
	s := startServer(t, setup{delegates: map[string]stubbornv1.DelegateServiceServer{"echo": demo.Echo{}}})
	ctx := testCtx(t)
	b := newBrowser(t)
	firstRows := `window.__seen.firstRowsFrameMs !== null && ` + q(`[data-testid=runs] [data-testid=run-row]`) + ` !== null`

	// The baseline: the same page with one run.
	if err := runToEnd(s, ctx, "run 1"); err != nil {
		t.Fatal(err)
	}
	base := firstRowsMs(t, b.timeLoads(s.url+"/#/", loads, "the first page of 1 run", firstRows))

	// 10,000 quick runs, each followed to its end (Run streams it).
	start := time.Now()
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		firstEr error
	)
	next.Store(1)
	for range 32 {
		wg.Go(func() {
			for i := next.Add(1); i <= total; i = next.Add(1) {
				if err := runToEnd(s, ctx, fmt.Sprintf("run %d", i)); err != nil {
					errOnce.Do(func() { firstEr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	if firstEr != nil {
		t.Fatal(firstEr)
	}
	t.Logf("%d runs in %v", total, time.Since(start).Round(time.Millisecond))
	list, err := s.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{View: stubbornv1.RunView_RUN_VIEW_SUMMARY, PageSize: 1})
	if err != nil || len(list.GetSummaries()) != 1 || list.GetNextPageToken() == "" {
		t.Fatalf("ListRuns: %v %v", list, err)
	}
	newest := list.GetSummaries()[0].GetRunId()
	// The server shares this process: the garbage of 10,000 runs' creation
	// is collected now, not during the measures.
	runtime.GC()

	// The server's part: the first page's ListRuns as the console asks
	// for it (Connect JSON over HTTP, 50 summaries).
	var calls []float64
	for range 5 {
		start := time.Now()
		postJSON(t, s.url+"/stubborn.v1.ControlService/ListRuns", `{"view": "RUN_VIEW_SUMMARY", "pageSize": 50}`)
		calls = append(calls, float64(time.Since(start).Microseconds())/1000)
	}
	t.Logf("ListRuns over HTTP: %v ms", calls)

	first := firstRowsMs(t, b.timeLoads(s.url+"/#/", loads, "the first page of 10,000 runs", firstRows))
	rows := eval[int](b, qa(`[data-testid=runs] [data-testid=run-row]`)+`.length`)
	if rows < 1 || rows > total {
		t.Errorf("%d rows", rows)
	}
	if !eval[bool](b, `!!`+q(`[data-testid=run-row][data-run-id="`+newest+`"]`)) {
		t.Errorf("the newest run %s is not on the first page", newest)
	}
	b.screenshot("perf-runs-10000.png")
	perf(t, "runs_page_10000_first_page_ms", ms(first))
	perf(t, "runs_page_10000_first_page_rows", rows)
	perf(t, "runs_page_10000_list_runs_http_ms", ms(median(calls)))
	perf(t, "runs_page_1_first_page_ms", ms(base))
}

// firstRowsMs returns the median time to the first rows' frame.
func firstRowsMs(t *testing.T, got []seen) float64 {
	t.Helper()
	var v []float64
	for _, w := range got {
		v = append(v, *w.FirstRowsFrameMs)
		t.Logf("first rows: %d in the DOM at %.1fms, painted at %.1fms", w.FirstRows, *w.FirstRowsMs, *w.FirstRowsFrameMs)
	}
	return median(v)
}

// postJSON makes a Connect unary call with a JSON body, failing the test
// unless it answers 200.
func postJSON(t *testing.T, url, body string) []byte {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Minute}
	resp, err := c.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d %s %v", url, resp.StatusCode, b, err)
	}
	return b
}

// runToEnd runs a quick echo run and reads its events to the end.
func runToEnd(s *stack, ctx context.Context, brief string) error {
	stream, err := s.client.Run(ctx, &stubbornv1.RunRequest{TaskBrief: brief,
		FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}})
	if err != nil {
		return err
	}
	for {
		if _, err := stream.Recv(); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
	}
}

func TestConsolePerfTimeline100Attempts(t *testing.T) {
	s := startServer(t, setup{delegates: map[string]stubbornv1.DelegateServiceServer{
		"fail99": &demo.Flaky{FailFirst: 99},
	}})
	ctx := testCtx(t)
	retries := int32(100)
	res, err := s.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "a hundred tries", Retry: &stubbornv1.RetrySpec{
		Target: "fail99", Attempts: &retries, BaseWait: durationpb.New(time.Millisecond), MaxWait: durationpb.New(time.Millisecond),
	}})
	if err != nil {
		t.Fatal(err)
	}
	id := res.GetRunId()
	state := s.waitStatus(t, ctx, id, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, time.Minute)
	if n := len(state.GetAttemptLog()); n != 100 {
		t.Fatalf("%d attempts, want 100", n)
	}

	b := newBrowser(t)
	got := b.timeLoads(s.url+"/#/runs/"+id, loads, "the 100 attempts",
		`window.__seen.attemptsMax >= 100 && window.__seen.attemptsMaxFrameMs !== null`)
	var all []float64
	for _, w := range got {
		if w.AttemptsMax != 100 {
			t.Errorf("%d attempts shown, want 100", w.AttemptsMax)
		}
		all = append(all, *w.AttemptsMaxFrameMs)
		t.Logf("100 attempts in the DOM at %.1fms, painted at %.1fms", *w.AttemptsMaxMs, *w.AttemptsMaxFrameMs)
	}
	b.waitJS("the run's status", q(`[data-testid=run][data-status=RUN_STATUS_SUCCEEDED]`), 10*time.Second)
	if got := b.attempts(); len(got) != 100 || got[99] != (attemptView{"100", "fail99", "ATTEMPT_OUTCOME_SUCCEEDED"}) {
		t.Errorf("%d attempts shown: %+v", len(got), got)
	}
	b.screenshot("perf-timeline-100.png")
	perf(t, "run_timeline_100_attempts_ms", ms(median(all)))
}
