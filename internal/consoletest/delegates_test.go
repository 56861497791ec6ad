//go:build browser

package consoletest

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// The Delegates page lists every delegate and preset, and follows them
// live (no reload): a delegate whose circuit breaker a failure opened
// shows it open, until when, and why, and the failure among its recent
// ones, with its code and its run; a delegate's rate use and bulkhead
// show what its calls took.
func TestConsoleDelegatesPage(t *testing.T) {
	s := startServer(t, setup{
		delegates: map[string]stubbornv1.DelegateServiceServer{
			"fragile": demo.Down{},
			"echo":    demo.Echo{},
		},
		configure: func(c *delegates.Config) {
			for i := range c.Delegates {
				switch c.Delegates[i].Name {
				case "fragile":
					c.Delegates[i].CircuitBreaker = &delegates.CircuitBreaker{ConsecutiveFailures: 1, Cooldown: delegates.Duration(time.Hour)}
				case "echo":
					c.Delegates[i].RequestsPerMinute = 100
					c.Delegates[i].MaxConcurrent = 4
				}
			}
			c.Presets = append(c.Presets, delegates.Preset{Name: "sturdy", Spec: &stubbornv1.ControlSpec{
				Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"fragile", "echo"}}},
			}})
		},
	})
	ctx := testCtx(t)
	b := newBrowser(t)
	fragile := `[data-testid=delegate-row][data-delegate=fragile]`
	echo := `[data-testid=delegate-row][data-delegate=echo]`
	b.do("opening the delegates page", 30*time.Second,
		chromedp.Navigate(s.url+"/#/delegates"),
		chromedp.WaitVisible(chromedp.CSS(fragile)),
		chromedp.WaitVisible(chromedp.CSS(echo)))
	b.waitJS("the preset", q(`[data-testid=preset][data-preset=sturdy]`)+`?.textContent.includes('fragile → echo')`, 5*time.Second)
	if got := eval[string](b, q(fragile+` [data-testid=breaker]`)+`.getAttribute('data-state')`); got != "BREAKER_STATE_CLOSED" {
		t.Errorf("fragile's breaker shows %s before any call, want BREAKER_STATE_CLOSED", got)
	}
	if n := eval[int](b, qa(fragile+` [data-testid=failure]`)+`.length`); n != 0 {
		t.Errorf("fragile shows %d failures before any call", n)
	}
	loads := b.seen().Loads

	res, err := s.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "open it", Retry: &stubbornv1.RetrySpec{
		Target: "fragile", Attempts: new(int32), OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL,
	}})
	if err != nil {
		t.Fatal(err)
	}
	id := res.GetRunId()
	s.waitStatus(t, ctx, id, stubbornv1.RunStatus_RUN_STATUS_FAILED, 10*time.Second)
	for range 3 {
		r, err := s.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "count me", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}})
		if err != nil {
			t.Fatal(err)
		}
		s.waitStatus(t, ctx, r.GetRunId(), stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, 10*time.Second)
	}

	b.waitJS("fragile's breaker open", q(fragile+` [data-testid=breaker][data-state=BREAKER_STATE_OPEN]`), 10*time.Second)
	b.waitJS("fragile's failure", q(fragile+` [data-testid=failure]`), 5*time.Second)
	until := eval[string](b, q(fragile+` [data-testid=breaker-until]`)+`?.textContent ?? ''`)
	if !strings.HasPrefix(until, "until ") || !strings.Contains(until, "(in 59m") {
		t.Errorf("fragile's breaker says %q, want until a time, in 59m…", until)
	}
	if got := eval[string](b, q(fragile+` [data-testid=breaker-reason]`)+`?.textContent ?? ''`); got != "1 transient failures in a row" {
		t.Errorf("fragile's breaker's reason is %q", got)
	}
	failure := eval[string](b, q(fragile+` [data-testid=failure]`)+`.textContent`)
	for _, want := range []string{"UNAVAILABLE", "down: not serving", id + " attempt 1", "ago"} {
		if !strings.Contains(failure, want) {
			t.Errorf("fragile's failure reads %q, want %q in it", failure, want)
		}
	}
	if got := eval[string](b, q(fragile+` [data-testid=failure] a`)+`.getAttribute('href')`); got != "#/runs/"+id {
		t.Errorf("the failure links to %q, want its run", got)
	}
	b.waitJS("echo's rate use", q(echo+` [data-testid=rate-requests]`)+`?.textContent === '3 of 100 requests'`, 10*time.Second)
	if got := eval[string](b, q(echo+` [data-testid=in-flight]`)+`.textContent`); got != "0 of 4" {
		t.Errorf("echo's calls in flight read %q, want 0 of 4", got)
	}
	if n := eval[int](b, qa(echo+` [data-testid=failure]`)+`.length`); n != 0 {
		t.Errorf("echo shows %d failures", n)
	}
	if w := b.seen(); w.Loads != loads {
		t.Errorf("the page was loaded %d times, want %d (live updates, no reload)", w.Loads, loads)
	}
	b.screenshot("console-delegates.png")
	if ex := b.log.Exceptions(); len(ex) > 0 {
		t.Errorf("uncaught exceptions: %q", ex)
	}
}

