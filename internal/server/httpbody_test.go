package server_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/server"
)

// chunked hides a reader's length, so that the client sends it chunked.
type chunked struct{ io.Reader }

// An oversized body is refused with a code no client retries (issue 30
// item 5): HTTP 413 and invalid_argument for a Connect unary call, with
// a Content-Length or chunked; invalid_argument in the protocol's own form
// for a Connect stream, gRPC-Web and gRPC (over h2c, no Content-Length). A
// body of exactly MaxHTTPBodyBytes is served. Over real HTTP, through
// NewHTTPServer.
func TestHTTPAPIOversizedBodyIsNotRetryable(t *testing.T) {
	e := start(t, delegates.Limits{})
	base := httpAPI(t, e)
	getRun := base + "/stubborn.v1.ControlService/GetRun"
	// pad makes a GetRun request body of n bytes.
	pad := func(n int) []byte {
		b := []byte(`{"runId": "run_nope"}`)
		return append(b, bytes.Repeat([]byte(" "), n-len(b))...)
	}
	post := func(url, contentType string, body io.Reader) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, url, body)
		require.NoError(t, err)
		req.Header.Set("Content-Type", contentType)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, b
	}
	connectError := func(b []byte) (code, msg string) {
		t.Helper()
		var out struct{ Code, Message string }
		require.NoError(t, json.Unmarshal(b, &out), "%s", b)
		return out.Code, out.Message
	}
	over := server.MaxHTTPBodyBytes + 1

	for name, body := range map[string]func() io.Reader{
		"with Content-Length": func() io.Reader { return bytes.NewReader(pad(over)) },
		"chunked":             func() io.Reader { return chunked{bytes.NewReader(pad(over))} },
	} {
		t.Run("connect unary "+name, func(t *testing.T) {
			resp, b := post(getRun, "application/json", body())
			assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "%s", b)
			code, msg := connectError(b)
			assert.Equal(t, "invalid_argument", code)
			assert.Contains(t, msg, "request body over 8388608 bytes")
		})
	}
	t.Run("at the bound", func(t *testing.T) {
		for _, body := range []io.Reader{bytes.NewReader(pad(server.MaxHTTPBodyBytes)), chunked{bytes.NewReader(pad(server.MaxHTTPBodyBytes))}} {
			resp, b := post(getRun, "application/json", body)
			assert.Equal(t, http.StatusNotFound, resp.StatusCode, "%s", b)
			code, _ := connectError(b)
			assert.Equal(t, "not_found", code, "served: the run does not exist")
		}
	})
	t.Run("connect stream", func(t *testing.T) {
		var body bytes.Buffer
		body.WriteByte(0)
		require.NoError(t, binary.Write(&body, binary.BigEndian, uint32(over)))
		body.Write(pad(over))
		resp, b := post(base+"/stubborn.v1.ControlService/WatchRun", "application/connect+json", chunked{&body})
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		require.GreaterOrEqual(t, len(b), 5)
		assert.Equal(t, byte(0x02), b[0], "an end-of-stream message")
		var end struct {
			Error struct{ Code, Message string }
		}
		require.NoError(t, json.Unmarshal(b[5:], &end), "%s", b)
		assert.Equal(t, "invalid_argument", end.Error.Code)
	})
	t.Run("grpc-web", func(t *testing.T) {
		resp, b := post(getRun, "application/grpc-web+proto", bytes.NewReader(make([]byte, over)))
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		assert.Equal(t, "3", resp.Header.Get("Grpc-Status"), "INVALID_ARGUMENT")
		assert.Contains(t, resp.Header.Get("Grpc-Message"), "request body over")
	})
	t.Run("grpc over h2c", func(t *testing.T) {
		conn, err := grpc.NewClient(strings.TrimPrefix(base, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		defer conn.Close()
		client := stubbornv1.NewControlServiceClient(conn)
		_, err = client.StartRun(testCtx(t), &stubbornv1.StartRunRequest{TaskBrief: strings.Repeat("x", over)})
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		assert.ErrorContains(t, err, "request body over")
		_, err = client.GetRun(testCtx(t), &stubbornv1.GetRunRequest{RunId: "run_nope"})
		assert.Equal(t, codes.NotFound, status.Code(err), "a small call on the same client is served: %v", err)
	})
}

// Media types are case-insensitive (RFC 9110 8.3.1): application/JSON is
// JSON, with its parameters too (issue 30 item 5).
func TestHTTPAPIContentTypeIsCaseInsensitive(t *testing.T) {
	e := start(t, delegates.Limits{})
	base := httpAPI(t, e)
	for _, ct := range []string{"application/JSON", "Application/Json; Charset=utf-8", "APPLICATION/JSON"} {
		req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, base+"/stubborn.v1.ControlService/StartRun",
			strings.NewReader(`{"taskBrief": "hi", "fallbackChain": {"chain": ["echo"]}}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", ct)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", ct, b)
		var out struct{ RunID string }
		require.NoError(t, json.Unmarshal(b, &out))
		assert.NotEmpty(t, out.RunID, ct)
	}
}
