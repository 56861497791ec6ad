package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// child is one process of the shipped scenarios. Its stdout is kept line by
// line for next; the last lines of its stderr are kept for errors, and the
// first match of a pattern in it (a server's address in its log) for
// matched. stop ends it; a child is also ended when the context it was
// started with ends (SIGTERM, then SIGKILL after 10 s) and, on Linux, when
// the bench dies (Pdeathsig).
type child struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.Closer // a role child ends when it is closed
	cancel context.CancelFunc
	exited chan struct{} // closed once it has exited and its output is read
	err    error         // how it exited; set before exited is closed

	mu      sync.Mutex
	lines   []string      // stdout lines not taken by next yet (guarded by mu)
	more    chan struct{} // signalled when a line is added to lines (cap 1)
	tail    []string      // stderr's last lines, tailLines at most (guarded by mu)
	found   string        // the first match of the stderr pattern (guarded by mu)
	matched chan struct{} // closed when found is set
}

// childSpec says what startChild runs.
type childSpec struct {
	name string   // in errors and progress
	path string   // the program
	args []string // its arguments
	// stdin gives the child a pipe for stdin, which stop closes: the
	// bench's roles with -exit-on-eof end when it is closed (or when the
	// bench dies).
	stdin bool
	// watch is matched against stderr's lines; the first line that
	// matches gives match its first non-empty submatch.
	watch *regexp.Regexp
}

const tailLines = 20

// startChild starts spec's program. The caller must stop it.
func startChild(ctx context.Context, spec childSpec) (*child, error) {
	ctx, cancel := context.WithCancel(ctx)
	c := &child{name: spec.name, cancel: cancel, exited: make(chan struct{}), more: make(chan struct{}, 1), matched: make(chan struct{})}
	cmd := exec.CommandContext(ctx, spec.path, spec.args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	cmd.SysProcAttr = childSysProcAttr()
	cmd.Stdout = &lineWriter{fn: c.addLine}
	cmd.Stderr = &lineWriter{fn: func(line string) { c.addStderr(line, spec.watch) }}
	if spec.stdin {
		w, err := cmd.StdinPipe()
		if err != nil {
			cancel()
			return nil, err
		}
		c.stdin = w
	}
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("%s: %w", spec.name, err)
	}
	c.cmd = cmd
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

func (c *child) addLine(line string) {
	c.mu.Lock()
	c.lines = append(c.lines, line)
	c.mu.Unlock()
	select {
	case c.more <- struct{}{}:
	default:
	}
}

func (c *child) addStderr(line string, watch *regexp.Regexp) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.tail) == tailLines {
		c.tail = append(c.tail[:0], c.tail[1:]...)
	}
	c.tail = append(c.tail, line)
	if watch == nil || c.found != "" {
		return
	}
	m := watch.FindStringSubmatch(line)
	if m == nil {
		return
	}
	for _, sub := range m[1:] {
		if sub != "" {
			c.found = sub
			close(c.matched)
			return
		}
	}
}

// next returns the first stdout line that starts with prefix, dropping
// the lines before it, waiting at most timeout.
func (c *child) next(ctx context.Context, prefix string, timeout time.Duration) (string, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		for len(c.lines) > 0 {
			line := c.lines[0]
			c.lines = c.lines[1:]
			if strings.HasPrefix(line, prefix) {
				c.mu.Unlock()
				return line, nil
			}
		}
		c.mu.Unlock()
		select {
		case <-c.more:
		case <-c.exited:
			// Its last lines may have come with its exit.
			c.mu.Lock()
			n := len(c.lines)
			c.mu.Unlock()
			if n == 0 {
				return "", c.failure(fmt.Sprintf("exited (%v) before printing %q", c.err, prefix))
			}
		case <-deadline.C:
			return "", c.failure(fmt.Sprintf("printed no %q within %v", prefix, timeout))
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// match waits at most timeout for the first match of its stderr pattern.
func (c *child) match(ctx context.Context, timeout time.Duration) (string, error) {
	select {
	case <-c.matched:
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.found, nil
	case <-c.exited:
		return "", c.failure(fmt.Sprintf("exited (%v) before it served", c.err))
	case <-time.After(timeout):
		return "", c.failure(fmt.Sprintf("did not serve within %v", timeout))
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// failure is an error about c that quotes the last lines of its stderr.
func (c *child) failure(what string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Errorf("%s %s; its last lines:\n%s", c.name, what, strings.Join(c.tail, "\n"))
}

// stop ends c (closing its stdin, then SIGTERM, then SIGKILL after 10 s)
// and waits until it has exited.
func (c *child) stop() {
	if c.stdin != nil {
		_ = c.stdin.Close()
	}
	c.cancel()
	<-c.exited
}

// alive returns an error if c has exited.
func (c *child) alive() error {
	select {
	case <-c.exited:
		return c.failure(fmt.Sprintf("exited (%v)", c.err))
	default:
		return nil
	}
}

// maxLine is the longest line a lineWriter waits for the end of: a
// streaming client's JSON line carries each call's figures (about 30
// bytes a call: 100,000 calls).
const maxLine = 4 << 20

// lineWriter calls fn with every whole line written to it.
type lineWriter struct {
	buf []byte
	fn  func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	rest := w.buf
	for {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			break
		}
		w.fn(string(rest[:i]))
		rest = rest[i+1:]
	}
	if len(rest) > maxLine { // a line that long is not one to wait for
		w.fn(string(rest))
		rest = nil
	}
	w.buf = append(w.buf[:0], rest...)
	return len(p), nil
}

// procCPU returns the user plus system CPU time process pid has used,
// from /proc/<pid>/stat (Linux).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces;
	// utime and stime are fields 14 and 15, the 12th and 13th after it.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / time.Duration(clockTicks()), nil
}

// clockTicks is sysconf(_SC_CLK_TCK), the unit of /proc/<pid>/stat's CPU
// times, read from the process's auxiliary vector (AT_CLKTCK); 100, as on
// every Linux in practice, when it cannot be read.
var clockTicks = sync.OnceValue(func() int64 {
	const atClkTck = 17
	b, err := os.ReadFile("/proc/self/auxv")
	if err != nil {
		return 100
	}
	word := strconv.IntSize / 8
	for i := 0; i+2*word <= len(b); i += 2 * word {
		var k, v uint64
		if word == 8 {
			k, v = binary.NativeEndian.Uint64(b[i:]), binary.NativeEndian.Uint64(b[i+8:])
		} else {
			k, v = uint64(binary.NativeEndian.Uint32(b[i:])), uint64(binary.NativeEndian.Uint32(b[i+4:]))
		}
		if k == atClkTck && v > 0 {
			return int64(v)
		}
	}
	return 100
})

// procMaxRSS returns process pid's peak resident set size (VmHWM in
// /proc/<pid>/status, Linux).
func procMaxRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/status: VmHWM: %w", pid, err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("no VmHWM in /proc/" + strconv.Itoa(pid) + "/status")
}

// pid is c's process id.
func (c *child) pid() int { return c.cmd.Process.Pid }
