package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

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
	assert.Regexp(t, `^Console: http://127\.0\.0\.1:\d+/ \(up only while the runs below play`, text, "the console's URL comes first; with -exit, no invitation to open it")
	assert.NotContains(t, text, "open it")
	assert.Regexp(t, "API on (127\\.0\\.0\\.1:\\d+) \\(gRPC: from another shell, `"+regexp.QuoteMeta(os.Args[0])+" list -addr 127\\.0\\.0\\.1:\\d+`\\)", text)
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
		{[]string{"-control", "race", "-delegates", "a,b", "-first-output-timeout", "3s", "-idle-timeout", "500ms", "-brief", "b"},
			func(t *testing.T, r *stubbornv1.RunRequest) {
				assert.Equal(t, 3*time.Second, r.GetOptions().GetFirstOutputTimeout().AsDuration())
				assert.Equal(t, 500*time.Millisecond, r.GetOptions().GetIdleTimeout().AsDuration())
			}, ""},
		{[]string{"-control", "retry", "-target", "a", "-brief", "b"},
			func(t *testing.T, r *stubbornv1.RunRequest) {
				assert.Nil(t, r.GetOptions().GetFirstOutputTimeout(), "unset means the delegate's")
				assert.Nil(t, r.GetOptions().GetIdleTimeout(), "unset means the delegate's")
			}, ""},
		{[]string{"-control", "balance", "-delegates", "a:3,b", "-strategy", "least-busy", "-max-attempts", "1", "-brief", "b"},
			func(t *testing.T, r *stubbornv1.RunRequest) {
				b := r.GetBalance()
				require.Len(t, b.GetTargets(), 2)
				assert.Equal(t, "a", b.GetTargets()[0].GetName())
				assert.EqualValues(t, 3, b.GetTargets()[0].GetWeight())
				assert.Nil(t, b.GetTargets()[1].Weight, "unset means 1")
				assert.Equal(t, stubbornv1.BalanceStrategy_BALANCE_STRATEGY_LEAST_BUSY, b.GetStrategy())
				assert.EqualValues(t, 1, b.GetMaxAttempts())
			}, ""},
		{[]string{"-control", "balance", "-delegates", "a,b", "-brief", "b"},
			func(t *testing.T, r *stubbornv1.RunRequest) {
				assert.Equal(t, stubbornv1.BalanceStrategy_BALANCE_STRATEGY_WEIGHTED, r.GetBalance().GetStrategy())
				assert.Nil(t, r.GetBalance().MaxAttempts, "unset means every target")
			}, ""},
		{[]string{"-control", "balance", "-delegates", "a:x", "-brief", "b"}, nil, `the weight of "a" must be a whole number`},
		{[]string{"-control", "balance", "-delegates", "a", "-strategy", "fastest", "-brief", "b"}, nil, "-strategy must be"},
		{[]string{"-control", "balance", "-target", "a", "-brief", "b"}, nil, "names its delegates with -delegates"},
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
		stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_BALANCE_PICK:   "attempt 1 → d (picked by the balance): brief",
	} {
		ev := &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_AttemptStarted{AttemptStarted: &stubbornv1.AttemptStarted{Attempt: attempt(1, reason)}}}
		assert.Contains(t, describe(ev), want)
	}
	var out bytes.Buffer
	printState(&out, &stubbornv1.ControlState{RunId: "r", AttemptLog: []*stubbornv1.Attempt{
		attempt(1, stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_AT_ONCE),
		attempt(2, stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_HEDGE_DELAY),
	}}, true)
	assert.Contains(t, out.String(), "#2 d: running (started after the hedge delay)", "an attempt in flight has no outcome yet")

	// A balance's pick says its figures.
	picked := attempt(1, stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_BALANCE_PICK)
	picked.StartDetail = "balance least_busy: 2 in flight (others e 3 in flight)"
	ev := &stubbornv1.RunEvent{Kind: &stubbornv1.RunEvent_AttemptStarted{AttemptStarted: &stubbornv1.AttemptStarted{Attempt: picked}}}
	assert.Contains(t, describe(ev), "attempt 1 → d (balance least_busy: 2 in flight (others e 3 in flight)): brief")
	out.Reset()
	w := int32(3)
	spec := &stubbornv1.ControlSpec{
		Kind: &stubbornv1.ControlSpec_Balance{Balance: &stubbornv1.BalanceSpec{Targets: []*stubbornv1.BalanceTarget{{Name: "d", Weight: &w}, {Name: "e"}}}},
	}
	printState(&out, &stubbornv1.ControlState{RunId: "r", AttemptLog: []*stubbornv1.Attempt{picked}, Control: spec}, true)
	assert.Contains(t, out.String(), "#1 d: running (balance least_busy: 2 in flight (others e 3 in flight))")
	assert.Contains(t, out.String(), "control   balance of d, e")
	assert.Equal(t, "balance (weighted) of d:3, e", controlName(spec))
}

