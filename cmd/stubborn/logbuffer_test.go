package main

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Info lines wait for the next flush; a warning is written at once, with
// what waited before it; Close writes the rest, and later lines go at
// once.
func TestLogBufferHoldsInfoNotWarnings(t *testing.T) {
	out := &syncBuffer{}
	buf := newLogBuffer(out, time.Hour)
	log := slog.New(bufferedHandler{slog.NewTextHandler(buf, nil), buf}).With("k", "v")
	log.Info("one")
	assert.Empty(t, out.String(), "an info line waits")
	log.Warn("two")
	assert.Equal(t, 2, strings.Count(out.String(), "k=v"), "a warning is written at once, after what waited: %q", out.String())
	assert.Less(t, strings.Index(out.String(), "msg=one"), strings.Index(out.String(), "msg=two"))
	log.Info("three")
	require.NoError(t, buf.Close())
	assert.Contains(t, out.String(), "msg=three")
	log.Info("four")
	assert.Contains(t, out.String(), "msg=four", "after Close, at once")
	require.NoError(t, buf.Close(), "Close twice")
}

// The flusher writes what waits every flushEvery.
func TestLogBufferFlushesByItself(t *testing.T) {
	out := &syncBuffer{}
	buf := newLogBuffer(out, time.Millisecond)
	defer buf.Close()
	slog.New(bufferedHandler{slog.NewTextHandler(buf, nil), buf}).Info("soon")
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "msg=soon") }, 5*time.Second, time.Millisecond)
}
