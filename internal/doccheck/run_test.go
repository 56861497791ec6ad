//go:build linux

package doccheck_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/internal/doccheck"
)

// fixtureRunner returns a Runner over a small git repository (a tracked
// file, an ignored one, a new one) with a ./tool binary (a script).
func fixtureRunner(t *testing.T) *doccheck.Runner {
	t.Helper()
	repo := t.TempDir()
	git := exec.Command("git", "init", "-q", repo)
	out, err := git.CombinedOutput()
	require.NoError(t, err, "%s", out)
	for name, body := range map[string]string{"README.md": "# fixture\n", ".gitignore": "ignored.txt\n", "ignored.txt": "x\n", "sub/new.txt": "new\n"} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(repo, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(repo, name), []byte(body), 0o644))
	}
	add := exec.Command("git", "add", "README.md", ".gitignore")
	add.Dir = repo
	out, err = add.CombinedOutput()
	require.NoError(t, err, "%s", out)
	tool := filepath.Join(t.TempDir(), "tool")
	require.NoError(t, os.WriteFile(tool, []byte("#!/bin/sh\necho tool says $*\n"), 0o755))
	return &doccheck.Runner{Repo: repo, Work: t.TempDir(), Binaries: map[string]string{"tool": tool}, Timeout: time.Minute}
}

func block(body string) doccheck.Block {
	return doccheck.Block{File: "guide.md", Line: 10, Lang: "sh", Body: body}
}

func TestRunnerRuns(t *testing.T) {
	r := fixtureRunner(t)
	res := r.Run(t.Context(), block("./tool hello\ncat README.md sub/new.txt\ntest ! -e ignored.txt\ntouch made.txt\n[[ $TMPDIR == "+r.Work+"/* ]]\n"))
	require.NoError(t, res.Err, res.Output)
	assert.Equal(t, "tool says hello\n# fixture\nnew\n", res.Output)
	// Each block has a fresh copy: what the last one made is gone.
	res = r.Run(t.Context(), block("test ! -e made.txt\n"))
	assert.NoError(t, res.Err, res.Output)
}

func TestRunnerFails(t *testing.T) {
	r := fixtureRunner(t)
	for _, tc := range []struct{ name, body, output string }{
		{"a failing command stops the block", "echo before\nfalse\necho after\n", "before\n"},
		{"pipefail", "false | cat\necho after\n", ""},
		{"nounset", "echo \"$NO_SUCH_VARIABLE\"\n", "NO_SUCH_VARIABLE: unbound variable"},
		{"a command that is not there", "echo\nstubborn list\n", "guide.md:12: stubborn: command not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := r.Run(t.Context(), block(tc.body))
			assert.Error(t, res.Err)
			assert.Contains(t, res.Output, tc.output)
			assert.NotContains(t, res.Output, "after")
		})
	}
}

// TestRunnerKillsBackground: a block's background processes, and their
// children, end with it, also when it times out.
func TestRunnerKillsBackground(t *testing.T) {
	r := fixtureRunner(t)
	pids := filepath.Join(t.TempDir(), "pids")
	r.Env = []string{"PIDS=" + pids}
	res := r.Run(t.Context(), block("sleep 300 &\necho $! >> \"$PIDS\"\nbash -c 'sleep 300 & echo $! >> \"$PIDS\"; wait' &\nsleep 0.2\n"))
	require.NoError(t, res.Err, res.Output)

	r.Timeout = time.Second
	res = r.Run(context.Background(), block("sleep 300 &\necho $! >> \"$PIDS\"\nsleep 300\n"))
	require.Error(t, res.Err)
	assert.Contains(t, res.Err.Error(), "still running after 1s")
	assert.Less(t, res.Elapsed, 30*time.Second)

	b, err := os.ReadFile(pids)
	require.NoError(t, err)
	lines := strings.Fields(string(b))
	require.Len(t, lines, 3)
	for _, p := range lines {
		pid, err := strconv.Atoi(p)
		require.NoError(t, err)
		assert.False(t, running(pid), "pid %d outlived its block", pid)
	}
}

// running says whether pid runs: it exists and is no zombie.
func running(pid int) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	s := string(stat)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z"
}

func TestRunnerOutputIsBounded(t *testing.T) {
	r := fixtureRunner(t)
	res := r.Run(t.Context(), block("head -c 100000 /dev/zero | tr '\\0' a\necho; echo the end\n"))
	require.NoError(t, res.Err)
	assert.LessOrEqual(t, len(res.Output), doccheck.MaxOutput+100)
	assert.True(t, strings.HasPrefix(res.Output, "[… the first "), res.Output[:50])
	assert.True(t, strings.HasSuffix(res.Output, "the end\n"))
}

// TestRunBlocks: of a guide's blocks, the runnable ones run; a failing one
// is an error naming its file and line, with its output; a marked one is
// not run, its reason logged.
func TestRunBlocks(t *testing.T) {
	r := fixtureRunner(t)
	md := "# Guide\n" +
		"```sh\n./tool works\n```\n" + // 2
		"<!-- not run: needs a GPU -->\n```sh\nexit 3\n```\n" + // 6
		"```console\n$ false\n```\n" + // 9
		"Then:\n```sh\necho step two\ngrep -q nothing README.md\necho unreached\n```\n" // 13
	var logs []string
	errs := r.RunBlocks(t.Context(), doccheck.ParseBlocks("guide.md", []byte(md)), func(format string, args ...any) {
		logs = append(logs, fmt.Sprintf(format, args...))
	})
	require.Len(t, errs, 1)
	assert.Contains(t, errs[0].Error(), "guide.md:13: the ```sh block fails (exited: exit status 1)")
	assert.True(t, strings.HasSuffix(errs[0].Error(), "Its output:\nstep two\n"), errs[0].Error())
	require.Len(t, logs, 2)
	assert.Regexp(t, `^guide.md:2: passed in `, logs[0])
	assert.Equal(t, "guide.md:6: not run: needs a GPU", logs[1])
}
