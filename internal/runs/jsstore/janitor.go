package jsstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// Retention on JetStream: only finished runs are ever removed, and
// Stubborn removes them, not the store's limits.
//
// The events stream has no MaxAge and, past MaxBytes, refuses a write
// rather than drop the oldest messages (DiscardNew); the states and owners
// buckets have no TTL. JetStream cannot tell a finished run from one in
// flight — a run awaiting a decision may wait for weeks — so its own limits
// never remove anything. Instead every store's janitor (one per replica)
// purges, every PurgeEvery:
//
//   - by age: every run whose journal ends in run_finished written more
//     than Retention ago;
//   - by size, when MaxBytes is set and the store is more than highWater
//     full (used): the finished runs whose journals ended first, until it
//     is less than lowWater full;
//   - leftovers older than Retention in the buckets: a finished run's state
//     whose journal is gone (a run that could not record its start, or one
//     a version before this one expired), deletion markers.
//
// A run whose owner entry is still there is not purged: its driver has yet
// to save its final state and let go of it (or the replica that takes it
// over will, from its journal, which must then still be there). A run is
// purged state first, journal last, and a journal up to the run_finished
// that was read only: a pass cut short leaves a journal that the next pass
// finds again, and nothing written later could go. Several replicas may
// purge the same run at once: a purge of what is gone already does
// nothing.
//
// How full the store is (used) counts what runs in flight have yet to
// write: the events stream's bytes, plus inFlightFactor times the owners
// bucket's, which holds the state of every run in flight as it was
// accepted, and the sizes of the runs claimed here in their journals
// (claims.go). New runs are admitted (admit) while used, plus what the new
// run adds to it, stays below admitBelow of MaxBytes. Beyond, admission
// makes room itself (makeRoom): it purges the finished runs that ended
// first, on the spot, until the new run fits with room to spare, and only
// when what is left is runs in flight (or still held) does Manager.Start
// refuse the run with ErrStoreFull. The top tenth of MaxBytes is room for
// what runs in flight write beyond the estimate (more attempts, large
// results) and for runs another replica admitted meanwhile. A write refused
// all the same is made again (a 503, see write) while the janitor makes
// room, if it can: a store full of runs in flight has none to make.

// Shares of MaxBytes, in percent.
const (
	// admitBelow bounds what admission lets the store hold.
	admitBelow = 90
	// highWater: above it, finished runs are purged by size...
	highWater = 80
	// lowWater: ...until the store is below it.
	lowWater = 60
)

// inFlightFactor is how many times its state a run in flight is counted
// on to write still. A run of one attempt writes about five times its
// state in all — the brief is in run_started, attempt_started,
// attempt_finished, and twice in run_finished — two of them before its
// first call.
const inFlightFactor = 4

// usedFresh is how long admission trusts the size it read last (plus what
// it admitted since): one read a second, not one per run. It is also how
// long admission waits, after a purge of its own that found nothing to
// purge, before it looks again.
const usedFresh = time.Second

// admitWait bounds how long a new run waits for admission to make room
// for it (its request's context may end it sooner).
const admitWait = 2 * time.Second

// idleWait bounds a pass's wait for the next message of a stream that
// had more when the pass began: they went meanwhile (another replica
// purged them, their TTL ran out). A pass cut short does no harm: the next
// one goes on.
const idleWait = time.Second

// janitor purges a JetStream store's finished runs and admits new runs.
type janitor struct {
	retention time.Duration
	maxBytes  int64 // 0: no bound
	log       *slog.Logger
	// statesStream and ownersStream are the buckets' streams: a purge
	// there leaves no marker behind.
	statesStream jetstream.Stream
	ownersStream jetstream.Stream
	indexStream  jetstream.Stream

	cancel context.CancelFunc // ends the loop; nil when there is none
	done   chan struct{}      // closed when the loop has returned
	kick   chan struct{}      // asks the loop for a pass now (admission, when full)
	// urgent says the last kick is a write the stream refused for its
	// size (roomFor): the pass does not wait out usedFresh first.
	urgent   atomic.Bool
	stopOnce sync.Once

	mu      sync.Mutex
	used    int64     // guarded by mu: the store's size read last, plus what was admitted since
	usedAt  time.Time // guarded by mu: when used was read; zero: never
	reading bool      // guarded by mu: a read of used is under way
	// starved, guarded by mu: the last pass left the store over highWater
	// with nothing to purge; admission asks for no pass before the next
	// one due (it would read every journal again for nothing).
	starved bool

	// makesRoom: admission purges finished runs itself when the store is
	// full (not when PurgeEvery is negative: nothing is purged then but by
	// a test's pass).
	makesRoom bool
	// making, guarded by mu: closed when the purge admission is making
	// ends; nil when none is under way. One at a time: the others wait for
	// it.
	making chan struct{}
	// roomFrom, guarded by mu: the events stream's sequence from which
	// admission's purges read. Every message before it was read by one and
	// is no purgeable run's end: a run in flight's, or an unreadable one
	// (the runs whose ends were there are purged). A finished run that was
	// held, or whose purge failed, keeps roomFrom at its end, to be read
	// again.
	roomFrom uint64
	// fruitless, guarded by mu: when admission's last purge found nothing
	// to purge and left the store without room; the next is not before
	// usedFresh later.
	fruitless time.Time
}

