package delegates

import (
	"sync"
	"time"

	"github.com/stubbornhq/stubborn/internal/controls"
)

// Traffic is what this server sees of each delegate's traffic: its calls in
// flight and its recent latency, counted by the Pools that share it
// (PoolOptions.Traffic). A server keeps one across reloads, as it keeps its
// Guards, so that a reload forgets neither the calls in flight nor the
// latency measured. Safe for concurrent use.
type Traffic struct {
	mu sync.Mutex
	by map[string]*delegateLoad
}

type delegateLoad struct {
	inFlight int
	latency  time.Duration // recent latency: a moving average; 0 before the first measure
}

// latencyWeight is the share of a new measure in the recent latency (an
// exponentially weighted moving average): the last few calls count most,
// so a deployment that slows down or recovers shows within a handful.
const latencyWeight = 0.25

// NewTraffic returns a Traffic that has counted nothing.
func NewTraffic() *Traffic {
	return &Traffic{by: map[string]*delegateLoad{}}
}

// flight is one call counted in flight by begin, until its end.
type flight struct {
	l     *Traffic
	d     *delegateLoad
	ended bool // guarded by l.mu
}

// begin counts a call to the delegate in flight; its end, called when it
// ends (a second call counts for nothing), uncounts it and, when measured,
// adds took to the recent latency.
func (l *Traffic) begin(name string) flight {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := l.by[name]
	if d == nil {
		d = &delegateLoad{}
		l.by[name] = d
	}
	d.inFlight++
	return flight{l: l, d: d}
}

func (f *flight) end(took time.Duration, measured bool) {
	f.l.mu.Lock()
	defer f.l.mu.Unlock()
	if f.ended {
		return
	}
	f.ended = true
	d := f.d
	d.inFlight--
	if !measured || took < 0 {
		return
	}
	if d.latency == 0 {
		d.latency = max(took, time.Nanosecond) // measured: never reads as "not yet"
		return
	}
	d.latency = max(time.Duration(float64(d.latency)*(1-latencyWeight)+float64(took)*latencyWeight), time.Nanosecond)
}

// of returns the delegate's calls in flight and recent latency (0 when
// none was measured yet).
func (l *Traffic) of(name string) (inFlight int, latency time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if d := l.by[name]; d != nil {
		return d.inFlight, d.latency
	}
	return 0, 0
}

// StandingGuards are Guards that also tell how each delegate stands
// (controls.Standings), for the balance control: the breaker and rate
// limits from the guards, the calls in flight and latency from Traffic.
type StandingGuards struct {
	*Guards
	// Traffic is the server's; nil counts no call in flight and no latency.
	Traffic *Traffic
}

var (
	_ controls.Guards    = StandingGuards{}
	_ controls.Standings = StandingGuards{}
)

// Standing returns how the delegate stands now, without changing any
// guard's state: its breaker open (within its cooldown: a half-open
// breaker is for the guards to admit or refuse), the share of its
// tightest rate limit left within the minute, its calls in flight from
// this server and its recent latency.
func (g StandingGuards) Standing(name string) controls.Standing {
	st := controls.Standing{Room: 1}
	if g.Traffic != nil {
		st.InFlight, st.Latency = g.Traffic.of(name)
	}
	if g.Guards == nil {
		return st
	}
	// With fleet-wide guards these are the fleet's, as last read (no
	// store round trip): the local breaker stays closed while the fleet's
	// governs.
	st.Open = g.BreakerOpen(name)
	if reqs, tokens, rpm, tpm, ok := g.RateUsage(name); ok {
		st.Room = min(roomLeft(reqs, rpm), roomLeft(tokens, tpm))
	}
	return st
}

// roomLeft is the share of limit left after used: 1 without a limit (0),
// 0 when spent.
func roomLeft(used, limit int64) float64 {
	if limit <= 0 {
		return 1
	}
	if used >= limit {
		return 0
	}
	return 1 - float64(used)/float64(limit)
}
