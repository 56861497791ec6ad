package delegates_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/internal/delegates"
)

// The delegates guide's config example loads as it is shown.
func TestReadmeDelegatesConfigLoads(t *testing.T) {
	b, err := os.ReadFile("../../docs/delegates.md")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(b), "<!-- bring-your-delegates")
	require.True(t, ok, "docs/delegates.md marks the example")
	_, rest, ok = strings.Cut(rest, "```yaml\n")
	require.True(t, ok)
	yaml, _, ok := strings.Cut(rest, "```")
	require.True(t, ok)

	t.Setenv("OPENAI_API_KEY", "") // empty counts as not set
	_, err = delegates.Parse([]byte(yaml))
	require.Error(t, err, "the variables are not set here")
	assert.Contains(t, err.Error(), "OPENAI_API_KEY is not set")

	for _, v := range []string{"OPENAI_API_KEY", "ANTHROPIC_API_KEY", "SEARCH_TOKEN"} {
		t.Setenv(v, "x")
	}
	cfg, err := delegates.Parse([]byte(yaml))
	require.NoError(t, err)
	kinds := map[string]string{}
	for _, d := range cfg.Delegates {
		kinds[d.Name] = d.Kind()
	}
	assert.Equal(t, map[string]string{
		"gpt": delegates.KindOpenAI, "local-llama": delegates.KindOpenAI,
		"claude": delegates.KindAnthropic, "search-api": delegates.KindHTTP,
	}, kinds)
	p := newPool(t, cfg)
	assert.True(t, p.Info("search-api").Idempotent)
}

// The delegates guide shows each example delegate verbatim: the code block after
// the heading is the file.
func TestReadmeShowsTheExampleDelegates(t *testing.T) {
	b, err := os.ReadFile("../../docs/delegates.md")
	require.NoError(t, err)
	for heading, file := range map[string]string{
		"## A delegate in Python": "../../clients/python/examples/delegate.py",
		"## A delegate in Go":     "../../examples/go-delegate/main.go",
	} {
		_, rest, ok := strings.Cut(string(b), heading+"\n")
		require.True(t, ok, heading)
		_, rest, ok = strings.Cut(rest, "```")
		require.True(t, ok, heading)
		_, rest, _ = strings.Cut(rest, "\n") // the fence's language
		shown, _, ok := strings.Cut(rest, "```")
		require.True(t, ok, heading)
		want, err := os.ReadFile(file)
		require.NoError(t, err)
		assert.Equal(t, string(want), shown, "%s shows %s as it is", heading, file)
	}
}
