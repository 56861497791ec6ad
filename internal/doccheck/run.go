//go:build linux

package doccheck

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// MaxOutput bounds the output of a block that a failure quotes: its end,
// where the error is.
const MaxOutput = 32 << 10

// Runner runs shell blocks, one at a time, each in a fresh copy of a
// repository with a built binary in it.
type Runner struct {
	// Repo is the repository the blocks document; its files (tracked, or
	// new and not ignored, as they are in the work tree) are copied.
	Repo string
	// Work is a directory of the runner's own. Every block runs in
	// Work/repo, the same path each time, so that a `go build` or `go run`
	// in a block finds the build cache warm from the ones before.
	Work string
	// Binaries maps a name to a file copied to that name in each copy
	// ("stubborn": the binary built once, which blocks run as ./stubborn).
	Binaries map[string]string
	// Timeout bounds each block.
	Timeout time.Duration
	// Env is appended to the environment of each block.
	Env []string
}

// Result is what running a block did.
type Result struct {
	// Output is the block's stdout and stderr, interleaved; its last
	// MaxOutput bytes when longer.
	Output string
	// Elapsed is how long the block ran.
	Elapsed time.Duration
	// Err is nil when the block exited 0 in time.
	Err error
}

// Dir returns the directory blocks run in.
func (r *Runner) Dir() string { return filepath.Join(r.Work, "repo") }

// Fresh replaces Dir with a copy of Repo and the binaries.
func (r *Runner) Fresh() error {
	dir := r.Dir()
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := CopyRepo(r.Repo, dir); err != nil {
		return err
	}
	for name, src := range r.Binaries {
		if err := copyFile(src, filepath.Join(dir, name), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// Run runs b with bash under `set -euo pipefail` in a fresh copy, in a
// process group of its own that is killed when the block ends (its
// background processes with it), and waits until that group is gone, so
// that the ports it listened on are free for the next block.
func (r *Runner) Run(ctx context.Context, b Block) Result {
	start := time.Now()
	res := r.run(ctx, b)
	res.Elapsed = time.Since(start)
	return res
}

func (r *Runner) run(ctx context.Context, b Block) Result {
	if err := r.Fresh(); err != nil {
		return Result{Err: fmt.Errorf("copying the repository: %w", err)}
	}
	// The block's lines keep their numbers, offset by the fence's line:
	// bash's "line N" of the script is line b.Line+N-1 of the file.
	script := filepath.Join(r.Work, "block.sh")
	if err := os.WriteFile(script, []byte("set -euo pipefail\n"+b.Body), 0o644); err != nil {
		return Result{Err: err}
	}
	out, err := os.Create(filepath.Join(r.Work, "block.out"))
	if err != nil {
		return Result{Err: err}
	}
	defer out.Close()

	ctx, cancel := context.WithTimeout(ctx, r.Timeout)
	defer cancel()
	cmd := exec.Command("bash", script)
	cmd.Dir = r.Dir()
	// Its temporary files (a bench's, a go build's) go with the Work
	// directory, not to the machine's /tmp.
	tmp := filepath.Join(r.Work, "tmp")
	if err := os.RemoveAll(tmp); err != nil {
		return Result{Err: err}
	}
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return Result{Err: err}
	}
	cmd.Env = append(append(os.Environ(), "TMPDIR="+tmp), r.Env...)
	// A file, not a pipe: a background process holding the pipe open
	// would keep Wait waiting after bash is done.
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return Result{Err: err}
	}
	pgid := cmd.Process.Pid
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var runErr error
	select {
	case runErr = <-done:
		if runErr != nil {
			runErr = fmt.Errorf("exited: %w", runErr)
		}
	case <-ctx.Done():
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-done
		runErr = fmt.Errorf("still running after %v (a server started without & or a command waiting for input?): %w", r.Timeout, ctx.Err())
	}
	if err := killGroup(pgid); err != nil {
		runErr = errors.Join(runErr, err)
	}
	return Result{Output: docLines(tail(out.Name(), MaxOutput), script, b), Err: runErr}
}

// docLines rewrites bash's "SCRIPT: line N:" in output as the line of the
// file the block is in ("README.md:57:"), where its author looks.
func docLines(output, script string, b Block) string {
	re := regexp.MustCompile(regexp.QuoteMeta(script) + `: line (\d+):`)
	return re.ReplaceAllStringFunc(output, func(m string) string {
		n, err := strconv.Atoi(re.FindStringSubmatch(m)[1])
		if err != nil || n < 2 {
			return m
		}
		return fmt.Sprintf("%s:%d:", b.File, b.Line+n-1)
	})
}

// RunBlocks runs the runnable blocks of blocks, one at a time, and returns
// an error for each that fails, naming it and quoting its output. logf
// tells a marked block's reason, and how long each run one took.
func (r *Runner) RunBlocks(ctx context.Context, blocks []Block, logf func(format string, args ...any)) []error {
	var errs []error
	for _, b := range blocks {
		if b.Lang != "sh" {
			continue
		}
		if !b.Runnable() {
			logf("%s: not run: %s", b, b.NotRun)
			continue
		}
		res := r.Run(ctx, b)
		if res.Err != nil {
			errs = append(errs, fmt.Errorf("%s: the ```sh block fails (%w), after %v; fix it, or mark it <!-- not run: REASON --> on the line before its fence. Its output:\n%s",
				b, res.Err, res.Elapsed.Round(time.Millisecond), res.Output))
			continue
		}
		logf("%s: passed in %v", b, res.Elapsed.Round(time.Millisecond))
	}
	return errs
}

// killGroup ends process group pgid: SIGTERM, then SIGKILL to what is left
// after 5 s, and waits until none of it runs. Zombies do not count: an
// orphan's is for init to reap, and it holds no port.
func killGroup(pgid int) error {
	if err := syscall.Kill(-pgid, syscall.SIGTERM); errors.Is(err, syscall.ESRCH) {
		return nil
	}
	for _, step := range []struct {
		wait time.Duration
		then syscall.Signal
	}{{5 * time.Second, syscall.SIGKILL}, {10 * time.Second, 0}} {
		deadline := time.Now().Add(step.wait)
		for groupAlive(pgid) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if !groupAlive(pgid) {
			return nil
		}
		if step.then != 0 {
			_ = syscall.Kill(-pgid, step.then)
		}
	}
	return fmt.Errorf("process group %d still runs after SIGKILL", pgid)
}

// groupAlive says whether a process of group pgid runs (not a zombie),
// from /proc/PID/stat: "pid (comm) state ppid pgrp …".
func groupAlive(pgid int) bool {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return syscall.Kill(-pgid, 0) == nil
	}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// comm may hold spaces and parentheses: the fields follow the last ')'.
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) >= 3 && f[0] != "Z" && f[2] == strconv.Itoa(pgid) {
			return true
		}
	}
	return false
}

