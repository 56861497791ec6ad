package delegates_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/stubbornhq/stubborn/internal/delegates"
)

func TestParseTenantsAndTLS(t *testing.T) {
	cfg, err := delegates.Parse([]byte(tenantsConfig))
	require.NoError(t, err)
	assert.Equal(t, 100, cfg.Limits.MaxConcurrentRuns)
	assert.InDelta(t, 20.5, cfg.Limits.RunStartsPerSecond, 0)
	assert.Equal(t, 40, cfg.Limits.RunStartBurst)
	assert.Equal(t, 8, cfg.Limits.MaxWatchersPerRun)
	assert.Equal(t, delegates.TLS{Enabled: true, CA: "ca.pem", ServerName: "echo.internal", Cert: "c.pem", Key: "k.pem"}, cfg.Delegates[0].TLS)
	assert.Equal(t, delegates.TLS{}, cfg.Delegates[1].TLS)
	assert.Equal(t, delegates.TLS{Enabled: true}, cfg.Delegates[2].TLS)
	require.Len(t, cfg.Tenants, 2)
	a := cfg.Tenants[0]
	assert.Equal(t, "team-a", a.Name)
	assert.Equal(t, []string{delegates.HashToken("test")}, a.TokenSHA256, "digests are lower-cased")
	assert.Equal(t, []string{"echo", "twice"}, a.Delegates)
	assert.Equal(t, delegates.Limits{MaxConcurrentRuns: 3, RunStartsPerSecond: 1, MaxBriefBytes: 100}, a.Limits, "a tenant's unset limits stay unset")
	assert.Equal(t, []string{"b-client"}, cfg.Tenants[1].CertCommonNames)
	assert.Equal(t, []string{"spiffe://example.org/b"}, cfg.Tenants[1].CertURIs)

	// The boolean form comes back out as it went in.
	out, err := yaml.Marshal(cfg.Delegates[2])
	require.NoError(t, err)
	assert.Contains(t, string(out), "tls: true")
}

func TestParseTenantErrors(t *testing.T) {
	h := delegates.HashToken("t1")
	for name, tt := range map[string]struct{ src, want string }{
		"no name":        {"tenants: [{token_sha256: [" + h + "]}]", "tenants[0]: name is empty"},
		"bad name":       {"tenants: [{name: 'a b', token_sha256: [" + h + "]}]", `tenants[0]: name "a b"`},
		"duplicate":      {"tenants: [{name: a, token_sha256: [" + h + "]}, {name: a, cert_uris: [x]}]", `tenants[1] ("a"): name: duplicate of tenants[0]`},
		"no credential":  {"tenants: [{name: a}]", `tenants[0] ("a"): no credential`},
		"not a digest":   {"tenants: [{name: a, token_sha256: [secret]}]", `tenants[0] ("a").token_sha256[0]: must be 64 hex digits`},
		"empty token":    {"tenants: [{name: a, token_sha256: [" + delegates.HashToken("") + "]}]", "SHA-256 of the empty token"},
		"shared token":   {"tenants: [{name: a, token_sha256: [" + h + "]}, {name: b, token_sha256: [" + strings.ToUpper(h) + "]}]", "the same token as tenants[0]"},
		"shared cert":    {"tenants: [{name: a, cert_uris: [u]}, {name: b, cert_uris: [u]}]", `"u" also names tenants[0]`},
		"unknown deleg.": {"tenants: [{name: a, cert_common_names: [c], delegates: [nope]}]", `tenants[0] ("a").delegates[0]: "nope" is not a delegate or preset`},
		"negative":       {"tenants: [{name: a, cert_common_names: [c], limits: {max_concurrent_runs: -1}}]", `tenants[0] ("a").limits.max_concurrent_runs: must not be negative`},
		"nan rate":       {"limits: {run_starts_per_second: .nan}", "limits.run_starts_per_second: must be a non-negative number"},
		"two own the default runs": {"tenants: [{name: a, cert_uris: [u], default_runs: true}, {name: b, cert_uris: [v], default_runs: true}]",
			`tenants[1] ("b").default_runs: tenants[0] has the default tenant's runs already: one tenant may`},
		"inf rate":      {"limits: {run_starts_per_second: .inf}", "limits.run_starts_per_second: must be a non-negative number"},
		"burst no rate": {"limits: {run_start_burst: 3}", "limits.run_start_burst: needs run_starts_per_second"},
		"unknown key":   {"tenants:\n  - name: a\n    tokens: [x]\n", `tenants[0] ("a").tokens: unknown field (line 3)`},
		"tls cert only": {"delegates: [{name: d, target: x, tls: {cert: c.pem}}]", `delegates[0] ("d"): tls: cert and key go together`},
		"tls bad key":   {"delegates:\n  - name: d\n    target: x\n    tls:\n      ca: c.pem\n      sni: x\n", `delegates[0] ("d").tls.sni: unknown field (line 6)`},
		"tls not bool":  {"delegates: [{name: d, target: x, tls: maybe}]", "tls must be true, false or a mapping"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := delegates.Parse([]byte(tt.src))
			require.ErrorIs(t, err, delegates.ErrInvalidConfig)
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

func TestLoadResolvesTLSPathsAgainstTheConfigsDirectory(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "stubborn.yaml")
	require.NoError(t, os.WriteFile(path, []byte("delegates:\n  - {name: d, target: x:1, tls: {ca: certs/ca.pem, cert: /abs/c.pem, key: k.pem}}\n"), 0o600))
	cfg, err := delegates.Load(path)
	require.NoError(t, err)
	assert.Equal(t, delegates.TLS{Enabled: true, CA: filepath.Join(dir, "certs/ca.pem"), Cert: "/abs/c.pem", Key: filepath.Join(dir, "k.pem")}, cfg.Delegates[0].TLS)

	// The pool reads the files when it is built.
	_, err = delegates.NewPool(cfg)
	assert.ErrorContains(t, err, `delegate "d": tls.ca`)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "bad.pem"), []byte("not pem"), 0o600))
	_, err = delegates.NewPool(&delegates.Config{Delegates: []delegates.Delegate{{Name: "d", Target: "x:1", TLS: delegates.TLS{Enabled: true, CA: filepath.Join(dir, "bad.pem")}}}})
	assert.ErrorContains(t, err, "holds no PEM certificate")
}
