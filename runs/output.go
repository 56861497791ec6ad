package runs

import (
	"sync"
	"time"
	"unicode/utf8"
)

// Defaults of Config.OutputFlushInterval and Config.OutputFlushBytes.
const (
	// DefaultOutputFlushInterval is how long a streamed attempt's text
	// gathers before it goes out as one attempt_output event (after the
	// attempt's first piece, which goes at once): at most 10 events, so
	// 10 store writes, a second per streaming attempt, besides what
	// OutputFlushBytes adds.
	DefaultOutputFlushInterval = 100 * time.Millisecond
	// DefaultOutputFlushBytes is the most text one attempt_output event
	// carries: more goes out at once, in events of this size.
	DefaultOutputFlushBytes = 4 << 10
)

// coalescer gathers a streamed attempt's pieces into attempt_output events
// (Config.OutputFlushInterval, OutputFlushBytes): the first piece goes out
// at once, then what came within each interval goes out together, no
// event over max bytes (cut between characters). A timer sends what waits
// when no piece follows; close sends the rest, before the call returns,
// so every piece precedes the attempt's end.
type coalescer struct {
	out    func(string)
	window time.Duration
	max    int

	mu     sync.Mutex
	buf    []byte
	last   time.Time // when text last went out
	sent   bool      // some did
	timer  *time.Timer
	armed  bool
	closed bool
}

func newCoalescer(out func(string), window time.Duration, max int) *coalescer {
	return &coalescer{out: out, window: window, max: max}
}

// piece takes the next piece of the attempt's text.
func (c *coalescer) piece(text string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.buf = append(c.buf, text...)
	for len(c.buf) >= c.max {
		c.sendLocked(c.max)
	}
	now := time.Now()
	switch {
	case len(c.buf) == 0:
	case !c.sent || now.Sub(c.last) >= c.window:
		c.sendLocked(len(c.buf))
	case !c.armed:
		c.armed = true
		wait := c.last.Add(c.window).Sub(now)
		if c.timer == nil {
			c.timer = time.AfterFunc(wait, c.tick)
		} else {
			c.timer.Reset(wait)
		}
	}
}

// tick sends what waits once the interval is over.
func (c *coalescer) tick() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed = false
	if !c.closed && len(c.buf) > 0 {
		c.sendLocked(len(c.buf))
	}
}

// sendLocked sends up to n bytes of the buffer, cut before a character
// that would not fit whole.
func (c *coalescer) sendLocked(n int) {
	if n < len(c.buf) {
		for n > 0 && !utf8.RuneStart(c.buf[n]) {
			n--
		}
		if n == 0 { // one character over max: it goes whole
			_, n = utf8.DecodeRune(c.buf)
		}
	}
	text := string(c.buf[:n])
	c.buf = c.buf[:copy(c.buf, c.buf[n:])]
	c.last, c.sent = time.Now(), true
	c.out(text)
}

// close sends what waits; nothing goes out after it.
func (c *coalescer) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
	}
	if len(c.buf) > 0 {
		c.sendLocked(len(c.buf))
	}
	c.closed = true
}
