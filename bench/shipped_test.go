package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// TestMain runs this test binary in a role when the shipped scenarios
// start it as one (they run os.Executable()).
func TestMain(m *testing.M) {
	if roleArgs(os.Args[1:]) {
		os.Exit(exitCode(nil))
	}
	os.Exit(m.Run())
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// children lists the processes whose parent is this one.
func children(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Skip("no /proc")
	}
	var out []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(b), ')')
		if f := strings.Fields(string(b[i+1:])); len(f) > 1 && f[1] == strconv.Itoa(os.Getpid()) {
			out = append(out, e.Name()+" "+string(b[:i+1]))
		}
	}
	return out
}

// The shipped scenarios in their processes, with a stand-in for the
// Temporal peer: every measurement is made without a failed call, each
// server's memory is read from /proc, the peer's lines are read, and no
// child process or temporary file outlives runShipped. (How many calls end
// within a window depends on the machine's load: not checked.)
func TestShippedScenariosWithAPeer(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	o := options{
		scenarios:   map[string]bool{"proc-direct": true, "proc-proxy": true},
		concurrency: []int{2},
		duration:    200 * time.Millisecond, slice: 200 * time.Millisecond,
		warmup: 100 * time.Millisecond, procWarmup: 50 * time.Millisecond,
		temporalDir: filepath.Join("testdata", "fakepeer"),
	}
	load, err := runShipped(testCtx(t), o)
	require.NoError(t, err)

	var got []string
	for _, r := range load {
		got = append(got, r.Scenario+" c="+strconv.Itoa(r.Concurrency))
		assert.Zero(t, r.Errors, "%s: %s", r.Scenario, r.FirstError)
		switch r.Scenario {
		case "proc-direct":
			assert.Zero(t, r.ServerRSSBytes, "no process between the client and the delegate")
		case "proc-proxy":
			assert.Positive(t, r.ServerRSSBytes, "the proxy process's")
		default:
			// fakepeer reports 10 calls per concurrent caller per slice.
			assert.Equal(t, int64(10*r.Concurrency), r.Ops, r.Scenario)
			assert.InDelta(t, 24000, r.P50us, 0.001, r.Scenario)
			assert.Positive(t, r.ServerRSSBytes, "the peer server's")
			assert.Positive(t, r.WorkerRSSBytes, "the peer worker's")
		}
	}
	assert.Equal(t, []string{"proc-direct c=2", "proc-proxy c=2", "temporal-one c=2", "temporal-retry3 c=2"}, got)
	assert.Empty(t, children(t))
	left, err := os.ReadDir(tmp)
	require.NoError(t, err)
	assert.Empty(t, left, "temporary files left")
}

// A child that fails to start fails the measurement with its own words,
// and the children already started are stopped.
func TestShippedStopsEverythingOnAFailure(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	t.Setenv("FAKEPEER_FAIL", "worker")
	o := options{
		scenarios:   map[string]bool{"proc-proxy": true},
		concurrency: []int{1}, duration: time.Second, slice: time.Second,
		temporalDir: filepath.Join("testdata", "fakepeer"),
	}
	_, err := runShipped(testCtx(t), o)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "temporal worker exited")
	assert.Contains(t, err.Error(), "fakepeer: cannot poll 127.0.0.1:")
	assert.Empty(t, children(t))
	left, err := os.ReadDir(tmp)
	require.NoError(t, err)
	assert.Empty(t, left, "temporary files left")
}

// The client role runs scenarios 3 and 4 against a Stubborn server in
// another process (here, this one) and says what it measured in one JSON
// line. (Whether a call ends within its window depends on the machine's
// load; the calls it made are on the server.)
func TestClientRoleRunsRunAndRetry(t *testing.T) {
	w, err := newWorld(2)
	require.NoError(t, err)
	defer w.close()
	s, err := startStubborn(w, "memory", 1)
	require.NoError(t, err)
	defer s.stop()
	self, err := os.Executable()
	require.NoError(t, err)
	ctx := testCtx(t)
	for _, tt := range []struct {
		scenario, control string
		attempts          int32
	}{{"run", "fallback_chain", 1}, {"retry", "retry", 3}} {
		sc := tt.scenario
		c, err := startChild(ctx, childSpec{name: sc, path: self, args: []string{
			"-role", "client", "-target", s.conns[0].Target(), "-scenario", sc, "-concurrency", "2", "-duration", "200ms",
		}})
		require.NoError(t, err)
		line, err := c.next(ctx, "{", time.Minute)
		c.stop()
		require.NoError(t, err)
		var r LoadResult
		require.NoError(t, json.Unmarshal([]byte(line), &r), line)
		assert.Equal(t, "proc-"+sc, r.Scenario)
		assert.Equal(t, 2, r.Concurrency)
		assert.Zero(t, r.Errors, "%s: %s", sc, r.FirstError)
		done, err := s.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, Control: tt.control, PageSize: 1})
		require.NoError(t, err)
		require.NotEmpty(t, done.GetRuns(), "no %s run succeeded", tt.control)
		assert.Equal(t, tt.attempts, done.GetRuns()[0].GetAttempts())
	}
}

func TestLineWriter(t *testing.T) {
	var got []string
	w := &lineWriter{fn: func(s string) { got = append(got, s) }}
	for _, p := range []string{"READY 127.0.0.1:1", " 127.0.0.1:2\n{\"ops\"", ":1}\n\n", "tail"} {
		_, err := w.Write([]byte(p))
		require.NoError(t, err)
	}
	assert.Equal(t, []string{"READY 127.0.0.1:1 127.0.0.1:2", `{"ops":1}`, ""}, got)
}

func TestProcCPUAndRSS(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	assert.Positive(t, clockTicks())
	// Spin until this process has used some CPU time, which /proc shows.
	for x := 0; cpuTime() < 50*time.Millisecond; x++ {
		_ = strconv.Itoa(x)
	}
	cpu, err := procCPU(os.Getpid())
	require.NoError(t, err)
	assert.Positive(t, cpu)
	rss, err := procMaxRSS(os.Getpid())
	require.NoError(t, err)
	assert.Positive(t, rss)
}