// streamEvents builds the events of a run for the printer tests: seq
// and time (at the epoch plus the seq in seconds) are filled in.
type streamEvents []*stubbornv1.RunEvent

func (s *streamEvents) add(path string, kind any) {
	ev := &stubbornv1.RunEvent{RunId: "r", Seq: int64(len(*s) + 1), Time: timestamppb.New(time.Unix(int64(len(*s)+1), 0)), Path: path}
	switch k := kind.(type) {
	case *stubbornv1.RunStarted:
		ev.Kind = &stubbornv1.RunEvent_RunStarted{RunStarted: k}
	case *stubbornv1.AttemptStarted:
		ev.Kind = &stubbornv1.RunEvent_AttemptStarted{AttemptStarted: k}
	case *stubbornv1.AttemptOutput:
		ev.Kind = &stubbornv1.RunEvent_AttemptOutput{AttemptOutput: k}
	case *stubbornv1.AttemptFinished:
		ev.Kind = &stubbornv1.RunEvent_AttemptFinished{AttemptFinished: k}
	case *stubbornv1.FailureAnalyzed:
		ev.Kind = &stubbornv1.RunEvent_FailureAnalyzed{FailureAnalyzed: k}
	case *stubbornv1.RunFinished:
		ev.Kind = &stubbornv1.RunEvent_RunFinished{RunFinished: k}
	default:
		panic(fmt.Sprintf("no event for %T", kind))
	}
	*s = append(*s, ev)
}

func (s *streamEvents) output(attempt int32, offset int64, text string) {
	s.add("", &stubbornv1.AttemptOutput{Attempt: attempt, Offset: offset, Text: text})
}

// at is how the printer shows the time of event seq.
func at(seq int) string { return time.Unix(int64(seq), 0).Local().Format("15:04:05.000") }

