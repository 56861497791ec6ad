package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// serve -http-listen answers the README's curl: a JSON POST to StartRun.
func TestServeHTTPListenAnswersCurl(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	echo := demo.Serve(lis, demo.Echo{})
	t.Cleanup(echo.Stop)
	cfg := filepath.Join(t.TempDir(), "stubborn.yaml")
	require.NoError(t, os.WriteFile(cfg, fmt.Appendf(nil, "delegates:\n  - {name: echo, target: %q}\n", lis.Addr()), 0o600))
	s := startServer(t, "-memory", "-config", cfg, "-listen", "127.0.0.1:0", "-http-listen", "127.0.0.1:0")
	base := s.loggedURL(t, "http api serving")
	assert.Equal(t, base+"/", s.loggedURL(t, "web console serving"), "serve logs the console's URL")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/stubborn.v1.ControlService/StartRun",
		strings.NewReader(`{"taskBrief": "hi", "fallbackChain": {"chain": ["echo"]}}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	var out struct {
		RunID string `json:"runId"`
	}
	require.NoError(t, json.Unmarshal(body, &out))
	assert.NotEmpty(t, out.RunID)
}

// loggedURL waits for the log line msg and returns the URL it gives.
func (s *child) loggedURL(t *testing.T, msg string) string {
	t.Helper()
	urlRE := regexp.MustCompile(`"msg":"` + regexp.QuoteMeta(msg) + `","url":"(https?://[^"]+)"`)
	var url string
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		m := urlRE.FindStringSubmatch(s.logs.String())
		if m != nil {
			url = m[1]
		}
		return m != nil
	}, 10*time.Second, 10*time.Millisecond)
	return url
}

// serve -pprof-listen serves net/http/pprof's index and profiles, but not
// the command line, which may hold a password in -nats-url.
func TestServePprofListen(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty.yaml")
	require.NoError(t, os.WriteFile(empty, []byte("delegates: []\n"), 0o600))
	s := startServer(t, "-memory", "-config", empty, "-listen", "127.0.0.1:0", "-pprof-listen", "127.0.0.1:0")
	base := s.loggedURL(t, "pprof serving")
	require.True(t, strings.HasSuffix(base, "/debug/pprof/"), base)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	get := func(url string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}
	code, body := get(base)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "goroutine")
	code, body = get(base + "goroutine?debug=1")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "goroutine profile:")
	code, _ = get(base + "cmdline")
	assert.Equal(t, http.StatusNotFound, code)
}

func TestServeRefusesPlaintextHTTPOffLoopback(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty.yaml")
	require.NoError(t, os.WriteFile(empty, []byte("delegates: []\n"), 0o600))
	for _, flag := range []string{"-http-listen", "-pprof-listen"} {
		t.Run(flag, func(t *testing.T) {
			code, err := run(context.Background(), []string{"serve", "-memory", "-config", empty, "-listen", "127.0.0.1:0", flag, "0.0.0.0:0"}, &bytes.Buffer{})
			assert.Equal(t, 2, code)
			require.Error(t, err)
			assert.Contains(t, err.Error(), flag+": refusing to serve plaintext on 0.0.0.0:0")
		})
	}
}

// The shipped binary's HTTP listener refuses a body over 8 MiB with 413
// and invalid_argument, with a Content-Length or chunked, and takes
// application/JSON as JSON (issue 30 item 5).
func TestServeHTTPBodyCodes(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "stubborn.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("delegates: []\n"), 0o600))
	s := startServer(t, "-memory", "-config", cfg, "-listen", "127.0.0.1:0", "-http-listen", "127.0.0.1:0")
	base := s.loggedURL(t, "http api serving")
	post := func(contentType string, body io.Reader) (int, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/stubborn.v1.ControlService/GetRun", body)
		require.NoError(t, err)
		req.Header.Set("Content-Type", contentType)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	big := append([]byte(`{"runId": "run_nope"}`), bytes.Repeat([]byte(" "), 8<<20)...)
	code, body := post("application/json", bytes.NewReader(big))
	assert.Equal(t, http.StatusRequestEntityTooLarge, code, body)
	assert.Contains(t, body, `"code":"invalid_argument"`)
	code, body = post("application/json", io.MultiReader(bytes.NewReader(big))) // no length: chunked
	assert.Equal(t, http.StatusRequestEntityTooLarge, code, body)
	assert.Contains(t, body, `"code":"invalid_argument"`)
	code, body = post("application/JSON", strings.NewReader(`{"runId": "run_nope"}`))
	assert.Equal(t, http.StatusNotFound, code, "served, and the run does not exist: %s", body)
	assert.Contains(t, body, `"code":"not_found"`)
}
