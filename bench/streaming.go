package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/stubbornhq/stubborn/delegatekit"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/runs"
)

// The streaming scenarios (issue #33) measure streamed output with the
// shipped binary, each piece in its own process, in the shipped rotation
// (shipped.go):
//
//	client ── ExecuteStream ───────────────> stream delegate (bench -role stream-delegate)
//	client ── POST /v1/chat/completions ───> SSE model (bench -role sse-model)
//	client ── Run ──> stubborn serve ──> either of them
//
// The four scenarios ("-scenarios streaming" for all of them):
//
//   - proc-stream-direct: ExecuteStream to the stream delegate, a gRPC
//     delegate written with delegatekit whose Func Sends the pieces; read
//     to its Result;
//   - proc-stream-sse: a Chat Completions request with stream: true to the
//     SSE model, an OpenAI-shaped server streaming the same pieces as
//     Server-Sent Events; read to data: [DONE];
//   - proc-stream-run: Run with fallback_chain [streamer] (the stream
//     delegate) on `stubborn serve`, read to run_finished;
//   - proc-stream-run-sse: the same with fallback_chain [model], the SSE
//     model registered as an `openai` delegate.
//
// Both delegates stream the same answer: -stream-pieces pieces of
// -stream-piece-bytes bytes, the first at once, then one every
// -stream-pace (by default 20 pieces of 50 bytes 5 ms apart: a 1,000-byte
// answer over 95 ms). Each call's client measures the time to its first
// output (TTFO: from sending the request to the first text received: a
// text_delta, an SSE event with content, or Run's first attempt_output
// event) and to its last (TTLO), how many messages carried the text
// (through Stubborn: attempt_output events; directly: the delegate's
// pieces) and checks that the whole text came, in order, once.
var streamingNames = []string{"proc-stream-direct", "proc-stream-sse", "proc-stream-run", "proc-stream-run-sse"}

// Delegate names of the streaming scenarios in `stubborn serve`'s config.
const (
	streamerName = "streamer" // the stream delegate (gRPC, ExecuteStream)
	modelName    = "model"    // the SSE model (kind openai)
)

// streamShape is the answer both streaming delegates give: pieces pieces
// of size bytes, the first at once and then one every pace.
type streamShape struct {
	pieces, size int
	pace         time.Duration
}

// defaultStreamShape is a model's answer sped up: 20 pieces of 50 bytes
// (about a dozen tokens each) 5 ms apart, 1,000 bytes over 95 ms, so that
// a 5 s measurement holds about 50 runs at concurrency 1 and the text of a
// run is one kilobyte.
var defaultStreamShape = streamShape{pieces: 20, size: 50, pace: 5 * time.Millisecond}

// flags registers the shape's flags on fs, with prefix ("stream-" on the
// bench's command line, none in a role's).
func (s *streamShape) flags(fs *flag.FlagSet, prefix string) {
	fs.IntVar(&s.pieces, prefix+"pieces", defaultStreamShape.pieces, "streaming scenarios: pieces of text each streamed answer has")
	fs.IntVar(&s.size, prefix+"piece-bytes", defaultStreamShape.size, "streaming scenarios: bytes of each piece")
	fs.DurationVar(&s.pace, prefix+"pace", defaultStreamShape.pace, "streaming scenarios: time between two pieces (the first goes at once)")
}

func (s streamShape) check() error {
	if s.pieces < 1 || s.size < 1 || s.pace < 0 {
		return errors.New("-stream-pieces and -stream-piece-bytes must be positive, -stream-pace not negative")
	}
	return nil
}

func (s streamShape) args() []string {
	return []string{"-pieces", fmt.Sprint(s.pieces), "-piece-bytes", fmt.Sprint(s.size), "-pace", s.pace.String()}
}

// piece is the answer's piece i: a word of one letter repeated, and a
// space.
func (s streamShape) piece(i int) string {
	w := strings.Repeat(string(rune('a'+i%26)), s.size)
	if s.size > 1 {
		w = w[:s.size-1] + " "
	}
	return w
}

// text is the whole answer.
func (s streamShape) text() string {
	var b strings.Builder
	for i := range s.pieces {
		b.WriteString(s.piece(i))
	}
	return b.String()
}

// stream calls send with each piece at its time: piece i at start + i·pace
// (so a late piece does not delay the next ones).
func (s streamShape) stream(ctx context.Context, send func(i int) error) error {
	start := time.Now()
	for i := range s.pieces {
		if i > 0 {
			if err := sleepUntil(ctx, start.Add(time.Duration(i)*s.pace)); err != nil {
				return err
			}
		}
		if err := send(i); err != nil {
			return err
		}
	}
	return nil
}

// streaming says whether scenario is a streaming one.
// (The front door's scenarios, frontdoor.go, are measured the same way.)
func streaming(scenario string) bool {
	return slices.Contains(streamingNames, scenario) || slices.Contains(frontDoorNames, scenario)
}

// streamProcs are the streaming delegates' processes.
type streamProcs struct {
	grpc, sse       *child
	grpcAddr, sseAt string // the stream delegate's address; the SSE model's base URL
}