// startJanitor sets the janitor up from cfg (defaults applied), and starts
// its loop unless cfg.PurgeEvery is negative.
func (s *JetStream) startJanitor(ctx context.Context, cfg JetStreamConfig) error {
	j := &s.janitor
	j.retention, j.maxBytes, j.log = cfg.Retention, max(cfg.MaxBytes, 0), cfg.Logger
	if j.log == nil {
		j.log = slog.Default()
	}
	var err error
	if j.statesStream, err = bindStream(ctx, s.js, kvStream(statesBucket)); err != nil {
		return fmt.Errorf("bucket %s: %w", statesBucket, err)
	}
	if j.ownersStream, err = bindStream(ctx, s.js, kvStream(ownersBucket)); err != nil {
		return fmt.Errorf("bucket %s: %w", ownersBucket, err)
	}
	if j.indexStream, err = bindStream(ctx, s.js, kvStream(indexBucket)); err != nil {
		return fmt.Errorf("bucket %s: %w", indexBucket, err)
	}
	j.kick = make(chan struct{}, 1)
	j.done = make(chan struct{})
	every := cfg.PurgeEvery
	if every == 0 {
		every = min(cfg.Retention/10, time.Minute)
	}
	if every < 0 {
		close(j.done)
		return nil
	}
	j.makesRoom = true
	loopCtx, cancel := context.WithCancel(context.Background())
	j.cancel = cancel
	go s.purgeLoop(loopCtx, max(every, time.Millisecond))
	return nil
}

// stopJanitor ends the loop and waits for it.
func (s *JetStream) stopJanitor() {
	j := &s.janitor
	j.stopOnce.Do(func() {
		if j.cancel != nil {
			j.cancel()
		}
		if j.done != nil {
			<-j.done
		}
	})
}

// purgeLoop purges every (jittered: replicas started together do not purge
// in step), and when admission asks, at most once per usedFresh.
func (s *JetStream) purgeLoop(ctx context.Context, every time.Duration) {
	j := &s.janitor
	defer close(j.done)
	var last time.Time
	for {
		t := time.NewTimer(every/2 + time.Duration(mrand.Int64N(int64(every))))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-j.kick:
			t.Stop()
			if !j.urgent.Swap(false) && !sleep(ctx, usedFresh-time.Since(last)) {
				return
			}
		}
		last = time.Now()
		n, err := s.purge(ctx, last)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			j.log.Warn("purging finished runs", "err", err, "purged", n)
		case n > 0:
			j.log.Debug("purged finished runs", "purged", n)
		}
	}
}

// sleep waits d unless ctx ends first, and reports whether it did not.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// purge makes one pass of the janitor as if it were now, and returns how
// many runs and leftovers it purged.
func (s *JetStream) purge(ctx context.Context, now time.Time) (int, error) {
	cutoff := now.Add(-s.janitor.retention)
	n, err := s.purgeRuns(ctx, cutoff)
	if err != nil {
		return n, err
	}
	for _, b := range []struct {
		stream jetstream.Stream
		bucket string
		state  bool
	}{
		{s.janitor.statesStream, statesBucket, true},
		{s.janitor.ownersStream, ownersBucket, false},
		// The markers deleted runs leave (unindexDeleted).
		{s.janitor.indexStream, indexBucket, false},
	} {
		m, err := s.purgeLeftovers(ctx, b.stream, b.bucket, cutoff, b.state)
		n += m
		if err != nil {
			return n, fmt.Errorf("bucket %s: %w", b.bucket, err)
		}
	}
	return n, nil
}

