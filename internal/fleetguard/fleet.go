// Package fleetguard keeps the delegates' guard state that the replicas
// sharing one NATS JetStream cluster share: each delegate's circuit breaker
// (a record changed by compare-and-set, watched by every replica) and its
// rate limits' ledger (the shares of the minute's budget the replicas
// leased). It knows nothing of delegates or runs: internal/delegates
// decides what the records mean.
package fleetguard

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Bucket names.
const (
	breakersBucket = "stubborn_guard_breakers"
	ratesBucket    = "stubborn_guard_rates"
)

// ratesTTL is how long a delegate's ledger outlives its last write: longer
// than any grant counts (Span), so a ledger nobody writes to, a crashed
// replica's leases with it, goes on its own.
const ratesTTL = 3 * time.Minute

// opTimeout bounds one store call made on a call's path: past it the
// replica takes itself for cut off and guards with its own counts.
const opTimeout = time.Second

// downFor is how long a failed store call keeps the replica on its own
// counts before it tries the fleet's again.
const downFor = 3 * time.Second

// casTries bounds the compare-and-set retries of one change.
const casTries = 16

// ErrConflict is a compare-and-set that lost: the record changed since it
// was read.
var ErrConflict = errors.New("fleetguard: the record changed since it was read")

// Config configures a Fleet.
type Config struct {
	// Replica names this replica in the records it writes (OpenedBy).
	Replica string
	// Replicas is the number of copies of the buckets; 0 means 1.
	Replicas int
	// Memory keeps the buckets in memory (tests).
	Memory bool
	// Logger gets the scope changes; nil means slog.Default().
	Logger *slog.Logger
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
}

// Fleet is this replica's view of the fleet's guard state.
type Fleet struct {
	cfg      Config
	nc       *nats.Conn
	breakers jetstream.KeyValue
	// stream is the breakers' bucket's stream, read by sequence when the
	// watch lags (readMissed); nil if it could not be bound.
	stream jetstream.Stream
	rates  jetstream.KeyValue
	log    *slog.Logger

	mu          sync.Mutex
	cache       map[string]cached // breaker records by delegate
	watching    bool              // the breakers' watch has read every record
	failedUntil time.Time
	reason      string // why the replica is on its own counts; "" when not
	local       bool   // last scope logged was local
	// joined says the replica was up with the fleet once: a replica
	// starting is not falling back.
	joined bool

	// pending are tokens counted but not yet written, by delegate and
	// second (CountTokens); guarded by mu.
	pending map[string]map[int64]int64
	// peers are the replicas each delegate's ledger last showed leasing
	// (Peers); guarded by mu.
	peers map[string]int
	// ledgers are each delegate's ledger as last read (LastUsage);
	// guarded by mu.
	ledgers map[string]ledger

	// onBreaker is SetOnBreaker's; guarded by mu.
	onBreaker func(delegate string, old, new Breaker)

	stop context.CancelFunc
	wg   sync.WaitGroup
}

type cached struct {
	rec Breaker
	rev uint64
}

// Open creates (or opens) the buckets on nc's JetStream and starts
// watching the breakers.
func Open(ctx context.Context, nc *nats.Conn, cfg Config) (*Fleet, error) {
	if cfg.Replica == "" {
		return nil, errors.New("fleetguard: Config.Replica is empty")
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	st := jetstream.FileStorage
	if cfg.Memory {
		st = jetstream.MemoryStorage
	}
	f := &Fleet{cfg: cfg, nc: nc, log: cfg.Logger, cache: map[string]cached{}, pending: map[string]map[int64]int64{}, peers: map[string]int{}, ledgers: map[string]ledger{}}
	if f.breakers, err = createBucket(ctx, js, jetstream.KeyValueConfig{
		Bucket: breakersBucket, History: 1, Storage: st, Replicas: cfg.Replicas,
	}); err != nil {
		return nil, fmt.Errorf("bucket %s: %w", breakersBucket, err)
	}
	if stream, err := js.Stream(ctx, kvStream(breakersBucket)); err == nil {
		f.stream = stream
	}
	if f.rates, err = createBucket(ctx, js, jetstream.KeyValueConfig{
		Bucket: ratesBucket, History: 1, Storage: st, Replicas: cfg.Replicas, TTL: ratesTTL,
	}); err != nil {
		return nil, fmt.Errorf("bucket %s: %w", ratesBucket, err)
	}
	wctx, stop := context.WithCancel(context.Background())
	f.stop = stop
	f.wg.Add(2)
	go f.watchLoop(wctx)
	go f.flushLoop(wctx)
	return f, nil
}

// Close stops the watch and writes the tokens counted.
func (f *Fleet) Close() {
	f.stop()
	f.wg.Wait()
}

// Replica is this replica's name.
func (f *Fleet) Replica() string { return f.cfg.Replica }

// Scope reports whether the fleet's state guards this replica's calls now
// (fleet), or why not.
func (f *Fleet) Scope() (fleet bool, reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	// What a caller is told is logged first, so that no call guarded on
	// its own counts goes unlogged.
	f.logScopeLocked()
	return f.upLocked()
}

func (f *Fleet) upLocked() (bool, string) {
	switch {
	case !f.nc.IsConnected():
		return false, "no NATS server reachable"
	case f.reason != "" && f.cfg.Now().Before(f.failedUntil):
		return false, f.reason
	case !f.watching:
		return false, "reading the fleet's breakers"
	}
	return true, ""
}

// fail puts the replica on its own counts for downFor after a store call
// failed for err.
func (f *Fleet) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failedUntil = f.cfg.Now().Add(downFor)
	f.reason = "the fleet's store did not answer: " + err.Error()
	f.logScopeLocked()
}