// startStreamers starts the stream delegate and the SSE model when o
// selects a streaming scenario (nil otherwise), with start (runShipped's:
// they are stopped with its other children).
func startStreamers(o options, self string, start func(spec childSpec, ready string, timeout time.Duration) (*child, []string, error)) (*streamProcs, error) {
	if !slices.ContainsFunc(streamingNames, func(s string) bool { return o.scenarios[s] }) &&
		!slices.ContainsFunc(frontDoorNames, func(s string) bool { return o.scenarios[s] }) {
		return nil, nil
	}
	var p streamProcs
	for _, r := range []struct {
		role string
		c    **child
		addr *string
	}{{"stream-delegate", &p.grpc, &p.grpcAddr}, {"sse-model", &p.sse, &p.sseAt}} {
		c, f, err := start(childSpec{name: r.role, path: self, args: append([]string{"-role", r.role, "-exit-on-eof"}, o.stream.args()...), stdin: true}, "READY", time.Minute)
		if err != nil {
			return nil, err
		}
		if len(f) != 1 {
			return nil, fmt.Errorf("%s: READY with %d addresses, want 1", r.role, len(f))
		}
		*r.c, *r.addr = c, f[0]
	}
	progress("streaming: %d pieces of %d bytes, %v apart; stream delegate on %s, SSE model at %s", o.stream.pieces, o.stream.size, o.stream.pace, p.grpcAddr, p.sseAt)
	return &p, nil
}

// config is what `stubborn serve`'s config adds for p: the stream delegate
// (a gRPC delegate, stream: auto) and the SSE model (kind openai).
func (p *streamProcs) config() []byte {
	if p == nil {
		return nil
	}
	return fmt.Appendf(nil, "  - {name: %s, target: %q, idempotent: true, timeout: 1m}\n  - {name: %s, openai: {base_url: %q, model: bench}, idempotent: true, timeout: 1m}\n",
		streamerName, p.grpcAddr, modelName, p.sseAt)
}

// directTargets are the scenarios that call the streaming delegates
// without Stubborn.
func (p *streamProcs) directTargets(o options, client func(target, scenario string) []string) []shippedTarget {
	if p == nil {
		return nil
	}
	var out []shippedTarget
	if o.scenarios["proc-stream-direct"] {
		out = append(out, shippedTarget{scenario: "proc-stream-direct", client: append(client(p.grpcAddr, "stream-direct"), o.stream.args()...), delegate: p.grpc})
	}
	if o.scenarios["proc-stream-sse"] {
		out = append(out, shippedTarget{scenario: "proc-stream-sse", client: append(client(p.sseAt, "stream-sse"), o.stream.args()...), delegate: p.sse})
	}
	if o.scenarios["proc-sse-plain"] {
		out = append(out, shippedTarget{scenario: "proc-sse-plain", client: append(client(p.sseAt, "sse-plain"), o.stream.args()...), delegate: p.sse})
	}
	return out
}

// runTargets are the scenarios that call them through s, `stubborn serve`
// on store at addr.
func (p *streamProcs) runTargets(o options, client func(target, scenario string) []string, s *child, store, addr string) []shippedTarget {
	if p == nil {
		return nil
	}
	var out []shippedTarget
	if o.scenarios["proc-stream-run"] {
		out = append(out, shippedTarget{scenario: "proc-stream-run", store: store, client: append(client(addr, "stream-run"), o.stream.args()...), server: s, delegate: p.grpc})
	}
	if o.scenarios["proc-stream-run-sse"] {
		out = append(out, shippedTarget{scenario: "proc-stream-run-sse", store: store, client: append(client(addr, "stream-run-sse"), o.stream.args()...), server: s, delegate: p.sse})
	}
	return out
}

