package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
)

// TLSFiles are the PEM files of the server's TLS.
type TLSFiles struct {
	// Cert and Key are the server's certificate (chain) and private key.
	// Required.
	Cert, Key string
	// ClientCA, when set, turns on mutual TLS: every client must present a
	// certificate that chains to one of these roots, or the handshake
	// fails. Its identity (subject CN, URI SANs) may then name a tenant.
	ClientCA string
}

// ServerTLSConfig returns the crypto/tls configuration for f: TLS 1.2 or
// later, and with a ClientCA, client certificates required and verified.
// Pass it to grpc.Creds(credentials.NewTLS(...)).
func ServerTLSConfig(f TLSFiles) (*tls.Config, error) {
	if f.Cert == "" || f.Key == "" {
		return nil, errors.New("TLS needs both a certificate and a key")
	}
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate and key: %w", err)
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if f.ClientCA != "" {
		pem, err := os.ReadFile(f.ClientCA)
		if err != nil {
			return nil, fmt.Errorf("TLS client CA: %w", err)
		}
		c.ClientCAs = x509.NewCertPool()
		if !c.ClientCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("TLS client CA: %s holds no PEM certificate", f.ClientCA)
		}
		c.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return c, nil
}

// CheckPlaintext refuses to serve without TLS on addr unless addr is a
// loopback address (127.0.0.0/8, ::1), which only this machine can reach,
// or insecure says the operator means it (a TLS-terminating proxy on the
// same network namespace, say). A wildcard address (0.0.0.0, ::) is not
// loopback: it listens on every interface.
func CheckPlaintext(addr net.Addr, insecure bool) error {
	if insecure {
		return nil
	}
	if tcp, ok := addr.(*net.TCPAddr); ok && tcp.IP.IsLoopback() {
		return nil
	}
	return fmt.Errorf("refusing to serve plaintext on %s, which is not a loopback address: "+
		"give -tls-cert and -tls-key (and -tls-client-ca for mutual TLS), listen on 127.0.0.1, "+
		"or pass -insecure to serve plaintext anyway", addr)
}
