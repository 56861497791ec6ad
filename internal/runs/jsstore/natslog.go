package jsstore

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats-server/v2/server"
)

// natsLogger carries the embedded NATS server's log to a slog.Logger, each
// line with component=nats: notices at Debug (a start alone writes a dozen
// of them: banner, version, limits, JetStream's settings), warnings at
// Warn, errors and fatal errors at Error. The server's debug and trace
// lines are not asked for (SetLoggerV2's flags are off), so they never
// come; were they asked for, they would go to Debug.
//
// A line of a stream's file store ("Filestore [STUBBORN_EVENTS] …") gets
// stream=<name>; one that says a block file is damaged (see damageWords)
// is an ERROR that reads "store damaged: stream <name>: …", whatever level
// nats-server gave it (it says so at Warn, and then goes on without the
// messages it could not read). A line that says a saved state is older
// than its blocks (recoveryWords: what every crash leaves, rebuilt with
// nothing lost) goes to Debug, and the start says it in one INFO line.
//
// A fatal error does not end the process, as nats-server's own logger
// would: the first one is kept for StartEmbedded to return (nats-server
// calls Fatalf, and goes on, when JetStream cannot start, say).
type natsLogger struct {
	log *slog.Logger

	mu    sync.Mutex
	fatal string // the first Fatalf's line; guarded by mu
	// damage says a line said a block file is damaged.
	damage atomic.Bool
	// rebuilt are the streams whose state a start rebuilt from their
	// blocks (recoveryWords), by name; guarded by mu.
	rebuilt map[string]int
	// reported says the start is over (reportRecovery): a recovery line
	// after it keeps its level.
	reported atomic.Bool
}

var _ server.Logger = (*natsLogger)(nil)

func newNATSLogger(l *slog.Logger) *natsLogger {
	if l == nil {
		l = slog.Default()
	}
	return &natsLogger{log: l.With("component", "nats")}
}

func (n *natsLogger) Noticef(format string, v ...any) { n.put(slog.LevelDebug, format, v) }
func (n *natsLogger) Warnf(format string, v ...any)   { n.put(slog.LevelWarn, format, v) }
func (n *natsLogger) Errorf(format string, v ...any)  { n.put(slog.LevelError, format, v) }
func (n *natsLogger) Debugf(format string, v ...any)  { n.put(slog.LevelDebug, format, v) }
func (n *natsLogger) Tracef(format string, v ...any)  { n.put(slog.LevelDebug, format, v) }

// damageWords are the words of nats-server's file store lines (v2.15)
// that say a block file is damaged or missing: a record that fails its
// sanity check or checksum, an index that does not match, a block that
// cannot be loaded or found. Its other lines (a state file outdated
// after a crash, which it rebuilds from the blocks, say) keep their level.
var damageWords = []string{
	"corrupt", "checksum", "sanity check", "overrun", "inconsistency",
	"could not locate msg block", "loadBlock error", "lost",
}

// recoveryWords are the words of nats-server's file store warnings
// (v2.15) that say its saved state (index.db, the TTL and scheduling
// state) is older than its blocks, as after a crash or a kill, and that it
// rebuilds that state from the blocks: what every unclean stop leaves, and
// nothing lost. They go to Debug, and a start says them in one INFO line
// (reportRecovery). A line that also has a damage word stays an ERROR.
var recoveryWords = []string{
	"stream state outdated", "errored: prior state file", "state is outdated; attempting to recover",
}

// storeLine splits a file store's line into its stream and the rest.
func storeLine(line string) (stream, rest string, ok bool) {
	rest, ok = strings.CutPrefix(line, "Filestore [")
	if !ok {
		return "", "", false
	}
	stream, rest, ok = strings.Cut(rest, "] ")
	return stream, rest, ok
}

func (n *natsLogger) Fatalf(format string, v ...any) {
	line := fmt.Sprintf(format, v...)
	n.mu.Lock()
	if n.fatal == "" {
		n.fatal = line
	}
	n.mu.Unlock()
	n.log.Error(line, "fatal", true)
}

// firstFatal is the first fatal error's line, "" if none came.
func (n *natsLogger) firstFatal() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.fatal
}

func (n *natsLogger) put(level slog.Level, format string, v []any) {
	ctx := context.Background()
	if level < slog.LevelWarn && !n.log.Enabled(ctx, level) {
		return // no Sprintf for a line that goes nowhere (a warning may be an error)
	}
	line := fmt.Sprintf(format, v...)
	stream, rest, ok := storeLine(line)
	if !ok {
		n.log.Log(ctx, level, line)
		return
	}
	if level >= slog.LevelWarn && damaged(rest) {
		n.damage.Store(true)
		n.log.Error(fmt.Sprintf("store damaged: stream %s: %s", stream, rest), "stream", stream)
		return
	}
	if level == slog.LevelWarn && !n.reported.Load() && containsAny(rest, recoveryWords) {
		n.mu.Lock()
		if n.rebuilt == nil {
			n.rebuilt = map[string]int{}
		}
		n.rebuilt[stream]++
		n.mu.Unlock()
		level = slog.LevelDebug
	}
	n.log.Log(ctx, level, line, "stream", stream)
}

// reportRecovery writes, once the start is over (ready or not), one INFO
// line naming the streams whose state it rebuilt from their blocks, if
// any: the normal recovery after an unclean stop. Damage, if any, was an
// ERROR already. Recovery lines after it keep their WARN.
func (n *natsLogger) reportRecovery() {
	n.reported.Store(true)
	n.mu.Lock()
	streams := slices.Sorted(maps.Keys(n.rebuilt))
	n.mu.Unlock()
	if len(streams) == 0 {
		return
	}
	msg := "recovered after an unclean stop: the store rebuilt its saved state from its blocks, nothing lost"
	if n.damage.Load() {
		msg = "recovered after an unclean stop: the store rebuilt its saved state from its blocks (and found damage: see the ERROR lines)"
	}
	n.log.Info(msg, "streams", streams)
}

func damaged(s string) bool { return containsAny(s, damageWords) }

// containsAny reports whether s has one of words, whatever their case.
func containsAny(s string, words []string) bool {
	s = strings.ToLower(s)
	for _, w := range words {
		if strings.Contains(s, strings.ToLower(w)) {
			return true
		}
	}
	return false
}
