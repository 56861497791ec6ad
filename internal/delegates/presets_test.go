package delegates_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
)

func TestPresetsParse(t *testing.T) {
	cfg, err := delegates.Parse([]byte(`
delegates:
  - {name: search-primary, target: "127.0.0.1:1", idempotent: true}
  - {name: search-backup, target: "127.0.0.1:2"}
presets:
  - name: search-with-retry
    retry: {target: search-primary, attempts: 2, base_wait: 100ms, max_wait: 1s, on_exhausted: fail}
  - name: careful-search
    fallback_chain: {chain: [search-with-retry, search-backup]}
  - name: hedged-search
    race: {candidates: [search-primary, search-backup], hedge_delay: 250ms}
  - name: hedged-presets
    race: {candidates: [search-with-retry, careful-search], hedge_delay: 1s}
`))
	require.NoError(t, err, "a hedged race may name presets")
	require.Len(t, cfg.Presets, 4)
	cfg, err = delegates.Parse([]byte(`
delegates:
  - {name: east, target: "127.0.0.1:1"}
  - {name: west, target: "127.0.0.1:2"}
presets:
  - name: spread
    balance: {targets: [{name: east, weight: 3}, {name: west}], strategy: least_busy, max_attempts: 1}
  - name: spread-or-east
    fallback_chain: {chain: [spread, east]}
  - name: spread-both
    balance: {targets: [{name: spread}, {name: west}], strategy: BALANCE_STRATEGY_LATENCY}
`))
	require.NoError(t, err, "a balance may name presets, and be named by them")
	b := cfg.Presets[0].Spec.GetBalance()
	require.NotNil(t, b)
	assert.Equal(t, stubbornv1.BalanceStrategy_BALANCE_STRATEGY_LEAST_BUSY, b.GetStrategy())
	assert.EqualValues(t, 3, b.GetTargets()[0].GetWeight())
	assert.Nil(t, b.GetTargets()[1].Weight, "unset: 1")
	assert.EqualValues(t, 1, b.GetMaxAttempts())
	assert.Equal(t, []string{"spread", "west"}, delegates.References(cfg.Presets[2].Spec))
	assert.Equal(t, stubbornv1.BalanceStrategy_BALANCE_STRATEGY_LATENCY, cfg.Presets[2].Spec.GetBalance().GetStrategy())
	cfg, err = delegates.Parse([]byte(`
delegates:
  - {name: search-primary, target: "127.0.0.1:1", idempotent: true}
  - {name: search-backup, target: "127.0.0.1:2"}
presets:
  - name: search-with-retry
    retry: {target: search-primary, attempts: 2, base_wait: 100ms, max_wait: 1s, on_exhausted: fail}
  - name: careful-search
    fallback_chain: {chain: [search-with-retry, search-backup]}
  - name: hedged-search
    race: {candidates: [search-primary, search-backup], hedge_delay: 250ms}
  - name: hedged-presets
    race: {candidates: [search-with-retry, careful-search], hedge_delay: 1s}
`))
	require.NoError(t, err)
	assert.Equal(t, []string{"search-with-retry", "careful-search"}, cfg.Presets[3].Spec.GetRace().GetCandidates())
	assert.Equal(t, 250*time.Millisecond, cfg.Presets[2].Spec.GetRace().GetHedgeDelay().AsDuration())
	r := cfg.Presets[0].Spec.GetRetry()
	require.NotNil(t, r)
	assert.Equal(t, "search-primary", r.GetTarget())
	assert.EqualValues(t, 2, r.GetAttempts())
	assert.Equal(t, 100*time.Millisecond, r.GetBaseWait().AsDuration())
	assert.Equal(t, time.Second, r.GetMaxWait().AsDuration())
	assert.Equal(t, stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL, r.GetOnExhausted())
	assert.Equal(t, []string{"search-with-retry", "search-backup"}, cfg.Presets[1].Spec.GetFallbackChain().GetChain())

	pool, err := delegates.NewPool(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pool.Close() })
	assert.True(t, pool.Known("careful-search"))
	assert.True(t, pool.Known("search-backup"))
	assert.False(t, pool.Known("nope"))
	spec, ok := pool.Preset("careful-search")
	require.True(t, ok)
	assert.NotNil(t, spec.GetFallbackChain())
}

