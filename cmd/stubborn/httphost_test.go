package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hostStatus POSTs ListRuns to the listener at addr with the given Host
// and returns the status and body.
func hostStatus(t *testing.T, addr, host string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/stubborn.v1.ControlService/ListRuns", strings.NewReader(`{}`))
	require.NoError(t, err)
	req.Host = host
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// serve's HTTP listener answers loopback Hosts, -http-allowed-hosts' and
// its own address's; on every interface (0.0.0.0) that is all, and any
// other Host is refused, naming the flag (issue 30 item 4).
func TestServeHTTPAllowedHosts(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "stubborn.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("delegates: []\n"), 0o600))

	code, err := run(context.Background(), []string{"serve", "-memory", "-config", cfg, "-listen", "127.0.0.1:0",
		"-http-listen", "127.0.0.1:0", "-http-allowed-hosts", "stubborn.example.com,https://stubborn.example.com"}, &bytes.Buffer{})
	assert.Equal(t, 2, code)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `-http-allowed-hosts: "https://stubborn.example.com" is not a host`)

	s := startServer(t, "-memory", "-config", cfg, "-listen", "127.0.0.1:0", "-insecure",
		"-http-listen", "0.0.0.0:0", "-http-allowed-hosts", " stubborn.example.com, pinned.example:8443")
	u, err := url.Parse(s.loggedURL(t, "http api serving"))
	require.NoError(t, err)
	addr := net.JoinHostPort("127.0.0.1", u.Port())
	for _, host := range []string{addr, "localhost:" + u.Port(), "stubborn.example.com", "pinned.example:8443"} {
		code, body := hostStatus(t, addr, host)
		assert.Equal(t, http.StatusOK, code, "Host %s: %s", host, body)
	}
	refused := []string{"rebind.attacker.example", "rebind.attacker.example:" + u.Port(), "pinned.example"}
	if ip := nonLoopbackIP(); ip != "" {
		// Bound on every interface, the machine's own address is not
		// implied: list it.
		refused = append(refused, net.JoinHostPort(ip, u.Port()))
	}
	for _, host := range refused {
		code, body := hostStatus(t, addr, host)
		assert.Equal(t, http.StatusMisdirectedRequest, code, "Host %s: %s", host, body)
		assert.Contains(t, body, "-http-allowed-hosts", host)
	}

	// On an address of its own, that address is served without listing
	// it.
	ip := nonLoopbackIP()
	if ip == "" {
		t.Log("no address but loopback here: the listen address's own host is not tried")
		return
	}
	s = startServer(t, "-memory", "-config", cfg, "-listen", "127.0.0.1:0", "-insecure", "-http-listen", net.JoinHostPort(ip, "0"))
	u, err = url.Parse(s.loggedURL(t, "http api serving"))
	require.NoError(t, err)
	code, body := hostStatus(t, u.Host, u.Host)
	assert.Equal(t, http.StatusOK, code, "Host %s: %s", u.Host, body)
	code, body = hostStatus(t, u.Host, "rebind.attacker.example:"+u.Port())
	assert.Equal(t, http.StatusMisdirectedRequest, code, body)
}

// nonLoopbackIP returns an IPv4 address of this machine that is not
// loopback, or "".
func nonLoopbackIP() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	return ""
}