// purgeRuns purges the finished runs whose journal ended before cutoff
// and, while the store is over highWater, those that ended first, until it
// is under lowWater. It reads the stream's messages in the order they were
// written, and a run's run_finished is its last: it meets the finished runs
// in the order they ended, and stops at the first message newer than
// cutoff when not purging by size. A pass by age reads the messages older
// than the retention only: those of the runs it purges, and of the few
// runs in flight for that long.
func (s *JetStream) purgeRuns(ctx context.Context, cutoff time.Time) (int, error) {
	// By size, used is estimated down by a run's average journal per
	// purge, and read again when the estimate says it is under lowWater.
	bySize, used, perRun := false, int64(0), int64(0)
	if s.janitor.maxBytes > 0 {
		var err error
		if used, perRun, err = s.readUsed(ctx); err != nil {
			return 0, err
		}
		bySize = used > s.share(highWater)
	}
	n := 0
	scan := orderedRead{cfg: jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy, InactiveThreshold: lastEventsIdle}, idle: idleWait}
	err := eachOrdered(ctx, s.events, scan, func(msg jetstream.Msg, meta *jetstream.MsgMetadata) (bool, error) {
		old := !meta.Timestamp.After(cutoff)
		if !old && !bySize {
			return false, nil
		}
		runID, end := s.finishedEnd(msg, meta.Sequence.Stream)
		if !end {
			return true, nil
		}
		purged, err := s.purgeRun(ctx, runID, meta.Sequence.Stream)
		if err != nil || !purged {
			return err == nil, err
		}
		n++
		if used -= perRun; bySize && used <= s.share(lowWater) {
			if used, perRun, err = s.readUsed(ctx); err != nil {
				return false, err
			}
			bySize = used > s.share(lowWater)
		}
		return true, nil
	})
	if err == nil && s.janitor.maxBytes > 0 {
		starved := false
		if n > 0 || bySize {
			// Admission sees the room made at once.
			if used, _, err = s.readUsed(ctx); err != nil {
				return n, err
			}
			starved = bySize && used > s.share(highWater)
		}
		s.janitor.mu.Lock()
		s.janitor.starved = starved
		s.janitor.mu.Unlock()
		if starved {
			s.janitor.log.Warn("the run store is over its high-water mark with no finished run left to purge: runs in flight fill it",
				"used_bytes", used, "max_bytes", s.janitor.maxBytes)
		}
	}
	return n, err
}

// purgeRun purges finished run runID whose journal ends at stream sequence
// seq, unless it still has an owner entry; it reports whether it did.
func (s *JetStream) purgeRun(ctx context.Context, runID string, seq uint64) (bool, error) {
	if validKey(runID) {
		if held, err := s.held(ctx, runID); err != nil || held {
			return false, err
		}
	}
	// A NATS server older than 2.11: the purge marker Release left does
	// not expire.
	if err := s.purgeRecords(ctx, runID, seq, s.markerTTL == 0, false, nil); err != nil {
		return false, err
	}
	return true, nil
}

// purgeRecords purges what the store keeps of run runID: its summary
// first (a run the index lists can be read until the end of the purge),
// its state, its owner entry or marker if owner, and its journal up to
// stream sequence seq (0: all of it; else up to the run_finished that was
// read, and nothing written after).
//
// A run deleted (DeleteRun, and again redoDeletes) leaves a purge marker
// in the index instead of nothing: the index's followers are told of the
// deletion (FollowSummaries); last is the run's last state not yet
// indexed, if any (indexer.settle). A run the janitor purges leaves none.
func (s *JetStream) purgeRecords(ctx context.Context, runID string, seq uint64, owner, deleted bool, last []byte) error {
	if validKey(runID) {
		if deleted {
			if err := s.unindexDeleted(ctx, runID, last); err != nil {
				return fmt.Errorf("run %s: purging its summary: %w", runID, err)
			}
		}
		for _, p := range []struct {
			stream        jetstream.Stream
			subject, what string
			skip          bool
		}{
			{s.janitor.indexStream, kvSubject(indexBucket, "*."+runID), "summary", deleted},
			{s.janitor.statesStream, kvSubject(statesBucket, runID), "state", false},
			{s.janitor.ownersStream, kvSubject(ownersBucket, runID), "owner's entry", !owner},
		} {
			if p.skip {
				if err := s.crashAt(p.what); err != nil {
					return err
				}
				continue
			}
			if err := p.stream.Purge(ctx, jetstream.WithPurgeSubject(p.subject)); err != nil {
				return fmt.Errorf("run %s: purging its %s: %w", runID, p.what, err)
			}
			if err := s.crashAt(p.what); err != nil {
				return err
			}
		}
	}
	opts := []jetstream.StreamPurgeOpt{jetstream.WithPurgeSubject(eventsSubject + runID)}
	if seq > 0 {
		opts = append(opts, jetstream.WithPurgeSequence(seq+1))
	}
	if err := s.events.Purge(ctx, opts...); err != nil {
		return fmt.Errorf("run %s: purging its journal: %w", runID, err)
	}
	if err := s.crashAt("journal"); err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.last, runID)
	s.mu.Unlock()
	return nil
}

