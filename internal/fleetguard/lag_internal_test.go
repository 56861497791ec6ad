package fleetguard

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// A watch is made again when its stream's leader moved, or when a
// sequence the stream held lagFor ago has not come; not when the store
// does not answer, nor while what the stream holds comes in time.
func TestLagCheckStale(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	up := func(last uint64, leader string) streamState { return streamState{last: last, leader: leader, ok: true} }

	l := lagCheck{seen: 5, leader: "n0"}
	assert.Empty(t, l.stale(at(0), up(5, "n0")), "caught up")
	assert.Empty(t, l.stale(at(time.Second), up(7, "n0")), "behind for the first time")
	l.seen = 7 // it came
	assert.Empty(t, l.stale(at(2*time.Second), up(7, "n0")))
	assert.Empty(t, l.stale(at(4*time.Second), up(7, "n0")), "caught up, whatever the time")

	l = lagCheck{seen: 5, leader: "n0"}
	assert.Empty(t, l.stale(at(0), up(6, "n0")))
	assert.Empty(t, l.stale(at(time.Second), up(9, "n0")), "still behind, within lagFor")
	assert.Empty(t, l.stale(at(2*time.Second), streamState{}), "the store does not answer: not judged")
	assert.Contains(t, l.stale(at(2*time.Second+time.Millisecond), up(9, "n0")), "held 6", "sequence 6 never came")

	l = lagCheck{seen: 5, leader: "n0"}
	assert.Contains(t, l.stale(at(0), up(5, "n1")), "from n0 to n1")

	l = lagCheck{seen: 5}
	assert.Empty(t, l.stale(at(0), up(5, "n2")), "a leader first known at a check")
	assert.Equal(t, "n2", l.leader)
	assert.Empty(t, l.stale(at(time.Second), up(5, "")), "no leader known (one server)")
}
