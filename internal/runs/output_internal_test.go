package runs

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// sink collects what a coalescer sends: each event's choice 0 text, and
// the event itself.
type sink struct {
	mu     sync.Mutex
	sent   []string
	events [][]*stubbornv1.OutputDelta
	got    chan struct{}
}

func newSink() *sink { return &sink{got: make(chan struct{}, 64)} }

func (s *sink) out(ds []*stubbornv1.OutputDelta) {
	text := ""
	for _, d := range ds {
		if d.GetChoice() == 0 {
			text += d.GetText()
		}
	}
	s.mu.Lock()
	s.sent = append(s.sent, text)
	s.events = append(s.events, ds)
	s.mu.Unlock()
	select {
	case s.got <- struct{}{}:
	default: // nobody waits for so many
	}
}

func (s *sink) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.sent...)
}

func TestTheFirstPieceGoesAtOnceAndTheRestIsCoalesced(t *testing.T) {
	s := newSink()
	c := newCoalescer(s.out, time.Hour, 1<<10) // no timer fires in the test
	c.piece("Once ")
	assert.Equal(t, []string{"Once "}, s.all(), "the first piece at once")
	for _, p := range []string{"upon ", "a ", "time"} {
		c.piece(p)
	}
	assert.Equal(t, []string{"Once "}, s.all(), "the rest waits for the interval")
	c.close()
	assert.Equal(t, []string{"Once ", "upon a time"}, s.all(), "close sends what waits")
	c.piece("late")
	assert.Len(t, s.all(), 2, "nothing after close")
}

func TestTheTimerSendsWhatWaits(t *testing.T) {
	s := newSink()
	c := newCoalescer(s.out, 10*time.Millisecond, 1<<10)
	defer c.close()
	c.piece("a")
	<-s.got
	c.piece("b")
	c.piece("c")
	select {
	case <-s.got:
	case <-time.After(10 * time.Second):
		t.Fatal("the timer never sent what waited")
	}
	assert.Equal(t, []string{"a", "bc"}, s.all())
}

func TestNoEventCarriesMoreThanTheBound(t *testing.T) {
	s := newSink()
	c := newCoalescer(s.out, time.Hour, 8)
	text := "héllo wörld, ünïcode ✓✓✓ and more"
	c.piece(text[:3]) // "hé": pieces are whole characters (the delegates layer makes them valid UTF-8)
	c.piece(text[3:])
	c.close()
	sent := s.all()
	require.NotEmpty(t, sent)
	assert.Equal(t, text, strings.Join(sent, ""), "nothing lost or repeated")
	for _, p := range sent {
		assert.LessOrEqual(t, len(p), 8, "%q", p)
		assert.True(t, strings.ToValidUTF8(p, "?") == p, "%q is cut between characters", p)
	}
}

func textDelta(choice int32, text string) *stubbornv1.OutputDelta {
	return &stubbornv1.OutputDelta{Choice: choice, Kind: &stubbornv1.OutputDelta_Text{Text: text}}
}

func callDelta(choice, index int32, id, name, args string) *stubbornv1.OutputDelta {
	return &stubbornv1.OutputDelta{Choice: choice, Kind: &stubbornv1.OutputDelta_ToolCall{ToolCall: &stubbornv1.ToolCallDelta{
		Index: index, Id: id, Name: name, Arguments: args,
	}}}
}

// describe renders an event's pieces for comparison.
func describe(ds []*stubbornv1.OutputDelta) []string {
	var out []string
	for _, d := range ds {
		if tc := d.GetToolCall(); tc != nil {
			out = append(out, fmt.Sprintf("%d/call%d %s %s %s", d.GetChoice(), tc.GetIndex(), tc.GetId(), tc.GetName(), tc.GetArguments()))
		} else {
			out = append(out, fmt.Sprintf("%d/text %s", d.GetChoice(), d.GetText()))
		}
	}
	return out
}

