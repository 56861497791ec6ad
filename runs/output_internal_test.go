package runs

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sink collects what a coalescer sends.
type sink struct {
	mu   sync.Mutex
	sent []string
	got  chan struct{}
}

func newSink() *sink { return &sink{got: make(chan struct{}, 64)} }

func (s *sink) out(text string) {
	s.mu.Lock()
	s.sent = append(s.sent, text)
	s.mu.Unlock()
	s.got <- struct{}{}
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
