package delegates_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/delegates"
)

const fullConfig = `
judge: judge-name
limits:
  max_brief_bytes: 1000
  max_attempts: 10
  max_chain: 4
  max_wait: 90s
  max_result_bytes: 4096
delegates:
  - name: search
    target: 127.0.0.1:7301
    idempotent: true
    read_only: false
    timeout: 5s
  - name: judge-name
    target: dns:///judge.internal:443
    read_only: true
    tls: true
  - name: local
    target: unix:///run/local.sock
`

func TestParseFull(t *testing.T) {
	cfg, err := delegates.Parse([]byte(fullConfig))
	require.NoError(t, err)
	assert.Equal(t, "judge-name", cfg.Judge)
	assert.Equal(t, delegates.Limits{
		MaxBriefBytes: 1000, MaxAttempts: 10, MaxChain: 4,
		MaxWait: delegates.Duration(90 * time.Second), MaxResultBytes: 4096,
	}, cfg.Limits)
	require.Len(t, cfg.Delegates, 3)
	assert.Equal(t, delegates.Delegate{
		Name: "search", Target: "127.0.0.1:7301", Idempotent: true,
		Timeout: delegates.Duration(5 * time.Second),
	}, cfg.Delegates[0])
	assert.Equal(t, delegates.Delegate{
		Name: "judge-name", Target: "dns:///judge.internal:443", ReadOnly: true, TLS: delegates.TLS{Enabled: true},
		Timeout: delegates.Duration(delegates.DefaultTimeout),
	}, cfg.Delegates[1])
	assert.Equal(t, controls.DelegateInfo{ReadOnly: true}, cfg.Delegates[1].Info())
	assert.Equal(t, delegates.DefaultTimeout, cfg.Delegates[2].Timeout.Std())
}

func TestParseDefaults(t *testing.T) {
	for name, src := range map[string]string{
		"no limits":      "delegates: []\n",
		"partial limits": "limits:\n  max_chain: 0\n",
	} {
		t.Run(name, func(t *testing.T) {
			cfg, err := delegates.Parse([]byte(src))
			require.NoError(t, err)
			assert.Equal(t, delegates.DefaultLimits(), cfg.Limits)
			assert.Empty(t, cfg.Delegates)
			assert.Empty(t, cfg.Judge)
		})
	}
	assert.Equal(t, delegates.Limits{
		MaxBriefBytes: 65536, MaxAttempts: 100, MaxChain: 32, MaxWait: delegates.Duration(time.Hour), MaxResultBytes: 1 << 20,
	}, delegates.DefaultLimits())
	assert.Equal(t, delegates.Limits{
		MaxBriefBytes: 10, MaxAttempts: 100, MaxChain: 32, MaxWait: delegates.Duration(time.Hour), MaxResultBytes: 1 << 20,
	}, delegates.Limits{MaxBriefBytes: 10}.WithDefaults())
}

// An empty file, or one whose delegates: or tenants: has no value, is
// what a file cut short looks like: Parse refuses it (issue 30 item 3).
func TestParseRefusesEmptyOrCutShort(t *testing.T) {
	for name, tt := range map[string]struct{ src, want string }{
		"empty":                {"", "the file is empty"},
		"blank":                {"\n  \n", "the file is empty"},
		"comment only":         {"# nothing yet\n", "the file is empty"},
		"null document":        {"~\n", "the file is empty"},
		"cut after delegates:": {"limits: {max_chain: 4}\ndelegates:\n", "delegates: no value (line 2; is the file cut short?)"},
		"cut after tenants:":   {"delegates: []\ntenants:\n", "tenants: no value (line 2; is the file cut short?): list them, or write `tenants: []` for none"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := delegates.Parse([]byte(tt.src))
			require.ErrorIs(t, err, delegates.ErrInvalidConfig)
			assert.ErrorContains(t, err, tt.want)
		})
	}
	path := filepath.Join(t.TempDir(), "stubborn.yaml")
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	_, err := delegates.Load(path)
	assert.ErrorContains(t, err, path+": invalid delegates config: the file is empty", "Load names the file")
}

