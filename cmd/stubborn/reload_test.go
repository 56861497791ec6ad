package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/internal/delegates"
)

// startReloader reads config as serve does, lets between run (the moments
// between the read and the watch), then starts a watching reloader whose
// log lines go to the returned buffer and whose applied configs to the
// returned channel.
func startReloader(t *testing.T, config string, between func()) (*syncBuffer, <-chan *delegates.Config) {
	t.Helper()
	initial, sum, err := delegates.LoadSum(config)
	require.NoError(t, err)
	between()
	logs := &syncBuffer{}
	applied := make(chan *delegates.Config, 10)
	r := &reloader{path: config, sec: &securityFlags{}, logger: slog.New(slog.NewJSONHandler(logs, nil)),
		apply: func(c *delegates.Config) error { applied <- c; return nil }}
	t.Cleanup(r.start(make(chan os.Signal), initial, sum, true))
	return logs, applied
}

// TestAConfigWrittenWhileServeStartsIsApplied: a config file replaced
// after serve read it and before the watch was armed was neither applied
// nor refused, and nothing said so (the watch took its baseline from the
// file it found, not from the bytes parsed). It is applied now, with the
// usual log line.
func TestAConfigWrittenWhileServeStartsIsApplied(t *testing.T) {
	t.Parallel()
	config := filepath.Join(t.TempDir(), "stubborn.yaml")
	require.NoError(t, os.WriteFile(config, []byte("delegates:\n  - {name: old, target: \"127.0.0.1:1\"}\n"), 0o600))
	logs, applied := startReloader(t, config, func() {
		require.NoError(t, os.WriteFile(config, []byte("delegates:\n  - {name: new, target: \"127.0.0.1:1\"}\n"), 0o600))
	})
	select {
	case cfg := <-applied:
		require.Len(t, cfg.Delegates, 1)
		assert.Equal(t, "new", cfg.Delegates[0].Name)
	case <-time.After(30 * time.Second):
		t.Fatalf("the file written before the watch was never applied; logs:\n%s", logs.String())
	}
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), `"msg":"config reloaded"`) }, 10*time.Second, 10*time.Millisecond)
	assert.Contains(t, logs.String(), `"delegates_added":["new"]`)
}

// TestAConfigBrokenWhileServeStartsIsRefusedAloud: the same moment, with a
// file that cannot be used: the config in use stays, and the log says why.
func TestAConfigBrokenWhileServeStartsIsRefusedAloud(t *testing.T) {
	t.Parallel()
	config := filepath.Join(t.TempDir(), "stubborn.yaml")
	require.NoError(t, os.WriteFile(config, []byte("delegates:\n  - {name: old, target: \"127.0.0.1:1\"}\n"), 0o600))
	logs, applied := startReloader(t, config, func() {
		require.NoError(t, os.WriteFile(config, []byte("delegates:\n  - {name: new, target: \n"), 0o600))
	})
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), `"msg":"config not reloaded: keeping the one in use"`)
	}, 30*time.Second, 10*time.Millisecond)
	assert.Empty(t, applied)
}

// TestAnUnchangedConfigIsNotReloadedAtStart: the check at the start finds
// the file as it was parsed and reloads nothing.
func TestAnUnchangedConfigIsNotReloadedAtStart(t *testing.T) {
	t.Parallel()
	config := filepath.Join(t.TempDir(), "stubborn.yaml")
	require.NoError(t, os.WriteFile(config, []byte("delegates:\n  - {name: old, target: \"127.0.0.1:1\"}\n"), 0o600))
	logs, applied := startReloader(t, config, func() {})
	// A change after it is applied: the watch is armed.
	require.NoError(t, os.WriteFile(config, []byte("delegates:\n  - {name: later, target: \"127.0.0.1:1\"}\n"), 0o600))
	select {
	case cfg := <-applied:
		assert.Equal(t, "later", cfg.Delegates[0].Name, "the first reload is the later change, not one at the start")
	case <-time.After(30 * time.Second):
		t.Fatalf("the change was never applied; logs:\n%s", logs.String())
	}
}

// TestAReloadOfManyDelegatesLogsABoundedLine: a reload that added 10,000
// delegates logged every name, one line of 150 KB. The line names 20 and
// says how many there are.
func TestAReloadOfManyDelegatesLogsABoundedLine(t *testing.T) {
	t.Parallel()
	config := filepath.Join(t.TempDir(), "stubborn.yaml")
	require.NoError(t, os.WriteFile(config, []byte("delegates:\n  - {name: old, target: \"127.0.0.1:1\"}\n"), 0o600))
	logs, applied := startReloader(t, config, func() {})
	var many strings.Builder
	many.WriteString("delegates:\n")
	for i := range 10_000 {
		fmt.Fprintf(&many, "  - {name: delegate-with-a-longish-name-%05d, target: \"127.0.0.1:1\"}\n", i)
	}
	require.NoError(t, os.WriteFile(config, []byte(many.String()), 0o600))
	select {
	case cfg := <-applied:
		require.Len(t, cfg.Delegates, 10_000)
	case <-time.After(30 * time.Second):
		t.Fatalf("never applied; logs:\n%s", logs.String())
	}
	var line string
	require.Eventually(t, func() bool {
		for l := range strings.Lines(logs.String()) {
			if strings.Contains(l, `"msg":"config reloaded"`) {
				line = l
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond)
	assert.Less(t, len(line), 4096, "one log line")
	var rec struct {
		Added   []string `json:"delegates_added"`
		Removed []string `json:"delegates_removed"`
	}
	require.NoError(t, json.Unmarshal([]byte(line), &rec))
	require.Len(t, rec.Added, maxLoggedNames+1)
	assert.Equal(t, "delegate-with-a-longish-name-00000", rec.Added[0])
	assert.Equal(t, "… and 9980 more (10000 in all)", rec.Added[maxLoggedNames])
	assert.Equal(t, []string{"old"}, rec.Removed)
}