// unindexDeleted replaces deleted run runID's summary in the index with a
// purge marker (a rollup: the summaries before it go), if it has one. One
// never indexed gets a marker all the same if last, its last state this
// server had yet to index, names its tenant: it was listed (ListRuns adds
// the runs driven here), and the index's followers are told it is gone.
func (s *JetStream) unindexDeleted(ctx context.Context, runID string, last []byte) error {
	prefix := kvSubject(indexBucket, "")
	msg, err := s.janitor.indexStream.GetLastMsgForSubject(ctx, prefix+"*."+runID)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		if id, tenant, _, ok := peekListing(last); ok && id == runID {
			return s.index.kv.Purge(ctx, indexKey(tenant, runID))
		}
		return nil // never indexed, or purged already
	case err != nil:
		return err
	case msg.Header.Get(kvOperation) != "":
		return nil // its marker, from the deletion before a crash
	}
	return s.index.kv.Purge(ctx, strings.TrimPrefix(msg.Subject, prefix))
}

// held reports whether run runID has an owner entry.
func (s *JetStream) held(ctx context.Context, runID string) (bool, error) {
	_, err := s.owners.Get(ctx, runID)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	default:
		return false, fmt.Errorf("run %s: reading its owner: %w", runID, err)
	}
}

// purgeLeftovers purges from a bucket's stream the deletion markers older
// than cutoff and, with states, the saved states older than cutoff of
// finished runs that no one owns: their journal is gone, or goes by age
// too (run_finished is written before the final state is saved).
func (s *JetStream) purgeLeftovers(ctx context.Context, stream jetstream.Stream, bucket string, cutoff time.Time, states bool) (int, error) {
	n := 0
	prefix := kvSubject(bucket, "")
	scan := orderedRead{cfg: jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy, InactiveThreshold: lastEventsIdle}, idle: idleWait}
	err := eachOrdered(ctx, stream, scan, func(msg jetstream.Msg, meta *jetstream.MsgMetadata) (bool, error) {
		if meta.Timestamp.After(cutoff) {
			return false, nil // the messages after it are newer still
		}
		key := strings.TrimPrefix(msg.Subject(), prefix)
		if msg.Headers().Get(kvOperation) == "" {
			if !states || !validKey(key) {
				return true, nil // a run's owner: in flight
			}
			st, err := store.DecodeState(msg.Data())
			if err != nil || !store.IsTerminal(st.GetStatus()) {
				return true, nil // in flight (or not Stubborn's)
			}
			if held, err := s.held(ctx, key); err != nil || held {
				return err == nil, err
			}
		}
		if err := stream.Purge(ctx, jetstream.WithPurgeSubject(msg.Subject()), jetstream.WithPurgeSequence(meta.Sequence.Stream+1)); err != nil {
			return false, fmt.Errorf("purging %s: %w", key, err)
		}
		n++
		return true, nil
	})
	return n, err
}

// kvOperation is the header of a KV deletion marker (DEL or PURGE).
const kvOperation = "KV-Operation"

// kvStream names a bucket's stream.
func kvStream(bucket string) string { return "KV_" + bucket }

// kvSubject is key's subject in bucket's stream.
func kvSubject(bucket, key string) string { return "$KV." + bucket + "." + key }

// share is percent % of MaxBytes, in bytes.
func (s *JetStream) share(percent int64) int64 { return s.janitor.maxBytes / 100 * percent }

