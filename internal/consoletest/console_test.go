//go:build browser

package consoletest

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// slowFlaky is demo.Flaky taking delay over each call, so that the console
// is watching before the first attempt ends: it shows the attempt running,
// then failed, then the backoff after it, live.
func slowFlaky(f *demo.Flaky, delay time.Duration) stubbornv1.DelegateServiceServer {
	return demo.NewScripted(func(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return f.Execute(ctx, req)
	})
}

// Selectors of the DOM contract between the console and this test.
const (
	runsTable  = `[data-testid=runs]`
	runRow     = `[data-testid=run-row]`
	startForm  = `[data-testid=start-form]`
	runPage    = `[data-testid=run]`
	attemptSel = `[data-testid=attempt]`
)

// q is a JavaScript expression for the first element matching sel.
func q(sel string) string { return `document.querySelector(` + js(sel) + `)` }

// qa is a JavaScript expression for the elements matching sel, as an array.
func qa(sel string) string { return `[...document.querySelectorAll(` + js(sel) + `)]` }

// attemptView is an attempt as the timeline shows it.
type attemptView struct {
	Attempt  string `json:"attempt"`
	Delegate string `json:"delegate"`
	Outcome  string `json:"outcome"`
}

func (tb *tab) attempts() []attemptView {
	tb.t.Helper()
	return eval[[]attemptView](tb, qa(attemptSel)+`.map(a => ({attempt: a.getAttribute('data-attempt'),
  delegate: a.getAttribute('data-delegate'), outcome: a.getAttribute('data-outcome')}))`)
}

// A retry run started from the console's form, followed live: its attempts
// (running, then failed) and the backoff between them appear without a
// reload; it ends awaiting a decision; Retry starts a new round whose
// attempt succeeds. A second tab on the runs page sees the run's status
// change live, and its row opens the run.
func TestConsoleRetryRun(t *testing.T) {
	flaky := &demo.Flaky{FailFirst: 2}
	s := startServer(t, setup{
		delegates: map[string]stubbornv1.DelegateServiceServer{
			"flaky": slowFlaky(flaky, 700*time.Millisecond),
			"echo":  demo.Echo{},
		},
		// The jitter of the first run's first backoff: close to its 100ms
		// bound, not a few milliseconds (logged below).
		seed: 1,
	})
	ctx := testCtx(t)
	b := newBrowser(t)

	// The form, filled in as a person would.
	id, loads := startFromForm(t, ctx, b, s)
	// Two attempts and a backoff, live; then the run waits for a decision.
	awaitsDecision(t, ctx, b, s, id)
	// Another tab on the runs page lists the run as awaiting a decision.
	runs := b.newTab("runs", false)
	row := runRow + `[data-run-id="` + id + `"]`
	runs.do("opening the runs page", 30*time.Second,
		chromedp.Navigate(s.url+"/#/"),
		chromedp.WaitVisible(chromedp.CSS(runsTable)))
	runs.waitJS("the run's row", q(runsTable+` `+row+`[data-status=RUN_STATUS_AWAITING_DECISION]`), 10*time.Second)
	runsLoads := runs.seen().Loads

	// Retry: a new round, whose attempt succeeds.
	retrySucceeds(t, ctx, b, s, id, flaky, loads)

	// The runs page followed it, without a reload; its row opens the run.
	runs.waitJS("the row to show the run succeeded", q(row+`[data-status=RUN_STATUS_SUCCEEDED]`), 10*time.Second)
	if w := runs.seen(); w.Loads != runsLoads {
		t.Errorf("the runs page was loaded %d times, want %d (live updates, no reload)", w.Loads, runsLoads)
	}
	runs.screenshot("console-runs.png")
	runs.do("opening the run from its row", 10*time.Second, chromedp.Click(chromedp.CSS(row)))
	runs.waitJS("the run's page from its row", `location.hash === '#/runs/`+id+`' && `+q(runPage+`[data-run-id="`+id+`"][data-status=RUN_STATUS_SUCCEEDED]`), 10*time.Second)
	runs.waitJS("its three attempts", qa(attemptSel)+`.length === 3`, 10*time.Second)

	for _, tb := range []*tab{b, runs} {
		if ex := tb.log.Exceptions(); len(ex) > 0 {
			t.Errorf("%s: uncaught exceptions: %q", tb.name, ex)
		}
	}
}