// TestPrintStreamsAttemptOutput: a chain's first model streams, stalls and
// its output is discarded, the second streams its answer. The text shows
// once, as it came, in one block under each attempt (a piece sent again
// is not printed again); the stall says the output is discarded; the
// answer's text is not quoted again under the attempt that streamed it.
func TestPrintStreamsAttemptOutput(t *testing.T) {
	var evs streamEvents
	epoch := func(s int) *timestamppb.Timestamp { return timestamppb.New(time.Unix(int64(s), 0)) }
	evs.add("", &stubbornv1.RunStarted{State: &stubbornv1.ControlState{RunId: "r",
		Control: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"model", "backup"}}}}}})
	evs.add("", &stubbornv1.AttemptStarted{Attempt: &stubbornv1.Attempt{Number: 1, Delegate: "model", Brief: "write a poem"}})
	evs.output(1, 0, "Roses are red,\nviol")
	evs.output(1, 19, "ets are blue,\n")
	evs.output(1, 19, "ets are blue,\n") // sent again: not printed again
	evs.output(1, 33, "sugar")
	evs.add("", &stubbornv1.AttemptFinished{OutputDiscarded: true, OutputBytes: 38, Attempt: &stubbornv1.Attempt{
		Number: 1, Delegate: "model", Outcome: stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_ERROR, StartTime: epoch(2), EndTime: epoch(7),
		Error: &stubbornv1.AttemptError{Code: 14, Message: "stalled: no output for 5s after 3 chunks (idle_timeout)"}}})
	evs.add("", &stubbornv1.FailureAnalyzed{WillRetry: true, Failure: &stubbornv1.FailureRecord{Attempt: 1, Delegate: "model", Reason: "stalled: no output for 5s after 3 chunks (idle_timeout)"}})
	evs.add("", &stubbornv1.AttemptStarted{Attempt: &stubbornv1.Attempt{Number: 2, Delegate: "backup", Brief: "write a poem"}})
	evs.output(2, 0, "Hello")
	evs.output(2, 3, "lo, world\n") // its first 2 bytes printed before
	evs.output(2, 13, "\nbye")
	result := &stubbornv1.Result{Text: "Hello, world\n\nbye"}
	evs.add("", &stubbornv1.AttemptFinished{OutputBytes: 18, Attempt: &stubbornv1.Attempt{
		Number: 2, Delegate: "backup", Outcome: stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED, StartTime: epoch(9), EndTime: epoch(13), Result: result}})
	evs.add("", &stubbornv1.RunFinished{State: &stubbornv1.ControlState{RunId: "r", Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, Attempts: 2, Winner: "backup", Result: result}})

	var out bytes.Buffer
	p := printer{w: &out}
	for _, ev := range evs {
		p.event(ev)
	}
	want := "" +
		"  1 " + at(1) + " run r started: fallback-chain model → backup\n" +
		"  2 " + at(2) + " attempt 1 → model: brief \"write a poem\"\n" +
		"      attempt 1 │ Roses are red,\n" +
		"                │ violets are blue,\n" +
		"                │ sugar\n" +
		"  7 " + at(7) + " attempt 1 ← model: ERROR Unavailable \"stalled: no output for 5s after 3 chunks (idle_timeout)\" in 5s\n" +
		"      attempt 1 output discarded (stalled: no output for 5s after 3 chunks (idle_timeout))\n" +
		"  8 " + at(8) + " failure of attempt 1 (model): \"stalled: no output for 5s after 3 chunks (idle_timeout)\"; next attempt follows\n" +
		"  9 " + at(9) + " attempt 2 → backup: brief \"write a poem\"\n" +
		"      attempt 2 │ Hello, world\n" +
		"                │\n" +
		"                │ bye\n" +
		" 13 " + at(13) + " attempt 2 ← backup: SUCCEEDED, its output above (18 bytes) in 4s\n" +
		" 14 " + at(14) + " run finished: SUCCEEDED after 2 attempt(s), winner backup, result \"Hello, world bye\"\n"
	assert.Equal(t, want, out.String())
	assert.Equal(t, int64(14), p.lastSeq, "watch -after follows from an output event's seq too")

	// -json: every event one protojson line, the output events as they came.
	out.Reset()
	p = printer{w: &out, json: true}
	for _, ev := range evs {
		p.event(ev)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	require.Len(t, lines, len(evs))
	for i, line := range lines {
		got := &stubbornv1.RunEvent{}
		require.NoError(t, protojson.Unmarshal([]byte(line), got), line)
		assert.True(t, proto.Equal(evs[i], got), "line %d: %s", i+1, line)
	}
	assert.Contains(t, lines[3], `"attemptOutput"`)
}

// TestPrintInterleavedAttemptOutput: a race's candidates stream at once;
// each change of attempt starts a labelled block, and a line taken up
// where another block cut it begins with "…", as does text after a gap
// (a watch from the middle of an answer). Provisional text and a nested
// control's are labelled so; control characters are not sent to the
// terminal; a stream that ends mid-line ends the line.
func TestPrintInterleavedAttemptOutput(t *testing.T) {
	var evs streamEvents
	evs.output(1, 0, "The answer")
	evs.output(2, 0, "Another\nline two")
	evs.output(1, 10, " is 42.\n")
	evs.output(2, 16, " and three\n")
	evs.add("chain[1]", &stubbornv1.AttemptOutput{Attempt: 3, Offset: 100, Text: "tail \x1b[31mred\r\n", Provisional: true})
	evs.add("chain[1]", &stubbornv1.AttemptOutput{Attempt: 3, Offset: 115, Text: "cut", Provisional: true})
	var out bytes.Buffer
	p := printer{w: &out}
	for _, ev := range evs {
		p.event(ev)
	}
	p.endOutput()
	assert.Equal(t, ""+
		"      attempt 1 │ The answer\n"+
		"      attempt 2 │ Another\n"+
		"                │ line two\n"+
		"      attempt 1 │ … is 42.\n"+
		"      attempt 2 │ … and three\n"+
		"      [chain[1]] attempt 3 (provisional) │ …tail \\x1b[31mred\n"+
		"                                         │ cut\n", out.String())
}