// A delegate that no health check asked (a retry asks none) shows what its
// calls did, not "Not checked yet": one whose calls are refused is failing
// since its first failure, with the last error; one whose call succeeded
// is OK; one never called has no calls yet.
func TestConsoleDelegatesHealthFromCalls(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := lis.Addr().String()
	_ = lis.Close() // nobody listens: connection refused
	s := startServer(t, setup{
		delegates: map[string]stubbornv1.DelegateServiceServer{"echo": demo.Echo{}, "idle": demo.Echo{}},
		configure: func(c *delegates.Config) {
			c.Delegates = append(c.Delegates, delegates.Delegate{Name: "unreachable", Target: closed, Idempotent: true, Timeout: delegates.Duration(time.Minute)})
		},
	})
	ctx := testCtx(t)
	run := func(target string, want stubbornv1.RunStatus) {
		t.Helper()
		res, err := s.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "call " + target, Retry: &stubbornv1.RetrySpec{
			Target: target, Attempts: new(int32), OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL,
		}})
		if err != nil {
			t.Fatal(err)
		}
		s.waitStatus(t, ctx, res.GetRunId(), want, 10*time.Second)
	}
	b := newBrowser(t)
	row := func(name string) string { return `[data-testid=delegate-row][data-delegate=` + name + `]` }
	b.do("opening the delegates page", 30*time.Second,
		chromedp.Navigate(s.url+"/#/delegates"),
		chromedp.WaitVisible(chromedp.CSS(row("unreachable"))))
	for _, name := range []string{"unreachable", "echo", "idle"} {
		if got := eval[string](b, q(row(name)+` [data-testid=health]`)+`.textContent`); got != "No calls yet" {
			t.Errorf("%s's health reads %q before any call, want No calls yet", name, got)
		}
	}

	for range 3 {
		run("unreachable", stubbornv1.RunStatus_RUN_STATUS_FAILED)
	}
	run("echo", stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED)

	b.waitJS("unreachable failing", q(row("unreachable")+` [data-testid=calls][data-state=failing]`), 10*time.Second)
	b.waitJS("echo ok", q(row("echo")+` [data-testid=calls][data-state=ok]`), 10*time.Second)
	if got := eval[string](b, q(row("unreachable")+` [data-testid=health]`)+`.textContent`); got != "Failing" {
		t.Errorf("unreachable's health reads %q, want Failing", got)
	}
	if n := eval[int](b, qa(row("unreachable")+` [data-testid=failure]`)+`.length`); n != 3 {
		t.Errorf("unreachable lists %d failures, want 3", n)
	}
	// Failing since the oldest of its three failures, as the page shows it.
	since := eval[string](b, q(row("unreachable")+` [data-testid=failing-since]`)+`.getAttribute('datetime')`)
	oldest := eval[string](b, qa(row("unreachable")+` [data-testid=failure] time`)+`.at(-1).getAttribute('datetime')`)
	if since == "" || since != oldest {
		t.Errorf("unreachable failing since %q, want its first failure's time %q", since, oldest)
	}
	calls := eval[string](b, q(row("unreachable")+` [data-testid=calls]`)+`.textContent`)
	for _, want := range []string{"Failing since ", "ago", "UNAVAILABLE", "connection refused"} {
		if !strings.Contains(calls, want) {
			t.Errorf("unreachable's calls read %q, want %q in it", calls, want)
		}
	}
	if got := eval[string](b, q(row("echo")+` [data-testid=health]`)+`.textContent`); got != "OK" {
		t.Errorf("echo's health reads %q, want OK", got)
	}
	if got := eval[string](b, q(row("echo")+` [data-testid=calls]`)+`.textContent`); !strings.HasPrefix(got, "Last call ok, ") || !strings.HasSuffix(got, " ago") {
		t.Errorf("echo's calls read %q, want Last call ok, … ago", got)
	}
	if got := eval[string](b, q(row("idle")+` [data-testid=health]`)+`.textContent`); got != "No calls yet" {
		t.Errorf("idle's health reads %q, want No calls yet", got)
	}
	if n := eval[int](b, qa(`[data-testid=health]`)+`.filter(e => e.textContent === 'Not checked yet').length`); n != 0 {
		t.Errorf("%d delegates read Not checked yet", n)
	}
	b.screenshot("console-delegates-calls.png")
	if ex := b.log.Exceptions(); len(ex) > 0 {
		t.Errorf("uncaught exceptions: %q", ex)
	}
}
