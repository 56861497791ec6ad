package controls_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// notServingReason is what a skip over a NOT_SERVING delegate records.
const notServingReason = "skipped: health check reports NOT_SERVING"

// fallbackCase is one run of fallback-chain.
type fallbackCase struct {
	name       string
	chain      []string
	script     map[string][]controlstest.Reply
	notServing []string          // delegates whose health check says NOT_SERVING
	criteria   controls.Criteria // nil: only errors fail
	check      func(t *testing.T, r ran, f *fixture)
}

func runFallbackCases(t *testing.T, cases []fallbackCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(tc.script)
			for _, n := range tc.notServing {
				f.fakes.SetNotServing(n)
			}
			f.env.Criteria = tc.criteria
			r := f.run(t, testCtx(t), chain(tc.chain...))
			tc.check(t, r, f)
		})
	}
}

var abc = []string{"primary", "secondary", "tertiary"}

// TestFallbackChainEnsures has one row per line of the Ensures section of
// spec/fallback-chain.md.
func TestFallbackChainEnsures(t *testing.T) {
	t.Parallel()
	runFallbackCases(t, []fallbackCase{
		{
			name:  "Delegates are tried sequentially in chain order",
			chain: abc,
			script: map[string][]controlstest.Reply{
				"primary":   {unavailable("primary down")},
				"secondary": {unavailable("secondary down")},
				"tertiary":  {ok("from tertiary")},
			},
			check: func(t *testing.T, r ran, f *fixture) {
				assert.Equal(t, abc, delegatesOf(r.calls))
				for i, c := range r.calls {
					assert.EqualValues(t, i+1, c.Attempt)
				}
				// Each attempt ends before the next one starts.
				assert.Equal(t, []string{
					"run_started",
					"attempt_started", "attempt_finished", "failure_analyzed",
					"attempt_started", "attempt_finished", "failure_analyzed",
					"attempt_started", "attempt_finished",
					"run_finished",
				}, f.events.Kinds())
			},
		},
		{
			name:  "First successful result is returned immediately — no further delegates are tried",
			chain: abc,
			script: map[string][]controlstest.Reply{
				"primary":   {unavailable("primary down")},
				"secondary": {ok("from secondary")},
				"tertiary":  {ok("from tertiary")},
			},
			check: func(t *testing.T, r ran, f *fixture) {
				assert.Equal(t, succeeded, r.out.Status)
				assert.Equal(t, "from secondary", r.out.Result.GetText())
				assert.Equal(t, []string{"primary", "secondary"}, delegatesOf(r.calls))
				assert.Empty(t, f.fakes.CallsTo("tertiary"), "no delegate after the winner is called")
			},
		},
		{
			name:  "Each delegate receives the ORIGINAL brief — no failure context from prior attempts",
			chain: abc,
			script: map[string][]controlstest.Reply{
				"primary":   {unavailable("primary down")},
				"secondary": {ok("no results found")},
				"tertiary":  {ok("from tertiary")},
			},
			criteria: noSources,
			check: func(t *testing.T, r ran, f *fixture) {
				assert.Equal(t, []string{taskBrief, taskBrief, taskBrief}, briefs(r.calls))
				for _, a := range r.state.GetAttemptLog() {
					assert.Equal(t, taskBrief, a.GetBrief())
				}
				for _, fa := range failureEvents(f.events.All()) {
					assert.Equal(t, taskBrief, fa.GetNextBrief())
				}
			},
		},
		{
			name:  "If all delegates fail: return null with full failure history",
			chain: abc,
			script: map[string][]controlstest.Reply{
				"primary":   {unavailable("primary down")},
				"secondary": {unavailable("secondary down")},
				"tertiary":  {unavailable("tertiary down")},
			},
			check: func(t *testing.T, r ran, _ *fixture) {
				assert.Equal(t, exhausted, r.out.Status)
				assert.Nil(t, r.out.Result)
				assert.Nil(t, r.state.GetResult())
				assert.Equal(t, []rec{
					{1, "primary", "Error: primary down", "primary down"},
					{2, "secondary", "Error: secondary down", "secondary down"},
					{3, "tertiary", "Error: tertiary down", "tertiary down"},
				}, recs(r.state.GetFailureHistory()))
			},
		},
		{
			name:  "&controlState.result contains the winning result (or null)",
			chain: abc,
			script: map[string][]controlstest.Reply{
				"primary":   {unavailable("primary down")},
				"secondary": {ok("from secondary")},
			},
			check: func(t *testing.T, r ran, _ *fixture) {
				assert.Equal(t, "from secondary", r.state.GetResult().GetText())
			},
		},
		{
			name:  "&controlState.winner contains the winning delegate's name (or null)",
			chain: abc,
			script: map[string][]controlstest.Reply{
				"primary":   {unavailable("primary down")},
				"secondary": {ok("from secondary")},
			},
			check: func(t *testing.T, r ran, _ *fixture) {
				assert.Equal(t, "secondary", r.out.Winner)
				assert.Equal(t, "secondary", r.state.GetWinner())
			},
		},
		{
			name:  "&controlState.attempts contains the number of delegates tried",
			chain: abc,
			script: map[string][]controlstest.Reply{
				"primary":   {unavailable("primary down")},
				"secondary": {ok("from secondary")},
			},
			check: func(t *testing.T, r ran, _ *fixture) {
				assert.EqualValues(t, 2, r.state.GetAttempts())
				assert.Len(t, r.state.GetAttemptLog(), 2)
			},
		},
		{
			name:  "&controlState.failure_history contains reasons for each failed attempt",
			chain: abc,
			script: map[string][]controlstest.Reply{
				"primary":   {unavailable("primary down")},
				"secondary": {ok("no results found")},
				"tertiary":  {ok("from tertiary")},
			},
			criteria: noSources,
			check: func(t *testing.T, r ran, _ *fixture) {
				assert.Equal(t, []rec{
					{1, "primary", "Error: primary down", "primary down"},
					{2, "secondary", "no results found", "the result has no sources"},
				}, recs(r.state.GetFailureHistory()))
			},
		},
	})
}

