package delegates_test

import (
	"errors"
	"os"
	"testing"

	"github.com/stubbornhq/stubborn/internal/delegates"
)

const tenantsConfig = `
limits: {max_concurrent_runs: 100, run_starts_per_second: 20.5, run_start_burst: 40, max_watchers_per_run: 8}
delegates:
  - name: echo
    target: 127.0.0.1:7400
    tls: {ca: ca.pem, server_name: echo.internal, cert: c.pem, key: k.pem}
  - {name: plain, target: "127.0.0.1:7401", tls: false}
  - {name: roots, target: "dns:///x:443", tls: true}
presets:
  - name: twice
    retry: {target: echo, attempts: 1, on_exhausted: fail}
tenants:
  - name: team-a
    token_sha256: [9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08]
    delegates: [echo, twice]
    limits: {max_concurrent_runs: 3, run_starts_per_second: 1, max_brief_bytes: 100}
  - name: team-b
    cert_common_names: [b-client]
    cert_uris: ["spiffe://example.org/b"]
`

// FuzzParse parses any config file: never a panic; every refusal wraps
// ErrInvalidConfig; an accepted config has unique delegate and tenant
// names, delegates with somewhere to call (a gRPC target, or an http,
// openai or anthropic endpoint), limits that are not negative, and tenants with credentials.
func FuzzParse(f *testing.F) {
	for _, s := range []string{fullConfig, tenantsConfig, "", "limits:\n  max_attempt: 3\n",
		"delegates:\n  - {name: a, target: x:1}\n  - {name: a, target: x:3}\n",
		"tenants:\n  - {name: t, token_sha256: [zz]}\n", "tenants: [{name: t}]\n",
		"delegates: [{name: a, target: b, tls: {ca: x, bogus: 1}}]\n",
		"limits: {run_starts_per_second: .nan}\n", "a: &a [*a, *a]\n",
	} {
		f.Add([]byte(s))
	}
	if b, err := os.ReadFile("../../stubborn.yaml"); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		cfg, err := delegates.Parse(b)
		if err != nil {
			if !errors.Is(err, delegates.ErrInvalidConfig) {
				t.Fatalf("error does not wrap ErrInvalidConfig: %v", err)
			}
			return
		}
		names := map[string]bool{}
		for _, d := range cfg.Delegates {
			if d.Name == "" || d.Target == "" && d.HTTP == nil && d.OpenAI == nil && d.Anthropic == nil || names[d.Name] || d.Timeout <= 0 {
				t.Fatalf("accepted delegate %+v", d)
			}
			names[d.Name] = true
		}
		check := func(l delegates.Limits) {
			if l.MaxBriefBytes < 0 || l.MaxAttempts < 0 || l.MaxChain < 0 || l.MaxWait < 0 || l.MaxConcurrentRuns < 0 ||
				!(l.RunStartsPerSecond >= 0) || l.RunStartBurst < 0 || l.MaxWatchersPerRun < 0 {
				t.Fatalf("accepted limits %+v", l)
			}
		}
		check(cfg.Limits)
		tenants := map[string]bool{}
		for _, tn := range cfg.Tenants {
			if tn.Name == "" || tenants[tn.Name] || len(tn.TokenSHA256)+len(tn.CertCommonNames)+len(tn.CertURIs) == 0 {
				t.Fatalf("accepted tenant %+v", tn)
			}
			tenants[tn.Name] = true
			check(tn.Limits)
		}
	})
}
