package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// helpOfCommand is what `stubborn CMD -h` prints (on stderr), and its exit
// code.
func helpOfCommand(t *testing.T, cmd string) string {
	t.Helper()
	errs := captureStderr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	code, err := run(ctx, []string{cmd, "-h"}, &syncBuffer{})
	require.NoError(t, err, cmd)
	require.Equal(t, 0, code, cmd)
	return errs.String()
}

// The usage text shows -json on the line of every command that has it,
// and on no other.
func TestUsageShowsJSONWhereACommandHasIt(t *testing.T) {
	withJSON := 0
	for _, cmd := range commands {
		if cmd == "help" {
			continue
		}
		line := regexp.MustCompile(`(?m)^  stubborn ` + cmd + ` .*$`).FindString(usage)
		require.NotEmpty(t, line, "the usage has no line for %s", cmd)
		has := strings.Contains(helpOfCommand(t, cmd), "\n  -json\n")
		assert.Equal(t, has, strings.Contains(line, "[-json]"), "%s has -json: %v; its usage line: %s", cmd, has, line)
		if has {
			withJSON++
		}
	}
	assert.Equal(t, 9, withJSON, "run, watch, get, list, cancel, decide, delete, registry and demo")
}

// A mistyped command gets a guess, short, exit 2; one with no close
// command gets the list.
func TestMistypedCommandGetsAGuess(t *testing.T) {
	errs := captureStderr(t)
	for arg, want := range map[string]string{
		"lsit":     `unknown command "lsit": did you mean list?`,
		"regsitry": `unknown command "regsitry": did you mean registry?`,
		"serv":     `unknown command "serv": did you mean serve?`,
		"xyz":      `unknown command "xyz": the commands are serve, run, watch, get, list, cancel, decide, delete, registry, delegates, demo, token, help (` + "`stubborn help`" + ` says what each does)`,
	} {
		code, err := run(context.Background(), []string{arg}, &syncBuffer{})
		assert.Equal(t, 2, code, arg)
		require.Error(t, err, arg)
		assert.Equal(t, want, err.Error())
	}
	code, err := run(context.Background(), []string{strings.Repeat("x", 1<<20)}, &syncBuffer{})
	assert.Equal(t, 2, code)
	require.Error(t, err)
	assert.Less(t, len(err.Error()), 300, "a long argument is cut")
	assert.Empty(t, errs.String(), "no usage dump")
}

// A run without what its control needs names the flags, not a proto field.
func TestRunNamesTheFlagsAControlNeeds(t *testing.T) {
	for args, want := range map[string]string{
		"-brief x":                              "run: -control fallback-chain (the default) needs -delegates a,b, the delegates it tries (or -control retry with -target for one delegate)",
		"-control race -brief x":                "run: -control race needs -delegates a,b, the delegates it tries (or -control retry with -target for one delegate)",
		"-control retry -brief x":               "run: -control retry needs -target DELEGATE, the delegate it calls again (or -control fallback-chain or race with -delegates a,b)",
		"-control retry-with-learning -brief x": "run: -control retry-with-learning needs -target DELEGATE, the delegate it calls again (or -control fallback-chain or race with -delegates a,b)",
		"-delegates a,,b -brief x":              `run: -delegates "a,,b": name 2 is empty`,
		"-delegates a":                          "run: -brief TEXT is required, the task the delegates are given (or -request FILE, a whole RunRequest)",
		"-control retry -target a":              "run: -brief TEXT is required, the task the delegates are given (or -request FILE, a whole RunRequest)",
	} {
		fs := newFlagSet("run")
		var f runFlags
		f.register(fs)
		require.NoError(t, fs.Parse(strings.Fields(args)))
		_, err := f.build(strings.NewReader(""))
		require.Error(t, err, args)
		assert.Equal(t, want, err.Error(), args)
		assert.NotContains(t, err.Error(), "fallback_chain", args)
	}

	// Through the command: exit 2, before any server is asked.
	code, err := run(context.Background(), []string{"run", "-brief", "x", "-addr", "127.0.0.1:1", "-wait", "0"}, &syncBuffer{})
	assert.Equal(t, 2, code)
	assert.ErrorContains(t, err, "needs -delegates a,b")
}

// serve -h groups its flags by purpose, shows every flag once, and says
// what -http-listen serves.
func TestServeHelpGroupedByPurpose(t *testing.T) {
	help := helpOfCommand(t, "serve")
	assert.True(t, strings.HasPrefix(help, "Usage: stubborn serve [flags]\n"), help)
	assert.Contains(t, help, "with -http-listen, the web console")
	var headings []string
	for _, m := range regexp.MustCompile(`(?m)^([A-Z][a-z]+):$`).FindAllStringSubmatch(help, -1) {
		headings = append(headings, m[1])
	}
	assert.Equal(t, []string{"Configuration", "Listening", "Store", "Security", "Observability", "Limits", "Upgrading"}, headings)
	assert.Regexp(t, `Upgrading:\n.*\n  -claim-in-owners\n`, help, "upgrade-only flags come last")
	assert.Regexp(t, `-http-listen string\n\s+address to serve the web console, the model front doors`, help)

	// Every flag of serve, once: a flag no group names would come under
	// Other, which the headings above do not have.
	flags := regexp.MustCompile(`(?m)^  -([a-z-]+)`).FindAllStringSubmatch(help, -1)
	seen := map[string]bool{}
	for _, f := range flags {
		assert.False(t, seen[f[1]], "-%s twice", f[1])
		seen[f[1]] = true
	}
	assert.Len(t, seen, 32)
}

// run -h shows -attempts and -max-retries side by side, each saying what
// it counts, and why the two differ.
func TestRunHelpAttemptsBesideMaxRetries(t *testing.T) {
	help := helpOfCommand(t, "run")
	assert.Regexp(t, `How many attempts:\n(  .*\n){4}  -attempts int\n\s+retry: the retries after the first try .*\n  -max-retries int\n\s+retry-with-learning: every attempt, the first included`, help)
	assert.Contains(t, help, "because each control keeps the contract it implements")
	// The other commands keep the flag package's alphabetical list.
	assert.True(t, strings.HasPrefix(helpOfCommand(t, "list"), "Usage of stubborn list:\n  -addr string\n"))
}
