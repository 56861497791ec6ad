package delegates

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"regexp"
	"strings"
)

// Tenant is a caller of a shared Stubborn: a team, a service. Every run
// belongs to the tenant that started it and is visible to it alone. A
// caller proves which tenant it is with a bearer token or with its TLS
// client certificate. When a config names no tenant, the server asks for no
// credentials and every caller is the default tenant "".
//
//	tenants:
//	  - name: search-team
//	    token_sha256: [9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08]
//	    cert_uris: ["spiffe://example.org/search"]
//	    delegates: [search-primary, search-backup]
//	    limits: {max_concurrent_runs: 50, run_starts_per_second: 10}
type Tenant struct {
	// Name identifies the tenant: runs record it (ControlState.tenant), and
	// logs name it. Required, unique; letters, digits, '.', '_', '-', at
	// most 64 characters.
	Name string `yaml:"name"`
	// TokenSHA256 are the hex SHA-256 digests of the tenant's bearer
	// tokens (sent as `authorization: Bearer <token>`). Only digests are
	// kept: whoever reads the file cannot call as the tenant. Tokens must be
	// random and long (32 random bytes, as `stubborn token` makes), which is
	// what makes a plain SHA-256 enough.
	TokenSHA256 []string `yaml:"token_sha256,omitempty"`
	// CertCommonNames are subject common names of TLS client certificates
	// (verified against serve's -tls-client-ca) that authenticate as the
	// tenant.
	CertCommonNames []string `yaml:"cert_common_names,omitempty"`
	// CertURIs are URI subject alternative names (a SPIFFE ID, say) of TLS
	// client certificates that authenticate as the tenant.
	CertURIs []string `yaml:"cert_uris,omitempty"`
	// Delegates, when not empty, are the only delegates and presets the
	// tenant's runs may name (targets, chains, candidates, judges,
	// analysts); a preset brings what it nests. Any other name is NOT_FOUND
	// to the tenant, as if it were not in the registry.
	Delegates []string `yaml:"delegates,omitempty"`
	// Limits are the tenant's own limits. Zero fields leave only the
	// config's limits; set ones apply besides them, so a tenant gets the
	// smaller of the two.
	Limits Limits `yaml:"limits,omitempty"`
	// SpendLimit is what the tenant may spend a day or a month
	// (tenantspend.go); nil means no limit.
	SpendLimit *TenantSpendLimit `yaml:"spend_limit,omitempty"`
	// DefaultRuns makes the tenant the owner of the default tenant's
	// runs: those started while the server had no tenants, which no
	// tenant would see otherwise (one awaiting a decision included). It
	// sees, lists, follows, decides, cancels and deletes them as its own.
	// At most one tenant sets it.
	DefaultRuns bool `yaml:"default_runs,omitempty"`
	// Notify are the webhooks told when the tenant's runs wait for a
	// person (docs/notifications.md).
	Notify []NotifyTarget `yaml:"notify,omitempty"`
}

// HashToken returns the hex SHA-256 digest of a bearer token, as
// Tenant.TokenSHA256 holds it.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// tenantName is what a tenant's name may be.
var tenantName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// emptyTokenSHA256 is the digest of the empty token, which never
// authenticates anyone.
var emptyTokenSHA256 = HashToken("")

// applyTenantDefaults lower-cases the token digests.
func (c *Config) applyTenantDefaults() {
	for i := range c.Tenants {
		for j, h := range c.Tenants[i].TokenSHA256 {
			c.Tenants[i].TokenSHA256[j] = strings.ToLower(strings.TrimSpace(h))
		}
	}
}

