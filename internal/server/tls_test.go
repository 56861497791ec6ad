package server_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/server"
)

// pki is a test certificate authority writing PEM files in a temp dir.
type pki struct {
	dir    string
	caFile string
	ca     *x509.Certificate
	key    *ecdsa.PrivateKey
	pool   *x509.CertPool
}

func newPKI(t *testing.T, name string) *pki {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	p := &pki{dir: t.TempDir(), ca: ca, key: key, pool: x509.NewCertPool()}
	p.pool.AddCert(ca)
	p.caFile = p.write(t, name+"-ca.pem", "CERTIFICATE", der)
	return p
}

func (p *pki) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
	return path
}

// issue makes a leaf certificate for cn (server and client use), with the
// given SANs, and returns its files and the loaded pair.
func (p *pki) issue(t *testing.T, cn string, dns []string, ips []net.IP, uris ...string) (certFile, keyFile string, pair tls.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:    dns, IPAddresses: ips,
	}
	for _, u := range uris {
		parsed, err := url.Parse(u)
		require.NoError(t, err)
		tmpl.URIs = append(tmpl.URIs, parsed)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.key)
	require.NoError(t, err)
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	certFile = p.write(t, serial.String()+".pem", "CERTIFICATE", der)
	keyFile = p.write(t, serial.String()+"-key.pem", "PRIVATE KEY", kder)
	pair, err = tls.LoadX509KeyPair(certFile, keyFile)
	require.NoError(t, err)
	return certFile, keyFile, pair
}

// clientConn dials addr over TLS trusting roots, presenting certs.
func clientConn(t *testing.T, addr string, roots *x509.CertPool, certs ...tls.Certificate) stubbornv1.ControlServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12, RootCAs: roots, Certificates: certs,
	})))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return stubbornv1.NewControlServiceClient(conn)
}

// TestMutualTLS serves Stubborn with a client CA and delegates that want
// TLS client certificates too, all from certificates the test makes: a
// client without a certificate (or with one of another CA) is refused; a
// client certificate names its tenant, which runs a control whose delegate
// is reached over TLS.
func TestMutualTLS(t *testing.T) {
	ca := newPKI(t, "stubborn-test")
	loopback := []net.IP{net.ParseIP("127.0.0.1")}
	srvCert, srvKey, _ := ca.issue(t, "stubborn", nil, loopback)
	_, _, clientA := ca.issue(t, "client-a", nil, nil, "spiffe://stubborn.test/a")
	_, _, anonymous := ca.issue(t, "nobody", nil, nil)
	_, _, delegateCert := ca.issue(t, "delegate", []string{"delegate.test"}, nil)
	toDelegateCert, toDelegateKey, _ := ca.issue(t, "stubborn-as-client", nil, nil)

	serverTLS, err := server.ServerTLSConfig(server.TLSFiles{Cert: srvCert, Key: srvKey, ClientCA: ca.caFile})
	require.NoError(t, err)
	delegateServerTLS := &tls.Config{
		MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{delegateCert},
		ClientCAs: ca.pool, ClientAuth: tls.RequireAndVerifyClientCert,
	}
	e := startWith(t, setup{
		tenants: []delegates.Tenant{
			{Name: "a", CertURIs: []string{"spiffe://stubborn.test/a"}},
			{Name: "b", TokenSHA256: []string{delegates.HashToken(tokenB)}},
		},
		serverOptions: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(serverTLS))},
		dialOptions:   []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.pool, Certificates: []tls.Certificate{clientA}}))},
		delegateTLS: &delegateTLS{
			serve:  []grpc.ServerOption{grpc.Creds(credentials.NewTLS(delegateServerTLS))},
			config: delegates.TLS{Enabled: true, CA: ca.caFile, ServerName: "delegate.test", Cert: toDelegateCert, Key: toDelegateKey},
		},
	})
	ctx := testCtx(t)

	// Without a client certificate, or with one of another CA: refused.
	other := newPKI(t, "other")
	_, _, stranger := other.issue(t, "client-a", nil, nil, "spiffe://stubborn.test/a")
	for name, c := range map[string]stubbornv1.ControlServiceClient{
		"no certificate": clientConn(t, e.addr, ca.pool),
		"another CA's":   clientConn(t, e.addr, ca.pool, stranger),
	} {
		_, err := c.StartRun(as(ctx, tokenB), echoRun("x"))
		assert.Equal(t, codes.Unavailable, status.Code(err), "%s: %v", name, err)
	}

	// With a's certificate: tenant a, and the TLS delegate answers.
	s, err := e.client.Run(ctx, &stubbornv1.RunRequest{TaskBrief: "over tls", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}})
	require.NoError(t, err)
	evs := collect(t, s)
	final := lastState(t, evs)
	require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, final.GetStatus(), final.GetStatusReason())
	assert.Equal(t, "echo: over tls", final.GetResult().GetText())
	assert.Equal(t, "a", final.GetTenant())
	list, err := e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{})
	require.NoError(t, err)
	assert.Len(t, list.GetRuns(), 1, "the refused clients started nothing")

	// A certificate of no tenant: a token decides, else UNAUTHENTICATED.
	anon := clientConn(t, e.addr, ca.pool, anonymous)
	_, err = anon.ListRuns(ctx, &stubbornv1.ListRunsRequest{})
	assert.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	res, err := anon.StartRun(as(ctx, tokenB), echoRun("x"))
	require.NoError(t, err)
	assert.Equal(t, "b", res.GetState().GetTenant())
	_, err = e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: res.GetRunId()})
	assert.Equal(t, codes.NotFound, status.Code(err), "a does not see b's run")
}

