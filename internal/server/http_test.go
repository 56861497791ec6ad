package server_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/server"
)

// httpAPI serves e's server over HTTP (as serve -http-listen does) until
// the test ends, and returns its base URL.
func httpAPI(t *testing.T, e *env) string {
	t.Helper()
	h, err := e.st.HTTPHandler()
	require.NoError(t, err)
	s := httptest.NewUnstartedServer(h)
	s.Config = server.NewHTTPServer(h)
	s.Start()
	t.Cleanup(s.Close)
	return s.URL
}

// postJSON makes a Connect unary call with a JSON body, as curl would.
func postJSON(t *testing.T, url, token, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &out), "%d %s: %s", resp.StatusCode, resp.Header, b)
	return resp.StatusCode, out
}

// The README's curl, and its errors.
func TestHTTPAPIUnaryJSON(t *testing.T) {
	e := start(t, delegates.Limits{})
	base := httpAPI(t, e)
	code, out := postJSON(t, base+"/stubborn.v1.ControlService/StartRun", "",
		`{"taskBrief": "hi", "fallbackChain": {"chain": ["echo"]}}`)
	require.Equal(t, http.StatusOK, code, "%v", out)
	id, _ := out["runId"].(string)
	require.NotEmpty(t, id)
	runToEnd(t, testCtx(t), e.client, id)

	code, out = postJSON(t, base+"/stubborn.v1.ControlService/GetRun", "", `{"runId": "`+id+`"}`)
	require.Equal(t, http.StatusOK, code)
	state, _ := out["state"].(map[string]any)
	assert.Equal(t, "RUN_STATUS_SUCCEEDED", state["status"])
	assert.Equal(t, "echo: hi", state["result"].(map[string]any)["text"])

	// Validation errors name the field, as over gRPC.
	code, out = postJSON(t, base+"/stubborn.v1.ControlService/StartRun", "", `{"taskBrief": "hi", "fallbackChain": {"chain": ["nope"]}}`)
	assert.Equal(t, http.StatusNotFound, code)
	assert.Equal(t, "not_found", out["code"])
	assert.Contains(t, out["message"], `fallback_chain.chain[0]: delegate "nope"`)
	// A body that is not the message, or a misspelled field: 400, naming
	// the field.
	code, out = postJSON(t, base+"/stubborn.v1.ControlService/StartRun", "", `{"taskBrief": 7}`)
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Equal(t, "invalid_argument", out["code"])
	assert.Contains(t, out["message"], "invalid value for string field taskBrief: 7")
	code, out = postJSON(t, base+"/stubborn.v1.ControlService/StartRun", "", `{"taskBreif": "x"}`)
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, out["message"], `unknown field "taskBreif"`)
}

// A bearer token works over HTTP as over gRPC: another tenant's run is
// NOT_FOUND, no token is UNAUTHENTICATED.
func TestHTTPAPITenants(t *testing.T) {
	e := startWith(t, setup{tenants: twoTenants(delegates.Limits{}, delegates.Limits{})})
	base := httpAPI(t, e)
	code, out := postJSON(t, base+"/stubborn.v1.ControlService/StartRun", tokenA,
		`{"taskBrief": "hi", "fallbackChain": {"chain": ["echo"]}}`)
	require.Equal(t, http.StatusOK, code, "%v", out)
	id := out["runId"].(string)

	code, out = postJSON(t, base+"/stubborn.v1.ControlService/GetRun", tokenB, `{"runId": "`+id+`"}`)
	assert.Equal(t, http.StatusNotFound, code)
	assert.Equal(t, "not_found", out["code"])
	code, out = postJSON(t, base+"/stubborn.v1.ControlService/GetRun", "", `{"runId": "`+id+`"}`)
	assert.Equal(t, http.StatusUnauthorized, code)
	assert.Equal(t, "unauthenticated", out["code"])
	code, _ = postJSON(t, base+"/stubborn.v1.ControlService/GetRun", tokenA, `{"runId": "`+id+`"}`)
	assert.Equal(t, http.StatusOK, code)
}

// WatchRun over the Connect protocol's server streaming, as a browser's
// fetch makes it: enveloped JSON messages, then an end-of-stream message.
func TestHTTPAPIWatchRunStreams(t *testing.T) {
	e := start(t, delegates.Limits{})
	base := httpAPI(t, e)
	_, out := postJSON(t, base+"/stubborn.v1.ControlService/StartRun", "",
		`{"taskBrief": "hi", "fallbackChain": {"chain": ["down", "echo"]}}`)
	id := out["runId"].(string)

	var body bytes.Buffer
	msg := []byte(`{"runId": "` + id + `"}`)
	body.WriteByte(0)
	require.NoError(t, binary.Write(&body, binary.BigEndian, uint32(len(msg))))
	body.Write(msg)
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, base+"/stubborn.v1.ControlService/WatchRun", &body)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("Connect-Protocol-Version", "1")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	r := bufio.NewReader(resp.Body)
	var kinds []string
	for {
		var head [5]byte
		_, err := io.ReadFull(r, head[:])
		require.NoError(t, err)
		payload := make([]byte, binary.BigEndian.Uint32(head[1:]))
		_, err = io.ReadFull(r, payload)
		require.NoError(t, err)
		if head[0]&0x02 != 0 { // end of stream
			assert.JSONEq(t, `{}`, string(payload), "ended without an error")
			break
		}
		var m struct {
			Event map[string]json.RawMessage `json:"event"`
		}
		require.NoError(t, json.Unmarshal(payload, &m))
		for k := range m.Event {
			switch k {
			case "runId", "seq", "time", "path", "status":
			default:
				kinds = append(kinds, k)
			}
		}
	}
	assert.Equal(t, "runStarted", kinds[0])
	assert.Equal(t, "runFinished", kinds[len(kinds)-1])
	assert.Contains(t, kinds, "attemptStarted")
}
