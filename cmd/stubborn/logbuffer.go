package main

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"sync"
	"time"
)

// logBuffer holds serve's log lines and writes them out together: every
// flushEvery, when its buffer fills, at once after a record at Warn or
// above (bufferedHandler), and on Close. At info level a run logs two or
// three lines and its call one more; written one system call each, they
// cost a busy server more than a third of its throughput (issue 21:
// `-log-level warn` ran 1.3-1.4 × the runs of `info` side by side).
// What a crash loses is at most flushEvery of info lines: a panic in a
// handler is recovered and logged at Error, which is written at once.
type logBuffer struct {
	mu     sync.Mutex
	w      *bufio.Writer
	closed bool // guarded by mu: records are written out at once

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// logBufferSize is the buffer's size: a burst bigger than it is written
// as it fills.
const logBufferSize = 64 << 10

// newLogBuffer returns a buffer in front of w that flushes every
// flushEvery until Close.
func newLogBuffer(w io.Writer, flushEvery time.Duration) *logBuffer {
	b := &logBuffer{w: bufio.NewWriterSize(w, logBufferSize), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(b.done)
		t := time.NewTicker(flushEvery)
		defer t.Stop()
		for {
			select {
			case <-b.stop:
				return
			case <-t.C:
				_ = b.Flush()
			}
		}
	}()
	return b
}

// Write buffers p, one log record.
func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.w.Write(p)
	if err == nil && b.closed {
		err = b.w.Flush()
	}
	return n, err
}

// Flush writes out what is buffered.
func (b *logBuffer) Flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.w.Flush()
}

// Close stops the flushes and writes out what is left. Records written
// after it are written out at once.
func (b *logBuffer) Close() error {
	b.once.Do(func() {
		close(b.stop)
		<-b.done
	})
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	return b.w.Flush()
}

// bufferedHandler is a slog.Handler writing to a logBuffer, which it
// flushes after every record at Warn or above: those are never held.
type bufferedHandler struct {
	slog.Handler
	buf *logBuffer
}

func (h bufferedHandler) Handle(ctx context.Context, r slog.Record) error {
	err := h.Handler.Handle(ctx, r)
	if r.Level >= slog.LevelWarn {
		if ferr := h.buf.Flush(); err == nil {
			err = ferr
		}
	}
	return err
}

func (h bufferedHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return bufferedHandler{h.Handler.WithAttrs(attrs), h.buf}
}

func (h bufferedHandler) WithGroup(name string) slog.Handler {
	return bufferedHandler{h.Handler.WithGroup(name), h.buf}
}