func TestRegistryShowsStreamSettings(t *testing.T) {
	assert.Empty(t, streamTraits(&stubbornv1.DelegateDescription{Stream: "auto"}))
	assert.Equal(t, []string{"stream on", "first output within 3s", "idle timeout 500ms"}, streamTraits(&stubbornv1.DelegateDescription{
		Stream: "on", FirstOutputTimeout: durationpb.New(3 * time.Second), IdleTimeout: durationpb.New(500 * time.Millisecond)}))
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

// TestAToolCallAnswerIsPrintedAsItsCalls: a model's answer of tool calls
// alone has no text; `get`, `watch` and `run` print its calls, not "".
func TestAToolCallAnswerIsPrintedAsItsCalls(t *testing.T) {
	calls := &stubbornv1.Result{Choices: []*stubbornv1.Choice{{Message: &stubbornv1.ChatMessage{
		Role:      stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT,
		ToolCalls: []*stubbornv1.ToolCall{{Id: "call_1", Name: "get_weather", Arguments: `{"city":"Paris"}`}},
	}}}}
	assert.Equal(t, `[{"name":"get_weather","arguments":{"city":"Paris"}}]`, answerText(calls))
	assert.Equal(t, "plain", answerText(&stubbornv1.Result{Text: "plain"}))
	var b strings.Builder
	printState(&b, &stubbornv1.ControlState{RunId: "r", Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, Result: calls}, true)
	assert.Contains(t, b.String(), `get_weather`)
}

// TestPrintStreamsToolCalls: a model's tool calls stream in the attempt's
// block as they come — a line "→ name " per call, then its arguments — once
// each (a piece sent again is not printed again); other choices' deltas
// are left to the answer.
func TestPrintStreamsToolCalls(t *testing.T) {
	var evs streamEvents
	evs.add("", &stubbornv1.AttemptStarted{Attempt: &stubbornv1.Attempt{Number: 1, Delegate: "model", Brief: "weather?"}})
	call := func(choice, index int32, offset int64, id, name, args string) *stubbornv1.OutputDelta {
		return &stubbornv1.OutputDelta{Choice: choice, Offset: offset, Kind: &stubbornv1.OutputDelta_ToolCall{ToolCall: &stubbornv1.ToolCallDelta{Index: index, Id: id, Name: name, Arguments: args}}}
	}
	evs.add("", &stubbornv1.AttemptOutput{Attempt: 1, Text: "Let me look.", Deltas: []*stubbornv1.OutputDelta{call(0, 0, 0, "c1", "get_weather", `{"ci`)}})
	evs.add("", &stubbornv1.AttemptOutput{Attempt: 1, Deltas: []*stubbornv1.OutputDelta{call(0, 0, 4, "", "", `ty":"Paris"}`)}})
	evs.add("", &stubbornv1.AttemptOutput{Attempt: 1, Deltas: []*stubbornv1.OutputDelta{call(0, 0, 4, "", "", `ty":"Paris"}`)}}) // again
	evs.add("", &stubbornv1.AttemptOutput{Attempt: 1, Deltas: []*stubbornv1.OutputDelta{call(1, 0, 0, "c9", "other_choice", `{}`), call(0, 1, 0, "c2", "get_time", `{}`)}})

	var out bytes.Buffer
	p := printer{w: &out}
	for _, ev := range evs {
		p.event(ev)
	}
	assert.Equal(t, ""+
		"  1 "+at(1)+" attempt 1 → model: brief \"weather?\"\n"+
		"      attempt 1 │ Let me look.\n"+
		"                │ → get_weather {\"city\":\"Paris\"}\n"+
		"                │ → get_time {}", out.String())
}
