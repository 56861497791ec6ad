package jsstore

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
)

// TestNATSLoggerLevels: each of nats-server's levels lands at its slog
// level with component=nats; a file store line says its stream, and one
// that says a block file is damaged is an ERROR naming the stream whatever
// level nats-server gave it; a fatal error is an ERROR that is kept.
func TestNATSLoggerLevels(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		log    func(*natsLogger)
		level  slog.Level
		msg    string
		stream string
	}{
		{"notice", func(n *natsLogger) { n.Noticef("Server is %s", "ready") }, slog.LevelDebug, "Server is ready", ""},
		{"debug", func(n *natsLogger) { n.Debugf("d %d", 1) }, slog.LevelDebug, "d 1", ""},
		{"trace", func(n *natsLogger) { n.Tracef("t %d", 1) }, slog.LevelDebug, "t 1", ""},
		{"warning", func(n *natsLogger) { n.Warnf("slow %s", "consumer") }, slog.LevelWarn, "slow consumer", ""},
		{"error", func(n *natsLogger) { n.Errorf("JetStream out of %s", "resources") }, slog.LevelError, "JetStream out of resources", ""},
		{"fatal", func(n *natsLogger) { n.Fatalf("Can't start JetStream: %v", "no space") }, slog.LevelError, "Can't start JetStream: no space", ""},
		{
			"a rebuild after a crash is debug (the start says it in one INFO line)",
			func(n *natsLogger) {
				n.Warnf("Filestore [STUBBORN_EVENTS] %s", "Stream state outdated, last block has additional entries, will rebuild")
			},
			slog.LevelDebug, "Filestore [STUBBORN_EVENTS] Stream state outdated, last block has additional entries, will rebuild", "STUBBORN_EVENTS",
		},
		{
			"another store warning keeps its level",
			func(n *natsLogger) {
				n.Warnf("Filestore [STUBBORN_EVENTS] WriteFullState took %v (%d bytes)", "2s", 10)
			},
			slog.LevelWarn, "Filestore [STUBBORN_EVENTS] WriteFullState took 2s (10 bytes)", "STUBBORN_EVENTS",
		},
		{
			"damaged record",
			func(n *natsLogger) {
				n.Warnf("Filestore [STUBBORN_EVENTS] indexCacheBuf corrupt record state in %s: dlen %d", "1.blk", 5)
			},
			slog.LevelError, "store damaged: stream STUBBORN_EVENTS: indexCacheBuf corrupt record state in 1.blk: dlen 5", "STUBBORN_EVENTS",
		},
		{
			"missing block",
			func(n *natsLogger) {
				n.Warnf("Filestore [KV_stubborn_owners] Stream state detected prior state, could not locate msg block %d", 3)
			},
			slog.LevelError, "store damaged: stream KV_stubborn_owners: Stream state detected prior state, could not locate msg block 3", "KV_stubborn_owners",
		},
		{
			"store notice is not escalated",
			func(n *natsLogger) { n.Noticef("Filestore [STUBBORN_EVENTS] checksum %s", "fine") },
			slog.LevelDebug, "Filestore [STUBBORN_EVENTS] checksum fine", "STUBBORN_EVENTS",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, l := runstest.NewCapturedLogs()
			n := newNATSLogger(l)
			tc.log(n)
			lines := h.Lines(slog.LevelDebug)
			require.Len(t, lines, 1)
			assert.Equal(t, tc.level, lines[0].Level)
			assert.Equal(t, tc.msg, lines[0].Msg)
			assert.Equal(t, "nats", lines[0].Attrs["component"])
			assert.Equal(t, tc.stream, lines[0].Attrs["stream"])
			if tc.name == "fatal" {
				assert.Equal(t, tc.msg, n.firstFatal())
			} else {
				assert.Empty(t, n.firstFatal())
			}
		})
	}
}

func TestSeqList(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "", seqList(nil, 3))
	assert.Equal(t, "4", seqList([]uint64{4}, 3))
	assert.Equal(t, "1,2,3", seqList([]uint64{1, 2, 3}, 3))
	assert.Equal(t, "1,2,3 and 2 more", seqList([]uint64{1, 2, 3, 4, 5}, 3))
}