// startFromForm fills in and submits the start form as a person would, and
// returns the run's id once the console shows its page, and how many times
// the page had loaded then.
func startFromForm(t *testing.T, ctx context.Context, b *tab, s *stack) (string, int) {
	t.Helper()
	b.do("opening the start form", 30*time.Second,
		chromedp.Navigate(s.url+"/#/start"),
		chromedp.WaitVisible(chromedp.CSS(startForm)))
	b.setSelect(startForm+` select[name=control]`, "retry")
	b.typeInto(startForm+` input[name=delegates]`, "flaky")
	b.typeInto(startForm+` textarea[name=brief]`, "say hello")
	b.typeInto(startForm+` input[name=attempts]`, "1")
	b.typeInto(startForm+` input[name=base_wait]`, "100ms")
	b.setSelect(startForm+` select[name=on_exhausted]`, "ask")
	b.do("starting the run", 10*time.Second, chromedp.Click(chromedp.CSS(`button[data-testid=start]`)))

	// The console goes to the run.
	b.waitJS("the run's page", `location.hash.startsWith('#/runs/') && `+q(runPage+`[data-run-id]`), 15*time.Second)
	id := eval[string](b, q(runPage)+`.getAttribute('data-run-id')`)
	if h := eval[string](b, `location.hash`); h != "#/runs/"+id {
		t.Errorf("location.hash %q, want #/runs/%s", h, id)
	}
	got, err := s.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
	if err != nil {
		t.Fatalf("the run page's data-run-id %q: %v", id, err)
	}
	if r := got.GetState().GetControl().GetRetry(); r.GetTarget() != "flaky" || r.GetAttempts() != 1 ||
		r.GetBaseWait().AsDuration() != 100*time.Millisecond || r.GetOnExhausted() != stubbornv1.OnExhausted_ON_EXHAUSTED_ASK ||
		got.GetState().GetTaskBrief() != "say hello" {
		t.Errorf("the form started %q with %v", got.GetState().GetTaskBrief(), got.GetState().GetControl())
	}
	loads := b.seen().Loads

	return id, loads
}

// awaitsDecision checks that run id's two failed attempts and the backoff
// between them appear live, and that the run then awaits a decision.
func awaitsDecision(t *testing.T, ctx context.Context, b *tab, s *stack, id string) {
	t.Helper()
	b.waitJS("the run to await a decision", q(runPage+`[data-status=RUN_STATUS_AWAITING_DECISION]`), 20*time.Second)
	b.waitJS("two failed attempts", qa(attemptSel)+`.filter(a => a.getAttribute('data-outcome') === 'ATTEMPT_OUTCOME_ERROR').length === 2`, 5*time.Second)
	if got, want := b.attempts(), []attemptView{
		{"1", "flaky", "ATTEMPT_OUTCOME_ERROR"}, {"2", "flaky", "ATTEMPT_OUTCOME_ERROR"},
	}; !slices.Equal(got, want) {
		t.Errorf("attempts %+v, want %+v", got, want)
	}
	b.do("the decision buttons", 5*time.Second,
		chromedp.WaitVisible(chromedp.CSS(`[data-testid=decide-retry]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid=decide-fail]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid=cancel]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid=status]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid=timeline]`)))
	s.waitStatus(t, ctx, id, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, 5*time.Second)
	w := b.seen()
	if !w.Backoff || !w.Countdown {
		t.Errorf("no backoff with a countdown was shown between the attempts (backoff %v, countdown %v)", w.Backoff, w.Countdown)
	}
	if a1 := w.Attempts["1"]; len(a1) < 2 || a1[0] != "running" || a1[len(a1)-1] != "ATTEMPT_OUTCOME_ERROR" {
		t.Errorf("attempt 1 was shown as %q, want running then ATTEMPT_OUTCOME_ERROR", a1)
	}
	if len(w.Statuses) < 2 || w.Statuses[len(w.Statuses)-1] != "RUN_STATUS_AWAITING_DECISION" {
		t.Errorf("the run's statuses were shown as %q, want a status before RUN_STATUS_AWAITING_DECISION", w.Statuses)
	}

}

