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

// What a person reads: statuses and outcomes in words, not enum names;
// the bar of an attempt over in under a millisecond wide enough for its
// label; a fallback chain's failed attempt naming the delegate tried next;
// the runs list telling runs apart by their briefs; the start form's empty
// fields not marked wrong before anything was typed.
func TestConsoleReadable(t *testing.T) {
	s := startServer(t, setup{
		delegates: map[string]stubbornv1.DelegateServiceServer{
			"down": demo.Down{},
			"echo": demo.Echo{},
		},
	})
	ctx := testCtx(t)
	const brief = "summarise the quarterly report for the board, in three short paragraphs, with figures and a closing recommendation"
	res, err := s.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: brief,
		FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"down", "echo"}}})
	if err != nil {
		t.Fatal(err)
	}
	id := res.GetRunId()
	s.waitStatus(t, ctx, id, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, 10*time.Second)

	b := newBrowser(t)
	b.do("opening the run", 30*time.Second,
		chromedp.Navigate(s.url+"/#/runs/"+id),
		chromedp.WaitVisible(chromedp.CSS(runPage+`[data-status=RUN_STATUS_SUCCEEDED]`)))
	b.waitJS("both attempts", qa(attemptSel)+`.length === 2`, 10*time.Second)
	if got := eval[string](b, q(`[data-testid=status]`)+`.textContent`); got != "Succeeded" {
		t.Errorf("the status badge says %q, want Succeeded", got)
	}
	badges := eval[[]string](b, qa(`[data-testid=attempt-detail] .head .badge`)+`.map(e => e.textContent)`)
	for _, badge := range badges {
		if strings.ContainsAny(badge, "_") || badge == strings.ToUpper(badge) {
			t.Errorf("an attempt's badge says %q, want words", badge)
		}
	}
	follows := eval[string](b, q(`[data-testid=attempt-detail][data-attempt="1"] [data-testid=follows]`)+`?.textContent ?? ''`)
	if follows != "the next delegate, echo, is tried" {
		t.Errorf("attempt 1 says %q after its failure, want the next delegate named", follows)
	}
	// Each bar is wide enough for its number ("#1"), however short the
	// attempt (3px before).
	type bar struct {
		Width float64 `json:"width"`
		Label string  `json:"label"`
	}
	bars := eval[[]bar](b, qa(attemptSel)+`.map(e => ({width: e.getBoundingClientRect().width, label: e.textContent}))`)
	for _, br := range bars {
		if br.Width < 24 {
			t.Errorf("bar %q is %.1fpx wide, want at least 24px", br.Label, br.Width)
		}
	}
	durs := eval[[]string](b, qa(`[data-testid=attempt-detail] .dur`)+`.map(e => e.textContent)`)
	for _, d := range durs {
		if d == "0ms" {
			t.Errorf("an attempt's duration reads %q", d)
		}
	}
	b.screenshot("console-readable.png")

	// The runs list: the brief, cut, tells the run apart.
	b.do("opening the runs page", 30*time.Second,
		chromedp.Navigate(s.url+"/#/"),
		chromedp.WaitVisible(chromedp.CSS(runRow+`[data-run-id="`+id+`"]`)))
	cell := q(runRow + `[data-run-id="` + id + `"] [data-testid=brief]`)
	if got := eval[string](b, cell+`.textContent`); got != brief[:80]+"…" {
		t.Errorf("the brief column reads %q", got)
	}
	if got := eval[string](b, q(runRow+`[data-run-id="`+id+`"] .badge`)+`.textContent`); got != "Succeeded" {
		t.Errorf("the row's status reads %q", got)
	}

	// The start form: an empty required field is not red before typing.
	b.do("opening the start form", 30*time.Second,
		chromedp.Navigate(s.url+"/#/start"),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid=start-form]`)))
	border := func(sel string) string { return eval[string](b, `getComputedStyle(`+q(sel)+`).borderTopColor`) }
	plain, empty := border(`#start-control`), border(`#start-delegates`)
	if plain != empty {
		t.Errorf("the empty Delegates box is outlined %s before anything was typed, other fields %s", empty, plain)
	}
	if ex := b.log.Exceptions(); len(ex) > 0 {
		t.Errorf("uncaught exceptions: %q", ex)
	}
}