// serveStreamer runs the role stream-delegate or sse-model: it serves on a
// loopback port, prints "READY <address>" (the SSE model: its base URL)
// and serves until ctx ends or, with eof, stdin closes.
func serveStreamer(ctx context.Context, role string, sh streamShape, stdin io.Reader, stdout io.Writer, eof bool) error {
	if err := sh.check(); err != nil {
		return err
	}
	lis, err := listen()
	if err != nil {
		return err
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	ready := lis.Addr().String()
	switch role {
	case "stream-delegate":
		srv := delegatekit.NewServer(sh.execute, delegatekit.WithGrace(time.Second), delegatekit.WithLogger(slog.New(slog.DiscardHandler)))
		go func() { done <- srv.Serve(sctx, lis) }()
	default:
		hs := &http.Server{Handler: newSSEModel(sh), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			err := hs.Serve(lis)
			if errors.Is(err, http.ErrServerClosed) {
				err = nil
			}
			done <- err
		}()
		go func() {
			<-sctx.Done()
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if hs.Shutdown(cctx) != nil {
				_ = hs.Close()
			}
		}()
		ready = "http://" + ready + "/v1"
	}
	fmt.Fprintf(stdout, "READY %s\n", ready)
	go func() {
		serveUntil(sctx, stdin, eof)
		stop()
	}()
	return <-done
}

// execute is the stream delegate's delegatekit.Func: it Sends the pieces
// at their times; the pieces joined are its answer.
func (s streamShape) execute(ctx context.Context, _ *stubbornv1.ExecuteRequest) (*stubbornv1.Result, error) {
	err := s.stream(ctx, func(i int) error { return delegatekit.Send(ctx, s.piece(i)) })
	return nil, err
}

// sseModel serves OpenAI's Chat Completions API: streamed, each piece is
// one SSE event (a chat.completion.chunk with the piece as its delta's
// content), then one with finish_reason, one with the usage and data:
// [DONE]; not streamed (the front door's proc-sse-plain), one
// chat.completion with the whole text, sent when the last piece would be.
// The answers are encoded once.
type sseModel struct {
	shape  streamShape
	events [][]byte // one a piece
	tail   []byte   // finish_reason, usage, [DONE]
	whole  []byte   // the chat.completion
}

func newSSEModel(sh streamShape) *sseModel {
	m := &sseModel{shape: sh}
	chunk := func(v any) []byte {
		b, err := json.Marshal(v)
		if err != nil {
			panic(err)
		}
		return fmt.Appendf(nil, "data: %s\n\n", b)
	}
	type delta struct {
		Content string `json:"content,omitempty"`
	}
	type choice struct {
		Index        int     `json:"index"`
		Delta        delta   `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	}
	type ev struct {
		ID      string         `json:"id"`
		Object  string         `json:"object"`
		Model   string         `json:"model"`
		Choices []choice       `json:"choices"`
		Usage   map[string]int `json:"usage,omitempty"`
	}
	for i := range sh.pieces {
		m.events = append(m.events, chunk(ev{ID: "bench", Object: "chat.completion.chunk", Model: "bench", Choices: []choice{{Delta: delta{Content: sh.piece(i)}}}}))
	}
	stop := "stop"
	m.tail = chunk(ev{ID: "bench", Object: "chat.completion.chunk", Model: "bench", Choices: []choice{{Delta: delta{}, FinishReason: &stop}}})
	m.tail = append(m.tail, chunk(ev{ID: "bench", Object: "chat.completion.chunk", Model: "bench", Choices: []choice{},
		Usage: map[string]int{"prompt_tokens": 8, "completion_tokens": sh.pieces, "total_tokens": 8 + sh.pieces}})...)
	m.tail = append(m.tail, "data: [DONE]\n\n"...)
	var err error
	m.whole, err = json.Marshal(map[string]any{
		"id": "bench", "object": "chat.completion", "model": "bench",
		"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": sh.text()}, "finish_reason": "stop"}},
		"usage":   map[string]int{"prompt_tokens": 8, "completion_tokens": sh.pieces, "total_tokens": 8 + sh.pieces},
	})
	if err != nil {
		panic(err)
	}
	return m
}

func (m *sseModel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		http.NotFound(w, r)
		return
	}
	var req struct {
		Stream bool `json:"stream"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		http.Error(w, `{"error":{"message":"bench: not a Chat Completions request"}}`, http.StatusBadRequest)
		return
	}
	if !req.Stream {
		// The whole answer when the streamed one would end.
		if m.shape.stream(r.Context(), func(int) error { return nil }) == nil {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(m.whole)
		}
		return
	}
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "no flusher", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	err := m.shape.stream(r.Context(), func(i int) error {
		if _, err := w.Write(m.events[i]); err != nil {
			return err
		}
		fl.Flush()
		return nil
	})
	if err == nil {
		_, _ = w.Write(m.tail)
	}
}

// streamSample is what a client saw of one streaming call: the times from
// the request to the first and the last text (µs), the messages that
// carried the text and its bytes; through Stubborn, also where the time to
// the first output went (Split). In JSON it is an array of the four (or
// eight), the times rounded to the µs: a client at concurrency 32 sends
// thousands.
type streamSample struct {
	First, Last float64
	Msgs, Bytes int
	// Split is a run's time to first output in four parts (µs), by the
	// events' times (the server's clock: one machine, one clock):
	//  0. the request to run_started's time (the call reaches Run, the
	//     run is accepted);
	//  1. run_started to attempt_started;
	//  2. attempt_started to the first attempt_output's time: the events
	//     before the call written, the delegate called, its first piece
	//     back (the delegate's own time to first output) and recorded;
	//  3. that time to the event's arrival at the client: written to the
	//     store, handed to the Run stream, sent.
	Split []float64
}

func (s streamSample) MarshalJSON() ([]byte, error) {
	b := fmt.Appendf(nil, "[%.0f,%.0f,%d,%d", s.First, s.Last, s.Msgs, s.Bytes)
	for _, v := range s.Split {
		b = fmt.Appendf(b, ",%.0f", v)
	}
	return append(b, ']'), nil
}

func (s *streamSample) UnmarshalJSON(b []byte) error {
	var v []float64
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	if len(v) != 4 && len(v) != 4+splitParts {
		return fmt.Errorf("a stream sample of %d numbers", len(v))
	}
	*s = streamSample{First: v[0], Last: v[1], Msgs: int(v[2]), Bytes: int(v[3])}
	if len(v) > 4 {
		s.Split = v[4:]
	}
	return nil
}

// splitParts is the length of streamSample.Split.
const splitParts = 4

// streamOp is one streaming call; it checks that the whole text came.
type streamOp func(ctx context.Context) (streamSample, error)

// streamClient runs the role client for a streaming scenario: a closed
// loop of calls against conn (or the SSE model at target), then one JSON
// line, a LoadResult with each counted call's streamSample.
func streamClient(ctx context.Context, target, scenario string, conc int, warmup, dur time.Duration, sh streamShape, stdout io.Writer) error {
	if err := sh.check(); err != nil {
		return err
	}
	// The window runLoadKeep measures in (its own start is a few µs
	// later: no call is counted that ends after it).
	win := &window{from: time.Now().Add(warmup)}
	win.end = win.from.Add(dur)
	var fn streamOp
	switch scenario {
	case "stream-sse", "frontdoor-stream":
		// The model: the SSE model's own name, or the delegate over it.
		fn = sseOp(target, frontDoorModel(scenario), conc, sh, win)
	case "sse-plain", "frontdoor":
		fn = plainOp(target, frontDoorModel(scenario), conc, sh, win)
	case "frontdoor-responses":
		fn = responsesOp(target, frontDoorModel(scenario), conc, sh, win)
	default:
		conn, err := dial(target)
		if err != nil {
			return err
		}
		defer conn.Close()
		switch scenario {
		case "stream-direct":
			fn = executeStreamOp(stubbornv1.NewDelegateServiceClient(conn), sh, win)
		case "stream-run", "stream-run-sse":
			name := streamerName
			if scenario == "stream-run-sse" {
				name = modelName
			}
			fn = streamRunOp(conn, name, sh, win)
		default:
			return fmt.Errorf("-scenario: unknown streaming scenario %q", scenario)
		}
	}
	m, samples := runLoadKeep(ctx, conc, warmup, dur, fn)
	r := summarize("proc-"+scenario, "", conc, m)
	r.Samples = samples
	r.WindowBytes = win.bytes.Load()
	return json.NewEncoder(stdout).Encode(r)
}

// window counts the text a client receives within its measured window,
// whatever call it is of (calls are counted only when they begin and end
// within it): the bench divides the processes' CPU time over the window by
// it. A call of a long answer is not counted in the window it straddles,
// but its text is.
type window struct {
	from, end time.Time
	bytes     atomic.Int64
}

func (w *window) add(n int) {
	if t := time.Now(); !t.Before(w.from) && t.Before(w.end) {
		w.bytes.Add(int64(n))
	}
}

// executeStreamOp is proc-stream-direct's call: ExecuteStream, read to
// its Result.
func executeStreamOp(c stubbornv1.DelegateServiceClient, sh streamShape, win *window) streamOp {
	want := sh.text()
	req := &stubbornv1.ExecuteStreamRequest{Brief: brief}
	return func(ctx context.Context) (streamSample, error) {
		var s streamSample
		var text strings.Builder
		t0 := time.Now()
		st, err := c.ExecuteStream(ctx, req)
		if err != nil {
			return s, err
		}
		var result *stubbornv1.Result
		for {
			m, err := st.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return s, err
			}
			if d := m.GetTextDelta(); d != "" {
				s.seen(t0, len(d), win)
				text.WriteString(d)
			}
			if r := m.GetResult(); r != nil {
				result = r
			}
		}
		if result == nil {
			return s, errors.New("the stream ended without a result")
		}
		return s, s.whole(text.String(), want)
	}
}