func TestDeltasAreMergedByStreamAndKeepTheirOrder(t *testing.T) {
	s := newSink()
	c := newCoalescer(s.out, time.Hour, 1<<10)
	c.piece("Let me ")
	c.piece("check")
	c.deltas([]*stubbornv1.OutputDelta{callDelta(0, 0, "call_1", "get_weather", `{"ci`)})
	given := callDelta(0, 0, "", "", `ty":"Paris"}`)
	c.deltas([]*stubbornv1.OutputDelta{given, callDelta(0, 1, "call_2", "get_time", "")})
	c.deltas([]*stubbornv1.OutputDelta{callDelta(0, 1, "", "", `{}`), textDelta(1, "Sunny"), textDelta(1, " today")})
	c.piece(".")
	c.close()
	require.Len(t, s.events, 2)
	assert.Equal(t, []string{"0/text Let me "}, describe(s.events[0]), "the first piece at once")
	assert.Equal(t, []string{
		"0/text check",
		`0/call0 call_1 get_weather {"city":"Paris"}`,
		"0/call1 call_2 get_time {}",
		"1/text Sunny today",
		"0/text .",
	}, describe(s.events[1]), "adjacent fragments of a stream merged, keeping the first's id and name; streams in order")
	assert.Equal(t, `ty":"Paris"}`, given.GetToolCall().GetArguments(), "the delegate's delta is not changed")
}

func TestDeltasKeepTheByteBound(t *testing.T) {
	s := newSink()
	const max = deltaFraming + 10
	c := newCoalescer(s.out, time.Hour, max)
	args := `{"city":"Zürich","unit":"celsius"}`
	c.deltas([]*stubbornv1.OutputDelta{textDelta(0, "héllo ✓✓")})
	for i := 0; i < len(args); i += 3 {
		c.deltas([]*stubbornv1.OutputDelta{callDelta(0, 0, map[bool]string{true: "c1"}[i == 0], map[bool]string{true: "get"}[i == 0], args[i:min(i+3, len(args))])})
	}
	c.deltas([]*stubbornv1.OutputDelta{textDelta(2, "ünïcode ✓✓✓ more")})
	c.close()
	var text, text2, got, id, name string
	for _, ev := range s.events {
		size := 0
		for _, d := range ev {
			size += deltaSize(d)
			if tc := d.GetToolCall(); tc != nil {
				got += tc.GetArguments()
				id += tc.GetId()
				name += tc.GetName()
				assert.True(t, utf8.ValidString(tc.GetArguments()), "%q is cut between characters", tc.GetArguments())
			} else if d.GetChoice() == 0 {
				text += d.GetText()
			} else {
				text2 += d.GetText()
				assert.True(t, utf8.ValidString(d.GetText()), "%q is cut between characters", d.GetText())
			}
		}
		assert.LessOrEqual(t, size, max, "%v", describe(ev))
	}
	assert.Equal(t, "héllo ✓✓", text)
	assert.Equal(t, args, got, "nothing lost or repeated")
	assert.Equal(t, "c1", id, "the id once")
	assert.Equal(t, "get", name, "the name once")
	assert.Equal(t, "ünïcode ✓✓✓ more", text2)
}

// However small and scattered the pieces, an event's encoding stays near
// the bound: each delta's framing counts.
func TestTinyDeltasKeepTheEventsEncodingNearTheBound(t *testing.T) {
	s := newSink()
	const max = 256
	c := newCoalescer(s.out, time.Hour, max)
	for i := range 2000 {
		c.deltas([]*stubbornv1.OutputDelta{
			callDelta(int32(i%3), int32(i%2), "", "", "x"),
			textDelta(int32(i%3), "y"),
		})
	}
	c.close()
	require.NotEmpty(t, s.events)
	for _, ev := range s.events {
		o := &stubbornv1.AttemptOutput{Attempt: 1, Offset: 1 << 40}
		for _, d := range ev {
			if d.GetChoice() == 0 && d.GetToolCall() == nil {
				o.Text += d.GetText()
			} else {
				d.Offset = 1 << 40
				o.Deltas = append(o.Deltas, d)
			}
		}
		assert.LessOrEqual(t, proto.Size(o), max+32, "%d deltas", len(o.Deltas))
	}
}
