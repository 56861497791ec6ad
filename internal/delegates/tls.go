package delegates

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"

	"go.yaml.in/yaml/v3"
)

// TLS is how Stubborn connects to a delegate over TLS. The zero value is
// plaintext. In YAML it is either a boolean, `tls: true` meaning TLS with
// the system's root certificates (as before there was anything more to
// say), or a mapping, which turns TLS on and sets the rest:
//
//	tls:
//	  ca: certs/delegates-ca.pem      # roots to verify the delegate; default: the system's
//	  server_name: search.internal    # name to verify (and send as SNI); default: the target's host
//	  cert: certs/stubborn.pem        # client certificate, for delegates that require mTLS
//	  key: certs/stubborn-key.pem     # its private key (cert and key go together)
//
// Relative paths are relative to the config file's directory (see load).
type TLS struct {
	// Enabled turns TLS on; every other field needs it.
	Enabled bool
	// CA is a PEM file of the root certificates that verify the delegate.
	// Empty means the system's roots.
	CA string
	// ServerName is the name the delegate's certificate must carry, also
	// sent as SNI. Empty means the host of the target.
	ServerName string
	// Cert and Key are PEM files of a client certificate and its key,
	// presented to delegates that verify their clients. Both or neither.
	Cert, Key string
}

// tlsKeys are the keys of the mapping form, in the order they are written.
var tlsKeys = []string{"ca", "server_name", "cert", "key"}

// UnmarshalYAML reads `tls: true|false` or the mapping form.
func (t *TLS) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		var on bool
		if err := n.Decode(&on); err != nil {
			return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: tls must be true, false or a mapping with %v", n.Line, tlsKeys)}}
		}
		*t = TLS{Enabled: on}
		return nil
	case yaml.MappingNode:
		var errs []string
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			known := false
			for _, want := range tlsKeys {
				known = known || k.Value == want
			}
			if !known {
				// Worded like yaml's own, so that decodeError names the field.
				errs = append(errs, fmt.Sprintf("line %d: field %s not found in type delegates.TLS", k.Line, k.Value))
			}
		}
		if len(errs) > 0 {
			return &yaml.TypeError{Errors: errs}
		}
		var m struct {
			CA         string `yaml:"ca"`
			ServerName string `yaml:"server_name"`
			Cert       string `yaml:"cert"`
			Key        string `yaml:"key"`
		}
		if err := n.Decode(&m); err != nil {
			return err
		}
		*t = TLS{Enabled: true, CA: m.CA, ServerName: m.ServerName, Cert: m.Cert, Key: m.Key}
		return nil
	}
	return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: tls must be true, false or a mapping with %v", n.Line, tlsKeys)}}
}

// MarshalYAML writes the boolean form when it says everything.
func (t TLS) MarshalYAML() (any, error) {
	if t == (TLS{Enabled: t.Enabled}) {
		return t.Enabled, nil
	}
	return map[string]string{"ca": t.CA, "server_name": t.ServerName, "cert": t.Cert, "key": t.Key}, nil
}

// IsZero reports plaintext, for omitempty.
func (t TLS) IsZero() bool { return t == TLS{} }

// check returns what is wrong with t, for the config's validation.
func (t TLS) check() []string {
	var bad []string
	if (t.Cert == "") != (t.Key == "") {
		bad = append(bad, "tls: cert and key go together: set both or neither")
	}
	return bad
}

// resolve makes t's relative paths relative to dir.
func (t *TLS) resolve(dir string) {
	for _, p := range []*string{&t.CA, &t.Cert, &t.Key} {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
}

// clientConfig returns the crypto/tls configuration of a connection to the
// delegate, reading the files; nil for plaintext.
func (t TLS) clientConfig() (*tls.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		if err != nil {
			return nil, fmt.Errorf("tls.ca: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls.ca: %s holds no PEM certificate", t.CA)
		}
	}
	if t.Cert != "" || t.Key != "" {
		cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			return nil, fmt.Errorf("tls.cert, tls.key: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}
