package server_test

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/internal/delegates"
)

// TestARevokedCallersDoorStreamEnds: a door's run is called in process,
// and is revocable as a gRPC stream is: a reload that takes the caller's
// token away ends the answer it is streaming with an error naming the run,
// which goes on.
func TestARevokedCallersDoorStreamEnds(t *testing.T) {
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"The \"}}]}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(release) }) // before slow.Close, which waits for the handler
	e, base := frontDoorEnv(t, setup{
		tenants: []delegates.Tenant{{Name: "acme", TokenSHA256: []string{delegates.HashToken("acme-token")}}},
		entries: []delegates.Delegate{{Name: "slow-model", OpenAI: &delegates.OpenAI{ModelAPI: delegates.ModelAPI{BaseURL: slow.URL, Model: "m"}}, ReadOnly: true, Timeout: delegates.Duration(time.Minute)}},
	})
	resp := postChat(t, base, "acme-token", `{"model": "slow-model", "stream": true, "messages": [{"role": "user", "content": "x"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	lines := bufio.NewReader(resp.Body)
	for {
		line, err := lines.ReadString('\n')
		require.NoError(t, err)
		if strings.Contains(line, `"content":"The "`) {
			break
		}
	}
	require.NoError(t, e.st.Reload(with(e.cfg, func(c *delegates.Config) {
		c.Tenants = []delegates.Tenant{{Name: "acme", TokenSHA256: []string{delegates.HashToken("new-token")}}}
	})))
	rest, err := io.ReadAll(lines)
	require.NoError(t, err)
	assert.Contains(t, string(rest), "stream_interrupted")
	assert.Contains(t, string(rest), "goes on, but its answer stopped coming here")
	assert.Contains(t, string(rest), "taken away by a config reload")
}
