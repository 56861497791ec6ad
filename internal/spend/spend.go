// Package spend keeps what each tenant spent in a period (a UTC day or
// month): a ledger in the store that every replica adds to and reads, so
// that a tenant's spend is the fleet's and survives restarts.
//
// A ledger entry is keyed by the tenant and the period key ("day.2026-12-05",
// "month.2026-12", PeriodKey); its value is the total cost, in the prices'
// unit. Adding is the only change: a period's total starts at zero and
// the next period has an entry of its own.
package spend

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"time"
)

// Period is the span a tenant's spend limit counts over.
type Period string

// The periods, as a config names them.
const (
	Day   Period = "day"
	Month Period = "month"
)

// Valid reports whether p is Day or Month.
func (p Period) Valid() bool { return p == Day || p == Month }

// Noun returns the period as an adjective of a limit: "daily", "monthly".
func (p Period) Noun() string {
	if p == Month {
		return "monthly"
	}
	return "daily"
}

// PeriodKey returns the key of the period p that t is in, in UTC:
// "day.2026-12-05" or "month.2026-12".
func PeriodKey(p Period, t time.Time) string {
	t = t.UTC()
	if p == Month {
		return "month." + t.Format("2006-01")
	}
	return "day." + t.Format("2006-01-02")
}

// Resets returns when the period p that t is in ends: the next midnight
// UTC, or the first of the next month at midnight UTC.
func Resets(p Period, t time.Time) time.Time {
	t = t.UTC()
	if p == Month {
		return time.Date(t.Year(), t.Month()+1, 1, 0, 0, 0, 0, time.UTC)
	}
	return time.Date(t.Year(), t.Month(), t.Day()+1, 0, 0, 0, 0, time.UTC)
}

// Bounds on what a ledger takes.
const (
	// MaxCost is the most one Add adds: a spend limit's own bound.
	MaxCost = 1e12
	// MaxTotal is where a total stops growing: far over any limit, and
	// still exact enough as a float64 to compare with one.
	MaxTotal = 1e15
	// TTL is how long an entry is kept after its last change: a month's
	// entry outlives its month (31 days), and no entry is kept for ever.
	TTL = 35 * 24 * time.Hour
)

// DefaultTenant is the name the default tenant ("") goes by in the ledger.
// No tenant can be named so: a tenant's name starts with a letter or digit.
const DefaultTenant = "_default"

// Errors of a ledger's callers' making.
var (
	ErrTenant    = errors.New("spend: a tenant's name is letters, digits, '.', '_' and '-' (at most 64, starting with a letter or digit)")
	ErrPeriodKey = errors.New("spend: a period key is day.YYYY-MM-DD or month.YYYY-MM")
	ErrCost      = fmt.Errorf("spend: a cost is a number from 0 to %g", float64(MaxCost))
)

// Ledger keeps each tenant's spend by period.
type Ledger interface {
	// Add adds cost to tenant's total for periodKey (PeriodKey).
	Add(ctx context.Context, tenant, periodKey string, cost float64) error
	// Spent returns tenant's total for periodKey: 0 when it has none.
	Spent(ctx context.Context, tenant, periodKey string) (float64, error)
}

// tenantName is a tenant's name as the config allows it (delegates'
// tenantName), the default tenant's "" apart.
var tenantName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// periodKey is what PeriodKey returns.
var periodKey = regexp.MustCompile(`^(day\.[0-9]{4}-[0-9]{2}-[0-9]{2}|month\.[0-9]{4}-[0-9]{2})$`)

// entryKey returns the ledger's key of tenant's periodKey:
// "<tenant>.<periodKey>". A tenant's '.' is written '=' (which no name
// has) so that the key is a valid NATS KV key whatever the name (no empty
// token: "a..b", "a.") and names one tenant only.
func entryKey(tenant, pk string) (string, error) {
	if !periodKey.MatchString(pk) {
		return "", ErrPeriodKey
	}
	if tenant == "" {
		return DefaultTenant + "." + pk, nil
	}
	if !tenantName.MatchString(tenant) {
		return "", ErrTenant
	}
	b := []byte(tenant)
	for i, c := range b {
		if c == '.' {
			b[i] = '='
		}
	}
	return string(b) + "." + pk, nil
}

// checkCost reports a cost a ledger does not take.
func checkCost(cost float64) error {
	if math.IsNaN(cost) || cost < 0 || cost > MaxCost {
		return ErrCost
	}
	return nil
}

// sum adds cost to total, bounded by MaxTotal.
func sum(total, cost float64) float64 { return min(total+cost, MaxTotal) }
