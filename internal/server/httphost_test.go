package server_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/server"
)

// httpAPIHosts serves e's server over HTTP, as serve -http-listen
// -http-allowed-hosts does, until the test ends, and returns its address
// (host:port).
func httpAPIHosts(t *testing.T, e *env, hosts ...string) string {
	t.Helper()
	h, err := e.st.HTTPHandler(hosts...)
	require.NoError(t, err)
	s := httptest.NewUnstartedServer(h)
	s.Config = server.NewHTTPServer(h)
	s.Start()
	t.Cleanup(s.Close)
	u, err := url.Parse(s.URL)
	require.NoError(t, err)
	return u.Host
}

// h2cClient speaks HTTP/2 without TLS (h2c, prior knowledge), as gRPC
// clients do on a plaintext listener: the Host it is given goes as
// :authority.
func h2cClient(t *testing.T) *http.Client {
	t.Helper()
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: p}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// hostCall makes a request to addr with the given Host (and Origin, when
// not empty): a POST of ListRuns when post, else a GET of the console's
// page. It returns the status, the protocol and the body.
func hostCall(t *testing.T, c *http.Client, addr, host, origin string, post bool) (int, string, string) {
	t.Helper()
	method, path, body := http.MethodGet, "/", ""
	if post {
		method, path, body = http.MethodPost, "/stubborn.v1.ControlService/ListRuns", `{}`
	}
	req, err := http.NewRequestWithContext(testCtx(t), method, "http://"+addr+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Host = host
	if post {
		req.Header.Set("Content-Type", "application/json")
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Proto, string(b)
}

// DNS rebinding (issue 30, item 4): a page of rebind.attacker.example whose
// name now resolves to 127.0.0.1 must not reach the API nor the console,
// over HTTP/1.1 (Host) or HTTP/2 (:authority); loopback names and
// addresses, and the hosts of -http-allowed-hosts, are served.
func TestHTTPRefusesForeignHost(t *testing.T) {
	e := start(t, delegates.Limits{})
	addr := httpAPIHosts(t, e, "stubborn.example.com", "pinned.example:8443", "[fd00::7]")
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	clients := map[string]*http.Client{"HTTP/1.1": http.DefaultClient, "HTTP/2.0": h2cClient(t)}
	for proto, c := range clients {
		for _, post := range []bool{true, false} {
			what := proto + " GET /"
			if post {
				what = proto + " POST ListRuns"
			}
			for _, host := range []string{
				"rebind.attacker.example", "rebind.attacker.example:" + port, "127.0.0.1.attacker.example",
				"localhost.attacker.example:" + port, "10.0.0.5:" + port, "[fd00::8]:" + port,
				"pinned.example", "pinned.example:" + port, "stubborn.example.com.attacker.example",
			} {
				code, gotProto, body := hostCall(t, c, addr, host, "", post)
				assert.Equal(t, proto, gotProto)
				assert.Equal(t, http.StatusMisdirectedRequest, code, "%s Host %s: %s", what, host, body)
				assert.Contains(t, body, `Host "`+host+`" is not served here`, what)
				assert.Contains(t, body, "-http-allowed-hosts", what)
				assert.NotContains(t, body, "runs", what)
			}
			for _, host := range []string{
				addr, "localhost:" + port, "localhost", "LocalHost:" + port, "127.0.0.1", "127.1.2.3:" + port,
				"[::1]:" + port, "[::1]", "localhost.:" + port,
				"stubborn.example.com", "stubborn.example.com:" + port, "STUBBORN.example.com:443",
				"pinned.example:8443", "[fd00::7]:" + port,
			} {
				code, gotProto, body := hostCall(t, c, addr, host, "", post)
				assert.Equal(t, proto, gotProto)
				assert.Equal(t, http.StatusOK, code, "%s Host %s: %s", what, host, body)
			}
		}
	}
	// Anything under the listener: an asset, a path that is nothing, the
	// health service.
	for _, path := range []string{"/index.html", "/nope", "/grpc.health.v1.Health/Check"} {
		req, err := http.NewRequestWithContext(testCtx(t), http.MethodGet, "http://"+addr+path, nil)
		require.NoError(t, err)
		req.Host = "rebind.attacker.example"
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusMisdirectedRequest, resp.StatusCode, path)
	}
	// A bad -http-allowed-hosts entry is an error, not a host that
	// matches nothing.
	for _, bad := range []string{"https://stubborn.example.com", "stubborn.example.com/api", "*.example.com", "host:port"} {
		_, err := e.st.HTTPHandler(bad)
		assert.ErrorContains(t, err, "-http-allowed-hosts", bad)
	}
}

// A POST whose Origin is not the request's own host (a page of another
// site, even one whose Host passed) is refused; a browser's page of this
// listener (Origin = its origin) and a client that sends no Origin are
// served.
func TestHTTPAPIChecksOrigin(t *testing.T) {
	e := start(t, delegates.Limits{})
	addr := httpAPIHosts(t, e, "stubborn.example.com")
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	clients := map[string]*http.Client{"HTTP/1.1": http.DefaultClient, "HTTP/2.0": h2cClient(t)}
	for proto, c := range clients {
		for _, tc := range []struct{ host, origin string }{
			{addr, "http://rebind.attacker.example"},
			{addr, "http://rebind.attacker.example:" + port},
			{addr, "null"},
			{addr, "http://localhost:" + port}, // another origin, allowed Host or not
			{addr, "http://127.0.0.1"},         // another port
			{"stubborn.example.com", "https://attacker.example"},
			{"stubborn.example.com", "http://stubborn.example.com:8080"},
		} {
			code, _, body := hostCall(t, c, addr, tc.host, tc.origin, true)
			assert.Equal(t, http.StatusForbidden, code, "%s Host %s Origin %s: %s", proto, tc.host, tc.origin, body)
			assert.Contains(t, body, `Origin "`+tc.origin+`" is not this server's`, proto)
		}
		for _, tc := range []struct{ host, origin string }{
			{addr, ""},
			{addr, "http://" + addr},
			{"localhost:" + port, "http://localhost:" + port},
			{"[::1]:" + port, "http://[::1]:" + port},
			{"stubborn.example.com", "https://stubborn.example.com"},     // behind a TLS-terminating proxy
			{"stubborn.example.com:443", "https://stubborn.example.com"}, // the default port
			{"stubborn.example.com", ""},
		} {
			code, _, body := hostCall(t, c, addr, tc.host, tc.origin, true)
			assert.Equal(t, http.StatusOK, code, "%s Host %s Origin %s: %s", proto, tc.host, tc.origin, body)
			assert.Contains(t, body, `"runs"`, proto)
		}
		// A GET is not state-changing: a foreign Origin on the console's
		// page is not asked about (the browser keeps the answer from the
		// other site's page anyway).
		code, _, _ := hostCall(t, c, addr, addr, "http://rebind.attacker.example", false)
		assert.Equal(t, http.StatusOK, code, proto)
	}
}