// logScopeLocked logs a change of scope, once each way.
func (f *Fleet) logScopeLocked() {
	up, why := f.upLocked()
	if up {
		f.joined = true
	}
	switch {
	case !f.joined:
	case !up && !f.local:
		f.local = true
		f.log.Warn("guards fall back to this replica's own counts", "replica", f.cfg.Replica, "why", why)
	case up && f.local:
		f.local = false
		f.log.Info("guards are the fleet's again", "replica", f.cfg.Replica)
	}
}

// watchLoop keeps the breakers' cache: it watches the bucket, and watches
// it again (reading every record anew) after the connection or the watch
// was lost.
func (f *Fleet) watchLoop(ctx context.Context) {
	defer f.wg.Done()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil {
		if f.nc.IsConnected() {
			f.watchOnce(ctx, tick.C)
		}
		f.mu.Lock()
		f.watching = false
		f.logScopeLocked()
		f.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// watchOnce watches the breakers until the watch or the connection ends.
func (f *Fleet) watchOnce(ctx context.Context, tick <-chan time.Time) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Every write up to the stream's last sequence now is in the watch's
	// first read or gone (purged, compacted): none for the watch to see.
	floor := f.streamNow(ctx)
	w, err := f.breakers.WatchAll(wctx)
	if err != nil {
		return
	}
	defer func() { _ = w.Stop() }()
	fresh := map[string]cached{}
	initial := true
	lastMsg := time.Now()
	// A reconnect may leave the watch's consumer silent until it finds out
	// (its heartbeats are 5 s apart): the watch is made again at once.
	reconnects := f.nc.Stats().Reconnects
	lag := lagCheck{leader: floor.leader}
	var read uint64 // the last sequence readMissed read
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
			f.mu.Lock()
			f.logScopeLocked()
			f.mu.Unlock()
			// A watch that went silent over a lost connection is made
			// again; the ordered consumer's heartbeats are 5 s apart.
			if !f.nc.IsConnected() || f.nc.Stats().Reconnects != reconnects || (initial && time.Since(lastMsg) > 5*time.Second) {
				return
			}
			// So is one whose consumer died with a server while this
			// replica's connection lived (its stream's leader killed):
			// nats.go would make it again only after two missed heartbeats.
			if now := time.Now(); !initial && lag.due(now) {
				st := f.streamNow(ctx)
				if why := lag.stale(now, st); why != "" {
					f.log.Warn("the fleet's breakers watch is made again", "replica", f.cfg.Replica, "why", why)
					return
				}
				// What the stream holds that the watch has not brought is
				// read by sequence meanwhile: a watch whose consumer died
				// is made again only lagFor later, and making it may wait
				// on a cluster that lost a node.
				if st.ok && st.last > max(lag.seen, read) {
					read = f.readMissed(ctx, max(lag.seen, read)+1, st.last)
				}
			}
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			lastMsg = time.Now()
			if e != nil {
				lag.seen = max(lag.seen, e.Revision())
			}
			if e == nil {
				initial = false
				lag.seen = max(lag.seen, floor.last)
				f.mu.Lock()
				f.cache, f.watching = fresh, true
				f.logScopeLocked()
				f.mu.Unlock()
				continue
			}
			name, rec, ok := record(e.Key(), e.Operation() == jetstream.KeyValuePut, e.Value())
			if !ok {
				continue
			}
			if initial {
				fresh[name] = cached{rec: rec, rev: e.Revision()}
				continue
			}
			f.put(name, rec, e.Revision(), true)
		}
	}
}

// lagEvery is how often a watch compares what it has seen with the
// breakers' stream; lagFor is how long the stream may hold a write the
// watch has not brought before the watch is made again.
const (
	lagEvery = time.Second
	lagFor   = 2 * time.Second
)

// streamState is what a watch is judged by: the breakers' stream's last
// sequence and its leader ("" when it has none, or unknown).
type streamState struct {
	last   uint64
	leader string
	ok     bool // the store answered
}

// lagCheck finds a watch that stopped bringing the records: the stream's
// leader changed since it was made (its consumer lived on the old one), or
// a sequence the stream held lagFor ago has still not come.
type lagCheck struct {
	seen     uint64    // the highest revision the watch brought, or the floor it was made at
	leader   string    // the stream's leader when the watch was made
	behind   uint64    // a last sequence the watch had not seen; 0 when caught up
	behindAt time.Time // when behind was read
	next     time.Time // when the stream is read next
}

