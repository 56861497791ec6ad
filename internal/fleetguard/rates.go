package fleetguard

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// LeaseLife is how long a replica may admit calls from a lease; then it
// gives back what it did not use.
const LeaseLife = time.Second

// spanSecs is how many whole seconds a grant counts against the limits
// from its second's start: 61 (so that no 60 seconds hold more than the
// limit whatever the calls' offsets within their seconds, as the local
// window) plus the lease's life, since a lease's calls are made up to
// LeaseLife after it was granted.
const spanSecs = 61 + int64(LeaseLife/time.Second)

// maxGrants bounds a ledger's entries (one per replica and second within
// spanSecs, so 66 replicas' worth): past it the oldest are merged.
const maxGrants = 4096

// ledger is a delegate's rate ledger: what each replica was granted (and
// the tokens its calls reported) per second, within spanSecs.
type ledger struct {
	G []grant `json:"g"`
}

type grant struct {
	Sec     int64  `json:"s"`
	Replica string `json:"r"`
	Reqs    int64  `json:"n,omitempty"`
	Tokens  int64  `json:"t,omitempty"`
}

// live drops the grants no longer counted at second sec and sums the rest.
func (l *ledger) live(sec int64) (reqs, tokens int64) {
	l.G = slices.DeleteFunc(l.G, func(g grant) bool { return g.Sec <= sec-spanSecs || g.Sec > sec+spanSecs })
	if len(l.G) > maxGrants {
		// The oldest are merged into one grant of the newest of their
		// seconds: counted a little longer, never less.
		slices.SortFunc(l.G, func(a, b grant) int { return int(a.Sec - b.Sec) })
		cut := len(l.G) - maxGrants + 1
		merged := grant{Sec: l.G[cut-1].Sec, Replica: "*"}
		for _, g := range l.G[:cut] {
			merged.Reqs += g.Reqs
			merged.Tokens += g.Tokens
		}
		l.G = append([]grant{merged}, l.G[cut:]...)
	}
	for _, g := range l.G {
		reqs += g.Reqs
		tokens += g.Tokens
	}
	return reqs, tokens
}

// entry returns replica's grant of second sec, added if missing.
func (l *ledger) entry(sec int64, replica string) *grant {
	for i := range l.G {
		if l.G[i].Sec == sec && l.G[i].Replica == replica {
			return &l.G[i]
		}
	}
	l.G = append(l.G, grant{Sec: sec, Replica: replica})
	return &l.G[len(l.G)-1]
}

// waitFor returns how long until enough grants age out that fits says
// yes; 0 when none would (the limits are 0 or tokens alone are over with
// nothing to age out).
func (l *ledger) waitFor(now time.Time, reqs, tokens int64, fits func(reqs, tokens int64) bool) time.Duration {
	gs := slices.Clone(l.G)
	slices.SortFunc(gs, func(a, b grant) int { return int(a.Sec - b.Sec) })
	for _, g := range gs {
		reqs -= g.Reqs
		tokens -= g.Tokens
		if fits(reqs, tokens) {
			return time.Unix(g.Sec+spanSecs, 0).Sub(now)
		}
	}
	return 0
}

// Lease asks the fleet for up to want calls to the delegate at now, under
// rpm requests and tpm tokens a minute (0: no limit): it grants what the
// limits leave, counted from now's second for spanSecs, or none and how
// long until some would be (0: not on their own). The calls are to be
// made within LeaseLife. back gives back, in the same write, what an
// earlier lease left unused.
func (f *Fleet) Lease(ctx context.Context, name string, now time.Time, want, rpm, tpm int64, back Unused) (granted int64, wait time.Duration, err error) {
	sec := now.Unix()
	fits := func(reqs, tokens int64) bool { return (rpm == 0 || reqs < rpm) && (tpm == 0 || tokens < tpm) }
	err = f.changeLedger(ctx, name, func(l *ledger) bool {
		returned := l.giveBack(back, f.cfg.Replica)
		reqs, tokens := l.live(sec)
		if !fits(reqs, tokens) {
			granted, wait = 0, l.waitFor(now, reqs, tokens, fits)
			return returned
		}
		granted = want
		if rpm > 0 {
			granted = min(want, rpm-reqs)
		}
		l.entry(sec, f.cfg.Replica).Reqs += granted
		return true
	})
	if err != nil {
		return 0, 0, err
	}
	return granted, wait, nil
}

// Unused is what a lease granted in second Sec left unused.
type Unused struct{ Sec, N int64 }

// giveBack uncounts u; it says whether it changed anything.
func (l *ledger) giveBack(u Unused, replica string) bool {
	if u.N <= 0 {
		return false
	}
	for i := range l.G {
		if g := &l.G[i]; g.Sec == u.Sec && g.Replica == replica {
			g.Reqs = max(g.Reqs-u.N, 0)
			return true
		}
	}
	return false // aged out already
}

