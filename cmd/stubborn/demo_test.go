package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// syncBuffer is a bytes.Buffer that the demo writes while the test reads.
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

// Without -exit, the demo serves the console and the HTTP API after its
// runs, with a run awaiting a decision, until it is interrupted.
func TestDemoServesConsoleUntilInterrupted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	demoCtx, interrupt := context.WithCancel(ctx)
	defer interrupt()
	var out syncBuffer
	type result struct {
		code int
		err  error
	}
	done := make(chan result, 1)
	go func() {
		code, err := run(demoCtx, []string{"demo", "-latency", "1ms", "-http-listen", "127.0.0.1:0"}, &out)
		done <- result{code, err}
	}()

	var base string
	require.Eventually(t, func() bool {
		m := regexp.MustCompile(`(?m)^Console: (http://\S+)/ `).FindStringSubmatch(out.String())
		if m != nil {
			base = m[1]
		}
		return m != nil
	}, 20*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "press Ctrl-C to stop") }, 30*time.Second, 10*time.Millisecond, out.String())
	assert.Contains(t, out.String(), "Demo finished: every run ended as expected.")
	assert.Regexp(t, `A fifth run awaits your decision .*: http://\S+/#/runs/run_\S+`, out.String())
	assert.Contains(t, out.String(), "(open it to follow the runs below live)")

	// The -addr hint it prints works, and starts with the command that runs
	// this binary (a test binary: its path as invoked).
	hint := regexp.MustCompile("Serving the console on \\S+, the front door \\(`curl [^`]+`\\) and the API on \\S+ \\(gRPC: `(\\S+) (list -addr \\S+)`\\)").FindStringSubmatch(out.String())
	require.NotNil(t, hint, out.String())
	assert.Equal(t, os.Args[0], hint[1])
	var listed bytes.Buffer
	code, err := run(ctx, strings.Fields(hint[2]), &listed)
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	assert.Equal(t, 5, strings.Count(listed.String(), "run_"), listed.String())

	// The console's page.
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	page, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, resp.Header.Get("Content-Type"), "text/html")
	assert.Contains(t, string(page), "app.js?v=")

	// The API beside it: the demo's five runs, the last awaiting a decision.
	// (Called from Eventually's goroutine: errors are "not yet", not
	// FailNow.)
	listRuns := func() (statuses []string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/stubborn.v1.ControlService/ListRuns",
			strings.NewReader(`{"view": "RUN_VIEW_SUMMARY"}`))
		if err != nil {
			return nil
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		var listed struct {
			Summaries []struct {
				Status string `json:"status"`
			} `json:"summaries"`
		}
		if json.NewDecoder(resp.Body).Decode(&listed) != nil {
			return nil
		}
		for _, s := range listed.Summaries {
			statuses = append(statuses, s.Status)
		}
		return statuses
	}
	require.Eventually(t, func() bool {
		st := listRuns()
		return len(st) == 5 && st[0] == "RUN_STATUS_AWAITING_DECISION"
	}, 20*time.Second, 50*time.Millisecond)

	select {
	case r := <-done:
		t.Fatalf("the demo ended by itself: %d %v\n%s", r.code, r.err, out.String())
	default:
	}
	interrupt()
	select {
	case r := <-done:
		require.NoError(t, r.err)
		assert.Equal(t, 0, r.code)
	case <-ctx.Done():
		t.Fatal("the demo did not stop when interrupted")
	}
	assert.Contains(t, out.String(), "Stopping.")
}

// The demo's hints start with a command the person has: the go run form
// for a go run build (whose binary is deleted when it exits), else the
// binary as it was invoked.
func TestDemoHintsACommandThePersonHas(t *testing.T) {
	for _, c := range []struct {
		exe, arg0, want string
		goRun           bool
	}{
		{"/tmp/go-build2871/b001/exe/stubborn", "/tmp/go-build2871/b001/exe/stubborn", "go run ./cmd/stubborn", true},
		{"/home/me/.cache/tmp/go-build99/b001/exe/stubborn", "stubborn", "go run ./cmd/stubborn", true},
		{"/home/me/stubborn/stubborn", "./stubborn", "./stubborn", false},
		{"/usr/local/bin/stubborn", "stubborn", "stubborn", false},
		{"/opt/my tools/stubborn", "/opt/my tools/stubborn", "'/opt/my tools/stubborn'", false},
		// A binary someone keeps under a directory named exe is not a go
		// run build.
		{"/srv/exe/stubborn", "/srv/exe/stubborn", "/srv/exe/stubborn", false},
		{"", "", "stubborn", false},
	} {
		got := selfOf(c.exe, c.arg0)
		assert.Equal(t, c.want, got.cmd, c.exe)
		assert.Equal(t, c.goRun, got.goRun, c.exe)
		if c.goRun {
			assert.Contains(t, got.buildHint(), "`go build -o stubborn ./cmd/stubborn`")
		} else {
			assert.Empty(t, got.buildHint())
		}
	}
}