// readUsed reads how full the store is (used: see the top of this file),
// and the average size of a run's journal. Admission trusts used for
// usedFresh.
func (s *JetStream) readUsed(ctx context.Context) (used, perRun int64, err error) {
	j := &s.janitor
	j.mu.Lock()
	j.reading = true
	j.mu.Unlock()
	defer func() {
		j.mu.Lock()
		defer j.mu.Unlock()
		j.reading = false
		if err == nil {
			j.used, j.usedAt = used, time.Now()
		}
	}()
	events, err := s.events.Info(ctx)
	if err != nil {
		return 0, 0, err
	}
	owners, err := s.janitor.ownersStream.Info(ctx)
	if err != nil {
		return 0, 0, err
	}
	// The runs in flight here that are claimed in their journals have no
	// owners entry yet (claims.go): counted by their run_started's size.
	// (Another replica's such runs are not: the top tenth of MaxBytes is
	// room for them.)
	used = int64(events.State.Bytes) + inFlightFactor*(int64(owners.State.Bytes)+s.claims.bytes.Load())
	return used, int64(events.State.Bytes / max(events.State.NumSubjects, 1)), nil
}

// admit refuses a new run whose encoded state has size bytes with
// ErrStoreFull when the store has no room for it (see the top of this
// file). It reads the store's size at most once per usedFresh, counting
// the runs it admits meanwhile; when that read fails it admits the run:
// the claim that follows meets the same trouble, and says so.
//
// When the run does not fit, admission makes room first (makeRoom): it
// purges the finished runs that ended first, itself, one purge at a time
// (a run that finds one under way waits for it), for at most admitWait
// and while ctx lasts. It refuses the run when that found nothing to
// purge: the store is full of runs in flight. Then it does not look again
// for usedFresh, and what it read through once it does not read again.
func (s *JetStream) Admit(ctx context.Context, size int) error {
	j := &s.janitor
	if j.maxBytes <= 0 {
		return nil
	}
	// Its claim, counted as a run in flight, then its run_started and
	// attempt_started, each about its state, until the next read.
	need := (inFlightFactor + 2) * int64(size)
	limit := s.share(admitBelow)
	if fits, err := s.tryAdmit(ctx, need, limit); fits || err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, admitWait)
	defer cancel()
	made, pause := false, 10*time.Millisecond
	for {
		j.mu.Lock()
		wait := j.making
		if wait == nil {
			if made || time.Since(j.fruitless) < usedFresh {
				err := s.storeFull(need, limit)
				j.mu.Unlock()
				return err
			}
			wait = make(chan struct{})
			j.making = wait
			j.mu.Unlock()
			held := s.makeRoom(wctx, min(s.share(lowWater), limit-need))
			j.mu.Lock()
			j.making = nil
			close(wait)
			j.mu.Unlock()
			// When its purge found finished runs still held, and none to
			// purge, their drivers let go of them in a moment: it looks
			// again then. Otherwise it made what room there was.
			made = !held
			if held && !sleep(wctx, pause) {
				// Held all along (a driver that died holds its finished
				// runs until they are taken over): the next runs do not
				// wait for them again before usedFresh.
				made = true
				j.mu.Lock()
				j.fruitless = time.Now()
				j.mu.Unlock()
			}
			pause = min(2*pause, 200*time.Millisecond)
		} else {
			j.mu.Unlock()
			select {
			case <-wait: // see what it made, and make more if need be
			case <-wctx.Done():
				j.mu.Lock()
				err := s.storeFull(need, limit)
				j.mu.Unlock()
				return err
			}
		}
		if fits, err := s.tryAdmit(ctx, need, limit); fits || err != nil {
			return err
		}
	}
}

