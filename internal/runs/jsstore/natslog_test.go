package jsstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
)

// TestEmbeddedServerLogsToSlog: the embedded NATS server's log reaches
// the logger of its EmbeddedConfig, notices at Debug with component=nats
// (before, the server ran with its log off); a clean start on an empty
// directory and on one it left says nothing at Warn or above.
func TestEmbeddedServerLogsToSlog(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dir := t.TempDir()
	for range 2 {
		h, logger := runstest.NewCapturedLogs()
		e, err := StartEmbedded(EmbeddedConfig{DataDir: dir, Logger: logger})
		require.NoError(t, err)
		s, err := NewJetStream(ctx, e.Conn, JetStreamConfig{})
		require.NoError(t, err)
		assert.Empty(t, s.Damage(ctx, logger))
		_ = s.Close()
		e.Close()
		l, ok := h.Find(slog.LevelDebug, "Server is ready")
		require.True(t, ok, "nats-server's notices reach the logger: %v", h.Lines(slog.LevelDebug))
		assert.Equal(t, slog.LevelDebug, l.Level)
		assert.Equal(t, "nats", l.Attrs["component"])
		assert.Empty(t, h.Lines(slog.LevelWarn))
	}
}

// TestDamagedEventsStreamIsAnErrorNamingIt: a block file of the events
// stream damaged while Stubborn was stopped — a record's header
// overwritten, or the block file gone — makes the next start log an
// ERROR "store damaged: stream STUBBORN_EVENTS: …". Before, the embedded
// server ran with its log off and the runs in that block were lost
// without a line (issue 17, finding 5).
func TestDamagedEventsStreamIsAnErrorNamingIt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, blk string)
	}{
		{"record header overwritten", func(t *testing.T, blk string) {
			b, err := os.ReadFile(blk)
			require.NoError(t, err)
			// The second record starts where the first one's length
			// (its first 4 bytes, less the headers bit) says.
			second := binary.LittleEndian.Uint32(b) &^ (1 << 31)
			require.Less(t, int(second)+4, len(b))
			for i := second; i < second+4; i++ {
				b[i] ^= 0xff
			}
			require.NoError(t, os.WriteFile(blk, b, 0o600))
		}},
		{"block file gone", func(t *testing.T, blk string) {
			require.NoError(t, os.Remove(blk))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			dir := t.TempDir()
			e, err := StartEmbedded(EmbeddedConfig{DataDir: dir, Logger: slog.New(slog.DiscardHandler)})
			require.NoError(t, err)
			first, err := NewJetStream(ctx, e.Conn, JetStreamConfig{})
			require.NoError(t, err)
			js, err := jetstream.New(e.Conn)
			require.NoError(t, err)
			for i := range 6 {
				for j := range 3 {
					_, err := js.Publish(ctx, fmt.Sprintf("stubborn.events.run_%d", i), fmt.Appendf(nil, "event %d of run %d", j, i))
					require.NoError(t, err)
				}
			}
			_ = first.Close()
			e.Close()
			tc.damage(t, filepath.Join(dir, "jetstream", "$G", "streams", "STUBBORN_EVENTS", "msgs", "1.blk"))

			h, logger := runstest.NewCapturedLogs()
			e, err = StartEmbedded(EmbeddedConfig{DataDir: dir, Logger: logger})
			require.NoError(t, err)
			defer e.Close()
			s, err := NewJetStream(ctx, e.Conn, JetStreamConfig{})
			require.NoError(t, err)
			defer func() { _ = s.Close() }()
			s.Damage(ctx, logger) // NATS 2.15 reports these two as WARN lines, not as lost data
			l, ok := h.Find(slog.LevelError, "store damaged: stream STUBBORN_EVENTS")
			require.True(t, ok, "an ERROR names the stream; logged: %v", h.Lines(slog.LevelWarn))
			assert.Equal(t, "STUBBORN_EVENTS", l.Attrs["stream"])
			assert.Equal(t, "nats", l.Attrs["component"])
		})
	}
}

// TestEmbeddedJetStreamThatCannotStartSaysWhy: nats-server reports a
// JetStream that cannot start (here: its directory is a file) as a fatal
// error and goes on without JetStream; StartEmbedded fails with that
// error and logs it. Before, it started, and the store failed later with
// "nats: jetstream not enabled". (Its own directory, a file, is refused
// before the server starts, by the data directory's lock.)
func TestEmbeddedJetStreamThatCannotStartSaysWhy(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "jetstream"), nil, 0o600))
	h, logger := runstest.NewCapturedLogs()
	_, err := StartEmbedded(EmbeddedConfig{DataDir: dir, Logger: logger})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Can't start JetStream")
	_, ok := h.Find(slog.LevelError, "Can't start JetStream")
	assert.True(t, ok, "logged: %v", h.Lines(slog.LevelWarn))
}

// TestAStaleSavedStateIsOneInfoLineNotWarnings: after an unclean stop, a
// stream's saved state (index.db) is older than its blocks, and nats-server
// rebuilds it from them with WARNs that sound alarming ("Stream state
// outdated …", "Recovering stream state from index errored: prior state
// file"). Nothing is lost: the start says so in one INFO line naming the
// stream, with nothing at WARN or above, and the damage check finds
// nothing; every message is there.
func TestAStaleSavedStateIsOneInfoLineNotWarnings(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir := t.TempDir()
	publish := func(n int) {
		e, err := StartEmbedded(EmbeddedConfig{DataDir: dir})
		require.NoError(t, err)
		defer e.Close()
		js, err := jetstream.New(e.Conn)
		require.NoError(t, err)
		_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Storage: jetstream.FileStorage})
		require.NoError(t, err)
		for i := range n {
			_, err := js.Publish(ctx, fmt.Sprintf("t.%d", i), []byte("x"))
			require.NoError(t, err)
		}
	}
	index := filepath.Join(dir, "jetstream", "$G", "streams", "T", "msgs", "index.db")
	publish(10) // a clean stop writes the saved state
	saved, err := os.ReadFile(index)
	require.NoError(t, err)
	publish(10)
	require.NoError(t, os.WriteFile(index, saved, 0o600)) // as if the second stop never wrote it

	h, logger := runstest.NewCapturedLogs()
	e, err := StartEmbedded(EmbeddedConfig{DataDir: dir, Logger: logger})
	require.NoError(t, err)
	defer e.Close()
	rebuilt := false
	for _, l := range h.Lines(slog.LevelDebug) {
		rebuilt = rebuilt || (l.Level == slog.LevelDebug && l.Attrs["stream"] == "T" && strings.Contains(l.Msg, "will rebuild"))
	}
	require.True(t, rebuilt, "nats-server rebuilt the stale state (the case under test): %v", h.Lines(slog.LevelDebug))
	assert.Empty(t, h.Lines(slog.LevelWarn), "a rebuild after an unclean stop is no warning")
	l, ok := h.Find(slog.LevelInfo, "recovered after an unclean stop")
	require.True(t, ok, "%v", h.Lines(slog.LevelInfo))
	assert.Contains(t, l.Msg, "nothing lost")
	assert.Equal(t, "[T]", fmt.Sprint(l.Attrs["streams"]))
	assert.False(t, e.Damaged())
	js, err := jetstream.New(e.Conn)
	require.NoError(t, err)
	st, err := js.Stream(ctx, "T")
	require.NoError(t, err)
	info, err := st.Info(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(20), info.State.Msgs)
}