func TestFallbackChainEdges(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("0123456789", 1024) // 10 kB
	runFallbackCases(t, []fallbackCase{
		{
			name:   "a chain of one that succeeds",
			chain:  []string{"only"},
			script: map[string][]controlstest.Reply{"only": {ok("from only")}},
			check: func(t *testing.T, r ran, _ *fixture) {
				assert.Equal(t, succeeded, r.out.Status)
				assert.Equal(t, "only", r.state.GetWinner())
				assert.Equal(t, "from only", r.state.GetResult().GetText())
				assert.EqualValues(t, 1, r.state.GetAttempts())
				assert.Empty(t, r.state.GetFailureHistory())
			},
		},
		{
			name:   "a chain of one that fails",
			chain:  []string{"only"},
			script: map[string][]controlstest.Reply{"only": {unavailable("only down")}},
			check: func(t *testing.T, r ran, f *fixture) {
				assert.Equal(t, exhausted, r.out.Status)
				assert.Empty(t, r.state.GetWinner())
				assert.Nil(t, r.state.GetResult())
				assert.EqualValues(t, 1, r.state.GetAttempts())
				assert.Equal(t, []rec{{1, "only", "Error: only down", "only down"}}, recs(r.state.GetFailureHistory()))
				fa := failureEvents(f.events.All())
				require.Len(t, fa, 1)
				assert.False(t, fa[0].GetWillRetry())
				assert.Empty(t, fa[0].GetNextBrief())
			},
		},
		{
			name:  "a NOT_SERVING delegate is skipped without a call, and the skip is recorded",
			chain: abc,
			script: map[string][]controlstest.Reply{
				"primary":   {ok("never asked")},
				"secondary": {ok("from secondary")},
			},
			notServing: []string{"primary"},
			check: func(t *testing.T, r ran, f *fixture) {
				assert.Empty(t, f.fakes.CallsTo("primary"), "no call to a NOT_SERVING delegate")
				assert.Equal(t, []controls.Call{{Delegate: "secondary", Brief: taskBrief, Attempt: 2, Task: true}}, r.calls)
				assert.Equal(t, succeeded, r.out.Status)
				assert.Equal(t, "secondary", r.state.GetWinner())
				assert.EqualValues(t, 2, r.state.GetAttempts(), "the skip counts as an attempt")

				log := r.state.GetAttemptLog()
				require.Len(t, log, 2)
				assert.Equal(t, "primary", log[0].GetDelegate())
				assert.Equal(t, attemptSkipped, log[0].GetOutcome())
				assert.Nil(t, log[0].GetResult())
				hist := r.state.GetFailureHistory()
				require.Len(t, hist, 1)
				assert.Equal(t, "primary", hist[0].GetDelegate())
				assert.EqualValues(t, 1, hist[0].GetAttempt())
				assert.Equal(t, notServingReason, hist[0].GetReason())
			},
		},
		{
			name:  "all fail, one skipped: EXHAUSTED, no result, no winner, attempts = len(chain)",
			chain: abc,
			script: map[string][]controlstest.Reply{
				"primary":   {ok("never asked")},
				"secondary": {unavailable("secondary down")},
				"tertiary":  {ok("no results found")},
			},
			notServing: []string{"primary"},
			criteria:   noSources,
			check: func(t *testing.T, r ran, _ *fixture) {
				assert.Equal(t, exhausted, r.out.Status)
				assert.Nil(t, r.out.Result)
				assert.Empty(t, r.out.Winner)
				assert.Nil(t, r.state.GetResult())
				assert.Empty(t, r.state.GetWinner())
				assert.EqualValues(t, 3, r.state.GetAttempts())
				hist := r.state.GetFailureHistory()
				require.Len(t, hist, 3, "one record per delegate")
				assert.Equal(t, rec{1, "primary", hist[0].GetSummary(), notServingReason}, recs(hist)[0])
				assert.Equal(t, []rec{
					{2, "secondary", "Error: secondary down", "secondary down"},
					{3, "tertiary", "no results found", "the result has no sources"},
				}, recs(hist[1:]))
				log := r.state.GetAttemptLog()
				assert.Equal(t, []stubbornv1.AttemptOutcome{attemptSkipped, attemptError, attemptRejected}, outcomes(log))
				assert.Equal(t, "no results found", log[2].GetResult().GetText(), "last result visible in the attempt log")
			},
		},
		{
			name:  "first down, second errors, third wins: three attempts in order, history names the first two",
			chain: abc,
			script: map[string][]controlstest.Reply{
				"secondary": {unavailable("secondary broke")},
				"tertiary":  {ok("from tertiary")},
			},
			notServing: []string{"primary"},
			check: func(t *testing.T, r ran, _ *fixture) {
				assert.Equal(t, "tertiary", r.state.GetWinner())
				var got []string
				for _, a := range r.state.GetAttemptLog() {
					got = append(got, a.GetDelegate())
				}
				assert.Equal(t, abc, got)
				assert.Equal(t, []string{"primary", "secondary"}, []string{
					r.state.GetFailureHistory()[0].GetDelegate(), r.state.GetFailureHistory()[1].GetDelegate(),
				})
			},
		},
		{
			name:  "an empty result is a success",
			chain: abc,
			script: map[string][]controlstest.Reply{
				"primary":   {ok("")},
				"secondary": {ok("never asked")},
			},
			check: func(t *testing.T, r ran, _ *fixture) {
				assert.Equal(t, succeeded, r.out.Status)
				require.NotNil(t, r.out.Result)
				assert.Empty(t, r.out.Result.GetText())
				assert.Equal(t, "primary", r.out.Winner)
				assert.Len(t, r.calls, 1)
			},
		},
		{
			name:  "an error with an empty message",
			chain: abc,
			script: map[string][]controlstest.Reply{
				"primary":   {unavailable("")},
				"secondary": {ok("from secondary")},
			},
			check: func(t *testing.T, r ran, _ *fixture) {
				assert.Equal(t, []rec{{1, "primary", "Error: ", ""}}, recs(r.state.GetFailureHistory()))
				assert.Equal(t, []string{taskBrief, taskBrief}, briefs(r.calls))
			},
		},
		{
			name:  "an error with a 10 kB message",
			chain: abc,
			script: map[string][]controlstest.Reply{
				"primary":   {unavailable(long)},
				"secondary": {ok("from secondary")},
			},
			check: func(t *testing.T, r ran, _ *fixture) {
				cut := long[:controls.MaxReasonBytes] + " …[6144 bytes cut]"
				assert.Equal(t, []rec{{1, "primary", "Error: " + cut, cut}}, recs(r.state.GetFailureHistory()))
				assert.Equal(t, cut, r.state.GetAttemptLog()[0].GetError().GetMessage())
			},
		},
	})
}