// tryAdmit admits a run that needs need bytes if the store has room for
// it under limit, reading its size when what admission knows is stale. It
// refuses it (ErrStoreFull) when it does not fit and admission cannot make
// room; fits is false and err nil when it could.
func (s *JetStream) tryAdmit(ctx context.Context, need, limit int64) (fits bool, err error) {
	j := &s.janitor
	j.mu.Lock()
	stale := j.usedAt.IsZero() || time.Since(j.usedAt) >= usedFresh && !j.reading
	j.mu.Unlock()
	if stale {
		if _, _, err := s.readUsed(ctx); err != nil {
			return true, nil
		}
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.used > s.share(highWater) && !j.starved {
		select {
		case j.kick <- struct{}{}:
		default:
		}
	}
	if j.used+need <= limit {
		j.used += need
		return true, nil
	}
	if !j.makesRoom || need > limit {
		return false, s.storeFull(need, limit)
	}
	return false, nil
}

// storeFull is admission's refusal of a run that needs need bytes.
// j.mu is held.
func (s *JetStream) storeFull(need, limit int64) error {
	j := &s.janitor
	why := "no finished run is left to purge: the runs in flight fill it"
	switch {
	case need > limit:
		why = fmt.Sprintf("a run this large (%d bytes, counting what it writes at its start) never fits: send a smaller brief, or raise -max-bytes", need)
	case !j.makesRoom:
		why = "finished runs are not purged (PurgeEvery is negative)"
	}
	return fmt.Errorf("%w: -max-bytes %d, of which it keeps the last %d%% for the runs in flight (the store holds %d bytes, the runs in flight included); %s",
		store.ErrStoreFull, j.maxBytes, 100-admitBelow, j.used, why)
}

// makeRoom is admission's purge: it purges the finished runs that ended
// first while the store is over target bytes (used), reading the events
// stream from roomFrom, and leaves used read afresh when it purged any.
// held says that it purged none, but found finished runs it could not
// purge yet (still held). Its errors are logged: admission refuses the run
// then, if it has no room.
func (s *JetStream) makeRoom(ctx context.Context, target int64) (held bool) {
	j := &s.janitor
	used, perRun, err := s.readUsed(ctx)
	if err != nil || used <= target {
		return false
	}
	j.mu.Lock()
	from := j.roomFrom
	j.mu.Unlock()
	p := &roomPurge{target: target, used: used, perRun: perRun, next: from}
	err = s.purgeForRoom(ctx, p, from)
	if p.kept > 0 {
		p.next = p.kept
	}
	if p.n > 0 {
		if _, _, rerr := s.readUsed(ctx); rerr != nil && err == nil {
			err = rerr
		}
	}
	held = p.n == 0 && err == nil && p.kept > 0
	s.noteRoomPurge(p.next, p.n == 0 && err == nil && !held)
	switch {
	case err != nil && ctx.Err() == nil:
		j.log.Warn("making room for a new run: purging finished runs", "err", err, "purged", p.n)
	case p.n > 0:
		j.log.Debug("made room for a new run: purged finished runs", "purged", p.n)
	}
	return held
}

// roomPurge is what one purge of admission's (makeRoom) has read and
// purged so far.
type roomPurge struct {
	target       int64 // the store's size to purge down to
	used, perRun int64 // as readUsed reads them, used estimated down by perRun a purge
	n            int   // runs purged
	// next: read up to it; kept: the first end of a finished run not
	// purged (0: none).
	next, kept uint64
}

// purgeForRoom reads the events stream from sequence from (0: the start)
// and purges the finished runs whose ends it meets, in the order they
// ended, until the store is down to p.target.
func (s *JetStream) purgeForRoom(ctx context.Context, p *roomPurge, from uint64) error {
	scan := orderedRead{cfg: jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy, InactiveThreshold: lastEventsIdle}, idle: idleWait}
	if from > 0 {
		scan.cfg.DeliverPolicy, scan.cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	return eachOrdered(ctx, s.events, scan, func(msg jetstream.Msg, meta *jetstream.MsgMetadata) (bool, error) {
		seq := meta.Sequence.Stream
		p.next = seq + 1
		runID, end := s.finishedEnd(msg, seq)
		if !end {
			return true, nil
		}
		purged, err := s.purgeRun(ctx, runID, seq)
		if err != nil || !purged {
			if p.kept == 0 {
				p.kept = seq // held: its driver lets go of it soon; or read it again
			}
			return err == nil, err
		}
		p.n++
		if p.used -= p.perRun; p.used <= p.target {
			if p.used, p.perRun, err = s.readUsed(ctx); err != nil {
				return false, err
			}
			return p.used > p.target, nil
		}
		return true, nil
	})
}

// noteRoomPurge notes where admission's next purge reads from (next, if
// further on), and whether this one was fruitless: it found nothing to
// purge and nothing held.
func (s *JetStream) noteRoomPurge(next uint64, fruitless bool) {
	j := &s.janitor
	j.mu.Lock()
	defer j.mu.Unlock()
	if next > j.roomFrom {
		j.roomFrom = next
	}
	if fruitless {
		j.fruitless = time.Now()
	}
}

// finishedEnd says whether the journal message at stream sequence seq
// ends a finished run (its last event is run_finished), and names the
// run. A message Stubborn cannot read ends none (and is logged): not one
// to purge.
func (s *JetStream) finishedEnd(msg jetstream.Msg, seq uint64) (runID string, end bool) {
	runID = strings.TrimPrefix(msg.Subject(), eventsSubject)
	evs, err := unpackEvents(msg.Data(), msg.Headers())
	if err != nil {
		s.janitor.log.Warn("purging finished runs: unreadable journal message", "run_id", runID, "seq", seq, "err", err)
		return runID, false
	}
	// Not its journal's end, or a run in flight: never purged.
	return runID, evs[len(evs)-1].Finished
}