func TestPresetsRejected(t *testing.T) {
	const delegatesYAML = "delegates:\n  - {name: a, target: \"127.0.0.1:1\"}\n"
	tests := []struct {
		name, presets, want string
	}{
		{"a cycle", `
  - {name: p, fallback_chain: {chain: [q]}}
  - {name: q, race: {candidates: [a, p]}}`, "cycle: p → q → p"},
		{"a preset naming itself", `
  - {name: p, retry: {target: p}}`, "cycle: p → p"},
		{"an unknown reference", `
  - {name: p, fallback_chain: {chain: [a, nope]}}`, `"nope" is neither a delegate nor a preset`},
		{"two controls", `
  - {name: p, retry: {target: a}, race: {candidates: [a]}}`, `presets[0] ("p"): needs exactly one of retry, retry_with_learning, fallback_chain, race, balance, got 2 (line 4)`},
		{"no control", `
  - {name: p}`, "needs exactly one of"},
		{"a name taken by a delegate", `
  - {name: a, retry: {target: a}}`, "a delegate has the same name"},
		{"a duplicate preset", `
  - {name: p, retry: {target: a}}
  - {name: p, retry: {target: a}}`, "duplicate preset"},
		{"an unknown field", `
  - {name: p, retry: {target: a, tries: 3}}`, `presets[0] ("p").retry.tries: unknown field (line 4)`},
		{"a misspelt field", `
  - {name: p, retry: {target: a, attempt: 3}}`, `presets[0] ("p").retry.attempt: unknown field (did you mean "attempts"?) (line 4)`},
		{"a bad duration", `
  - {name: p, retry: {target: a, max_wait: soon}}`, `presets[0] ("p").retry.max_wait: invalid duration "soon" (line 4)`},
		// Issue 35: these named the preset's name.
		{"a delegate's key in a preset", `
  - {name: a2, retry: {target: a}}
  - name: web503
    http: {url: "http://x"}`, `presets[1] ("web503").http: unknown field (a delegate's key: a preset is a name and one of retry, retry_with_learning, fallback_chain, race, balance; is this entry meant for delegates?) (line 6)`},
		{"a bad duration, written as blocks", `
  - name: p
    retry:
      target: a
      base_wait: 5`, `presets[0] ("p").retry.base_wait: a duration must be a string such as "500ms" (line 7)`},
		{"a negative hedge_delay", `
  - {name: p, race: {candidates: [a], hedge_delay: -1s}}`, "race.hedge_delay must not be negative"},
		{"a balance without targets", `
  - {name: p, balance: {targets: []}}`, `presets[0] ("p"): balance.targets: at least one target is required`},
		{"a balance's weight of 0", `
  - {name: p, balance: {targets: [{name: a, weight: 0}]}}`, `presets[0] ("p"): balance.targets[0].weight: must be 1 to 1000, got 0`},
		{"a balance's target twice", `
  - {name: p, balance: {targets: [{name: a}, {name: a}]}}`, `balance.targets[1].name: "a" is targets[0] already`},
		{"a balance's unknown strategy", `
  - {name: p, balance: {targets: [{name: a}], strategy: fastest}}`, `presets[0] ("p").balance.strategy: must be weighted, least_busy, latency or usage, got fastest`},
		{"a balance's max_attempts of 0", `
  - {name: p, balance: {targets: [{name: a}], max_attempts: 0}}`, `balance.max_attempts: must be 1 to 100 (limits.max_attempts), got 0`},
		{"a balance naming an unknown target", `
  - {name: p, balance: {targets: [{name: nope}]}}`, `"nope" is neither a delegate nor a preset`},
		{"criteria in a balance preset", `
  - {name: p, balance: {targets: [{name: a}], failure_when: "true"}}`, "not supported in presets"},
		{"criteria in a preset", `
  - {name: p, fallback_chain: {chain: [a], failure_when: "true"}}`, "not supported in presets"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := delegates.Parse([]byte(delegatesYAML + "presets:" + tt.presets + "\n"))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

// on_exhausted takes the short form or the .proto's, in any case, as the
// CLI does; anything else is an error naming the preset's control.
func TestPresetOnExhaustedSpellings(t *testing.T) {
	parse := func(v string) (*delegates.Config, error) {
		return delegates.Parse([]byte("delegates:\n  - {name: a, target: \"127.0.0.1:1\"}\npresets:\n  - name: p\n    retry: {target: a, on_exhausted: " + v + "}\n"))
	}
	for v, want := range map[string]stubbornv1.OnExhausted{
		"fail": stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL, "Ask": stubbornv1.OnExhausted_ON_EXHAUSTED_ASK,
		"ON_EXHAUSTED_FAIL": stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL, "on_exhausted_ask": stubbornv1.OnExhausted_ON_EXHAUSTED_ASK,
	} {
		cfg, err := parse(v)
		require.NoError(t, err, v)
		assert.Equal(t, want, cfg.Presets[0].Spec.GetRetry().GetOnExhausted(), v)
	}
	_, err := parse("never")
	require.Error(t, err)
	assert.ErrorContains(t, err, `presets[0] ("p").retry.on_exhausted: must be ask or fail (or ON_EXHAUSTED_ASK, ON_EXHAUSTED_FAIL), got never (line 5)`)
}
