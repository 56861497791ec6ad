package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/internal/delegates"
)

func TestTokenCommand(t *testing.T) {
	var out bytes.Buffer
	code, err := cmdToken(nil, strings.NewReader(""), &out)
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 2)
	tok := strings.TrimSpace(strings.TrimPrefix(lines[0], "token:"))
	sum := strings.TrimSpace(strings.TrimPrefix(lines[1], "token_sha256:"))
	assert.GreaterOrEqual(t, len(tok), 43, "32 random bytes")
	assert.Equal(t, delegates.HashToken(tok), sum)

	out.Reset()
	code, err = cmdToken([]string{"-hash"}, strings.NewReader(tok+"\n\n"), &out)
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	assert.Equal(t, sum+"\n", out.String())
	code, _ = cmdToken([]string{"-hash"}, strings.NewReader(""), &out)
	assert.Equal(t, 2, code)
}

func TestServeRefusesSecurityFlagsThatDoNotFit(t *testing.T) {
	dir := t.TempDir()
	withCerts := filepath.Join(dir, "certs.yaml")
	require.NoError(t, os.WriteFile(withCerts, []byte("tenants: [{name: a, cert_uris: [\"spiffe://x/a\"]}]\n"), 0o600))
	empty := filepath.Join(dir, "empty.yaml")
	require.NoError(t, os.WriteFile(empty, []byte("delegates: []\n"), 0o600))
	for name, tt := range map[string]struct {
		args []string
		want string
	}{
		"client CA without cert": {[]string{"-config", empty, "-tls-client-ca", "ca.pem"}, "-tls-client-ca needs -tls-cert"},
		"cert tenants, no mTLS":  {[]string{"-config", withCerts}, "needs -tls-client-ca"},
		"cert without key":       {[]string{"-config", empty, "-tls-cert", "c.pem"}, "certificate and a key"},
		"missing files":          {[]string{"-config", empty, "-tls-cert", "c.pem", "-tls-key", "k.pem"}, "TLS certificate and key"},
	} {
		t.Run(name, func(t *testing.T) {
			code, err := run(context.Background(), append([]string{"serve", "-memory", "-listen", "127.0.0.1:0"}, tt.args...), &bytes.Buffer{})
			assert.Equal(t, 2, code)
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

// TestServeRefusesPlaintextOffLoopbackBeforeBinding: serve -listen
// 0.0.0.0:P (or :P) without TLS or -insecure is refused naming the address
// as given, before anything is bound: the test holds 127.0.0.1:P, so a
// bind of every interface on P would fail "address already in use"
// instead (it used to bind, then refuse naming [::]:P).
func TestServeRefusesPlaintextOffLoopbackBeforeBinding(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty.yaml")
	require.NoError(t, os.WriteFile(empty, []byte("delegates: []\n"), 0o600))
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer held.Close()
	port := held.Addr().(*net.TCPAddr).Port
	for _, listen := range []string{fmt.Sprintf("0.0.0.0:%d", port), fmt.Sprintf(":%d", port)} {
		code, err := run(context.Background(), []string{"serve", "-memory", "-config", empty, "-listen", listen}, &bytes.Buffer{})
		assert.Equal(t, 2, code, listen)
		require.Error(t, err, listen)
		assert.Contains(t, err.Error(), "refusing to serve plaintext on "+listen+", which is not a loopback address")
		assert.NotContains(t, err.Error(), "[::]")
		assert.NotContains(t, err.Error(), "in use", "serve tried to bind %s", listen)
	}
}

func TestClientOptionsFromTheEnvironment(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	opts, err := clientOptions("127.0.0.1:7300", env(nil))
	require.NoError(t, err)
	assert.Len(t, opts, 1, "plaintext, no token")
	opts, err = clientOptions("localhost:7300", env(map[string]string{"STUBBORN_TOKEN": "t"}))
	require.NoError(t, err)
	assert.Len(t, opts, 2, "a token to loopback in plaintext")
	_, err = clientOptions("stubborn.example:7300", env(map[string]string{"STUBBORN_TOKEN": "t"}))
	assert.ErrorContains(t, err, "refusing to send STUBBORN_TOKEN in plaintext")
	opts, err = clientOptions("stubborn.example:7300", env(map[string]string{"STUBBORN_TOKEN": "t", "STUBBORN_TLS_SERVER_NAME": "stubborn.example"}))
	require.NoError(t, err)
	assert.Len(t, opts, 2, "TLS with the system roots, and the token")
	_, err = clientOptions("x:1", env(map[string]string{"STUBBORN_TLS_CA": filepath.Join(t.TempDir(), "none.pem")}))
	assert.ErrorContains(t, err, "STUBBORN_TLS_CA")
}