// seen notes a message with n bytes of text, received now.
func (s *streamSample) seen(t0 time.Time, n int, win *window) {
	win.add(n)
	t := us(time.Since(t0))
	if s.Msgs == 0 {
		s.First = t
	}
	s.Last = t
	s.Msgs++
}

// whole checks that the text received is the whole answer, and keeps its
// size.
func (s *streamSample) whole(got, want string) error {
	s.Bytes = len(got)
	if got != want {
		return fmt.Errorf("got %d bytes of text in %d messages, want the %d bytes of the answer", len(got), s.Msgs, len(want))
	}
	return nil
}

// sseOp is proc-stream-sse's call: a Chat Completions request with stream:
// true, as Stubborn's openai kind sends it, its events read to [DONE].
func sseOp(base, model string, conc int, sh streamShape, win *window) streamOp {
	want := sh.text()
	hc := chatClient(conc)
	url := strings.TrimSuffix(base, "/") + "/chat/completions"
	body, _ := json.Marshal(map[string]any{
		"model": model, "messages": []map[string]string{{"role": "user", "content": brief}},
		"stream": true, "stream_options": map[string]bool{"include_usage": true},
	})
	return func(ctx context.Context) (streamSample, error) {
		var s streamSample
		var text strings.Builder
		t0 := time.Now()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return s, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "text/event-stream")
		resp, err := hc.Do(req)
		if err != nil {
			return s, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
			return s, fmt.Errorf("%s: %s", resp.Status, b)
		}
		sc := bufio.NewScanner(resp.Body)
		done := false
		for !done && sc.Scan() {
			data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
			if !ok {
				continue
			}
			if string(data) == "[DONE]" {
				done = true
				break
			}
			var ch struct {
				Choices []struct {
					Delta struct {
						Content string `json:"content"`
					} `json:"delta"`
				} `json:"choices"`
			}
			if err := json.Unmarshal(data, &ch); err != nil {
				return s, fmt.Errorf("not a chunk: %w", err)
			}
			if len(ch.Choices) > 0 && ch.Choices[0].Delta.Content != "" {
				s.seen(t0, len(ch.Choices[0].Delta.Content), win)
				text.WriteString(ch.Choices[0].Delta.Content)
			}
		}
		if err := sc.Err(); err != nil {
			return s, err
		}
		if !done {
			return s, errors.New("the stream ended without [DONE]")
		}
		return s, s.whole(text.String(), want)
	}
}

