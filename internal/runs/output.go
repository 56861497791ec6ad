package runs

import (
	"sync"
	"time"
	"unicode/utf8"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
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
// event over max bytes (texts and tool calls' arguments cut between
// characters; each delta's framing counted, deltaFraming). Pieces keep their order; adjacent fragments of one stream
// (a choice's text, one of its tool calls) are merged into one. A timer
// sends what waits when no piece follows; close sends the rest, before the
// call returns, so every piece precedes the attempt's end.
//
// Choice 0's text (Call.Output) is held as a text delta of choice 0, as
// Call.Deltas takes it, so that one event carries text and deltas that
// came together.
type coalescer struct {
	out    func([]*stubbornv1.OutputDelta)
	window time.Duration
	max    int

	mu     sync.Mutex
	buf    []*stubbornv1.OutputDelta
	size   int       // what buf costs an event (deltaSize)
	last   time.Time // when output last went out
	sent   bool      // some did
	timer  *time.Timer
	armed  bool
	closed bool
}

func newCoalescer(out func([]*stubbornv1.OutputDelta), window time.Duration, max int) *coalescer {
	return &coalescer{out: out, window: window, max: max}
}

// piece takes the next piece of the attempt's text (choice 0's).
func (c *coalescer) piece(text string) {
	if text == "" {
		return
	}
	c.deltas([]*stubbornv1.OutputDelta{{Kind: &stubbornv1.OutputDelta_Text{Text: text}}})
}

// deltas takes the next pieces of the attempt's answer.
func (c *coalescer) deltas(ds []*stubbornv1.OutputDelta) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	for _, d := range ds {
		c.pushLocked(d)
	}
	for c.size >= c.max {
		c.sendLocked(c.max)
	}
	now := time.Now()
	switch {
	case c.size == 0:
	case !c.sent || now.Sub(c.last) >= c.window:
		c.sendLocked(c.size)
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

// deltaKey says which stream a delta continues: its choice, and -1 for
// the choice's text or the index of its tool call.
type deltaKey struct{ choice, call int32 }

func streamOf(d *stubbornv1.OutputDelta) (deltaKey, bool) {
	switch k := d.GetKind().(type) {
	case *stubbornv1.OutputDelta_Text:
		return deltaKey{d.GetChoice(), -1}, true
	case *stubbornv1.OutputDelta_ToolCall:
		return deltaKey{d.GetChoice(), k.ToolCall.GetIndex()}, true
	}
	return deltaKey{}, false
}

// deltaFraming is what a delta that goes out as one (any but choice 0's
// text, which is the event's text) costs besides its texts: about its
// encoding's tags, lengths, choice, index and offset. Counted against the
// byte bound, so that an event's encoding stays near it however small its
// pieces are.
const deltaFraming = 24

// deltaSize is the bytes a delta costs an event: its text, or its call's
// id, name and arguments, and its framing when it goes out as a delta.
func deltaSize(d *stubbornv1.OutputDelta) int {
	if tc := d.GetToolCall(); tc != nil {
		return deltaFraming + len(tc.GetId()) + len(tc.GetName()) + len(tc.GetArguments())
	}
	if d.GetChoice() != 0 {
		return deltaFraming + len(d.GetText())
	}
	return len(d.GetText())
}

// payload is the bytes a delta carries: its text, or its call's id, name
// and arguments.
func payload(d *stubbornv1.OutputDelta) int {
	if tc := d.GetToolCall(); tc != nil {
		return len(tc.GetId()) + len(tc.GetName()) + len(tc.GetArguments())
	}
	return len(d.GetText())
}

// pushLocked adds d to the buffer (a copy: the delegate's stays its own),
// merged into the last piece when both continue the same stream. Callers
// hold c.mu.
func (c *coalescer) pushLocked(d *stubbornv1.OutputDelta) {
	key, ok := streamOf(d)
	if !ok || payload(d) == 0 {
		return
	}
	if len(c.buf) > 0 {
		if last := c.buf[len(c.buf)-1]; streamKeyOf(last) == key {
			c.size -= deltaSize(last)
			if tc := last.GetToolCall(); tc != nil {
				add := d.GetToolCall()
				tc.Arguments += add.GetArguments()
				if tc.Id == "" && tc.Name == "" { // the first piece had neither
					tc.Id, tc.Name = add.GetId(), add.GetName()
				}
			} else {
				last.Kind = &stubbornv1.OutputDelta_Text{Text: last.GetText() + d.GetText()}
			}
			c.size += deltaSize(last)
			return
		}
	}
	d = copyDelta(d)
	c.size += deltaSize(d)
	c.buf = append(c.buf, d)
}

func streamKeyOf(d *stubbornv1.OutputDelta) deltaKey {
	k, _ := streamOf(d)
	return k
}

// copyDelta copies d but its offset, which the tracker sets.
func copyDelta(d *stubbornv1.OutputDelta) *stubbornv1.OutputDelta {
	if tc := d.GetToolCall(); tc != nil {
		return &stubbornv1.OutputDelta{Choice: d.GetChoice(), Kind: &stubbornv1.OutputDelta_ToolCall{ToolCall: &stubbornv1.ToolCallDelta{
			Index: tc.GetIndex(), Id: tc.GetId(), Name: tc.GetName(), Arguments: tc.GetArguments(),
		}}}
	}
	return &stubbornv1.OutputDelta{Choice: d.GetChoice(), Kind: &stubbornv1.OutputDelta_Text{Text: d.GetText()}}
}

// tick sends what waits once the interval is over.
func (c *coalescer) tick() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed = false
	if !c.closed && c.size > 0 {
		c.sendLocked(c.size)
	}
}

// sendLocked sends up to n bytes of the buffer (deltaSize), in order, the
// piece that would not fit whole cut before a character of its text or
// arguments (a tool call's id and name never cut). When not even that
// fits, the first character, or the first call's id and name, goes alone,
// over n.
func (c *coalescer) sendLocked(n int) {
	var ev []*stubbornv1.OutputDelta
	for len(c.buf) > 0 && n > 0 {
		d := c.buf[0]
		if s := deltaSize(d); s <= n {
			ev = append(ev, d)
			c.buf, n = c.buf[1:], n-s
			continue
		}
		if head := cutDelta(d, n); head != nil {
			ev = append(ev, head)
		}
		break
	}
	if len(ev) == 0 && len(c.buf) > 0 {
		ev = append(ev, cutDelta(c.buf[0], 0))
		if payload(c.buf[0]) == 0 {
			c.buf = c.buf[1:]
		}
	}
	c.size = 0
	for _, d := range c.buf {
		c.size += deltaSize(d)
	}
	if len(c.buf) == 0 {
		c.buf = nil // let the sent pieces go
	}
	c.last, c.sent = time.Now(), true
	c.out(ev)
}

// cutDelta takes from d what fits n bytes (deltaSize), cut between
// characters, and leaves the rest in d; nil when nothing fits. n 0 takes
// the least that can go: one character of text, or a call's id and name
// (or one character of its arguments when it has neither).
func cutDelta(d *stubbornv1.OutputDelta, n int) *stubbornv1.OutputDelta {
	cut := func(s string, n int) int {
		if n >= len(s) {
			return len(s)
		}
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		return n
	}
	least := n == 0
	if tc := d.GetToolCall(); tc != nil {
		head := deltaFraming + len(tc.GetId()) + len(tc.GetName())
		i := 0
		switch {
		case least && head == deltaFraming:
			_, i = utf8.DecodeRuneInString(tc.GetArguments())
		case least:
		case n < head:
			return nil
		default:
			i = cut(tc.GetArguments(), n-head)
			if i == 0 && head == deltaFraming {
				return nil
			}
		}
		out := &stubbornv1.OutputDelta{Choice: d.GetChoice(), Kind: &stubbornv1.OutputDelta_ToolCall{ToolCall: &stubbornv1.ToolCallDelta{
			Index: tc.GetIndex(), Id: tc.GetId(), Name: tc.GetName(), Arguments: tc.GetArguments()[:i],
		}}}
		tc.Id, tc.Name, tc.Arguments = "", "", tc.GetArguments()[i:]
		return out
	}
	text := d.GetText()
	i := 0
	if least {
		_, i = utf8.DecodeRuneInString(text)
	} else if room := n - (deltaSize(d) - len(text)); room > 0 {
		i = cut(text, room)
	}
	if i == 0 {
		return nil
	}
	d.Kind = &stubbornv1.OutputDelta_Text{Text: text[i:]}
	return &stubbornv1.OutputDelta{Choice: d.GetChoice(), Kind: &stubbornv1.OutputDelta_Text{Text: text[:i]}}
}

// close sends what waits; nothing goes out after it.
func (c *coalescer) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
	}
	for c.size > 0 {
		c.sendLocked(min(c.size, c.max))
	}
	c.closed = true
}
