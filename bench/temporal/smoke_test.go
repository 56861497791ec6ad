package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The test binary runs the subcommands as child processes of its own,
// exactly as the harness runs the built program: with this variable set,
// TestMain is main.
const childEnv = "BENCH_TEMPORAL_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestSmoke starts the delegates, the dev server and the worker as child
// processes, runs a 2 s load of each scenario at concurrency 1 and 8, and
// stops every process with SIGTERM, which each must exit 0 on.
func TestSmoke(t *testing.T) {
	delegates := startChild(t, time.Minute, "delegates")
	addrs := strings.Fields(delegates.ready)
	if len(addrs) != 3 {
		t.Fatalf("delegates said %q", delegates.ready)
	}
	server := startChild(t, 3*time.Minute, "server", "-port", "0")
	hostPort := strings.TrimPrefix(server.ready, "READY ")
	worker := startChild(t, time.Minute, "worker", "-temporal", hostPort, "-delegate", addrs[1], "-flaky-delegate", addrs[2])
	if worker.ready != "READY" {
		t.Fatalf("worker said %q", worker.ready)
	}

	for _, scenario := range []string{"one", "retry3"} {
		for _, conc := range []int{1, 8} {
			out, err := childCmd("load", "-temporal", hostPort, "-scenario", scenario,
				"-concurrency", fmt.Sprint(conc), "-duration", "2s", "-warmup", "500ms").Output()
			if err != nil {
				t.Fatalf("load %s: %v", scenario, err)
			}
			if bytes.Count(out, []byte("\n")) != 1 {
				t.Errorf("load printed more than one line: %q", out)
			}
			var r loadResult
			if err := json.Unmarshal(out, &r); err != nil {
				t.Fatalf("load %s: %v: %q", scenario, err, out)
			}
			t.Logf("%s", bytes.TrimSpace(out))
			if r.Scenario != "temporal-"+scenario || r.Store != "temporal" || r.Concurrency != conc {
				t.Errorf("load %s at %d: labelled %q %q %d", scenario, conc, r.Scenario, r.Store, r.Concurrency)
			}
			if r.Ops == 0 || r.Errors != 0 || r.P50us <= 0 || r.P99us < r.P50us {
				t.Errorf("load %s at %d: %+v", scenario, conc, r)
			}
		}
	}

	for _, c := range []*child{worker, server, delegates} {
		c.stop(t)
	}
}

func childCmd(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	return cmd
}

type child struct {
	name   string
	cmd    *exec.Cmd
	ready  string // its READY line
	stderr *syncBuffer
	done   chan error
}

// startChild starts a subcommand and waits for its first line on stdout,
// which must start with READY. The child is killed at the end of the test
// if it is still running.
func startChild(t *testing.T, timeout time.Duration, args ...string) *child {
	t.Helper()
	c := &child{name: args[0], cmd: childCmd(args...), stderr: new(syncBuffer), done: make(chan error, 1)}
	c.cmd.Stderr = c.stderr
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, stdout)
		c.done <- c.cmd.Wait()
	}()
	select {
	case line, ok := <-lines:
		if !ok || !strings.HasPrefix(line, "READY") {
			t.Fatalf("%s: first line %q; stderr:\n%s", c.name, line, tail(c.stderr))
		}
		c.ready = line
	case <-time.After(timeout):
		t.Fatalf("%s: no READY in %v; stderr:\n%s", c.name, timeout, tail(c.stderr))
	}
	return c
}

// stop sends SIGTERM and wants exit status 0 within 30 s.
func (c *child) stop(t *testing.T) {
	t.Helper()
	start := time.Now()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Errorf("%s: %v", c.name, err)
		return
	}
	select {
	case err := <-c.done:
		if err != nil {
			t.Errorf("%s: exit after SIGTERM: %v; stderr:\n%s", c.name, err, tail(c.stderr))
		}
		t.Logf("%s stopped in %v", c.name, time.Since(start).Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		t.Errorf("%s: still running 30 s after SIGTERM", c.name)
	}
}

func tail(b *syncBuffer) string {
	s := b.String()
	if len(s) > 4000 {
		s = "…" + s[len(s)-4000:]
	}
	return s
}

// syncBuffer is a bytes.Buffer that exec writes a child's stderr to while
// the test may read it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