func TestServerTLSConfig(t *testing.T) {
	ca := newPKI(t, "c")
	cert, key, _ := ca.issue(t, "s", nil, nil)
	c, err := server.ServerTLSConfig(server.TLSFiles{Cert: cert, Key: key})
	require.NoError(t, err)
	assert.Equal(t, tls.NoClientCert, c.ClientAuth)
	c, err = server.ServerTLSConfig(server.TLSFiles{Cert: cert, Key: key, ClientCA: ca.caFile})
	require.NoError(t, err)
	assert.Equal(t, tls.RequireAndVerifyClientCert, c.ClientAuth)
	_, err = server.ServerTLSConfig(server.TLSFiles{Cert: cert})
	assert.Error(t, err)
	_, err = server.ServerTLSConfig(server.TLSFiles{Cert: cert, Key: key, ClientCA: key})
	assert.ErrorContains(t, err, "no PEM certificate")
}

func TestPlaintextOnlyOnLoopback(t *testing.T) {
	for addr, ok := range map[string]bool{
		"127.0.0.1:7300": true, "127.0.0.9:1": true, "[::1]:7300": true,
		"0.0.0.0:7300": false, "[::]:7300": false, "10.1.2.3:7300": false,
	} {
		a, err := net.ResolveTCPAddr("tcp", addr)
		require.NoError(t, err)
		err = server.CheckPlaintext(a, false)
		if ok {
			assert.NoError(t, err, addr)
		} else {
			assert.ErrorContains(t, err, "-insecure", addr)
		}
		assert.NoError(t, server.CheckPlaintext(a, true), addr)
	}
}

// TestPlaintextListenCheckedBeforeBinding: the -listen address is checked
// as given, before anything is bound, with CheckPlaintext's rule: an empty
// host, 0.0.0.0 or :: is every interface, a name must resolve to loopback
// addresses only; the error names the address as given.
func TestPlaintextListenCheckedBeforeBinding(t *testing.T) {
	t.Parallel()
	hosts := map[string][]netip.Addr{
		"lo.test":   {netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")},
		"db.test":   {netip.MustParseAddr("10.1.2.3")},
		"both.test": {netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.0.0.1")},
		"none.test": {},
	}
	var asked []string
	lookup := func(_ context.Context, network, host string) ([]netip.Addr, error) {
		asked = append(asked, host)
		ips, ok := hosts[host]
		if !ok {
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		return ips, nil
	}
	ctx := context.Background()
	for listen, want := range map[string]string{
		"127.0.0.1:7300": "", "127.0.0.9:1": "", "[::1]:7300": "", "[::ffff:127.0.0.1]:7300": "", "lo.test:7300": "",
		"0.0.0.0:7300":      "refusing to serve plaintext on 0.0.0.0:7300, which is not a loopback address (every interface)",
		"[::]:7300":         "refusing to serve plaintext on [::]:7300, which is not a loopback address (every interface)",
		":7300":             "refusing to serve plaintext on :7300, which is not a loopback address (every interface)",
		"10.1.2.3:7300":     "refusing to serve plaintext on 10.1.2.3:7300, which is not a loopback address: ",
		"[fe80::1%lo]:7300": "refusing to serve plaintext on [fe80::1%lo]:7300, which is not a loopback address",
		"db.test:7300":      "refusing to serve plaintext on db.test:7300, which is not a loopback address (db.test resolves to 10.1.2.3)",
		"both.test:7300":    "(both.test resolves to 10.0.0.1)",
		"none.test:7300":    "refusing to serve plaintext on none.test:7300: none.test resolves to no address",
		"nowhere.test:7300": "refusing to serve plaintext on nowhere.test:7300: cannot tell whether it is a loopback address",
		"7300":              "listen address \"7300\"",
	} {
		err := server.CheckPlaintextListenWith(ctx, listen, false, lookup)
		if want == "" {
			assert.NoError(t, err, listen)
		} else {
			assert.ErrorContains(t, err, want, listen)
		}
		assert.NoError(t, server.CheckPlaintextListenWith(ctx, listen, true, lookup), "%s with -insecure", listen)
	}
	assert.ElementsMatch(t, []string{"lo.test", "db.test", "both.test", "none.test", "nowhere.test"}, asked, "only names are resolved, and only without -insecure")
	// The real resolver is not needed for addresses.
	assert.NoError(t, server.CheckPlaintextListen(ctx, "127.0.0.1:0", false))
	assert.ErrorContains(t, server.CheckPlaintextListen(ctx, "0.0.0.0:0", false), "on 0.0.0.0:0,")
}