// retrySucceeds clicks Retry on run id and checks the new round's attempt
// succeeds, live, on a page loaded loads times.
func retrySucceeds(t *testing.T, ctx context.Context, b *tab, s *stack, id string, flaky *demo.Flaky, loads int) {
	t.Helper()
	b.clickUntil("deciding retry", `[data-testid=decide-retry]`, q(`[data-testid=action-result]`)+`?.textContent.trim()`)
	b.waitJS("the action's result", q(`[data-testid=action-result]`)+`?.textContent.trim()`, 10*time.Second)
	b.waitJS("the new round's attempt", q(attemptSel+`[data-attempt="3"]`), 10*time.Second)
	b.waitJS("the run to succeed", q(runPage+`[data-status=RUN_STATUS_SUCCEEDED]`), 20*time.Second)
	b.waitJS("attempt 3 to succeed", q(attemptSel+`[data-attempt="3"][data-outcome=ATTEMPT_OUTCOME_SUCCEEDED]`), 5*time.Second)
	b.waitJS("the result", q(`[data-testid=result]`)+`?.textContent.includes('echo: say hello')`, 5*time.Second)
	final := s.waitStatus(t, ctx, id, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, 5*time.Second)
	if got := b.attempts(); len(got) != 3 || got[2] != (attemptView{"3", "flaky", "ATTEMPT_OUTCOME_SUCCEEDED"}) {
		t.Errorf("attempts %+v, want a third that succeeded", got)
	}
	if n := len(final.GetAttemptLog()); n != 3 || flaky.Calls() != 3 {
		t.Errorf("the server has %d attempts and flaky %d calls, want 3", n, flaky.Calls())
	} else {
		t.Logf("the backoff before attempt 2 was %v", final.GetAttemptLog()[1].GetWaitBefore().AsDuration())
	}
	status := strings.ToLower(eval[string](b, q(`[data-testid=status]`)+`.textContent`))
	if !strings.Contains(status, "succeeded") {
		t.Errorf("[data-testid=status] says %q", status)
	}
	if w := b.seen(); w.Loads != loads {
		t.Errorf("the run's page was loaded %d times, want %d (live updates, no reload)", w.Loads, loads)
	} else if a3 := w.Attempts["3"]; len(a3) == 0 || a3[len(a3)-1] != "ATTEMPT_OUTCOME_SUCCEEDED" {
		t.Errorf("attempt 3 was shown as %q", a3)
	}
	b.do("scrolling to the top", 5*time.Second, chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, 0)`))
	timeline := b.screenshot("console-run.png")
	if os.Getenv("STUBBORN_UPDATE_SCREENSHOTS") == "1" {
		path := filepath.Join("..", "..", "docs", "console-run.png")
		if err := os.WriteFile(path, timeline, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", path)
	}

}

// Runs started elsewhere (gRPC), opened by their address: Fail ends one
// awaiting a decision FAILED, Cancel ends another CANCELLED, and the page
// shows it live.
func TestConsoleFailAndCancel(t *testing.T) {
	s := startServer(t, setup{delegates: map[string]stubbornv1.DelegateServiceServer{"down": demo.Down{}}})
	ctx := testCtx(t)
	awaiting := func() string {
		zero := int32(0)
		res, err := s.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "wait for me", Retry: &stubbornv1.RetrySpec{
			Target: "down", Attempts: &zero, OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_ASK,
		}})
		if err != nil {
			t.Fatal(err)
		}
		s.waitStatus(t, ctx, res.GetRunId(), stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, 10*time.Second)
		return res.GetRunId()
	}
	failed, cancelled := awaiting(), awaiting()

	b := newBrowser(t)
	for _, c := range []struct {
		id, button string
		want       stubbornv1.RunStatus
	}{
		{failed, "decide-fail", stubbornv1.RunStatus_RUN_STATUS_FAILED},
		{cancelled, "cancel", stubbornv1.RunStatus_RUN_STATUS_CANCELLED},
	} {
		page := runPage + `[data-run-id="` + c.id + `"]`
		b.do("opening run "+c.id, 30*time.Second,
			chromedp.Navigate(s.url+"/#/runs/"+c.id),
			chromedp.WaitVisible(chromedp.CSS(page+`[data-status=RUN_STATUS_AWAITING_DECISION]`)))
		b.clickUntil("clicking "+c.button, `[data-testid=`+c.button+`]`, q(`[data-testid=action-result]`)+`?.textContent.trim()`)
		b.waitJS(c.want.String(), q(page+`[data-status=`+c.want.String()+`]`), 10*time.Second)
		b.waitJS("the action's result", q(`[data-testid=action-result]`)+`?.textContent.trim()`, 10*time.Second)
		s.waitStatus(t, ctx, c.id, c.want, 5*time.Second)
	}
	if ex := b.log.Exceptions(); len(ex) > 0 {
		t.Errorf("uncaught exceptions: %q", ex)
	}
}

// A hedged race started from the form: its hedge delay reaches the
// server, and the timeline says why each candidate started when it did:
// slow with the race, echo once the delay had passed (slow still running).
func TestConsoleHedgedRace(t *testing.T) {
	s := startServer(t, setup{delegates: map[string]stubbornv1.DelegateServiceServer{
		// Far slower than the hedge delay: echo, started after it, wins
		// whatever the machine's load (a delay equal to it was a tie).
		"slow": &demo.Slow{Delay: 2 * time.Second},
		"echo": demo.Echo{},
	}})
	ctx := testCtx(t)
	b := newBrowser(t)
	b.do("opening the start form", 30*time.Second,
		chromedp.Navigate(s.url+"/#/start"),
		chromedp.WaitVisible(chromedp.CSS(startForm)))
	b.setSelect(startForm+` select[name=control]`, "race")
	b.typeInto(startForm+` input[name=delegates]`, "slow, echo")
	b.typeInto(startForm+` textarea[name=brief]`, "say hello")
	b.typeInto(startForm+` input[name=hedge_delay]`, "200ms")
	b.do("starting the run", 10*time.Second, chromedp.Click(chromedp.CSS(`button[data-testid=start]`)))
	b.waitJS("the run to succeed", q(runPage+`[data-status=RUN_STATUS_SUCCEEDED]`), 20*time.Second)
	id := eval[string](b, q(runPage)+`.getAttribute('data-run-id')`)
	st := s.waitStatus(t, ctx, id, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, 5*time.Second)
	if d := st.GetControl().GetRace().GetHedgeDelay().AsDuration(); d != 200*time.Millisecond || st.GetWinner() != "echo" {
		t.Errorf("the form started a race with hedge_delay %v, won by %q; want 200ms, echo", d, st.GetWinner())
	}
	reason := func(n string) string {
		return `(` + q(`[data-testid=attempt-detail][data-attempt="`+n+`"] [data-testid=start-reason]`) + `?.textContent ?? '')`
	}
	b.waitJS("attempt 2's start reason", reason("2")+`.includes('after the hedge delay')`, 5*time.Second)
	if got := eval[string](b, reason("1")); got != "started with the race" {
		t.Errorf("attempt 1's start reason shows %q", got)
	}
	if ex := b.log.Exceptions(); len(ex) > 0 {
		t.Errorf("uncaught exceptions: %q", ex)
	}
}

// A balance started from the form: its targets' weights and strategy
// reach the run, and each attempt shows why it was picked, with the
// figures.
func TestConsoleBalance(t *testing.T) {
	s := startServer(t, setup{delegates: map[string]stubbornv1.DelegateServiceServer{
		"slow": &demo.Slow{Delay: 200 * time.Millisecond}, // either pick succeeds: a tie of 0 in flight is drawn by weight
		"echo": demo.Echo{},
	}})
	ctx := testCtx(t)
	b := newBrowser(t)
	b.do("opening the start form", 30*time.Second,
		chromedp.Navigate(s.url+"/#/start"),
		chromedp.WaitVisible(chromedp.CSS(startForm)))
	b.setSelect(startForm+` select[name=control]`, "balance")
	b.typeInto(startForm+` input[name=delegates]`, "echo:3, slow")
	b.setSelect(startForm+` select[name=strategy]`, "least_busy")
	b.typeInto(startForm+` textarea[name=brief]`, "say hello")
	b.do("starting the run", 10*time.Second, chromedp.Click(chromedp.CSS(`button[data-testid=start]`)))
	b.waitJS("the run to succeed", q(runPage+`[data-status=RUN_STATUS_SUCCEEDED]`), 20*time.Second)
	id := eval[string](b, q(runPage)+`.getAttribute('data-run-id')`)
	st := s.waitStatus(t, ctx, id, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, 5*time.Second)
	bal := st.GetControl().GetBalance()
	if bal.GetStrategy() != stubbornv1.BalanceStrategy_BALANCE_STRATEGY_LEAST_BUSY || len(bal.GetTargets()) != 2 || bal.GetTargets()[0].GetWeight() != 3 {
		t.Errorf("the form started %v, want a least_busy balance of echo:3, slow", bal)
	}
	reason := `(` + q(`[data-testid=attempt-detail][data-attempt="1"] [data-testid=start-reason]`) + `?.textContent ?? '')`
	b.waitJS("attempt 1's pick", reason+`.startsWith('balance least_busy: 0 in flight')`, 5*time.Second)
	if ex := b.log.Exceptions(); len(ex) > 0 {
		t.Errorf("uncaught exceptions: %q", ex)
	}
}

// A circuit breaker's decisions in the timeline: the attempt whose failure
// opened it says so in its note; in the next run the delegate is skipped,
// its failure's source the circuit breaker.
func TestConsoleCircuitBreaker(t *testing.T) {
	s := startServer(t, setup{
		delegates: map[string]stubbornv1.DelegateServiceServer{
			"fragile": demo.Down{},
			"echo":    demo.Echo{},
		},
		configure: func(c *delegates.Config) {
			for i := range c.Delegates {
				if c.Delegates[i].Name == "fragile" {
					c.Delegates[i].CircuitBreaker = &delegates.CircuitBreaker{ConsecutiveFailures: 1, Cooldown: delegates.Duration(time.Hour)}
				}
			}
		},
	})
	ctx := testCtx(t)
	run := func(brief string) string {
		res, err := s.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: brief, Retry: &stubbornv1.RetrySpec{Target: "fragile", Attempts: new(int32)}})
		if err != nil {
			t.Fatal(err)
		}
		return res.GetRunId()
	}
	first := run("opens it")
	s.waitStatus(t, ctx, first, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, 10*time.Second)
	second := run("meets it open")
	s.waitStatus(t, ctx, second, stubbornv1.RunStatus_RUN_STATUS_FAILED, 10*time.Second)

	b := newBrowser(t)
	detail := `[data-testid=attempt-detail][data-attempt="1"]`
	b.do("opening the first run", 30*time.Second,
		chromedp.Navigate(s.url+"/#/runs/"+first),
		chromedp.WaitVisible(chromedp.CSS(runPage)))
	b.waitJS("the note of the failure that opened the breaker", q(detail)+`?.textContent.includes('circuit breaker closed → open: 1 transient failures in a row')`, 10*time.Second)
	b.do("opening the second run", 30*time.Second,
		chromedp.Navigate(s.url+"/#/runs/"+second),
		chromedp.WaitVisible(chromedp.CSS(runPage+`[data-run-id="`+second+`"]`)))
	b.waitJS("the skip by the breaker", q(detail+` .src-circuit-breaker`)+`?.textContent === 'circuit breaker'`, 10*time.Second)
	if got := eval[string](b, q(detail)+`.textContent`); !strings.Contains(got, "circuit breaker open (1 transient failures in a row)") || !strings.Contains(got, "Skipped") {
		t.Errorf("attempt 1 of the second run shows %q", got)
	}
	if ex := b.log.Exceptions(); len(ex) > 0 {
		t.Errorf("uncaught exceptions: %q", ex)
	}
}

// With tenants, the console asks for a token, then shows that tenant's
// runs only; another browser (storage of its own) with another tenant's
// token sees its own, and not the first tenant's run by its address.
func TestConsoleTenants(t *testing.T) {
	const (
		tokenA = "token-of-tenant-a-0123456789abcdef0123456789abcdef"
		tokenB = "token-of-tenant-b-0123456789abcdef0123456789abcdef"
	)
	s := startServer(t, setup{
		delegates: map[string]stubbornv1.DelegateServiceServer{"echo": demo.Echo{}},
		tenants: []delegates.Tenant{
			{Name: "a", TokenSHA256: []string{delegates.HashToken(tokenA)}},
			{Name: "b", TokenSHA256: []string{delegates.HashToken(tokenB)}},
		},
	})
	ctx := testCtx(t)
	start := func(token, brief string) string {
		res, err := s.client.StartRun(as(ctx, token), &stubbornv1.StartRunRequest{TaskBrief: brief,
			FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}})
		if err != nil {
			t.Fatal(err)
		}
		s.waitStatus(t, as(ctx, token), res.GetRunId(), stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, 10*time.Second)
		return res.GetRunId()
	}
	a1, a2, b1 := start(tokenA, "a one"), start(tokenA, "a two"), start(tokenB, "b one")
	// What the server says without a token: the prompt says it, once,
	// however many of the page's calls were refused.
	_, err := s.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("ListRuns without a token: %v, want UNAUTHENTICATED", err)
	}
	refusal := status.Convert(err).Message()

	signIn := func(tb *tab, token string, want ...string) {
		t.Helper()
		tb.do("opening the console", 30*time.Second,
			chromedp.Navigate(s.url+"/#/"),
			chromedp.WaitVisible(chromedp.CSS(`[data-testid=token]`)))
		tb.waitJS("the runs page's calls refused", q(`[data-testid=live][data-state=down]`), 10*time.Second)
		if n := eval[int](tb, `document.body.innerText.split(`+js(refusal)+`).length - 1`); n != 1 {
			t.Errorf("%s: the page says %q %d times, want once (the token prompt)", tb.name, refusal, n)
		}
		field := `input[data-testid=token], textarea[data-testid=token]`
		if !eval[bool](tb, `!!`+q(field)) {
			field = `[data-testid=token] input` // a container of the field
		}
		tb.typeInto(field, token)
		tb.do("saving the token", 10*time.Second, chromedp.Click(chromedp.CSS(`[data-testid=token-save]`)))
		slices.Sort(want)
		tb.waitJS("the tenant's runs", qa(runsTable+` `+runRow)+`.map(r => r.getAttribute('data-run-id')).sort().join() === `+js(strings.Join(want, ",")), 15*time.Second)
	}

	b := newBrowser(t)
	signIn(b, tokenA, a1, a2)
	b.screenshot("console-tenant-a.png")

	other := b.newTab("tenant-b", true)
	signIn(other, tokenB, b1)
	// a's run, by its address: b is not shown it.
	other.do("opening a's run as b", 10*time.Second, chromedp.Evaluate[chromedp.Void](`location.hash = '#/runs/`+a1+`'`))
	other.do("a moment", 5*time.Second, chromedp.Sleep(1500*time.Millisecond))
	if eval[bool](other, `!!`+q(runPage+`[data-status=RUN_STATUS_SUCCEEDED]`)+` || document.body.textContent.includes('echo: a one')`) {
		t.Errorf("tenant b was shown tenant a's run %s", a1)
	}

	for _, tb := range []*tab{b, other} {
		if ex := tb.log.Exceptions(); len(ex) > 0 {
			t.Errorf("%s: uncaught exceptions: %q", tb.name, ex)
		}
	}
}
