package delegates

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"

	"github.com/stubbornhq/stubborn/internal/controls"
	"google.golang.org/grpc/codes"
)

// Stream formats of an HTTP answer.
const (
	formatSSE    = "sse"
	formatNDJSON = "ndjson"
)

// maxEventSlack is what one streamed event may hold besides its text (a
// model's JSON around each delta), past max_result_bytes.
const maxEventSlack = 64 << 10

// errStreamDone is returned by an event handler at the stream's end
// marker (`data: [DONE]`): the rest is not read.
var errStreamDone = errors.New("stream done")

// cutShort is the error of a model's stream that ended without its end
// marker: the answer is not whole, and another try may give it all.
func cutShort(what string) *controls.CallError {
	return &controls.CallError{Code: codes.Unavailable, Message: "the model's stream ended before " + what + ": the answer is cut short"}
}

// cutMidEvent is the error of a stream that ended in the middle of an
// event: a last line without its newline, or (SSE) an event without the
// blank line that ends it. The unfinished event is dropped unread, as the
// WHATWG SSE grammar drops it: half a JSON value is a cut, not a model's
// unreadable answer, and another try may give it all.
func cutMidEvent() *controls.CallError {
	return &controls.CallError{Code: codes.Unavailable, Message: "the stream ended in the middle of an event: the answer is cut short"}
}

// errMidEvent is what readEvents returns for a stream that ended in the
// middle of an event; doStream makes it cutMidEvent.
var errMidEvent = errors.New("the stream ended in the middle of an event")

// event is one streamed event: its SSE event name ("" for NDJSON or an
// unnamed event) and its data.
type event struct {
	name string
	data []byte
}

// doStream sends req, asking for an answer in format, and reads a 2xx
// answer that streams (Content-Type text/event-stream for SSE; for NDJSON
// anything but application/json) event by event, giving each to each,
// until the body ends, each returns errStreamDone, or an error. A 2xx
// answer that does not stream (a server that ignored the request to) is
// returned whole, as do returns it, for the caller to read as one answer.
// The stall timers (s.begin) start as the request is sent. Any other
// answer or failure is a *controls.CallError.
func (h *httpClient) doStream(req *http.Request, s *stream, format string, each func(event) error) (*answer, error) {
	if format == formatSSE {
		req.Header.Set("Accept", "text/event-stream")
	}
	s.begin()
	resp, err := h.client.Do(req)
	if err != nil {
		return nil, requestError(req.Context(), err)
	}
	defer resp.Body.Close()
	ct := resp.Header.Get("Content-Type")
	mt, _, _ := mime.ParseMediaType(ct)
	streams := resp.StatusCode >= 200 && resp.StatusCode <= 299 &&
		((format == formatSSE && mt == "text/event-stream") || (format == formatNDJSON && mt != "application/json"))
	if !streams {
		s.disarm()
		return h.read(req, resp)
	}
	if err := readEvents(resp.Body, format, h.maxResult+maxEventSlack, each); err != nil {
		if errors.Is(err, errStreamDone) {
			return nil, nil
		}
		if errors.Is(err, errMidEvent) {
			return nil, cutMidEvent()
		}
		if _, isCallError := errors.AsType[*controls.CallError](err); isCallError {
			return nil, err
		}
		return nil, requestError(req.Context(), err)
	}
	return nil, nil
}

// readEvents reads body as a stream of events in format, each line at
// most maxLine bytes. A stream that ends in the middle of an event is
// errMidEvent, that event unread: an SSE event without its blank line (or
// a field line without its newline), an NDJSON line without its newline
// that is not a whole JSON value (JSON Lines lets the last newline go).
func readEvents(body io.Reader, format string, maxLine int, each func(event) error) error {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	// unterminated: the line just scanned is the body's last and has no
	// newline (bufio.ScanLines hides it).
	unterminated := false
	sc.Split(func(data []byte, atEOF bool) (int, []byte, error) {
		n, tok, err := bufio.ScanLines(data, atEOF)
		unterminated = atEOF && tok != nil && bytes.IndexByte(data, '\n') < 0
		return n, tok, err
	})
	var (
		ev      event
		hasData bool
		pending bool // a field of an event not yet ended
	)
	for sc.Scan() {
		line := sc.Bytes()
		if format == formatNDJSON {
			if len(bytes.TrimSpace(line)) == 0 {
				continue
			}
			if unterminated && !json.Valid(line) {
				return errMidEvent
			}
			if err := each(event{data: line}); err != nil {
				return err
			}
			continue
		}
		// Server-Sent Events (the WHATWG grammar, the fields used here):
		// a blank line dispatches the event; "data:" lines add to its
		// data, "event:" names it; comments and other fields are
		// skipped.
		if len(line) == 0 {
			if hasData {
				if err := each(ev); err != nil {
					return err
				}
			}
			ev, hasData, pending = event{}, false, false
			continue
		}
		if unterminated && line[0] != ':' { // a comment carries nothing
			return errMidEvent
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "data":
			if hasData {
				ev.data = append(ev.data, '\n')
			}
			ev.data = append(ev.data, value...)
			hasData, pending = true, true
			if len(ev.data) > maxLine {
				return resultTooLarge(maxLine-maxEventSlack, fmt.Sprintf("a streamed event is over %d bytes", maxLine))
			}
		case "event":
			ev.name = string(value)
			pending = true
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return resultTooLarge(maxLine-maxEventSlack, fmt.Sprintf("a streamed line is over %d bytes", maxLine))
		}
		return err
	}
	if pending {
		return errMidEvent
	}
	return nil
}
