package controls_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// runaway is a comprehension of a million iterations: far beyond the cost
// limit.
var runaway = func() string {
	ten := "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]"
	expr := `result.text != "x"`
	for _, v := range []string{"a", "b", "c", "d", "e", "f"} {
		expr = ten + ".all(" + v + ", " + expr + ")"
	}
	return "!" + expr
}()

func TestCompileExprRejectsWhatCannotRun(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, src, err string
	}{
		{"syntax error", `result.text ==`, "Syntax error"},
		{"unknown variable", `answer == ""`, "undeclared reference to 'answer'"},
		{"unknown field of result", `result.txt == ""`, "undefined field 'txt'"},
		{"not a bool: string", `result.text`, "must be a bool expression, but has type string"},
		{"not a bool: int", `attempt + 1`, "must be a bool expression, but has type int"},
		{"type error", `attempt == "1"`, "no matching overload"},
		{"too long", `result.text == "` + strings.Repeat("x", controls.CELMaxLength) + `"`, "size exceeds"},
		// The expression: 7 GB over a 60 KB answer.
		{"replace that may build too much", `result.text.replace("", result.text + result.text).size() < 0`,
			"replace may build a value of up to 2199026401281 bytes (over an answer of 1048576 bytes), more than the limit of 16777216 bytes"},
		{"replace hidden in dyn", `dyn(result.text.replace("", result.text)) == 1`, "replace may build a value of up to 1099513724929 bytes"},
		{"replace with a long replacement", `result.text.replace("a", "0123456789abcdef").size() > 1`, "replace may build a value of up to 17825809 bytes"},
		{"join with a long separator", `result.text.split("").join(result.text).size() > 1`, "join may build a value of up to 2199027449857 bytes"},
		{"format of anything", `"%s".format([result.data]) == "x"`, "format may build a value of up to 429916572 bytes"},
		{"a computed regular expression", `result.text.matches(result.text)`,
			"matches a pattern computed when evaluated, of up to 1048576 bytes: such a pattern may be at most 20 bytes long"},
		{"a regular expression too large", `result.text.matches("` + strings.Repeat("(a){1000}", 7) + `")`, "matches a regular expression that may compile to 28009 instructions, more than the limit of 20000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := controls.CompileExpr("failure_when", tc.src)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.err)
		})
	}
	for _, src := range []string{
		`result.text == ""`,
		`result.text.contains("no results")`,
		`size(result.data.items) < 3`,
		`result.data.ok`, // dyn: checked when evaluated
		`attempt > 2 && delegate == "search"`,
		`result.text.lowerAscii().startsWith("error")`, // strings extension
		`!has(result.data)`,
		runaway, // compiles: only the cost limit stops it
		// Builders whose largest result stays within CELMaxValueBytes.
		`result.text.replace("\n", " ").contains("x")`,
		`result.text.replace("a", "0123456").size() > 1`,
		`result.text.split(" ").exists(w, w == "no")`,
		`result.text.split("").join(",").size() > 1`,
		`"%s: %s".format([delegate, result.text]).size() > 1`,
		`"%s %d".format([delegate, attempt]) == "x"`,
		`strings.quote(result.text).size() > 1`,
		`(result.text + result.text + result.text + result.text).size() > 1`,
		`result.data.items.map(i, i.name).exists(n, n == "x")`,
		`result.data.items.exists(i, i.name + "!" == "x!")`,
		`result.text.matches("^(error|fail)[a-z ]{0,100}$")`,
		`delegate.matches("^search-[0-9]+$")`,
	} {
		_, err := controls.CompileExpr("failure_when", src)
		assert.NoError(t, err, src)
	}
}

