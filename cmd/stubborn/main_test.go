package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

func TestMain(m *testing.M) {
	// Durability tests run this test binary as the server, to kill it.
	if os.Getenv(childEnv) == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code, err := run(ctx, os.Args[1:], os.Stdout)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "stubborn:", err)
		}
		os.Exit(code)
	}
	goleak.VerifyTestMain(m)
}

func TestDemoRunsEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out bytes.Buffer
	code, err := run(ctx, []string{"demo", "-latency", "1ms", "-exit", "-http-listen", "127.0.0.1:0"}, &out)
	require.NoError(t, err, out.String())
	assert.Equal(t, 0, code)
	text := out.String()
	assert.Regexp(t, `^Console: http://127\.0\.0\.1:\d+/ `, text, "the console's URL comes first")
	for _, want := range []string{
		"attempt 1 ← down: SKIPPED",
		"attempt 3 ← search-backup: ERROR",
		"run finished: SUCCEEDED after 4 attempt(s), winner echo",
		"attempt 1 ← flaky: ERROR Unavailable \"flaky: failing call 1 of 2\"",
		"│ Attempt 2: Error: flaky: failing call 2 of 2",
		"attempt 3 ← flaky: SUCCEEDED",
		"backing off",
		"winner flaky-api",
		"Demo finished: every run ended as expected.",
	} {
		assert.Contains(t, text, want)
	}
}

func TestRunFlagsBuildRequests(t *testing.T) {
	tests := []struct {
		args  []string
		check func(*testing.T, *stubbornv1.RunRequest)
		err   string
	}{
		{[]string{"-control", "retry", "-target", "a", "-attempts", "0", "-max-wait", "2s", "-on-exhausted", "fail", "-brief", "b"},
			func(t *testing.T, r *stubbornv1.RunRequest) {
				assert.Equal(t, "a", r.GetRetry().GetTarget())
				require.NotNil(t, r.GetRetry().Attempts)
				assert.EqualValues(t, 0, r.GetRetry().GetAttempts())
				assert.Equal(t, 2*time.Second, r.GetRetry().GetMaxWait().AsDuration())
				assert.Equal(t, stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL, r.GetRetry().GetOnExhausted())
			}, ""},
		{[]string{"-control", "retry", "-target", "a", "-brief", "b"},
			func(t *testing.T, r *stubbornv1.RunRequest) {
				assert.Nil(t, r.GetRetry().Attempts, "unset means the default")
			}, ""},
		{[]string{"-control", "race", "-delegates", "a,b", "-brief", "b"},
			func(t *testing.T, r *stubbornv1.RunRequest) {
				assert.Equal(t, []string{"a", "b"}, r.GetRace().GetCandidates())
				assert.Nil(t, r.GetRace().GetHedgeDelay(), "no hedging unless asked")
			}, ""},
		{[]string{"-control", "race", "-delegates", "a,b", "-hedge-delay", "250ms", "-brief", "b"},
			func(t *testing.T, r *stubbornv1.RunRequest) {
				assert.Equal(t, 250*time.Millisecond, r.GetRace().GetHedgeDelay().AsDuration())
			}, ""},
		{[]string{"-control", "retry-with-learning", "-target", "a", "-max-retries", "4", "-brief", "b"},
			func(t *testing.T, r *stubbornv1.RunRequest) {
				assert.EqualValues(t, 4, r.GetRetryWithLearning().GetMaxRetries())
			}, ""},
		{[]string{"-control", "nope"}, nil, "-control must be"},
		{[]string{"-control", "retry", "-on-exhausted", "maybe"}, nil, "-on-exhausted"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			fs := newFlagSet("run")
			var f runFlags
			f.register(fs)
			require.NoError(t, fs.Parse(tt.args))
			req, err := f.build(strings.NewReader(""))
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			tt.check(t, req)
		})
	}
}

// TestPrintSaysWhyARaceCandidateStarted: the attempt_started line and
// `get`'s attempt log say why a race's candidate started when it did.
func TestPrintSaysWhyARaceCandidateStarted(t *testing.T) {
	attempt := func(n int32, reason stubbornv1.AttemptStartReason) *stubbornv1.Attempt {
		return &stubbornv1.Attempt{Number: n, Delegate: "d", Brief: "b", StartReason: reason}
	}
	for reason, want := range map[stubbornv1.AttemptStartReason]string{
		stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_AT_ONCE:        "attempt 1 → d (started with the race): brief",
		stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_HEDGE_DELAY:    "attempt 1 → d (started after the hedge delay): brief",
		stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_EARLIER_FAILED: "attempt 1 → d (started early: the candidates before it failed): brief",
		stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_UNSPECIFIED:    "attempt 1 → d: brief",
	} {
		ev := &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_AttemptStarted{AttemptStarted: &stubbornv1.AttemptStarted{Attempt: attempt(1, reason)}}}
		assert.Contains(t, describe(ev), want)
	}
	var out bytes.Buffer
	printState(&out, &stubbornv1.ControlState{RunId: "r", AttemptLog: []*stubbornv1.Attempt{
		attempt(1, stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_AT_ONCE),
		attempt(2, stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_HEDGE_DELAY),
	}}, true)
	assert.Contains(t, out.String(), "#2 d: UNSPECIFIED (started after the hedge delay)")
}

func TestRunFlagsReadProtoJSON(t *testing.T) {
	f := runFlags{request: "-"}
	req, err := f.build(strings.NewReader(`{"task_brief": "x", "fallback_chain": {"chain": ["a"]}}`))
	require.NoError(t, err)
	assert.Equal(t, []string{"a"}, req.GetFallbackChain().GetChain())
	_, err = (&runFlags{request: "-"}).build(strings.NewReader(`{"nope": 1}`))
	assert.ErrorContains(t, err, "-request")
}

func TestParseWithIDTakesFlagsAnywhere(t *testing.T) {
	fs := newFlagSet("decide")
	addr := fs.String("addr", "", "")
	id, rest, err := parseWithID(fs, []string{"run_1", "retry", "-addr", "x:1"})
	require.NoError(t, err)
	assert.Equal(t, "run_1", id)
	assert.Equal(t, []string{"retry"}, rest)
	assert.Equal(t, "x:1", *addr)
	_, _, err = parseWithID(newFlagSet("get"), nil)
	assert.ErrorContains(t, err, "usage")
}

func TestUnknownCommand(t *testing.T) {
	code, err := run(context.Background(), []string{"frobnicate"}, &bytes.Buffer{})
	assert.Equal(t, 2, code)
	assert.ErrorContains(t, err, "unknown command")
}