// streamRunOp is proc-stream-run's and proc-stream-run-sse's call: Run
// with fallback_chain [name], read to its end, which must be a
// run_finished SUCCEEDED after one attempt; its attempt_output events must
// be the whole answer, each at the offset the ones before it end at.
func streamRunOp(conn *grpc.ClientConn, name string, sh streamShape, win *window) streamOp {
	c := stubbornv1.NewControlServiceClient(conn)
	want := sh.text()
	req := &stubbornv1.RunRequest{TaskBrief: brief, FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{name}}}
	return func(ctx context.Context) (streamSample, error) {
		var s streamSample
		var text strings.Builder
		t0 := time.Now()
		st, err := c.Run(ctx, req)
		if err != nil {
			return s, err
		}
		var last *stubbornv1.RunEvent
		var started, attempt time.Time
		for {
			m, err := st.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return s, err
			}
			last = m.GetEvent()
			switch {
			case last.GetRunStarted() != nil:
				started = last.GetTime().AsTime()
			case last.GetAttemptStarted() != nil && attempt.IsZero():
				attempt = last.GetTime().AsTime()
			}
			if o := last.GetAttemptOutput(); o != nil {
				if s.Msgs == 0 && !started.IsZero() && !attempt.IsZero() {
					// Wall clocks: the server's times are wall times.
					now, at := time.Now().Round(0), last.GetTime().AsTime()
					s.Split = []float64{us(started.Sub(t0.Round(0))), us(attempt.Sub(started)), us(at.Sub(attempt)), us(now.Sub(at))}
				}
				s.seen(t0, len(o.GetText()), win)
				if o.GetOffset() != int64(text.Len()) {
					return s, fmt.Errorf("attempt_output at offset %d after %d bytes", o.GetOffset(), text.Len())
				}
				text.WriteString(o.GetText())
			}
		}
		rs := last.GetRunFinished().GetState()
		if rs.GetStatus() != stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED || rs.GetAttempts() != 1 {
			return s, fmt.Errorf("run ended %s after %d attempts (%s)", rs.GetStatus(), rs.GetAttempts(), rs.GetStatusReason())
		}
		return s, s.whole(text.String(), want)
	}
}

// outputBound is the most attempt_output events a run whose output
// streamed over span (first to last event, as its client saw them) and
// held n bytes may have: the first piece at once, then at most one an
// interval (floor(span/interval) on the server's clock; rounded up here,
// as the client's span may be a little shorter than the server's), one a
// maxBytes of text, and what waits when the call ends.
func outputBound(span, interval time.Duration, n, maxBytes int) int {
	return 2 + int(math.Ceil(float64(span)/float64(interval))) + n/maxBytes
}

// mergeStreaming fills r's streaming figures from the samples of its
// slices (a client reports each call's): TTFO and TTLO percentiles over
// every counted call, the text's bytes and messages per call, messages per
// second of streaming (all messages over all the time from a call's first
// to its last output), and the runs whose attempt_output events exceed
// outputBound with serve's coalescing (flags, else the defaults).
func mergeStreaming(r *LoadResult, slices_ []LoadResult, serveFlags []string) {
	var all []streamSample
	for _, s := range slices_ {
		all = append(all, s.Samples...)
	}
	if len(all) == 0 {
		return
	}
	interval, maxBytes := coalescing(serveFlags)
	var split [splitParts][]float64
	for _, s := range all {
		if len(s.Split) == splitParts {
			for i, v := range s.Split {
				split[i] = append(split[i], v)
			}
		}
	}
	if len(split[0]) > 0 {
		r.TTFOSplitP50us = make([]float64, splitParts)
		for i := range split {
			r.TTFOSplitP50us[i] = median(split[i], func(v float64) float64 { return v })
		}
	}
	first := make([]time.Duration, len(all))
	last := make([]time.Duration, len(all))
	var msgs, n int
	var span time.Duration
	for i, s := range all {
		first[i] = time.Duration(s.First * float64(time.Microsecond))
		last[i] = time.Duration(s.Last * float64(time.Microsecond))
		msgs += s.Msgs
		n += s.Bytes
		span += last[i] - first[i]
		if strings.Contains(r.Scenario, "-run") && s.Msgs > outputBound(last[i]-first[i], interval, s.Bytes, maxBytes) {
			r.OverBound++
		}
	}
	slices.Sort(first)
	slices.Sort(last)
	r.TTFOP50us, r.TTFOP99us = us(percentile(first, 0.50)), us(percentile(first, 0.99))
	r.TTLOP50us, r.TTLOP99us = us(percentile(last, 0.50)), us(percentile(last, 0.99))
	r.OutputBytesPerOp = float64(n) / float64(len(all))
	r.OutputMsgsPerOp = float64(msgs) / float64(len(all))
	if span > 0 {
		r.OutputMsgsPerSec = float64(msgs) / span.Seconds()
	}
	r.StreamedCalls = int64(len(all))
}