func TestExprChecks(t *testing.T) {
	t.Parallel()
	items := func(n int) *structpb.Value {
		l := make([]any, n)
		for i := range l {
			l[i] = i
		}
		v, err := structpb.NewValue(map[string]any{"items": l, "ok": "yes"})
		require.NoError(t, err)
		return v
	}
	for _, tc := range []struct {
		name     string
		field    string
		src      string
		attempt  int32
		delegate string
		result   *stubbornv1.Result
		failed   bool
		err      string // a *CriteriaError, when set
	}{
		{"empty text fails", "failure_when", `result.text == ""`, 1, "d", &stubbornv1.Result{}, true, ""},
		{"text passes", "failure_when", `result.text == ""`, 1, "d", &stubbornv1.Result{Text: "x"}, false, ""},
		{"contains fails", "failure_when", `result.text.contains("no results")`, 1, "d", &stubbornv1.Result{Text: "no results found"}, true, ""},
		{"contains passes", "failure_when", `result.text.contains("no results")`, 1, "d", &stubbornv1.Result{Text: "3 results"}, false, ""},
		{"two items fail", "failure_when", `size(result.data.items) < 3`, 1, "d", &stubbornv1.Result{Data: items(2)}, true, ""},
		{"three items pass", "failure_when", `size(result.data.items) < 3`, 1, "d", &stubbornv1.Result{Data: items(3)}, false, ""},
		{"attempt and delegate", "failure_when", `attempt < 3 && delegate == "search"`, 2, "search", &stubbornv1.Result{}, true, ""},
		{"no data: missing key is an error", "failure_when", `size(result.data.items) < 3`, 1, "d", &stubbornv1.Result{Text: "x"},
			true, "failure_when could not be evaluated: no such key: items"},
		{"dyn that is not a bool", "failure_when", `result.data.ok`, 1, "d", &stubbornv1.Result{Data: items(1)},
			true, "failure_when could not be evaluated: evaluated to string, not a bool"},
		{"accept_when true accepts", "accept_when", `size(result.data.items) >= 3`, 1, "d", &stubbornv1.Result{Data: items(3)}, false, ""},
		{"accept_when false rejects", "accept_when", `size(result.data.items) >= 3`, 1, "d", &stubbornv1.Result{Data: items(1)}, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e, err := controls.CompileExpr(tc.field, tc.src)
			require.NoError(t, err)
			v, err := e.Check(t.Context(), tc.attempt, tc.delegate, tc.result)
			if tc.err != "" {
				var ce *controls.CriteriaError
				require.ErrorAs(t, err, &ce)
				assert.Equal(t, tc.err, ce.Msg)
				assert.Equal(t, byCEL, ce.Source)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.failed, v.Failed)
			if tc.failed {
				want := tc.field + " is true: " + tc.src
				if tc.field == "accept_when" {
					want = tc.field + " is false: " + tc.src
				}
				assert.Equal(t, want, v.Reason)
			}
		})
	}
}

