package main

import (
	"log/slog"
	"time"
)

// Health follows the store's heartbeats as well as its connection (issue
// 29, item 6): a link that went silent (a blackhole, a stopped NATS node)
// leaves the connection up in nats.go's eyes until its pings go
// unanswered, while every store call fails. Once no heartbeat has landed
// for a lease, the other replicas count this one as dead and take its runs
// over, and its writes are fenced: health says NOT_SERVING then, and
// SERVING again once a heartbeat lands.

// beatCheckEvery is how often watchBeats looks, as a share of the lease.
const beatCheckEvery = 10

// watchBeats tells w whether the heartbeats land: stale once none has for
// lease since the last that did (or since the watch began, before the
// first). It logs a WARN once as they stop landing and an INFO once they
// land again. stop ends it.
func watchBeats(w *storeWatch, lastBeat func() time.Time, lease time.Duration, logger *slog.Logger) (stop func()) {
	done, stopped := make(chan struct{}), make(chan struct{})
	began := time.Now()
	go func() {
		defer close(stopped)
		t := time.NewTicker(max(lease/beatCheckEvery, 50*time.Millisecond))
		defer t.Stop()
		stale := false
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			last := lastBeat()
			if last.Before(began) {
				last = began
			}
			now := time.Since(last) > lease
			if now == stale {
				continue
			}
			stale = now
			if stale {
				logger.Warn("the store's heartbeats have not landed for a lease: health says NOT_SERVING (other replicas take this one's runs over)",
					"last_beat", last, "lease", lease)
			} else {
				logger.Info("the store's heartbeats land again: health says SERVING")
			}
			w.setStale(stale)
		}
	}()
	return func() { close(done); <-stopped }
}

// setStale records whether the store's heartbeats have stopped landing,
// and tells health.
func (w *storeWatch) setStale(stale bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stale = stale
	if w.serving != nil {
		w.serving(w.up())
	}
}

// up reports whether the store is reachable: its connection up, its
// heartbeats landing. Callers hold w.mu.
func (w *storeWatch) up() bool { return !w.down && !w.stale }
