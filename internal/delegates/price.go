package delegates

import (
	"fmt"
	"math"
	"strings"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Price is what a delegate's calls cost (stubbornv1.Price): per million
// tokens read, written and read from the provider's cache, and per call, in
// a currency-neutral unit (USD in the examples).
type Price struct {
	InputPerMTok       float64 `yaml:"input_per_mtok,omitempty"`
	OutputPerMTok      float64 `yaml:"output_per_mtok,omitempty"`
	CachedInputPerMTok float64 `yaml:"cached_input_per_mtok,omitempty"`
	PerCall            float64 `yaml:"per_call,omitempty"`
}

// maxPrice bounds every price: a million units a million tokens (or a
// call) is far past any model's, and keeps a run's cost finite.
const maxPrice = 1e6

// Proto returns p as the API has it; nil for nil.
func (p *Price) Proto() *stubbornv1.Price {
	if p == nil {
		return nil
	}
	return &stubbornv1.Price{
		InputPerMtok: p.InputPerMTok, OutputPerMtok: p.OutputPerMTok,
		CachedInputPerMtok: p.CachedInputPerMTok, PerCall: p.PerCall,
	}
}

// check returns what is wrong with p, each naming its field.
func (p *Price) check() []string {
	if p == nil {
		return nil
	}
	var bad []string
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"input_per_mtok", p.InputPerMTok}, {"output_per_mtok", p.OutputPerMTok},
		{"cached_input_per_mtok", p.CachedInputPerMTok}, {"per_call", p.PerCall},
	} {
		if math.IsNaN(f.v) || f.v < 0 || f.v > maxPrice {
			bad = append(bad, fmt.Sprintf("price.%s: must be between 0 and %g (got %g)", f.name, float64(maxPrice), f.v))
		}
	}
	return bad
}

// SpendLimit is a preset's default spend limit for the runs whose control
// names it at its top (stubbornv1.SpendLimit): max_cost in the prices'
// unit, max_total_tokens, and on_exhausted ask (the default) or fail.
type SpendLimit struct {
	MaxCost        float64 `yaml:"max_cost,omitempty"`
	MaxTotalTokens int64   `yaml:"max_total_tokens,omitempty"`
	OnExhausted    string  `yaml:"on_exhausted,omitempty"`
}

// Proto returns l as the API has it; nil for nil.
func (l *SpendLimit) Proto() *stubbornv1.SpendLimit {
	if l == nil {
		return nil
	}
	out := &stubbornv1.SpendLimit{MaxCost: l.MaxCost, MaxTotalTokens: l.MaxTotalTokens}
	if strings.EqualFold(l.OnExhausted, "fail") {
		out.OnExhausted = stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL
	}
	return out
}

// check returns what is wrong with l, each naming its field.
func (l *SpendLimit) check() []string {
	if l == nil {
		return nil
	}
	var bad []string
	if math.IsNaN(l.MaxCost) || l.MaxCost < 0 || l.MaxCost > 1e12 {
		bad = append(bad, fmt.Sprintf("spend_limit.max_cost: must be between 0 and 1e12 (got %g)", l.MaxCost))
	}
	if l.MaxTotalTokens < 0 || l.MaxTotalTokens > 1e15 {
		bad = append(bad, fmt.Sprintf("spend_limit.max_total_tokens: must be between 0 and 1e15 (got %d)", l.MaxTotalTokens))
	}
	if o := strings.ToLower(l.OnExhausted); o != "" && o != "ask" && o != "fail" {
		bad = append(bad, fmt.Sprintf("spend_limit.on_exhausted: must be ask or fail (got %q)", l.OnExhausted))
	}
	if l.MaxCost == 0 && l.MaxTotalTokens == 0 {
		bad = append(bad, "spend_limit: sets neither max_cost nor max_total_tokens")
	}
	return bad
}
