package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/server"
)

// securityFlags are serve's TLS, plaintext and reflection flags.
type securityFlags struct {
	cert, key, clientCA string
	insecure            bool
	reflection          bool
	// tc is the TLS config serverOptions built, for the HTTP listener.
	tc *tls.Config
}

func (f *securityFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.cert, "tls-cert", "", "serve TLS with this PEM certificate (chain); needs -tls-key")
	fs.StringVar(&f.key, "tls-key", "", "PEM private key of -tls-cert")
	fs.StringVar(&f.clientCA, "tls-client-ca", "", "mutual TLS: require client certificates that chain to these PEM roots")
	fs.BoolVar(&f.insecure, "insecure", false, "serve plaintext even on an address that is not loopback (without -tls-cert, -listen, -http-listen and -pprof-listen must be loopback otherwise)")
	fs.BoolVar(&f.reflection, "reflection", true, "serve gRPC reflection (it asks for credentials as the API does when the config has tenants)")
}

func (f *securityFlags) tls() bool { return f.cert != "" || f.key != "" }

func (f *securityFlags) describe() string {
	switch {
	case f.clientCA != "":
		return "mutual"
	case f.tls():
		return "on"
	}
	return "off"
}

// serverOptions returns the gRPC server's credentials, after checking that
// the flags and the config's tenants fit together.
func (f *securityFlags) serverOptions(cfg *delegates.Config) ([]grpc.ServerOption, error) {
	if !f.tls() {
		if f.clientCA != "" {
			return nil, errors.New("-tls-client-ca needs -tls-cert and -tls-key")
		}
	}
	if err := f.checkTenants(cfg); err != nil {
		return nil, err
	}
	if !f.tls() {
		return nil, nil
	}
	tc, err := server.ServerTLSConfig(server.TLSFiles{Cert: f.cert, Key: f.key, ClientCA: f.clientCA})
	if err != nil {
		return nil, err
	}
	f.tc = tc
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(tc))}, nil
}

// checkTenants checks that the config's tenants can authenticate with
// these flags: one that names client certificates needs -tls-client-ca.
func (f *securityFlags) checkTenants(cfg *delegates.Config) error {
	if f.clientCA != "" {
		return nil
	}
	for i, t := range cfg.Tenants {
		if len(t.CertCommonNames)+len(t.CertURIs) > 0 {
			return fmt.Errorf("tenants[%d] (%q) authenticates by client certificate, which needs -tls-client-ca", i, t.Name)
		}
	}
	return nil
}

// clientOptions are the dial options of the CLI's clients, from the
// environment: STUBBORN_TLS_CA (PEM roots; TLS with the system roots when
// only other TLS variables are set), STUBBORN_TLS_SERVER_NAME,
// STUBBORN_TLS_CERT and STUBBORN_TLS_KEY (a client certificate, for mutual
// TLS), and STUBBORN_TOKEN (a bearer token, sent as authorization: Bearer;
// over plaintext only to a loopback address).
func clientOptions(addr string, getenv func(string) string) ([]grpc.DialOption, error) {
	ca, name := getenv("STUBBORN_TLS_CA"), getenv("STUBBORN_TLS_SERVER_NAME")
	cert, key := getenv("STUBBORN_TLS_CERT"), getenv("STUBBORN_TLS_KEY")
	token := getenv("STUBBORN_TOKEN")
	secure := ca != "" || name != "" || cert != "" || key != ""
	var opts []grpc.DialOption
	if !secure {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	} else {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: name}
		if ca != "" {
			pem, err := os.ReadFile(ca)
			if err != nil {
				return nil, fmt.Errorf("STUBBORN_TLS_CA: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("STUBBORN_TLS_CA: %s holds no PEM certificate", ca)
			}
		}
		if cert != "" || key != "" {
			c, err := tls.LoadX509KeyPair(cert, key)
			if err != nil {
				return nil, fmt.Errorf("STUBBORN_TLS_CERT, STUBBORN_TLS_KEY: %w", err)
			}
			tc.Certificates = []tls.Certificate{c}
		}
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	}
	if token != "" {
		if !secure && !loopbackTarget(addr) {
			return nil, fmt.Errorf("refusing to send STUBBORN_TOKEN in plaintext to %s: set STUBBORN_TLS_CA (or another STUBBORN_TLS_* variable) for TLS", addr)
		}
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(token)))
	}
	return opts, nil
}

// loopbackTarget reports whether a host:port target is on this machine.
func loopbackTarget(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// bearer sends a bearer token with every call.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity is false so that a token may go to a loopback
// server in plaintext; clientOptions refuses any other plaintext target.
func (bearer) RequireTransportSecurity() bool { return false }