func TestFallbackChainRunContext(t *testing.T) {
	t.Parallel()

	t.Run("cancelled during an attempt: CANCELLED, no later delegate called", func(t *testing.T) {
		t.Parallel()
		f := newFixture(map[string][]controlstest.Reply{
			"primary":   {hang},
			"secondary": {ok("never asked")},
		})
		ctx, cancel := context.WithCancelCause(testCtx(t))
		defer cancel(nil)
		done := f.start(ctx, chain(abc...))
		f.waitStarted(t, "primary")
		cancel(errors.New("CancelRun"))
		r := f.end(t, done)

		assert.Equal(t, cancelled, r.out.Status)
		assert.Equal(t, "cancelled: CancelRun", r.out.Reason)
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_CANCELLED, r.out.Code)
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_CANCELLED, r.state.GetStatusReasonCode())
		assert.Empty(t, r.out.Winner)
		assert.Equal(t, []string{"primary"}, delegatesOf(r.calls))
		assert.Equal(t, []stubbornv1.AttemptOutcome{attemptCancelled}, outcomes(r.state.GetAttemptLog()))
		assert.ErrorIs(t, f.waitReturned(t, "primary")["primary"].ctxErr, context.Canceled)
	})

	t.Run("plain cancel: reason cancelled", func(t *testing.T) {
		t.Parallel()
		f := newFixture(map[string][]controlstest.Reply{"primary": {hang}})
		ctx, cancel := context.WithCancel(testCtx(t))
		defer cancel()
		done := f.start(ctx, chain(abc...))
		f.waitStarted(t, "primary")
		cancel()
		r := f.end(t, done)
		assert.Equal(t, cancelled, r.out.Status)
		assert.Equal(t, "cancelled", r.out.Reason)
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_CANCELLED, r.out.Code)
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_CANCELLED, r.state.GetStatusReasonCode())
	})

	t.Run("an expired deadline: FAILED, run timeout exceeded, no call", func(t *testing.T) {
		t.Parallel()
		f := newFixture(map[string][]controlstest.Reply{"primary": {ok("never asked")}})
		ctx, cancel := context.WithDeadline(testCtx(t), time.Now().Add(-time.Second))
		defer cancel()
		r := f.run(t, ctx, chain(abc...))
		assert.Equal(t, failed, r.out.Status)
		assert.Equal(t, "run timeout exceeded", r.out.Reason)
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_RUN_TIMEOUT, r.out.Code)
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_RUN_TIMEOUT, r.state.GetStatusReasonCode())
		assert.Empty(t, r.calls)
		assert.Zero(t, r.state.GetAttempts())
	})
}
