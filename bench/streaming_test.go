package main

import (
	"encoding/json"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/server"
)

// smokeShape is a short answer for the smoke tests: 5 pieces of 40 bytes,
// 2 ms apart.
var smokeShape = streamShape{pieces: 5, size: 40, pace: 2 * time.Millisecond}

// checkStreamed checks a streaming measurement's figures: no call failed,
// some were counted, each got the whole text, and the times make sense.
func checkStreamed(t *testing.T, r LoadResult) {
	t.Helper()
	assert.Zero(t, r.Errors, "%s: %s", r.Scenario, r.FirstError)
	assert.Positive(t, r.StreamedCalls, "%s: no call counted", r.Scenario)
	assert.Positive(t, r.TTFOP50us, r.Scenario)
	assert.GreaterOrEqual(t, r.TTFOP99us, r.TTFOP50us, r.Scenario)
	assert.GreaterOrEqual(t, r.TTLOP50us, r.TTFOP50us, r.Scenario)
	// The last piece goes (pieces-1)·pace after the first, which goes
	// after the request came.
	assert.GreaterOrEqual(t, r.TTLOP50us, us(time.Duration(smokeShape.pieces-1)*smokeShape.pace), r.Scenario)
	assert.Equal(t, float64(len(smokeShape.text())), r.OutputBytesPerOp, "%s: every call got the whole text", r.Scenario)
	if r.Scenario != "proc-sse-plain" && r.Scenario != "proc-frontdoor" && r.Scenario != "proc-frontdoor-responses" {
		assert.Positive(t, r.OutputMsgsPerSec, r.Scenario) // (an answer in one piece streams over no time)
	}
	assert.Zero(t, r.OverBound, r.Scenario)
	assert.Empty(t, r.Samples, "%s: the samples stay between the client and the bench", r.Scenario)
}

// The direct streaming scenarios in their processes (the stream delegate,
// the SSE model, a client per slice): every call gets the whole answer in
// its pieces, the figures are sane, each delegate's CPU is read, and no
// child process or temporary file outlives runShipped. (Through Stubborn:
// TestStreamingThroughStubborn, without building the binary.)
func TestStreamingScenariosDirect(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	o := options{
		scenarios:   map[string]bool{"proc-stream-direct": true, "proc-stream-sse": true, "proc-sse-plain": true},
		concurrency: []int{2},
		duration:    400 * time.Millisecond, slice: 400 * time.Millisecond,
		warmup: 100 * time.Millisecond, procWarmup: 50 * time.Millisecond,
		stream: smokeShape,
	}
	load, err := runShipped(testCtx(t), o)
	require.NoError(t, err)
	var got []string
	for _, r := range load {
		got = append(got, r.Scenario)
		checkStreamed(t, r)
		if r.Scenario == "proc-sse-plain" {
			assert.Equal(t, 1.0, r.OutputMsgsPerOp, "%s: the whole answer at once", r.Scenario)
		} else {
			assert.Equal(t, float64(smokeShape.pieces), r.OutputMsgsPerOp, "%s: one message a piece", r.Scenario)
		}
		// (CPU time is read in ticks of 10 ms: a short window may see none.)
		assert.GreaterOrEqual(t, r.DelegateCPUusPerKB, 0.0, r.Scenario)
		assert.Zero(t, r.ServerRSSBytes, "%s: no process between the client and the delegate", r.Scenario)
	}
	assert.Equal(t, []string{"proc-stream-direct", "proc-stream-sse", "proc-sse-plain"}, got)
	assert.Empty(t, children(t))
	left, err := os.ReadDir(tmp)
	require.NoError(t, err)
	assert.Empty(t, left, "temporary files left")
}

