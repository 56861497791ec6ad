package delegates_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/internal/delegates"
)

func TestParseTenantSpendLimits(t *testing.T) {
	cfg, err := delegates.Parse([]byte(`
tenants:
  - {name: acme, cert_uris: [a], spend_limit: {max_cost: 10, period: day}}
  - {name: beta, cert_uris: [b], spend_limit: {max_cost: 250.5, period: month}}
  - {name: free, cert_uris: [c]}
`))
	require.NoError(t, err)
	assert.Equal(t, &delegates.TenantSpendLimit{MaxCost: 10, Period: "day"}, cfg.TenantSpend("acme"))
	assert.Equal(t, &delegates.TenantSpendLimit{MaxCost: 250.5, Period: "month"}, cfg.TenantSpend("beta"))
	assert.Nil(t, cfg.TenantSpend("free"))
	assert.Nil(t, cfg.TenantSpend("nobody"))
	assert.Nil(t, cfg.TenantSpend(""), "a config with tenants has no default tenant")

	cfg, err = delegates.Parse([]byte("spend_limit: {max_cost: 3, period: month}\n"))
	require.NoError(t, err)
	assert.Equal(t, &delegates.TenantSpendLimit{MaxCost: 3, Period: "month"}, cfg.TenantSpend(""), "the default tenant's")
}

func TestParseTenantSpendLimitErrors(t *testing.T) {
	for name, tt := range map[string]struct{ src, want string }{
		"zero":        {"tenants: [{name: a, cert_uris: [u]}, {name: b, cert_uris: [v], spend_limit: {max_cost: 0, period: day}}]", "tenants[1].spend_limit.max_cost: must be more than 0 and at most 1e+12 (got 0)"},
		"negative":    {"tenants: [{name: a, cert_uris: [u], spend_limit: {max_cost: -1, period: day}}]", "tenants[0].spend_limit.max_cost: must be more than 0"},
		"nan":         {"tenants: [{name: a, cert_uris: [u], spend_limit: {max_cost: .nan, period: day}}]", "tenants[0].spend_limit.max_cost: must be more than 0"},
		"too much":    {"spend_limit: {max_cost: 2e12, period: day}", "spend_limit.max_cost: must be more than 0 and at most 1e+12 (got 2e+12)"},
		"period":      {"tenants: [{name: a, cert_uris: [u]}, {name: b, cert_uris: [v], spend_limit: {max_cost: 1, period: week}}]", `tenants[1].spend_limit.period: must be day or month (got "week")`},
		"no period":   {"spend_limit: {max_cost: 1}", `spend_limit.period: must be day or month (got "")`},
		"unknown key": {"spend_limit: {max_cost: 1, period: day, currency: usd}", "currency"},
		"top level with tenants": {"spend_limit: {max_cost: 1, period: day}\ntenants: [{name: a, cert_uris: [u]}]",
			"spend_limit: is the default tenant's, and a config with tenants has no default tenant: set tenants[].spend_limit"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := delegates.Parse([]byte(tt.src))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}