// TestCELCostLimitStopsARunawayExpression: the evaluation stops at the cost
// limit, quickly, and the attempt fails with that reason. Not parallel: it
// burns CPU up to the limit on purpose.
func TestCELCostLimitStopsARunawayExpression(t *testing.T) {
	e, err := controls.CompileExpr("failure_when", runaway)
	require.NoError(t, err)
	began := time.Now()
	_, err = e.Check(t.Context(), 1, "d", &stubbornv1.Result{Text: "y"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "failure_when could not be evaluated: operation cancelled: actual cost limit exceeded")
	assert.Less(t, time.Since(began), 5*time.Second, "stopped long before a million iterations")

	f := newFixture(map[string][]controlstest.Reply{"target": {ok("y")}})
	spec := withCriteria(learning(proto.Int32(2)), "", runaway)
	r := judged(t, f, spec)
	assert.Equal(t, exhausted, r.out.Status)
	require.Len(t, r.state.GetFailureHistory(), 2)
	for _, fr := range r.state.GetFailureHistory() {
		assert.Equal(t, "failure_when could not be evaluated: operation cancelled: actual cost limit exceeded", fr.GetReason())
		assert.Equal(t, byCEL, fr.GetSource())
	}
}

// TestCELEvaluationStopsWithTheRun: a cancelled run interrupts the
// evaluation.
func TestCELEvaluationStopsWithTheRun(t *testing.T) {
	e, err := controls.CompileExpr("failure_when", runaway)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = e.Check(ctx, 1, "d", &stubbornv1.Result{Text: "y"})
	var ce *controls.CriteriaError
	require.True(t, errors.As(err, &ce))
	assert.Equal(t, "failure_when could not be evaluated: cancelled", ce.Msg)
}

// TestRaceAcceptWhen: a candidate whose answer accept_when rejects does not
// win; the next acceptable one does.
func TestRaceAcceptWhen(t *testing.T) {
	t.Parallel()
	f := newFixture(map[string][]controlstest.Reply{"short": {ok("A")}, "long": {ok("A, B and C")}})
	open := f.gate("long")
	spec := withCriteria(race("short", "long"), "", `size(result.text) > 3`)
	f.env.Criteria = controls.NewCriteria(spec, "", f.obs)
	done := f.start(testCtx(t), spec)
	f.waitFailureOf(t, "short")
	open()
	r := f.end(t, done)
	assert.Equal(t, succeeded, r.out.Status)
	assert.Equal(t, "long", r.out.Winner)
	require.Len(t, r.state.GetFailureHistory(), 1)
	fr := r.state.GetFailureHistory()[0]
	assert.Equal(t, "accept_when is false: size(result.text) > 3", fr.GetReason())
}

// allocated is how many bytes f allocates. Tests that call it are not
// parallel, so that little else allocates meanwhile.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestCELMemoryIsBoundedOverTheLargestAnswer: the expressions that build
// the most and still compile, over answers of MaxResultBytes made to make
// them build the most, allocate well under 64 MiB each (CELMaxValueBytes
// for the largest value, plus what the cost limit lets through). Not
// parallel: it measures allocations.
func TestCELMemoryIsBoundedOverTheLargestAnswer(t *testing.T) {
	as := strings.Repeat("a", controls.MaxResultBytes)
	items := make([]any, 40_000)
	for i := range items {
		items[i] = map[string]any{"name": "n"}
	}
	data, err := structpb.NewValue(map[string]any{"items": items})
	require.NoError(t, err)
	ten := "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]"
	for src, text := range map[string]string{
		`result.text.replace("a", "0123456").size() > 1`:                           as,
		`result.text.replace("", "0123456", 2000000).size() > 1`:                   as,
		`result.text.split("").join(",").size() > 1`:                               as,
		`result.text.split(" ").exists(w, w == "b")`:                               strings.Repeat("a ", controls.MaxResultBytes/2),
		`strings.quote(result.text).size() > 1`:                                    strings.Repeat(`"`, controls.MaxResultBytes),
		`(result.text + result.text + result.text + result.text).size() > 1`:       as,
		`"%s: %s".format([delegate, result.text]).size() > 1`:                      as,
		ten + ".map(a, " + ten + `.map(b, "%s".format([result.text]))).size() < 0`: as,
		`result.text.lowerAscii().upperAscii().trim().size() > 1`:                  as,
		`bytes(result.text).size() > 1`:                                            as,
		`result.data.items.map(i, i.name + "!").exists(n, n == "x")`:               "",
	} {
		e, err := controls.CompileExpr("failure_when", src)
		require.NoError(t, err, src)
		r := &stubbornv1.Result{Text: text, Data: data}
		n := allocated(func() { _, _ = e.Eval(t.Context(), 1, "d", r) })
		assert.Less(t, n, uint64(64<<20), "%s allocated %d bytes", src, n)
	}
}

// TestFormatIsChargedForWhatItBuilds: format was charged for its format
// string only, so a thousand copies of a 100 KB answer (100 MB, and a GB
// over the largest answer) cost next to nothing; charged for what it
// builds, the cost limit stops them after a few. Not parallel: it measures
// allocations.
func TestFormatIsChargedForWhatItBuilds(t *testing.T) {
	ten := "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]"
	e, err := controls.CompileExpr("failure_when", ten+".map(a, "+ten+".map(b, "+ten+`.map(c, "%s".format([result.text])))).size() < 0`)
	require.NoError(t, err)
	r := &stubbornv1.Result{Text: strings.Repeat("a", 100_000)}
	n := allocated(func() { _, err = e.Eval(t.Context(), 1, "d", r) })
	require.Error(t, err)
	assert.Contains(t, err.Error(), "actual cost limit exceeded")
	assert.Less(t, n, uint64(16<<20), "allocated %d bytes", n)
}

// TestExprRefusesInputsOverTheBounds: an answer over MaxResultBytes, or a
// delegate name over MaxDelegateNameBytes, is not evaluated: the attempt
// fails with the reason (the expression was checked for inputs within
// them).
func TestExprRefusesInputsOverTheBounds(t *testing.T) {
	t.Parallel()
	big, err := structpb.NewValue(strings.Repeat("x", controls.MaxResultBytes))
	require.NoError(t, err)
	e, err := controls.CompileExpr("failure_when", `result.text == "" && !has(result.data)`)
	require.NoError(t, err)
	for _, tc := range []struct {
		name     string
		delegate string
		r        *stubbornv1.Result
		err      string
	}{
		{"text", "d", &stubbornv1.Result{Text: strings.Repeat("x", controls.MaxResultBytes+1)},
			"failure_when could not be evaluated: too large: result.text is 1048577 bytes, more than the limit of 1048576"},
		{"data", "d", &stubbornv1.Result{Data: big},
			"failure_when could not be evaluated: too large: result.data is 1048580 bytes, more than the limit of 1048576"},
		{"delegate", strings.Repeat("d", controls.MaxDelegateNameBytes+1), &stubbornv1.Result{},
			"failure_when could not be evaluated: too large: the delegate's name is 129 bytes, more than the limit of 128"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := e.Check(t.Context(), 1, tc.delegate, tc.r)
			var ce *controls.CriteriaError
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, tc.err, ce.Msg)
			assert.Equal(t, byCEL, ce.Source)
		})
	}
	v, err := e.Check(t.Context(), 1, strings.Repeat("d", controls.MaxDelegateNameBytes), &stubbornv1.Result{Text: strings.Repeat("x", controls.MaxResultBytes)})
	require.NoError(t, err, "at the limits")
	assert.False(t, v.Failed)
}
