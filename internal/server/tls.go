package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
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
	return plaintextRefused(addr.String(), "")
}

// CheckPlaintextListen is CheckPlaintext for listen, a host:port to listen
// on (serve -listen), before anything is bound, naming listen as given. An
// empty host (":7300"), 0.0.0.0 or :: is every interface: not loopback. A
// name is resolved (net.DefaultResolver) and every address it has must be
// loopback; one that cannot be resolved is refused.
func CheckPlaintextListen(ctx context.Context, listen string, insecure bool) error {
	return checkPlaintextListen(ctx, listen, insecure, net.DefaultResolver.LookupNetIP)
}

// checkPlaintextListen is CheckPlaintextListen resolving names with lookup
// (net.Resolver.LookupNetIP).
func checkPlaintextListen(ctx context.Context, listen string, insecure bool, lookup func(ctx context.Context, network, host string) ([]netip.Addr, error)) error {
	if insecure {
		return nil
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("listen address %q: %w", listen, err)
	}
	if host == "" {
		return plaintextRefused(listen, "every interface")
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Unmap().IsLoopback() {
			return nil
		}
		if ip.IsUnspecified() {
			return plaintextRefused(listen, "every interface")
		}
		return plaintextRefused(listen, "")
	}
	ips, err := lookup(ctx, "ip", host)
	if err != nil {
		return fmt.Errorf("refusing to serve plaintext on %s: cannot tell whether it is a loopback address: %w", listen, err)
	}
	if len(ips) == 0 {
		return fmt.Errorf("refusing to serve plaintext on %s: %s resolves to no address", listen, host)
	}
	for _, ip := range ips {
		if !ip.Unmap().IsLoopback() {
			return plaintextRefused(listen, fmt.Sprintf("%s resolves to %s", host, ip))
		}
	}
	return nil
}

// plaintextRefused is CheckPlaintext's error for addr, with why it is not
// loopback when there is more to say than the address.
func plaintextRefused(addr, why string) error {
	if why != "" {
		why = " (" + why + ")"
	}
	return fmt.Errorf("refusing to serve plaintext on %s, which is not a loopback address%s: "+
		"give -tls-cert and -tls-key (and -tls-client-ca for mutual TLS), listen on 127.0.0.1, "+
		"or pass -insecure to serve plaintext anyway", addr, why)
}