// coalescing is serve's -output-flush-interval and -output-flush-bytes in
// flags, or their defaults.
func coalescing(flags []string) (time.Duration, int) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	interval := fs.Duration("output-flush-interval", runs.DefaultOutputFlushInterval, "")
	maxBytes := fs.Int("output-flush-bytes", runs.DefaultOutputFlushBytes, "")
	// Only these two: skip the other flags (and their values).
	var mine []string
	for i := 0; i < len(flags); i++ {
		name := strings.TrimLeft(flags[i], "-")
		k, _, hasValue := strings.Cut(name, "=")
		if k != "output-flush-interval" && k != "output-flush-bytes" {
			continue
		}
		mine = append(mine, flags[i])
		if !hasValue && i+1 < len(flags) {
			mine = append(mine, flags[i+1])
			i++
		}
	}
	_ = fs.Parse(mine)
	return *interval, *maxBytes
}

// StreamRow compares streamed output through Stubborn with the same
// delegate called directly, in one run at one concurrency.
type StreamRow struct {
	// Delegate is "grpc" (proc-stream-run beside proc-stream-direct) or
	// "openai" (proc-stream-run-sse beside proc-stream-sse).
	Delegate    string `json:"delegate"`
	Store       string `json:"store"`
	Concurrency int    `json:"concurrency"`

	TTFOP50us       float64 `json:"ttfo_p50_us"`
	TTFOP99us       float64 `json:"ttfo_p99_us"`
	DirectTTFOP50us float64 `json:"direct_ttfo_p50_us"`
	DirectTTFOP99us float64 `json:"direct_ttfo_p99_us"`
	TTLOP50us       float64 `json:"ttlo_p50_us"`
	TTLOP99us       float64 `json:"ttlo_p99_us"`
	DirectTTLOP50us float64 `json:"direct_ttlo_p50_us"`
	DirectTTLOP99us float64 `json:"direct_ttlo_p99_us"`
	// Added are Stubborn's figures minus the direct ones.
	AddedTTFOP50us float64 `json:"added_ttfo_p50_us"`
	AddedTTFOP99us float64 `json:"added_ttfo_p99_us"`
	AddedTTLOP50us float64 `json:"added_ttlo_p50_us"`
	AddedTTLOP99us float64 `json:"added_ttlo_p99_us"`

	// ServerCPUusPerKB is `stubborn serve`'s CPU time per 1,000 bytes of
	// text streamed through it (all its CPU: the runs' own work too);
	// DelegateCPUusPerKB the streaming delegate's, called directly.
	ServerCPUusPerKB   float64 `json:"server_cpu_us_per_kb"`
	DelegateCPUusPerKB float64 `json:"delegate_cpu_us_per_kb"`
	// ServerCPUusPerRun is `stubborn serve`'s CPU time per run counted
	// (a little high for long answers: see window).
	ServerCPUusPerRun float64 `json:"server_cpu_us_per_run"`
	// EventsPerRun are the attempt_output events of a run (each at most one
	// store write; several may share one); DirectPieces the messages that
	// carried the text directly.
	EventsPerRun float64 `json:"events_per_run"`
	DirectPieces float64 `json:"direct_pieces"`
	// EventsPerSec is attempt_output events per second of a run's
	// streaming (its first to its last output), over all runs.
	EventsPerSec float64 `json:"events_per_sec"`
	// OverBound counts runs with more events than outputBound.
	OverBound int64 `json:"over_bound"`
	Runs      int64 `json:"runs"`

	// TTFOSplitP50us is the median of each part of a run's time to first
	// output (streamSample.Split).
	TTFOSplitP50us []float64 `json:"ttfo_split_p50_us,omitempty"`

	// The target on AddedTTFOP50us at the lowest concurrency (0: none).
	AddedTTFOP50AtMostUs float64 `json:"added_ttfo_p50_at_most_us,omitempty"`
}

func (r StreamRow) key() string { return fmt.Sprintf("%s|%s|%d", r.Delegate, r.Store, r.Concurrency) }

// Issue #33's targets: added TTFO p50 at concurrency 1, by store.
var targetAddedTTFO = map[string]float64{"memory": 1000, "embedded-interval": 2000}

