package delegates

import (
	"slices"
	"sync"
	"time"
)

// rateWindow counts a delegate's requests and model tokens over the last
// minute, in one-second slots, for requests_per_minute and
// tokens_per_minute (as LiteLLM's rpm and tpm): a request is let through
// while fewer than rpm requests were let through, and fewer than tpm
// tokens reported used, within the minute before it. A slot counts for 61
// whole seconds from its second's start, so that no 60 seconds ever hold
// more than the limits, whatever the requests' offsets within their
// seconds.
type rateWindow struct {
	mu       sync.Mutex
	rpm, tpm int64 // 0: no limit
	slots    [rateSlots]rateSlot
}

// rateSlots is how many seconds a slot counts for.
const rateSlots = 61

type rateSlot struct {
	sec    int64 // Unix second it counts
	reqs   int64
	tokens int64
}

// take counts a request at now if the limits let it through; else it
// returns how long until they would (0 when it never will on its own:
// tokens alone are over and no slot ages out).
func (w *rateWindow) take(now time.Time) (ok bool, wait time.Duration) {
	return w.takeShare(now, 1)
}

// takeShare is take under a 1/share of the limits (at least 1 each): a
// replica cut off from the fleet's ledger (fleet.go) takes its share of
// them, share the replicas it last saw leasing.
func (w *rateWindow) takeShare(now time.Time, share int64) (ok bool, wait time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	rpm, tpm := w.rpm, w.tpm
	if share > 1 {
		w.rpm, w.tpm = shareOf(rpm, share), shareOf(tpm, share)
		defer func() { w.rpm, w.tpm = rpm, tpm }()
	}
	sec := now.Unix()
	var live []rateSlot
	var reqs, tokens int64
	for _, s := range w.slots {
		if s.sec > sec-rateSlots && s.sec <= sec && (s.reqs > 0 || s.tokens > 0) {
			live = append(live, s)
			reqs += s.reqs
			tokens += s.tokens
		}
	}
	if w.fits(reqs, tokens) {
		w.slot(sec).reqs++
		return true, 0
	}
	// The oldest slots age out first: the wait is until enough have.
	slices.SortFunc(live, func(a, b rateSlot) int { return int(a.sec - b.sec) })
	for _, s := range live {
		reqs -= s.reqs
		tokens -= s.tokens
		if w.fits(reqs, tokens) {
			return false, time.Unix(s.sec+rateSlots, 0).Sub(now)
		}
	}
	return false, 0
}

// shareOf is limit/share, at least 1; 0 (no limit) stays 0.
func shareOf(limit, share int64) int64 {
	if limit == 0 {
		return 0
	}
	return max(limit/share, 1)
}

// usage returns the requests and tokens counted within the window as of
// now: what take weighs the next request against.
func (w *rateWindow) usage(now time.Time) (reqs, tokens int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	sec := now.Unix()
	for _, s := range w.slots {
		if s.sec > sec-rateSlots && s.sec <= sec {
			reqs += s.reqs
			tokens += s.tokens
		}
	}
	return reqs, tokens
}

func (w *rateWindow) fits(reqs, tokens int64) bool {
	return (w.rpm == 0 || reqs < w.rpm) && (w.tpm == 0 || tokens < w.tpm)
}

// used counts tokens a request used, reported at now.
func (w *rateWindow) used(now time.Time, tokens int64) {
	if tokens <= 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.slot(now.Unix()).tokens += tokens
}

// slot returns sec's slot, emptied if it counted an older second.
func (w *rateWindow) slot(sec int64) *rateSlot {
	s := &w.slots[((sec%rateSlots)+rateSlots)%rateSlots]
	if s.sec != sec {
		*s = rateSlot{sec: sec}
	}
	return s
}

// giveBack uncounts a request take counted in second sec (a call refused
// after it was counted).
func (w *rateWindow) giveBack(sec int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := &w.slots[((sec%rateSlots)+rateSlots)%rateSlots]; s.sec == sec && s.reqs > 0 {
		s.reqs--
	}
}

// setLimits changes the limits, keeping the counts.
func (w *rateWindow) setLimits(rpm, tpm int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.rpm, w.tpm = rpm, tpm
}

// count counts a request at now whatever the limits: one the fleet's
// ledger let through (fleet.go), so that this replica's own counts are
// ready if it falls back to them.
func (w *rateWindow) count(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.slot(now.Unix()).reqs++
}