// validateLimits reports negative limits and a rate that is not a number.
func validateLimits(where string, l Limits, bad func(string, ...any)) {
	for _, f := range []struct {
		field string
		v     int64
	}{
		{"max_brief_bytes", int64(l.MaxBriefBytes)},
		{"max_attempts", int64(l.MaxAttempts)},
		{"max_chain", int64(l.MaxChain)},
		{"max_wait", int64(l.MaxWait)},
		{"max_concurrent_runs", int64(l.MaxConcurrentRuns)},
		{"run_start_burst", int64(l.RunStartBurst)},
		{"max_watchers_per_run", int64(l.MaxWatchersPerRun)},
		{"max_concurrent_reads", int64(l.MaxConcurrentReads)},
	} {
		if f.v < 0 {
			bad("%s.%s: must not be negative", where, f.field)
		}
	}
	if r := l.RunStartsPerSecond; r < 0 || math.IsNaN(r) || math.IsInf(r, 0) {
		bad("%s.run_starts_per_second: must be a non-negative number, got %v", where, r)
	}
	if l.RunStartBurst > 0 && l.RunStartsPerSecond == 0 {
		bad("%s.run_start_burst: needs run_starts_per_second", where)
	}
	if l.MaxResultBytes < 0 || l.MaxResultBytes > maxMaxResultBytes {
		bad("%s.max_result_bytes: must be between 1 and %d, got %d", where, maxMaxResultBytes, l.MaxResultBytes)
	}
}

// validateTenants checks the tenants against each other and the registry
// (names: the delegates' and presets' names).
func (c *Config) validateTenants(names map[string]bool, bad func(string, ...any)) {
	seen := map[string]int{}
	tokens := map[string]int{}
	idents := map[string]int{}
	defaultRuns := -1
	for i, t := range c.Tenants {
		where := fmt.Sprintf("tenants[%d]", i)
		switch {
		case t.Name == "":
			bad("%s: name is empty", where)
		case !tenantName.MatchString(t.Name):
			bad("%s: name %q: use letters, digits, '.', '_' and '-' (at most 64, starting with a letter or digit)", where, t.Name)
		default:
			where = fmt.Sprintf("tenants[%d] (%q)", i, t.Name)
			if j, dup := seen[t.Name]; dup {
				bad("%s: name: duplicate of tenants[%d]", where, j)
			} else {
				seen[t.Name] = i
			}
		}
		if t.DefaultRuns {
			if defaultRuns >= 0 {
				bad("%s.default_runs: tenants[%d] has the default tenant's runs already: one tenant may", where, defaultRuns)
			}
			defaultRuns = i
		}
		if len(t.TokenSHA256)+len(t.CertCommonNames)+len(t.CertURIs) == 0 {
			bad("%s: no credential: set token_sha256, cert_common_names or cert_uris", where)
		}
		for j, h := range t.TokenSHA256 {
			field := fmt.Sprintf("%s.token_sha256[%d]", where, j)
			if b, err := hex.DecodeString(h); err != nil || len(b) != sha256.Size {
				bad("%s: must be 64 hex digits, the SHA-256 of the token (stubborn token makes one)", field)
				continue
			}
			if h == emptyTokenSHA256 {
				bad("%s: is the SHA-256 of the empty token", field)
			}
			if k, dup := tokens[h]; dup {
				bad("%s: the same token as tenants[%d]: a token names one tenant", field, k)
			}
			tokens[h] = i
		}
		for _, id := range []struct {
			field, prefix string
			list          []string
		}{{"cert_common_names", "cn:", t.CertCommonNames}, {"cert_uris", "uri:", t.CertURIs}} {
			for j, v := range id.list {
				field := fmt.Sprintf("%s.%s[%d]", where, id.field, j)
				if strings.TrimSpace(v) == "" {
					bad("%s: is empty", field)
					continue
				}
				if k, dup := idents[id.prefix+v]; dup {
					bad("%s: %q also names tenants[%d]: a certificate identity names one tenant", field, v, k)
				}
				idents[id.prefix+v] = i
			}
		}
		for j, d := range t.Delegates {
			if !names[d] {
				bad("%s.delegates[%d]: %q is not a delegate or preset in the registry", where, j, d)
			}
		}
		validateLimits(where+".limits", t.Limits, bad)
		if t.Limits.MaxResultBytes != 0 {
			bad("%s.limits.max_result_bytes: is server-wide: set it in the config's limits", where)
		}
	}
}
