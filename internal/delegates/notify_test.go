package delegates_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/stubbornhq/stubborn/internal/delegates"
)

const notifyConfig = `
delegates: [{name: echo, target: "127.0.0.1:1"}]
presets:
  - name: careful
    retry: {target: echo}
    notify: [{url: "https://hooks.example.com/p", secret_env: NOTIFY_TEST_SECRET, format: slack}]
notify:
  - url: http://127.0.0.1:9/hook
    secret_env: NOTIFY_TEST_SECRET
tenants:
  - name: a
    cert_uris: [u]
    notify:
      - {url: "https://hooks.example.com/a", secret_env: NOTIFY_TEST_SECRET, on: [awaiting_decision, failed]}
`

func TestParseNotify(t *testing.T) {
	t.Setenv("NOTIFY_TEST_SECRET", "s3cret")
	cfg, err := delegates.Parse([]byte(notifyConfig))
	require.NoError(t, err)
	require.True(t, cfg.HasNotify())
	require.Len(t, cfg.Notify, 1)
	assert.Equal(t, "s3cret", cfg.Notify[0].Secret(), "the secret is read at load")
	assert.True(t, cfg.Notify[0].Wants(delegates.NotifyAwaitingDecision), "on defaults to awaiting_decision")
	assert.False(t, cfg.Notify[0].Wants(delegates.NotifyFailed))
	require.Len(t, cfg.Tenants[0].Notify, 1)
	assert.True(t, cfg.Tenants[0].Notify[0].Wants(delegates.NotifyFailed))
	assert.False(t, cfg.Tenants[0].Notify[0].Wants(delegates.NotifyExhausted))
	require.Len(t, cfg.Presets[0].Notify, 1)
	assert.Equal(t, "slack", cfg.Presets[0].Notify[0].Format)
	assert.Equal(t, "s3cret", cfg.Presets[0].Notify[0].Secret())

	// A preset's notify comes back out as it went in, without the secret.
	out, err := yaml.Marshal(cfg.Presets[0])
	require.NoError(t, err)
	assert.Contains(t, string(out), "hooks.example.com/p")
	assert.NotContains(t, string(out), "s3cret")
}

func TestParseNotifyErrors(t *testing.T) {
	t.Setenv("NOTIFY_TEST_SECRET", "s3cret")
	t.Setenv("NOTIFY_TEST_EMPTY", "")
	long := "https://h.example/" + strings.Repeat("x", delegates.MaxNotifyURLBytes)
	for name, tt := range map[string]struct{ src, want string }{
		"tenant url scheme": {"tenants: [{name: a, cert_uris: [u], notify: [{url: 'https://h/x', secret_env: NOTIFY_TEST_SECRET}, {url: 'ftp://h/x', secret_env: NOTIFY_TEST_SECRET}]}]",
			`tenants[0].notify[1].url: must be http or https, got "ftp"`},
		"url empty":       {"notify: [{secret_env: NOTIFY_TEST_SECRET}]", "notify[0].url: is empty"},
		"url too long":    {"notify: [{url: '" + long + "', secret_env: NOTIFY_TEST_SECRET}]", "notify[0].url: is over 2048 bytes"},
		"url credentials": {"notify: [{url: 'https://u:p@h/x', secret_env: NOTIFY_TEST_SECRET}]", "notify[0].url: must not carry credentials"},
		"no secret_env":   {"notify: [{url: 'https://h/x'}]", "notify[0].secret_env: is empty"},
		"secret unset":    {"notify: [{url: 'https://h/x', secret_env: NOTIFY_TEST_UNSET_XYZ}]", "notify[0].secret_env: environment variable NOTIFY_TEST_UNSET_XYZ is not set"},
		"secret empty":    {"notify: [{url: 'https://h/x', secret_env: NOTIFY_TEST_EMPTY}]", "notify[0].secret_env: environment variable NOTIFY_TEST_EMPTY is not set"},
		"bad format":      {"notify: [{url: 'https://h/x', secret_env: NOTIFY_TEST_SECRET, format: xml}]", `notify[0].format: must be json or slack, got "xml"`},
		"bad on":          {"notify: [{url: 'https://h/x', secret_env: NOTIFY_TEST_SECRET, on: [succeeded]}]", `notify[0].on[0]: must be awaiting_decision, failed or exhausted, got "succeeded"`},
		"preset bad url":  {"delegates: [{name: e, target: x}]\npresets: [{name: p, retry: {target: e}, notify: [{url: 'x', secret_env: NOTIFY_TEST_SECRET}]}]", "presets[0].notify[0].url: must be http or https"},
		"preset bad key":  {"delegates: [{name: e, target: x}]\npresets: [{name: p, retry: {target: e}, notify: [{url: 'https://h/x', secret: y}]}]", `presets[0] ("p").notify[0].secret: unknown field`},
		"unknown key":     {"notify: [{url: 'https://h/x', secret_env: NOTIFY_TEST_SECRET, when: [x]}]", "notify[0].when: unknown field"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := delegates.Parse([]byte(tt.src))
			require.ErrorIs(t, err, delegates.ErrInvalidConfig)
			assert.ErrorContains(t, err, tt.want)
			assert.NotContains(t, err.Error(), "s3cret", "a secret is never in an error")
		})
	}
}
