package doccheck_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/doccheck"
)

// reference writes a configuration reference documenting keys.
func reference(keys ...string) []byte {
	var b strings.Builder
	b.WriteString("# Configuration\n\n| Key | Meaning |\n|-----|---------|\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "| `%s` | what it does |\n", k)
	}
	return []byte(b.String())
}

// leaves are the parser's keys that are no containers: what a complete
// reference documents.
func leaves(t *testing.T) []string {
	t.Helper()
	keys, err := doccheck.ParserKeys()
	require.NoError(t, err)
	var out []string
	for _, k := range keys {
		if !k.Container {
			out = append(out, k.Path)
		}
	}
	return out
}

func TestDocumentedKeys(t *testing.T) {
	md := "intro with `not.a.key`\n\n" + // 1-2
		"| Key | Default |\n" + // 3
		"| :-- | --: |\n" + // 4
		"| `limits.max_chain` | 32 |\n" + // 5
		"|`judge`|none|\n" + // 6
		"| prose, `limits.max_wait` | x |\n" + // 7
		"```yaml\n| `in.a.fence` |\n```\n" + // 8-10
		"  | `delegates[].tls.ca` | roots |\n" // 11
	assert.Equal(t, []doccheck.DocKey{{Path: "limits.max_chain", Line: 5}, {Path: "judge", Line: 6}, {Path: "delegates[].tls.ca", Line: 11}},
		doccheck.DocumentedKeys([]byte(md)))
}

func TestCompareKeys(t *testing.T) {
	parser, err := doccheck.ParserKeys()
	require.NoError(t, err)
	all := leaves(t)
	compare := func(keys ...string) []string {
		var out []string
		for _, e := range doccheck.CompareKeys("docs/configuration.md", parser, doccheck.DocumentedKeys(reference(keys...))) {
			out = append(out, e.Error())
		}
		return out
	}

	assert.Empty(t, compare(all...), "every leaf documented: containers need no row of their own")
	assert.Empty(t, compare(append([]string{"limits", "delegates[].openai", "presets[].retry"}, all...)...), "a container may have a row too")

	// A documented key the parser does not take.
	assert.Equal(t, []string{"docs/configuration.md:5: `limits.max_bogus` is documented, but the config parser takes no such key"},
		compare(append([]string{"limits.max_bogus"}, all...)...))
	assert.Equal(t, []string{"docs/configuration.md:5: `delegates.openai.model` is documented, but the config parser takes no such key (did you mean `delegates[].openai.model`?)"},
		compare(append([]string{"delegates.openai.model"}, all...)...))
	// Twice.
	errs := compare(append([]string{"judge"}, all...)...)
	require.Len(t, errs, 1)
	assert.Contains(t, errs[0], "`judge` is documented twice (first on line 5)")

	// A key the parser takes, undocumented.
	for _, missing := range []string{"limits.max_wait", "delegates[].tls.server_name", "presets[].retry.retry_on.grpc_codes", "tenants[].limits.max_chain", "delegates[].tls"} {
		var rest []string
		for _, k := range all {
			if k != missing {
				rest = append(rest, k)
			}
		}
		assert.Equal(t, []string{fmt.Sprintf("docs/configuration.md: the config parser takes `%s`, which has no row: add one (| `%s` | … |)", missing, missing)}, compare(rest...), missing)
	}
	// A container with nothing under it documented is undocumented.
	var noBudget []string
	for _, k := range all {
		if !strings.HasPrefix(k, "retry_budget.") {
			noBudget = append(noBudget, k)
		}
	}
	assert.Contains(t, compare(noBudget...), "docs/configuration.md: the config parser takes `retry_budget.max_tokens`, which has no row: add one (| `retry_budget.max_tokens` | … |)")
}

// TestParserKeys checks the keys ParserKeys derives against the parser
// itself: delegates.Parse takes every one of them, and refuses a key beside
// them that is none, so the reference's check compares with what the
// parser really reads, the keys of the types that read themselves (tls,
// presets) included.
func TestParserKeys(t *testing.T) {
	keys, err := doccheck.ParserKeys()
	require.NoError(t, err)
	paths := map[string]bool{}
	for _, k := range keys {
		paths[k.Path] = true
	}
	for _, want := range []string{"judge", "limits.max_brief_bytes", "delegates[].openai.base_url", "delegates[].tls", "delegates[].tls.ca",
		"delegates[].circuit_breaker.cooldown", "delegates[].stream", "presets[].name", "presets[].retry.max_wait", "presets[].race.hedge_delay",
		"tenants[].token_sha256", "tenants[].limits.max_concurrent_runs", "retry_budget.token_ratio"} {
		assert.True(t, paths[want], "ParserKeys lacks %s", want)
	}
	for _, k := range keys {
		if !strings.HasSuffix(k.Path, "[]") {
			if err := parseWith(k.Path, nil); err != nil {
				assert.NotContains(t, err.Error(), "unknown field", "the parser refuses %s, which ParserKeys lists", k.Path)
			}
		}
		// A list's entries are probed as path[]; tls is a value or a mapping.
		if k.Container && !paths[k.Path+"[]"] || k.Path == "delegates[].tls" {
			// The probe can tell: a key that is none is refused.
			err := parseWith(k.Path+".zz_no_such_key", "x")
			if assert.Error(t, err, k.Path) {
				assert.Contains(t, err.Error(), "unknown field", "%s.zz_no_such_key", k.Path)
			}
		}
	}
}

// parseWith parses a config that sets path (a key's dotted path) to value.
// Errors other than an unknown key's are expected: the values make no
// sense.
func parseWith(path string, value any) error {
	parts := strings.Split(path, ".")
	var v any = value
	for i := len(parts) - 1; i >= 0; i-- {
		name, list := strings.CutSuffix(parts[i], "[]")
		if list {
			v = []any{v}
		}
		m := map[string]any{name: v}
		if name == "retry" || name == "retry_with_learning" || name == "fallback_chain" || name == "race" {
			// A preset's control is a mapping: keep it one when path ends there.
			if v == nil {
				m[name] = map[string]any{}
			}
		}
		v = m
	}
	b, err := yaml.Marshal(v)
	if err != nil {
		panic(err)
	}
	_, err = delegates.Parse(b)
	return err
}
