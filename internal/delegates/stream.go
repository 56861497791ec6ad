package delegates

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
)

// Stream settings of a delegate (registry `stream`).
const (
	// streamAuto streams when the delegate can: a gRPC delegate is asked
	// ExecuteStream first and, if it answers UNIMPLEMENTED before any
	// output, Execute from then on; the model kinds ask for an SSE stream
	// (an answer that comes as one JSON body is read as before); an http
	// kind streams when it sets stream_format.
	streamAuto = "auto"
	// streamOn always streams (a gRPC delegate: ExecuteStream only).
	streamOn = "on"
	// streamOff never streams: Execute, or one JSON answer.
	streamOff = "off"
)

// MaxStallTimeout bounds first_output_timeout and idle_timeout, in the
// registry and in a run's options.
const MaxStallTimeout = 24 * time.Hour

// stallHead is how many characters of the output so far a stall's message
// quotes.
const stallHead = 200

// stream is one streamed call's output, as the transport reads it: each
// piece goes to the call's Output, the whole is kept (its text, when the
// delegate's last message sets none) and bounded by max_result_bytes, and
// the call's context ends when the output stalls: no first output within
// first_output_timeout, or none for idle_timeout after one.
type stream struct {
	out         func(string)
	deltas      func([]*stubbornv1.OutputDelta)
	max         int
	first, idle time.Duration
	cancel      context.CancelCauseFunc
	begun       time.Time

	mu      sync.Mutex
	timer   *time.Timer
	chunks  int
	text    strings.Builder
	other   int           // bytes of the deltas besides the text, bounded with it
	firstAt time.Duration // since begun, once a piece came
	last    time.Time     // when the last piece came
	done    bool
}

// stallError is why a stalled call's context ended.
type stallError struct{ msg string }

func (e *stallError) Error() string { return e.msg }

// newStream is the stream of call c, whose context is ctx: ctx's child
// that a stall ends is returned. Nothing is timed until the transport
// begins streaming (begin): a delegate that answers at once is bounded by
// its attempt timeout alone.
func newStream(ctx context.Context, c controls.Call, max int, first, idle time.Duration) (context.Context, *stream) {
	sctx, cancel := context.WithCancelCause(ctx)
	return sctx, &stream{out: c.Output, deltas: c.Deltas, max: max, first: first, idle: idle, cancel: cancel}
}

// begin starts the stall timers: the transport's request is on its way,
// and its answer will stream.
func (s *stream) begin() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.begun = time.Now()
	if s.first > 0 {
		s.timer = time.AfterFunc(s.first, s.stall)
	}
}

// stall ends the call: its output stalled.
func (s *stream) stall() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return
	}
	if s.chunks > 0 {
		if s.idle <= 0 {
			return // the first output came as its timer fired; no idle timeout
		}
		if wait := s.idle - time.Since(s.last); wait > 0 {
			// A piece came as the timer fired (piece could not stop
			// it): the gap is not over.
			s.timer.Reset(wait)
			return
		}
	}
	var msg string
	if s.chunks == 0 {
		msg = fmt.Sprintf("stalled: no output within %s (first_output_timeout)", s.first)
	} else {
		msg = fmt.Sprintf("stalled: no output for %s after %d chunks (idle_timeout); the output began %s",
			s.idle, s.chunks, strconv.Quote(head(s.text.String(), stallHead)))
	}
	s.cancel(&stallError{msg: msg})
}

// head is the first n characters of text.
func head(text string, n int) string {
	i := 0
	for pos := range text {
		if i == n {
			return text[:pos] + "…"
		}
		i++
	}
	return text
}

// piece takes the next piece of text (a model's: its first choice's): it
// goes to the call's Output, and rearms the idle timer. An error (the
// whole over max_result_bytes) ends the call.
func (s *stream) piece(text string) error {
	if text == "" {
		return nil
	}
	text = strings.ToValidUTF8(text, "\uFFFD")
	if ok, err := s.took(len(text), text); !ok || err != nil {
		return err
	}
	if s.out != nil {
		s.out(text)
	}
	return nil
}

// delta takes the next pieces of a model's answer besides its first
// choice's text (other choices' text, tool calls' fragments): they go to
// the call's Deltas, count toward max_result_bytes with the text, and
// rearm the idle timer as text does.
func (s *stream) delta(ds []*stubbornv1.OutputDelta) error {
	n := 0
	for _, d := range ds {
		tc := d.GetToolCall()
		n += len(d.GetText()) + len(tc.GetId()) + len(tc.GetName()) + len(tc.GetArguments())
	}
	if len(ds) == 0 {
		return nil
	}
	if ok, err := s.took(n, ""); !ok || err != nil {
		return err
	}
	if s.deltas != nil {
		s.deltas(ds)
	}
	return nil
}

// took counts n more bytes of output (text, when it is the first
// choice's text) and rearms the timers; ok is false once the stream is
// done (nothing more is passed on).
func (s *stream) took(n int, text string) (ok bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return false, nil
	}
	if s.text.Len()+s.other+n > s.max {
		return false, resultTooLarge(s.max, fmt.Sprintf("the streamed answer is over %d bytes", s.max))
	}
	s.last = time.Now()
	if s.chunks == 0 {
		s.firstAt = s.last.Sub(s.begun)
	}
	s.chunks++
	if text != "" {
		s.text.WriteString(text)
	} else {
		s.other += n
	}
	switch {
	case s.idle <= 0 && s.timer != nil:
		s.timer.Stop()
	case s.idle > 0 && s.timer == nil:
		s.timer = time.AfterFunc(s.idle, s.stall)
	case s.idle > 0:
		s.timer.Reset(s.idle)
	}
	return true, nil
}

// disarm stops the stall timers: the answer turned out not to stream (a
// gRPC delegate without ExecuteStream, a model server that answered with
// one JSON body), and is bounded by the attempt timeout alone.
func (s *stream) disarm() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.done = true
	if s.timer != nil {
		s.timer.Stop()
	}
}

// end stops the timers; no piece is taken after it.
func (s *stream) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.done = true
	if s.timer != nil {
		s.timer.Stop()
	}
}

// joined returns the text streamed so far.
func (s *stream) joined() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.text.String()
}

// streamed reports whether any piece came.
func (s *stream) streamed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.chunks > 0
}

// stalled returns the error of a call whose output stalled (ctx is the
// stream's), or nil: a transient DEADLINE_EXCEEDED that says which timeout
// and for how long. The call was sent.
func stalled(ctx context.Context) *controls.CallError {
	var se *stallError
	if !errors.As(context.Cause(ctx), &se) {
		return nil
	}
	return &controls.CallError{Code: codes.DeadlineExceeded, Message: se.msg}
}