func (l *lagCheck) due(now time.Time) bool {
	if now.Before(l.next) {
		return false
	}
	l.next = now.Add(lagEvery)
	return true
}

// stale takes the stream as read now and says why the watch is to be made
// again, or "".
func (l *lagCheck) stale(now time.Time, st streamState) string {
	if !st.ok {
		return "" // judged again when the store answers
	}
	if l.leader != "" && st.leader != "" && st.leader != l.leader {
		return fmt.Sprintf("the stream's leader moved from %s to %s", l.leader, st.leader)
	}
	if l.leader == "" {
		l.leader = st.leader
	}
	if l.behind != 0 && l.seen >= l.behind {
		l.behind = 0
	}
	if l.behind != 0 && now.Sub(l.behindAt) >= lagFor {
		return fmt.Sprintf("it brought sequence %d, the stream held %d %s ago", l.seen, l.behind, lagFor)
	}
	if l.behind == 0 && st.last > l.seen {
		l.behind, l.behindAt = st.last, now
	}
	return ""
}

// streamNow reads the breakers' stream's state (ok false when the store
// does not answer).
func (f *Fleet) streamNow(ctx context.Context) streamState {
	ctx, cancel := opCtx(ctx)
	defer cancel()
	st, err := f.breakers.Status(ctx)
	if err != nil {
		return streamState{}
	}
	si, ok := st.(interface{ StreamInfo() *jetstream.StreamInfo })
	if !ok || si.StreamInfo() == nil {
		return streamState{}
	}
	info := si.StreamInfo()
	out := streamState{last: info.State.LastSeq, ok: true}
	if info.Cluster != nil {
		out.leader = info.Cluster.Leader
	}
	return out
}

// record decodes a breaker's entry: its key, whether it is a put (a
// delete or a purge is the zero record: closed) and its value. ok is false
// for an entry that is not a breaker's.
func record(k string, put bool, v []byte) (name string, rec Breaker, ok bool) {
	name, err := keyName(k)
	if err != nil {
		return "", Breaker{}, false
	}
	if put && json.Unmarshal(v, &rec) != nil {
		return "", Breaker{}, false
	}
	return name, rec, true
}

// maxMissed bounds the sequences one readMissed reads: the last ones (the
// watch made again brings all).
const maxMissed = 64

// readMissed reads the breakers' stream's messages from sequence from to
// to by sequence (a direct read any of the stream's servers answers, no
// consumer) and caches each record that is newer than the one cached, as
// the watch would have. It returns the last sequence it read through:
// to, or the one before a read that failed.
func (f *Fleet) readMissed(ctx context.Context, from, to uint64) uint64 {
	if f.stream == nil {
		return from - 1
	}
	if to-from >= maxMissed {
		from = to - maxMissed + 1
	}
	prefix := "$KV." + breakersBucket + "."
	for seq := from; seq <= to; seq++ {
		octx, cancel := opCtx(ctx)
		m, err := f.stream.GetMsg(octx, seq)
		cancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // replaced by a later write of its key (History 1)
		}
		if err != nil {
			return seq - 1
		}
		k, ok := strings.CutPrefix(m.Subject, prefix)
		if !ok {
			continue
		}
		put := m.Header.Get(kvOperation) == ""
		if name, rec, ok := record(k, put, m.Data); ok {
			f.put(name, rec, seq, true)
		}
	}
	return to
}

// kvOperation is the header of a KV delete's or purge's marker.
const kvOperation = "KV-Operation"

// kvStream is the name of the stream that holds KV bucket b.
func kvStream(b string) string { return "KV_" + b }

// put caches a record read at rev, unless a later one is cached; from the
// watch, a record another replica wrote is passed to OnBreaker.
func (f *Fleet) put(name string, rec Breaker, rev uint64, watched bool) {
	f.mu.Lock()
	old, had := f.cache[name]
	if had && old.rev >= rev {
		f.mu.Unlock()
		return
	}
	f.cache[name] = cached{rec: rec, rev: rev}
	on := f.onBreaker
	f.mu.Unlock()
	if watched && on != nil && rec.By != f.cfg.Replica {
		on(name, old.rec, rec)
	}
}

// SetOnBreaker has fn told of every breaker record another replica wrote,
// as the watch brings it. fn must not block.
func (f *Fleet) SetOnBreaker(fn func(delegate string, old, new Breaker)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.onBreaker = fn
}

// key is a delegate's key: its name in base64url (a delegate's name may
// hold characters a key may not).
func key(name string) string { return base64.RawURLEncoding.EncodeToString([]byte(name)) }

func keyName(k string) (string, error) {
	b, err := base64.RawURLEncoding.DecodeString(k)
	return string(b), err
}

// opCtx bounds a store call made on a call's path.
func opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, opTimeout)
}

// storeErr says whether err is the store's failing (the replica goes on
// its own counts), not a compare-and-set that lost or a missing key.
func storeErr(err error) bool {
	return err != nil && !conflict(err) && !errors.Is(err, jetstream.ErrKeyNotFound) && !errors.Is(err, context.Canceled)
}

// conflict says whether err is a compare-and-set's refusal (Create of a
// key that exists, Update of a changed one).
func conflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}