// The client role runs the streaming scenarios through Stubborn (here an
// in-process server with the config `stubborn serve` gets) against the
// streaming delegates' processes: each run's attempt_output events are the
// whole answer, fewer than its pieces, within the coalescing's bound.
func TestStreamingThroughStubborn(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	ctx := testCtx(t)
	self, err := os.Executable()
	require.NoError(t, err)
	var kids []*child
	defer func() {
		for _, c := range kids {
			c.stop()
		}
	}()
	start := func(spec childSpec, ready string, timeout time.Duration) (*child, []string, error) {
		c, err := startChild(ctx, spec)
		if err != nil {
			return nil, nil, err
		}
		kids = append(kids, c)
		line, err := c.next(ctx, ready, timeout)
		if err != nil {
			return nil, nil, err
		}
		return c, strings.Fields(line)[1:], nil
	}
	o := options{scenarios: map[string]bool{"proc-stream-run": true}, stream: smokeShape}
	p, err := startStreamers(o, self, start)
	require.NoError(t, err)
	reg, err := delegates.Parse(append([]byte("delegates:\n"), p.config()...))
	require.NoError(t, err)
	srv, err := server.New(server.Config{Registry: reg, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	lis, err := listen()
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop(5 * time.Second)
	// The front door, as serve -http-listen serves it.
	h, err := srv.HTTPHandler()
	require.NoError(t, err)
	hlis, err := listen()
	require.NoError(t, err)
	hs := server.NewHTTPServer(h)
	go func() { _ = hs.Serve(hlis) }()
	defer hs.Close()
	door := "http://" + hlis.Addr().String() + "/v1"

	for _, sc := range []string{"stream-run", "stream-run-sse", "frontdoor", "frontdoor-stream", "frontdoor-responses"} {
		target := lis.Addr().String()
		if strings.HasPrefix(sc, "frontdoor") {
			target = door
		}
		args := append([]string{"-role", "client", "-target", target, "-scenario", sc,
			"-concurrency", "2", "-duration", "300ms", "-warmup", "50ms"}, smokeShape.args()...)
		c, err := startChild(ctx, childSpec{name: sc, path: self, args: args})
		require.NoError(t, err)
		line, err := c.next(ctx, "{", time.Minute)
		c.stop()
		require.NoError(t, err)
		var r LoadResult
		require.NoError(t, json.Unmarshal([]byte(line), &r), line)
		assert.Equal(t, "proc-"+sc, r.Scenario)
		require.NotEmpty(t, r.Samples, "%s: the client's samples", sc)
		merged := LoadResult{Scenario: r.Scenario, Errors: r.Errors, FirstError: r.FirstError}
		mergeStreaming(&merged, []LoadResult{r}, nil)
		checkStreamed(t, merged)
		if strings.HasPrefix(sc, "frontdoor") {
			continue // no run events: chunks (or one answer)
		}
		// The first piece at once, the rest within one flush interval
		// (the answer takes 8 ms) and at the call's end.
		assert.GreaterOrEqual(t, merged.OutputMsgsPerOp, 1.0, sc)
		assert.Less(t, merged.OutputMsgsPerOp, float64(smokeShape.pieces), "%s: coalesced", sc)
		// Where the time to first output went, in four parts.
		require.Len(t, merged.TTFOSplitP50us, splitParts, sc)
		assert.Positive(t, merged.TTFOSplitP50us[2], "%s: the delegate's call", sc)
	}
}

func TestStreamSampleJSON(t *testing.T) {
	b, err := json.Marshal([]streamSample{{First: 812.4, Last: 95_310.6, Msgs: 2, Bytes: 1000}})
	require.NoError(t, err)
	assert.JSONEq(t, `[[812,95311,2,1000]]`, string(b))
	var got []streamSample
	require.NoError(t, json.Unmarshal(b, &got))
	assert.Equal(t, []streamSample{{First: 812, Last: 95_311, Msgs: 2, Bytes: 1000}}, got)
	b, err = json.Marshal(streamSample{First: 1, Last: 2, Msgs: 1, Bytes: 3, Split: []float64{100, 20.2, 500, -3}})
	require.NoError(t, err)
	assert.Equal(t, `[1,2,1,3,100,20,500,-3]`, string(b))
	var one streamSample
	require.NoError(t, json.Unmarshal(b, &one))
	assert.Equal(t, []float64{100, 20, 500, -3}, one.Split)
	assert.Error(t, json.Unmarshal([]byte(`[1,2,3]`), &one))
}

func TestCoalescingFromServeFlags(t *testing.T) {
	i, b := coalescing([]string{"-log-level", "warn"})
	assert.Equal(t, 100*time.Millisecond, i)
	assert.Equal(t, 4096, b)
	i, b = coalescing([]string{"-pprof-listen", "127.0.0.1:6060", "-output-flush-interval", "20ms", "--output-flush-bytes=512"})
	assert.Equal(t, 20*time.Millisecond, i)
	assert.Equal(t, 512, b)
	// The first piece, one an interval (rounded up), the rest at the end.
	assert.Equal(t, 2, outputBound(0, 100*time.Millisecond, 50, 4096))
	assert.Equal(t, 3, outputBound(95*time.Millisecond, 100*time.Millisecond, 1000, 4096))
	assert.Equal(t, 4, outputBound(101*time.Millisecond, 100*time.Millisecond, 1000, 4096))
	assert.Equal(t, 5, outputBound(95*time.Millisecond, 100*time.Millisecond, 9000, 4096))
}

// The streamed output rows pair each run with its direct call, and their
// medians are each run's own differences'.
func TestStreamRows(t *testing.T) {
	load := []LoadResult{
		{Scenario: "proc-stream-direct", Concurrency: 1, TTFOP50us: 200, TTLOP50us: 95_000, OutputMsgsPerOp: 20, DelegateCPUusPerKB: 300},
		{Scenario: "proc-stream-run", Store: "memory", Concurrency: 1, TTFOP50us: 700, TTLOP50us: 96_000, ServerCPUusPerOp: 900, ServerCPUusPerKB: 880, OutputBytesPerOp: 1000, OutputMsgsPerOp: 2, StreamedCalls: 40},
		{Scenario: "proc-stream-run", Store: "embedded-interval", Concurrency: 1, TTFOP50us: 2500, OutputBytesPerOp: 500, ServerCPUusPerOp: 1000, ServerCPUusPerKB: 2000},
		{Scenario: "proc-stream-direct", Concurrency: 32, TTFOP50us: 400},
		{Scenario: "proc-stream-run", Store: "memory", Concurrency: 32, TTFOP50us: 900},
	}
	rows := streamRows(load)
	require.Len(t, rows, 3)
	assert.Equal(t, StreamRow{
		Delegate: "grpc", Store: "memory", Concurrency: 1,
		TTFOP50us: 700, DirectTTFOP50us: 200, AddedTTFOP50us: 500,
		TTLOP50us: 96_000, DirectTTLOP50us: 95_000, AddedTTLOP50us: 1000,
		ServerCPUusPerKB: 880, DelegateCPUusPerKB: 300, ServerCPUusPerRun: 900, EventsPerRun: 2, DirectPieces: 20, Runs: 40,
		AddedTTFOP50AtMostUs: 1000,
	}, rows[0])
	assert.Equal(t, 2300.0, rows[1].AddedTTFOP50us)
	assert.Equal(t, 2000.0, rows[1].AddedTTFOP50AtMostUs)
	assert.Zero(t, rows[2].AddedTTFOP50AtMostUs, "targets at concurrency 1 only")

	other := append([]LoadResult(nil), load...)
	other[1].TTFOP50us, other[0].TTFOP50us = 1500, 100 // added 1400
	third := append([]LoadResult(nil), load...)
	third[1].TTFOP50us = 800 // added 600
	reps := []*Report{{Load: load}, {Load: other}, {Load: third}}
	for _, r := range reps {
		r.Streaming = streamRows(r.Load)
	}
	m := medianStreamRows(reps)
	require.Len(t, m, 3)
	assert.Equal(t, 600.0, m[0].AddedTTFOP50us, "the median of 500, 1400, 600")
	assert.Equal(t, int64(120), m[0].Runs)

	var b strings.Builder
	printStreaming(&b, m, "medians")
	assert.Contains(t, b.String(), "| grpc | memory | 1 | 800 µs (200 µs) | +600 µs |")
	assert.Contains(t, b.String(), "≤ 1.00 ms: met")
	assert.Contains(t, b.String(), "≤ 2.00 ms: **missed**")
}
