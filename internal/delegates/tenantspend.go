package delegates

import (
	"fmt"
	"math"
)

// maxTenantSpend bounds a tenant's spend limit, as a run's (max_cost).
const maxTenantSpend = 1e12

// TenantSpendLimit is what a tenant may spend in a period, in the prices'
// unit: once its spend in the current UTC day (or month) has reached
// MaxCost, its new runs are refused until the period ends. Runs in flight
// go on; a run's own spend_limit is what stops a run.
//
//	tenants:
//	  - name: acme
//	    spend_limit: {max_cost: 10, period: day}
type TenantSpendLimit struct {
	// MaxCost is the most the tenant spends in a period. Required, more
	// than 0, at most 1e12.
	MaxCost float64 `yaml:"max_cost"`
	// Period is day or month (UTC).
	Period string `yaml:"period"`
}

// check returns what is wrong with l, each naming its field after
// prefix ("tenants[1]." or "").
func (l *TenantSpendLimit) check(prefix string) []string {
	if l == nil {
		return nil
	}
	var bad []string
	if math.IsNaN(l.MaxCost) || l.MaxCost <= 0 || l.MaxCost > maxTenantSpend {
		bad = append(bad, fmt.Sprintf("%sspend_limit.max_cost: must be more than 0 and at most %g (got %g)", prefix, float64(maxTenantSpend), l.MaxCost))
	}
	if l.Period != "day" && l.Period != "month" {
		bad = append(bad, fmt.Sprintf("%sspend_limit.period: must be day or month (got %q)", prefix, l.Period))
	}
	return bad
}

// validateTenantSpend checks the config's and the tenants' spend limits.
func (c *Config) validateTenantSpend(bad func(string, ...any)) {
	if c.SpendLimit != nil && len(c.Tenants) > 0 {
		bad("spend_limit: is the default tenant's, and a config with tenants has no default tenant: set tenants[].spend_limit")
	}
	for _, msg := range c.SpendLimit.check("") {
		bad("%s", msg)
	}
	for i := range c.Tenants {
		for _, msg := range c.Tenants[i].SpendLimit.check(fmt.Sprintf("tenants[%d].", i)) {
			bad("%s", msg)
		}
	}
}

// TenantSpend returns tenant's spend limit: the tenant's own, or for the
// default tenant "" the config's top-level one; nil when it has none.
func (c *Config) TenantSpend(tenant string) *TenantSpendLimit {
	if c == nil {
		return nil
	}
	if tenant == "" {
		return c.SpendLimit
	}
	for i := range c.Tenants {
		if c.Tenants[i].Name == tenant {
			return c.Tenants[i].SpendLimit
		}
	}
	return nil
}