// tail returns the last max bytes of the file at path.
func tail(path string, max int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	prefix := ""
	if st.Size() > max {
		if _, err := f.Seek(st.Size()-max, io.SeekStart); err != nil {
			return ""
		}
		prefix = fmt.Sprintf("[… the first %d bytes left out]\n", st.Size()-max)
	}
	b, _ := io.ReadAll(io.LimitReader(f, max))
	return prefix + string(b)
}

// RepoFiles lists the files of the repository at root as its work tree
// holds them: tracked ones that exist, and new ones git does not ignore.
func RepoFiles(root string) ([]string, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return nil, fmt.Errorf("git ls-files in %s: %w", root, err)
	}
	var files []string
	for _, f := range strings.Split(string(out), "\x00") {
		if f != "" {
			files = append(files, f)
		}
	}
	return files, nil
}

// CopyRepo copies the files of the repository at root (RepoFiles) to dst,
// keeping their modes; a tracked file deleted from the work tree is left
// out, as it is from the tree. The copy is no git repository.
func CopyRepo(root, dst string) error {
	files, err := RepoFiles(root)
	if err != nil {
		return err
	}
	for _, f := range files {
		src := filepath.Join(root, f)
		st, err := os.Lstat(src)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue
		case err != nil:
			return err
		}
		to := filepath.Join(dst, f)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return err
		}
		switch {
		case st.Mode()&fs.ModeSymlink != 0:
			link, err := os.Readlink(src)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, to); err != nil {
				return err
			}
		case st.Mode().IsRegular():
			if err := copyFile(src, to, st.Mode().Perm()); err != nil {
				return err
			}
		}
	}
	return nil
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
