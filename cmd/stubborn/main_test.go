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
