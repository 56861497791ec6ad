package controls

import (
	"runtime"
	"strings"
	"testing"

	"cel.dev/cel-go/common/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// unchecked compiles src as CompileExpr does, but without checkBounds: an
// expression the estimate would refuse, to see what evaluating it does.
func unchecked(t *testing.T, src string) *Expr {
	t.Helper()
	env, err := celEnv()
	require.NoError(t, err)
	ast, iss := env.Compile(src)
	require.NoError(t, iss.Err())
	e, err := newExpr(env, ast, "failure_when", src)
	require.NoError(t, err)
	return e
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

// TestBuildersCountBeforeTheyBuild: replace and join count the bytes of
// their result before building it, so an expression the estimate would
// have refused, evaluated anyway, fails with the reason and allocates next
// to nothing. (Without the guard, each of these builds 20 to 50 MB; over
// the 60 KB answer, replace asked for 7 GB.)
func TestBuildersCountBeforeTheyBuild(t *testing.T) {
	r := &stubbornv1.Result{Text: strings.Repeat("a", 5000)}
	for src, want := range map[string]string{
		`result.text.replace("", result.text + result.text).size() < 0`: "too large: replace would build a string of 50015000 bytes, more than the limit of 16777216",
		`result.text.replace("a", result.text, 4000).size() < 0`:        "too large: replace would build a string of 20001000 bytes, more than the limit of 16777216",
		`result.text.split("").join(result.text).size() < 0`:            "too large: join would build a string of 25000000 bytes, more than the limit of 16777216",
	} {
		e := unchecked(t, src)
		var err error
		n := allocated(func() { _, err = e.Eval(t.Context(), 1, "d", r) })
		require.Error(t, err, src)
		assert.ErrorIs(t, err, errTooLarge, src)
		assert.Contains(t, err.Error(), want, src)
		assert.Less(t, n, uint64(1<<20), "%s allocated %d bytes", src, n)
	}
}

// TestRegexProgramBoundsWhatCompiles: the instructions counted from a
// pattern's syntax are at least, and not far above, what it compiles to.
func TestRegexProgramBoundsWhatCompiles(t *testing.T) {
	t.Parallel()
	for _, p := range []string{
		"", "a", "^[a-z]+$", "(?i)hello", "x*", "x+?", "(a|b|c)+", "a{2,}", "a{3,5}", "(a){1000}", "((a)){2,7}",
		"(?:)", "(?:a*)*", "^(error|fail)[a-z ]{0,100}$", `\d{1,3}(\.\d{1,3}){3}`, `[\p{L}\p{N}]{1,50}`, "(x{2}y{3,}){4}",
	} {
		n, err := regexProgram(p)
		require.NoError(t, err, p)
		compiled, err := types.RegexProgramSize(p)
		require.NoError(t, err, p)
		assert.GreaterOrEqual(t, n, uint64(compiled), p)
		assert.LessOrEqual(t, n, uint64(2*compiled+8), p, "not far above")
	}
}

// TestALargeLiteralRegexIsRefusedWithoutCompilingIt: a 4 KB pattern that
// compiles to over a million instructions (hundreds of MiB each time
// matches compiles it) is refused at submission from its syntax, without
// compiling it.
func TestALargeLiteralRegexIsRefusedWithoutCompilingIt(t *testing.T) {
	src := `result.text.matches("` + strings.Repeat("((((((a)))))){1000}", 200) + `")`
	var err error
	n := allocated(func() { _, err = CompileExpr("failure_when", src) })
	require.Error(t, err)
	assert.Contains(t, err.Error(), "matches a regular expression that may compile to 2800202 instructions, more than the limit of 20000")
	assert.Less(t, n, uint64(8<<20), "allocated %d bytes", n)
}

// TestBoundedBuildersKeepTheirMeaning: the replace and join that count
// first answer as ext.Strings' do.
func TestBoundedBuildersKeepTheirMeaning(t *testing.T) {
	t.Parallel()
	for src, want := range map[string]bool{
		`"a-b-c".replace("-", "+") == "a+b+c"`:         true,
		`"a-b-c".replace("-", "+", 1) == "a+b-c"`:      true,
		`"a-b-c".replace("-", "+", 0) == "a-b-c"`:      true,
		`"a-b-c".replace("-", "+", -1) == "a+b+c"`:     true,
		`"a-b-c".replace("-", "") == "abc"`:            true,
		`"ab".replace("", "_") == "_a_b_"`:             true,
		`"é".replace("", "_") == "_é_"`:                true,
		`"ab".replace("", "_", 2) == "_a_b"`:           true,
		`["a", "b", "c"].join() == "abc"`:              true,
		`["a", "b", "c"].join(", ") == "a, b, c"`:      true,
		`[].join(", ") == ""`:                          true,
		`["a"].join(", ") == "a"`:                      true,
		`"a b  c".split(" ").join("|") == "a|b||c"`:    true,
		`result.text.replace("x", "y") == result.text`: true,
	} {
		e, err := CompileExpr("failure_when", src)
		require.NoError(t, err, src)
		got, err := e.Eval(t.Context(), 1, "d", &stubbornv1.Result{Text: "abc"})
		require.NoError(t, err, src)
		assert.Equal(t, want, got, src)
	}
}