// Return gives back what a lease left unused.
func (f *Fleet) Return(ctx context.Context, name string, u Unused) error {
	if u.N <= 0 {
		return nil
	}
	return f.changeLedger(ctx, name, func(l *ledger) bool { return l.giveBack(u, f.cfg.Replica) })
}

// Usage returns the requests granted and the tokens reported within the
// last minute, fleet-wide, as of now.
func (f *Fleet) Usage(ctx context.Context, name string, now time.Time) (reqs, tokens int64, err error) {
	l, _, err := f.readLedger(ctx, name)
	if err != nil {
		return 0, 0, err
	}
	reqs, tokens = l.live(now.Unix())
	return reqs, tokens, nil
}

// changeLedger changes the delegate's ledger by compare-and-set; change
// returns false to write nothing.
func (f *Fleet) changeLedger(ctx context.Context, name string, change func(*ledger) bool) error {
	for range casTries {
		l, rev, err := f.readLedger(ctx, name)
		if err != nil {
			return err
		}
		if !change(&l) {
			return nil
		}
		data, err := json.Marshal(l)
		if err != nil {
			return err
		}
		octx, cancel := opCtx(ctx)
		if rev == 0 {
			_, err = f.rates.Create(octx, key(name), data)
		} else {
			_, err = f.rates.Update(octx, key(name), data, rev)
		}
		cancel()
		if err == nil {
			return nil
		}
		if !conflict(err) {
			if storeErr(err) {
				f.fail(err)
			}
			return err
		}
	}
	return ErrConflict
}

// maxLedgerBytes bounds a ledger read from the store.
const maxLedgerBytes = 1 << 20

func (f *Fleet) readLedger(ctx context.Context, name string) (ledger, uint64, error) {
	octx, cancel := opCtx(ctx)
	defer cancel()
	e, err := f.rates.Get(octx, key(name))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return ledger{}, 0, nil
	}
	if err != nil {
		if storeErr(err) {
			f.fail(err)
		}
		return ledger{}, 0, err
	}
	var l ledger
	if len(e.Value()) > maxLedgerBytes || json.Unmarshal(e.Value(), &l) != nil {
		// Unreadable: started afresh, overwritten at the next write.
		return ledger{}, e.Revision(), nil
	}
	f.sawPeers(name, l)
	f.mu.Lock()
	f.ledgers[name] = ledger{G: slices.Clone(l.G)}
	f.mu.Unlock()
	return l, e.Revision(), nil
}

// LastUsage returns the requests granted and tokens reported within the
// minute before now, fleet-wide, as the delegate's ledger read last (at
// this replica's latest lease: as stale as a lease's life while it calls
// the delegate), with no round trip; ok false when it was never read.
func (f *Fleet) LastUsage(name string, now time.Time) (reqs, tokens int64, ok bool) {
	f.mu.Lock()
	l, ok := f.ledgers[name]
	l.G = slices.Clone(l.G)
	f.mu.Unlock()
	if !ok {
		return 0, 0, false
	}
	reqs, tokens = l.live(now.Unix())
	return reqs, tokens, true
}

// sawPeers notes how many replicas the ledger shows leasing.
func (f *Fleet) sawPeers(name string, l ledger) {
	seen := map[string]bool{f.cfg.Replica: true}
	for _, g := range l.G {
		seen[g.Replica] = true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.peers[name] = len(seen)
}

// Peers returns how many replicas (this one included) the delegate's
// ledger last showed leasing; 1 before it was read. A replica cut off
// from the fleet takes that share of the limits on its own counts.
func (f *Fleet) Peers(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return max(f.peers[name], 1)
}

// flushEvery is how often the tokens counted are written to the ledgers.
const flushEvery = 250 * time.Millisecond

// CountTokens counts tokens a call to the delegate reported at second sec;
// they reach the fleet's ledger within flushEvery (one write a delegate,
// not one a call).
func (f *Fleet) CountTokens(name string, sec, tokens int64) {
	if tokens <= 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.pending[name]
	if m == nil {
		m = map[int64]int64{}
		f.pending[name] = m
	}
	m[sec] += tokens
}

// flushLoop writes the tokens counted, every flushEvery and at Close. A
// write that fails is dropped: the ledger undercounts them, the bound the
// guide states.
func (f *Fleet) flushLoop(ctx context.Context) {
	defer f.wg.Done()
	tick := time.NewTicker(flushEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			f.flush(context.Background())
			return
		case <-tick.C:
			f.flush(ctx)
		}
	}
}

func (f *Fleet) flush(ctx context.Context) {
	f.mu.Lock()
	pending := f.pending
	f.pending = map[string]map[int64]int64{}
	f.mu.Unlock()
	for name, bySec := range pending {
		if !f.nc.IsConnected() {
			return
		}
		_ = f.changeLedger(ctx, name, func(l *ledger) bool {
			var newest int64
			for sec, n := range bySec {
				newest = max(newest, sec)
				l.entry(sec, f.cfg.Replica).Tokens += n
			}
			l.live(newest)
			return true
		})
	}
}