// A reload may not lose the delegates: or tenants: key that the config in
// use has entries under; removing them all takes an explicit [] (issue 30
// item 3).
func TestCheckReplaces(t *testing.T) {
	parse := func(src string) *delegates.Config {
		t.Helper()
		cfg, err := delegates.Parse([]byte(src))
		require.NoError(t, err, src)
		return cfg
	}
	const tenant = "tenants: [{name: a, token_sha256: [9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08]}]\n"
	const delegate = "delegates: [{name: d, target: \"127.0.0.1:1\"}]\n"
	inUse := parse(delegate + tenant)
	for name, tt := range map[string]struct{ src, want string }{
		"no tenants key":   {delegate, "the file has no `tenants:` while 1 are in use (is it cut short?): to remove them all, write `tenants: []`"},
		"no delegates key": {tenant, "the file has no `delegates:` while 1 are in use"},
		"neither":          {"limits: {max_chain: 4}\n", "`delegates:`"},
	} {
		t.Run(name, func(t *testing.T) {
			err := parse(tt.src).CheckReplaces(inUse)
			require.ErrorIs(t, err, delegates.ErrInvalidConfig)
			assert.ErrorContains(t, err, tt.want)
		})
	}
	for name, src := range map[string]string{
		"explicit tenants: []":   delegate + "tenants: []\n",
		"explicit delegates: []": "delegates: []\n" + tenant,
		"same":                   delegate + tenant,
	} {
		assert.NoError(t, parse(src).CheckReplaces(inUse), name)
	}
	// Keys with nothing under them in use may go.
	assert.NoError(t, parse("limits: {max_chain: 4}\n").CheckReplaces(parse("delegates: []\n")))
	assert.NoError(t, parse(delegate).CheckReplaces(nil), "at start there is nothing to lose")
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string // substrings of the error
	}{
		{
			name: "duplicate name",
			src:  "delegates:\n  - {name: a, target: x:1}\n  - {name: b, target: x:2}\n  - {name: a, target: x:3}\n",
			want: []string{`delegates[2] ("a"): name: duplicate of delegates[0]`},
		},
		{
			name: "empty name",
			src:  "delegates:\n  - target: x:1\n",
			want: []string{`delegates[0]: name is empty`},
		},
		{
			name: "name with a space",
			src:  "delegates:\n  - {name: \"my echo\", target: x:1}\n",
			want: []string{`delegates[0] ("my echo"): name: must have no whitespace, control or format character`},
		},
		{
			name: "name over 128 bytes",
			src:  "delegates:\n  - {name: " + strings.Repeat("n", delegates.MaxNameBytes+1) + ", target: x:1}\n",
			want: []string{"name: is 129 bytes, more than the limit of 128"},
		},
		{
			name: "preset name with a tab",
			src:  "delegates:\n  - {name: a, target: x:1}\npresets:\n  - {name: \"p\\tq\", retry: {target: a}}\n",
			want: []string{`presets[0] ("p\tq"): name: must have no whitespace`},
		},
		{
			name: "empty target",
			src:  "delegates:\n  - name: a\n    target: \"  \"\n",
			want: []string{`delegates[0] ("a"): target is empty`},
		},
		{
			name: "negative timeout",
			src:  "delegates:\n  - name: a\n    target: x:1\n    timeout: -5s\n",
			want: []string{`delegates[0] ("a"): timeout: must not be negative (got -5s)`},
		},
		{
			name: "unknown delegate key",
			src:  "delegates:\n  - name: a\n    target: x:1\n  - name: b\n    target: x:2\n    tmeout: 5s\n",
			want: []string{`delegates[1] ("b").tmeout: unknown field (did you mean "timeout"?) (line 6)`},
		},
		{
			name: "unknown top-level key",
			src:  "judge: \"\"\npresetz: {}\n",
			want: []string{`presetz: unknown field (did you mean "presets"?) (line 2)`},
		},
		{
			name: "unknown limits key",
			src:  "limits:\n  max_attempt: 3\n",
			want: []string{`limits.max_attempt: unknown field (did you mean "max_attempts"?) (line 2)`},
		},
		{
			name: "bad duration",
			src:  "delegates:\n  - name: a\n    target: x:1\n    timeout: 5 seconds\n",
			want: []string{`delegates[0] ("a").timeout: invalid duration "5 seconds"`, "(line 4)"},
		},
		{
			// Issue 35: the error named the first key on the line.
			name: "bad duration on a one-line entry",
			src:  "delegates:\n  - {name: e, target: x:1, timeout: 5}\n",
			want: []string{`delegates[0] ("e").timeout: invalid duration "5": durations need a unit, such as 5s (line 2)`},
		},
		{
			name: "wrong type on a one-line entry",
			src:  "delegates:\n  - {name: e, target: x:1, max_concurrent: lots}\n",
			want: []string{"delegates[0] (\"e\").max_concurrent: cannot unmarshal !!str `lots` into int (line 2)"},
		},
		{
			name: "misspelt key, nested",
			src:  "delegates:\n  - name: e\n    target: x:1\n    circuit_breaker: {consecutive_failure: 5}\n    idempotant: true\n",
			want: []string{`delegates[0] ("e").circuit_breaker.consecutive_failure: unknown field (did you mean "consecutive_failures"?) (line 4)`,
				`delegates[0] ("e").idempotant: unknown field (did you mean "idempotent"?) (line 5)`},
		},
		{
			name: "unknown key far from any",
			src:  "delegates:\n  - {name: e, target: x:1, colour: red}\n",
			want: []string{`delegates[0] ("e").colour: unknown field (line 2)`},
		},
		{
			name: "bad max_wait",
			src:  "limits:\n  max_wait: [1]\n",
			want: []string{`limits.max_wait: a duration must be a string`},
		},
		{
			name: "wrong type",
			src:  "delegates:\n  - name: a\n    target: x:1\n    idempotent: maybe\n",
			want: []string{`delegates[0] ("a").idempotent: cannot unmarshal`},
		},
		{
			name: "negative limits",
			src:  "limits:\n  max_attempts: -1\n  max_wait: -1s\n",
			want: []string{"limits.max_attempts: must not be negative", "limits.max_wait: must not be negative"},
		},
		{
			name: "unknown judge",
			src:  "judge: nobody\ndelegates:\n  - {name: a, target: x:1}\n",
			want: []string{`judge: "nobody" is not a delegate in the registry`},
		},
		{
			name: "several problems at once",
			src:  "delegates:\n  - name: a\n  - name: a\n    target: x:1\n",
			want: []string{`delegates[0] ("a"): target is empty`, `delegates[1] ("a"): name: duplicate of delegates[0]`},
		},
		{
			name: "not yaml",
			src:  "delegates: [\n",
			want: []string{"invalid delegates config"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := delegates.Parse([]byte(tt.src))
			require.Error(t, err)
			assert.Nil(t, cfg)
			assert.ErrorIs(t, err, delegates.ErrInvalidConfig)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "delegates.yaml")
	require.NoError(t, os.WriteFile(good, []byte(fullConfig), 0o600))
	cfg, err := delegates.Load(good)
	require.NoError(t, err)
	assert.Len(t, cfg.Delegates, 3)

	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("delegates:\n  - name: a\n"), 0o600))
	_, err = delegates.Load(bad)
	require.ErrorIs(t, err, delegates.ErrInvalidConfig)
	assert.Contains(t, err.Error(), bad+": ")

	_, err = delegates.Load(filepath.Join(dir, "missing.yaml"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

// TestParseAtReadsRelativePathsFromTheFilesDirectory: a reload parses the
// file's bytes with ParseAt, which resolves a delegate's relative tls
// paths against the file's directory as Load does; absolute ones stay.
func TestParseAtReadsRelativePathsFromTheFilesDirectory(t *testing.T) {
	src := []byte(`delegates: [{name: d, target: "127.0.0.1:1", tls: {ca: certs/ca.pem, cert: /abs/c.pem, key: /abs/k.pem}}]`)
	cfg, err := delegates.ParseAt(src, "/etc/stubborn/stubborn.yaml")
	require.NoError(t, err)
	assert.Equal(t, "/etc/stubborn/certs/ca.pem", cfg.Delegates[0].TLS.CA)
	assert.Equal(t, "/abs/c.pem", cfg.Delegates[0].TLS.Cert)
	dir := t.TempDir()
	path := filepath.Join(dir, "stubborn.yaml")
	require.NoError(t, os.WriteFile(path, src, 0o600))
	loaded, err := delegates.Load(path)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "certs/ca.pem"), loaded.Delegates[0].TLS.CA)
}