// streamRows pairs each streaming run measurement in load with its direct
// one.
func streamRows(load []LoadResult) []StreamRow {
	lo := math.MaxInt
	for _, r := range load {
		if streaming(r.Scenario) {
			lo = min(lo, r.Concurrency)
		}
	}
	var out []StreamRow
	for _, r := range load {
		if r.Scenario != "proc-stream-run" && r.Scenario != "proc-stream-run-sse" {
			continue
		}
		delegate, direct := "grpc", "proc-stream-direct"
		if r.Scenario == "proc-stream-run-sse" {
			delegate, direct = "openai", "proc-stream-sse"
		}
		i := slices.IndexFunc(load, func(d LoadResult) bool { return d.Scenario == direct && d.Concurrency == r.Concurrency })
		if i < 0 {
			continue
		}
		d := load[i]
		row := StreamRow{
			Delegate: delegate, Store: r.Store, Concurrency: r.Concurrency,
			TTFOP50us: r.TTFOP50us, TTFOP99us: r.TTFOP99us, DirectTTFOP50us: d.TTFOP50us, DirectTTFOP99us: d.TTFOP99us,
			TTLOP50us: r.TTLOP50us, TTLOP99us: r.TTLOP99us, DirectTTLOP50us: d.TTLOP50us, DirectTTLOP99us: d.TTLOP99us,
			AddedTTFOP50us: r.TTFOP50us - d.TTFOP50us, AddedTTFOP99us: r.TTFOP99us - d.TTFOP99us,
			AddedTTLOP50us: r.TTLOP50us - d.TTLOP50us, AddedTTLOP99us: r.TTLOP99us - d.TTLOP99us,
			ServerCPUusPerRun: r.ServerCPUusPerOp,
			EventsPerRun:      r.OutputMsgsPerOp, DirectPieces: d.OutputMsgsPerOp, EventsPerSec: r.OutputMsgsPerSec,
			OverBound: r.OverBound, Runs: r.StreamedCalls,
			TTFOSplitP50us:     r.TTFOSplitP50us,
			ServerCPUusPerKB:   r.ServerCPUusPerKB,
			DelegateCPUusPerKB: d.DelegateCPUusPerKB,
		}
		if r.Concurrency == lo {
			row.AddedTTFOP50AtMostUs = targetAddedTTFO[r.Store]
		}
		out = append(out, row)
	}
	return out
}

// medianStreamRows is each row of reps[0] with every figure the median of
// that row's in every report (each report's own differences).
func medianStreamRows(reps []*Report) []StreamRow {
	var out []StreamRow
	for _, base := range reps[0].Streaming {
		vs := collect(reps, func(r *Report) []StreamRow { return r.Streaming }, base.key(), StreamRow.key)
		m := base
		for _, f := range []struct {
			dst *float64
			get func(StreamRow) float64
		}{
			{&m.TTFOP50us, func(v StreamRow) float64 { return v.TTFOP50us }},
			{&m.TTFOP99us, func(v StreamRow) float64 { return v.TTFOP99us }},
			{&m.DirectTTFOP50us, func(v StreamRow) float64 { return v.DirectTTFOP50us }},
			{&m.DirectTTFOP99us, func(v StreamRow) float64 { return v.DirectTTFOP99us }},
			{&m.TTLOP50us, func(v StreamRow) float64 { return v.TTLOP50us }},
			{&m.TTLOP99us, func(v StreamRow) float64 { return v.TTLOP99us }},
			{&m.DirectTTLOP50us, func(v StreamRow) float64 { return v.DirectTTLOP50us }},
			{&m.DirectTTLOP99us, func(v StreamRow) float64 { return v.DirectTTLOP99us }},
			{&m.AddedTTFOP50us, func(v StreamRow) float64 { return v.AddedTTFOP50us }},
			{&m.AddedTTFOP99us, func(v StreamRow) float64 { return v.AddedTTFOP99us }},
			{&m.AddedTTLOP50us, func(v StreamRow) float64 { return v.AddedTTLOP50us }},
			{&m.AddedTTLOP99us, func(v StreamRow) float64 { return v.AddedTTLOP99us }},
			{&m.ServerCPUusPerKB, func(v StreamRow) float64 { return v.ServerCPUusPerKB }},
			{&m.DelegateCPUusPerKB, func(v StreamRow) float64 { return v.DelegateCPUusPerKB }},
			{&m.ServerCPUusPerRun, func(v StreamRow) float64 { return v.ServerCPUusPerRun }},
			{&m.EventsPerRun, func(v StreamRow) float64 { return v.EventsPerRun }},
			{&m.DirectPieces, func(v StreamRow) float64 { return v.DirectPieces }},
			{&m.EventsPerSec, func(v StreamRow) float64 { return v.EventsPerSec }},
		} {
			*f.dst = median(vs, f.get)
		}
		if len(base.TTFOSplitP50us) == splitParts {
			m.TTFOSplitP50us = make([]float64, splitParts)
			for i := range m.TTFOSplitP50us {
				m.TTFOSplitP50us[i] = median(vs, func(v StreamRow) float64 {
					if len(v.TTFOSplitP50us) != splitParts {
						return 0
					}
					return v.TTFOSplitP50us[i]
				})
			}
		}
		m.OverBound, m.Runs = 0, 0
		for _, v := range vs {
			m.OverBound += v.OverBound // all of them: any is news
			m.Runs += v.Runs
		}
		if base.Concurrency == lowestStreamConcurrency(reps[0].Streaming) {
			m.AddedTTFOP50AtMostUs = targetAddedTTFO[base.Store]
		}
		out = append(out, m)
	}
	return out
}

