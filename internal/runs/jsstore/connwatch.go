package jsstore

import (
	"context"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go"
)

// ConnState is the state of the store's NATS connection, as WatchConn
// reports it.
type ConnState int

const (
	// ConnUp: the connection is up.
	ConnUp ConnState = iota
	// ConnDown: the connection dropped and nats.go is reconnecting.
	// Store calls fail or wait meanwhile; they work again once it is up.
	ConnDown
	// ConnClosed: the connection is closed for good. nats.go gave up
	// reconnecting, or the server closed it for a protocol error (a
	// control line over its limit, say), after which nats.go never
	// reconnects. Every store call fails from then on: the process can
	// only be restarted.
	ConnClosed
)

func (s ConnState) String() string {
	switch s {
	case ConnUp:
		return "up"
	case ConnDown:
		return "down"
	case ConnClosed:
		return "closed"
	}
	return "unknown"
}

// WatchConn reports the changes of nc's state to report and logs them: a
// disconnect at Warn, a reconnect at Info, a close at Error, and the
// asynchronous errors nats.go hands its error handler (the server's -ERR,
// a slow consumer) at Error. err is the error that came with the change,
// if any: for ConnClosed, the reason the connection was closed (nil if it
// was closed by a Close of this process).
//
// It takes over nc's disconnect, reconnect, closed and error handlers.
// report is called from nats.go's callback goroutine, one change at a
// time, each state reported once however many callbacks say it; the state
// nc is in when WatchConn is called is reported before WatchConn returns
// if it is not ConnUp. A disconnect that is over by the time its callback
// runs is logged but not reported.
//
// stop ends the reports and the logging: call it before closing nc on
// purpose, so that the close is not taken for a failure.
func WatchConn(nc *nats.Conn, logger *slog.Logger, report func(ConnState, error)) (stop func()) {
	if logger == nil {
		logger = slog.Default()
	}
	w := &connWatch{nc: nc, log: logger, report: report, last: ConnUp}
	nc.SetDisconnectErrHandler(func(c *nats.Conn, err error) {
		if c.IsClosed() {
			w.changed("", 0, err) // the closed handler logs it
			return
		}
		w.changed("NATS connection lost, reconnecting", slog.LevelWarn, err)
	})
	nc.SetReconnectHandler(func(c *nats.Conn) {
		w.changed("NATS connection restored", slog.LevelInfo, nil, "server", c.ConnectedUrlRedacted())
	})
	nc.SetClosedHandler(func(c *nats.Conn) {
		w.changed("NATS connection closed for good", slog.LevelError, c.LastError())
	})
	nc.SetErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
		var attrs []any
		if sub != nil {
			attrs = append(attrs, "subject", sub.Subject)
		}
		w.changed("NATS error", slog.LevelError, err, attrs...)
	})
	// A change before the handlers were set has no callback coming.
	w.changed("", 0, nc.LastError())
	return w.stop
}

// connWatch is one WatchConn.
type connWatch struct {
	nc     *nats.Conn
	log    *slog.Logger
	report func(ConnState, error)

	mu      sync.Mutex // serializes reports, so they come in the order of the states read
	stopped bool       // guarded by mu
	last    ConnState  // the last state reported (ConnUp at first); guarded by mu
}

// changed logs msg (unless it is empty) and reports nc's state now if it
// differs from the last one reported. The state is read from nc rather
// than taken from the callback: a callback may run after the state it was
// about has passed.
func (w *connWatch) changed(msg string, level slog.Level, err error, attrs ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	if msg != "" {
		if err != nil {
			attrs = append(attrs, "err", err)
		}
		w.log.Log(context.Background(), level, msg, attrs...)
	}
	st := connState(w.nc.Status())
	if st == w.last {
		return
	}
	if st == ConnClosed && err == nil {
		err = w.nc.LastError()
	}
	w.last = st
	if w.report != nil {
		w.report(st, err)
	}
}

func (w *connWatch) stop() {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
}

func connState(s nats.Status) ConnState {
	switch s {
	case nats.CONNECTED, nats.DRAINING_SUBS, nats.DRAINING_PUBS:
		return ConnUp
	case nats.CLOSED:
		return ConnClosed
	}
	return ConnDown // DISCONNECTED, RECONNECTING, CONNECTING
}
