package runstest

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
)

// LogLine is one record a CapturedLogs handler kept.
type LogLine struct {
	Level slog.Level
	Msg   string
	Attrs map[string]string
}

func (l LogLine) String() string { return fmt.Sprintf("%s %q %v", l.Level, l.Msg, l.Attrs) }

// CapturedLogs is a slog.Handler that keeps every record, at every level.
type CapturedLogs struct {
	mu    *sync.Mutex
	lines *[]LogLine
	attrs []slog.Attr
}

// NewCapturedLogs returns a handler and a logger that writes to it.
func NewCapturedLogs() (*CapturedLogs, *slog.Logger) {
	h := &CapturedLogs{mu: &sync.Mutex{}, lines: &[]LogLine{}}
	return h, slog.New(h)
}

func (h *CapturedLogs) Enabled(context.Context, slog.Level) bool { return true }

func (h *CapturedLogs) Handle(_ context.Context, r slog.Record) error {
	l := LogLine{Level: r.Level, Msg: r.Message, Attrs: map[string]string{}}
	for _, a := range h.attrs {
		l.Attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		l.Attrs[a.Key] = a.Value.String()
		return true
	})
	h.mu.Lock()
	*h.lines = append(*h.lines, l)
	h.mu.Unlock()
	return nil
}

func (h *CapturedLogs) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return &c
}

func (h *CapturedLogs) WithGroup(string) slog.Handler { return h }

// Lines returns the records kept so far at level or above.
func (h *CapturedLogs) Lines(level slog.Level) []LogLine {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []LogLine
	for _, l := range *h.lines {
		if l.Level >= level {
			out = append(out, l)
		}
	}
	return out
}

// Find returns the first record at level or above whose message holds s.
func (h *CapturedLogs) Find(level slog.Level, s string) (LogLine, bool) {
	for _, l := range h.Lines(level) {
		if strings.Contains(l.Msg, s) {
			return l, true
		}
	}
	return LogLine{}, false
}