func lowestStreamConcurrency(rows []StreamRow) int {
	lo := math.MaxInt
	for _, r := range rows {
		lo = min(lo, r.Concurrency)
	}
	return lo
}

// printStreaming prints the streaming rows and the verdicts on issue #33's
// targets.
func printStreaming(w io.Writer, rows []StreamRow, what string) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "### Streamed output (issue 33; %s)\n\n", what)
	fmt.Fprintln(w, "TTFO/TTLO: from the request to the first/last text at the client. Stubborn = `Run`, fallback_chain over the delegate, first output = the first `attempt_output` event; direct = ExecuteStream (grpc) or an SSE request (openai) to the same delegate. Added = Stubborn − direct. CPU/KB: `stubborn serve`'s CPU time per 1,000 bytes of text it streamed (the delegate's, called directly). Events: `attempt_output` events per run (each at most one store write); pieces: the delegate's messages. Events/s: per second of a run's streaming (first to last output).")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| delegate | store | c | TTFO p50 (direct) | added p50 | TTFO p99 (direct) | added p99 | TTLO p50 (direct) | added p50 | TTLO p99 (direct) | server CPU/KB (delegate) | events/run (pieces) | events/s | runs over bound | target: added TTFO p50 |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|")
	for _, r := range rows {
		target := "–"
		if r.AddedTTFOP50AtMostUs > 0 {
			target = fmt.Sprintf("≤ %s: %s", usStr(r.AddedTTFOP50AtMostUs), verdict(r.AddedTTFOP50us <= r.AddedTTFOP50AtMostUs))
		}
		fmt.Fprintf(w, "| %s | %s | %d | %s (%s) | %s | %s (%s) | %s | %s (%s) | %s | %s (%s) | %s (%s) | %.1f (%.0f) | %.1f | %d of %d | %s |\n",
			r.Delegate, r.Store, r.Concurrency,
			usStr(r.TTFOP50us), usStr(r.DirectTTFOP50us), signedUs(r.AddedTTFOP50us),
			usStr(r.TTFOP99us), usStr(r.DirectTTFOP99us), signedUs(r.AddedTTFOP99us),
			usStr(r.TTLOP50us), usStr(r.DirectTTLOP50us), signedUs(r.AddedTTLOP50us),
			usStr(r.TTLOP99us), usStr(r.DirectTTLOP99us),
			orDash(r.ServerCPUusPerKB, usStr), orDash(r.DelegateCPUusPerKB, usStr), r.EventsPerRun, r.DirectPieces, r.EventsPerSec, r.OverBound, r.Runs, target)
	}
	fmt.Fprintln(w)
	if !slices.ContainsFunc(rows, func(r StreamRow) bool { return len(r.TTFOSplitP50us) == splitParts }) {
		return
	}
	fmt.Fprintln(w, "Where a run's time to first output goes (medians, by the events' times; the parts need not add up to the TTFO p50): request → run_started; → attempt_started; → first attempt_output recorded (events written, delegate called, its first piece back; the delegate's own TTFO is the direct p50); → received by the client (written to the store, sent on the Run stream).")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| delegate | store | c | → run_started | → attempt_started | → output recorded | → output received | direct TTFO p50 |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|")
	for _, r := range rows {
		if len(r.TTFOSplitP50us) != splitParts {
			continue
		}
		p := r.TTFOSplitP50us
		fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %s | %s | %s |\n", r.Delegate, r.Store, r.Concurrency,
			wallUs(p[0]), wallUs(p[1]), wallUs(p[2]), wallUs(p[3]), usStr(r.DirectTTFOP50us))
	}
	fmt.Fprintln(w)
}

// wallUs is usStr of a difference of two processes' wall clocks, which
// may be a little negative.
func wallUs(v float64) string {
	if v < 0 {
		return "−" + usStr(-v)
	}
	return usStr(v)
}

// signedUs is usStr with a sign.
func signedUs(v float64) string {
	if v < 0 {
		return "−" + usStr(-v)
	}
	return "+" + usStr(v)
}

// runLoadKeep is runLoad for a call that says what it saw: it also returns
// what the counted calls returned.
func runLoadKeep[T any](ctx context.Context, conc int, warmup, dur time.Duration, fn func(context.Context) (T, error)) (measured, []T) {
	var mu sync.Mutex
	var kept []T
	m := runLoadWith(ctx, conc, warmup, dur, func(ctx context.Context) (func(), error) {
		v, err := fn(ctx)
		return func() {
			mu.Lock()
			kept = append(kept, v)
			mu.Unlock()
		}, err
	})
	return m, kept
}
