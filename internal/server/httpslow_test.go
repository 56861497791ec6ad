package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"

	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/server"
)

// dribble writes b to c a byte every interval until it is written or c
// fails.
func dribble(c net.Conn, b []byte, interval time.Duration) {
	for i := range b {
		if _, err := c.Write(b[i : i+1]); err != nil {
			return
		}
		time.Sleep(interval)
	}
}

// slowConn opens a TCP connection to the HTTP API e serves through
// NewHTTPServer, with a deadline past which the test fails.
func slowConn(t *testing.T, e *env, within time.Duration) net.Conn {
	t.Helper()
	u, err := url.Parse(httpAPI(t, e))
	require.NoError(t, err)
	c, err := net.Dial("tcp", u.Host)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.SetReadDeadline(time.Now().Add(within)))
	return c
}

// A request body dribbled a byte a second is cut at HTTPBodyTimeout
// (issue 30 item 6): HTTP 408, and the connection closed. Before, it held
// its connection and goroutine for as long as the client kept dribbling.
func TestHTTPDribbledBodyIsCut(t *testing.T) {
	t.Parallel()
	e := start(t, delegates.Limits{})
	within := server.HTTPBodyTimeout + 5*time.Second
	c := slowConn(t, e, within)
	body := `{"runId": "run_nope"}` + fmt.Sprintf("%100s", "")
	_, err := fmt.Fprintf(c, "POST /stubborn.v1.ControlService/GetRun HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
	require.NoError(t, err)
	began := time.Now()
	go dribble(c, []byte(body), time.Second)

	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err, "no answer within %v", within)
	assert.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err, "the connection is closed after the answer, within %v", within)
	took := time.Since(began)
	assert.GreaterOrEqual(t, took, server.HTTPBodyTimeout-time.Second)
	assert.True(t, resp.Close, "Connection: close")
	_, err = c.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "closed, within %v", within)
}

// A HEADERS frame dribbled a byte a second over h2c (prior knowledge) is
// cut within HTTP2PingAfter+HTTP2PingTimeout (issue 30 item 6): the
// server's PING cannot be answered in the middle of a frame. Before, it
// held the connection until the 2-minute idle timeout.
func TestH2CHeaderDribbleIsCut(t *testing.T) {
	t.Parallel()
	e := start(t, delegates.Limits{})
	bound := server.HTTP2PingAfter + server.HTTP2PingTimeout
	c := slowConn(t, e, bound+5*time.Second)
	_, err := io.WriteString(c, http2.ClientPreface)
	require.NoError(t, err)
	fr := http2.NewFramer(c, c)
	require.NoError(t, fr.WriteSettings())
	// A HEADERS frame of 1,000 bytes for stream 1, its header written at
	// once and its block a byte a second.
	head := []byte{0, 0x03, 0xe8, byte(http2.FrameHeaders), byte(http2.FlagHeadersEndHeaders | http2.FlagHeadersEndStream), 0, 0, 0, 1}
	_, err = c.Write(head)
	require.NoError(t, err)
	began := time.Now()
	go dribble(c, make([]byte, 1000), time.Second)

	pinged := false
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			require.ErrorIs(t, err, io.EOF, "closed within %v", bound+5*time.Second)
			break
		}
		if p, ok := f.(*http2.PingFrame); ok && !p.IsAck() {
			pinged = true
		}
	}
	took := time.Since(began)
	t.Logf("closed after %v", took)
	assert.True(t, pinged, "closed for the unanswered PING")
	assert.Less(t, took, bound+2*time.Second)
}

// A stream over HTTP outlives HTTPBodyTimeout and the HTTP/2 PING (issue
// 30 item 6): the body's deadline is lifted once it is read, and no write
// timeout cuts a response. WatchRuns over Connect streaming, over HTTP/1.1
// and h2c, still delivers a run started after the bounds have passed.
func TestHTTPStreamOutlivesTheReadBounds(t *testing.T) {
	t.Parallel()
	e := start(t, delegates.Limits{})
	base := httpAPI(t, e)
	for name, client := range map[string]*http.Client{"HTTP/1.1": http.DefaultClient, "h2c": h2cClient(t)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), server.HTTPBodyTimeout+20*time.Second)
			defer cancel()
			body := []byte{0, 0, 0, 0, 2, '{', '}'}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/stubborn.v1.ControlService/WatchRuns", bytes.NewReader(body))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/connect+json")
			req.Header.Set("Connect-Protocol-Version", "1")
			resp, err := client.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
			r := bufio.NewReader(resp.Body)
			next := func() string {
				t.Helper()
				var head [5]byte
				_, err := io.ReadFull(r, head[:])
				require.NoError(t, err)
				payload := make([]byte, binary.BigEndian.Uint32(head[1:]))
				_, err = io.ReadFull(r, payload)
				require.NoError(t, err)
				require.Zero(t, head[0]&0x02, "ended: %s", payload)
				return string(payload)
			}
			assert.NotContains(t, next(), "runId", "following")
			time.Sleep(max(server.HTTPBodyTimeout, server.HTTP2PingAfter+server.HTTP2PingTimeout) + 2*time.Second)
			_, out := postJSON(t, base+"/stubborn.v1.ControlService/StartRun", "",
				`{"taskBrief": "late", "fallbackChain": {"chain": ["echo"]}}`)
			id := out["runId"].(string)
			for !strings.Contains(next(), id) { // the other stream's runs too
			}
		})
	}
}
