package jsstore

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestASecondEmbeddedServerOnAHeldDirRefuses: two embedded servers on one
// data directory corrupt its files (a second `serve` from the same
// directory once resumed the first one's runs and damaged a stream). The
// second is refused at once, naming the directory and the holder, and
// leaves the directory as it was; once the first closes, the directory
// opens again.
func TestASecondEmbeddedServerOnAHeldDirRefuses(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first, err := StartEmbedded(EmbeddedConfig{DataDir: dir})
	require.NoError(t, err)
	before := listDir(t, dir)

	_, err = StartEmbedded(EmbeddedConfig{DataDir: dir})
	var inUse *DirInUseError
	require.ErrorAs(t, err, &inUse)
	assert.Equal(t, dir, inUse.Dir)
	assert.Equal(t, os.Getpid(), inUse.PID)
	assert.Contains(t, err.Error(), dir)
	assert.Equal(t, before, listDir(t, dir), "the refused server touched the directory")
	// The first is unharmed: it still takes writes.
	_, err = first.Conn.JetStream()
	require.NoError(t, err)
	require.True(t, first.Conn.IsConnected())

	first.Close()
	again, err := StartEmbedded(EmbeddedConfig{DataDir: dir})
	require.NoError(t, err, "the lock is dropped on Close")
	again.Close()
}

// listDir lists the files under dir, with the lock file's content: what
// a second server would have changed (the first one's own writes change
// only the files' contents).
func listDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		out[path] = ""
		if info.Name() == "stubborn.lock" {
			b, err := os.ReadFile(path) // #nosec G304 -- the test's own directory
			out[path] = string(b)
			return err
		}
		return nil
	}))
	return out
}
