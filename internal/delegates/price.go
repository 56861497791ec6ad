package delegates

import (
	"fmt"
	"math"

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
