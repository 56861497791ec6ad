package jsstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// Claims in the journal (issue 32): a new run is claimed by its journal's
// first write, not by an owners entry of its own, and let go of by its
// last (run_finished), not by deleting that entry. A one-attempt run
// costs two writes: its journal before the call and after it.
//
//   - The first message of a run's journal carries claimHeader, the name
//     of the server that accepted the run, and is published expecting the
//     run's subject to be empty: a second writer of the same run is
//     fenced as every later write is (publish). Every message that copy
//     of the run writes carries it too: a journal whose first message was
//     lost (a damaged store) still says who claimed it.
//   - Who drives a run: its owners entry when it has one, else the claim
//     of its journal's last message until the journal ends with
//     run_finished (Driver). A run taken over gets an owners entry
//     (TakeOver), which names its driver from then on.
//   - A run that outlives claimDelay gets an owners entry all the same,
//     written by the server that drives it off the run's path
//     (claimWriter), and released at its end as before: so that finding
//     the runs of a dead server does not mean reading journals written
//     long ago.
//   - Every server keeps a mark in the marks bucket (Beat writes it with
//     its heartbeats): a stream sequence at or below the first
//     message of every run it claimed that has neither ended nor an
//     owners entry yet. A server taking over a dead one's runs reads the
//     journal messages after that mark (headers only) for that server's
//     claims (journalOrphans), besides the owners bucket, and drops the
//     mark when it has taken them all over.
//   - A server whose beats stop landing stops writing a lease later
//     (write's fence), claims included, and its fence moves on only once
//     a heartbeat and its mark both landed; the mark is written whenever
//     it changed and at least every half lease: a server that was thought
//     dead (silent for a lease), and whose mark was dropped, writes it
//     again before it claims another run.

// claimHeader is the header of a run's first journal message that names
// the server that accepted the run.
const claimHeader = "Stubborn-Claim"

// marksBucket holds each server's mark.
const marksBucket = "stubborn_marks"

// claimDelay is how long a run claimed in its journal may go on before
// its driver writes it an owners entry: runs shorter than that (most)
// never do. 0 means the lease.
const claimDelay = 0

// claimState is where a journal claim's owners entry stands.
type claimState uint8

const (
	// claimSending: the first write is under way.
	claimSending claimState = iota
	// claimPending: the first write landed; no owners entry yet.
	claimPending
	// claimUncertain: the first write failed, perhaps after it landed;
	// the claim writer reads the journal to tell.
	claimUncertain
	// claimWriting: the owners entry is being written.
	claimWriting
)

// claim is a run this store claimed in its journal, until it is released.
type claim struct {
	owner    string
	runState []byte // run_started's state, for the owners entry
	// floor is the highest stream sequence this store had seen written
	// when the first write was sent: that write's sequence is above it.
	floor uint64
	at    time.Time // when the first write landed (or failed)
	state claimState
	// released: Release came while the owners entry was being written;
	// the claim writer deletes it once written.
	released bool
	// misses counts the reads of an uncertain claim's journal that found
	// no claim (uncertainReads).
	misses int
}

// uncertainReads is how many reads of its journal, a claim delay apart,
// must find nothing before an uncertain claim is taken for one never
// written: a node that lags is not behind for that long.
const uncertainReads = 3

// stateBefore is the state a claim goes back to when its owners entry
// could not be written now.
func (cl *claim) stateBefore(uncertain bool) claimState {
	if uncertain {
		return claimUncertain
	}
	return claimPending
}

// claims is a JetStream store's table of its journal claims.
type claims struct {
	mu   sync.Mutex
	runs map[string]*claim
	// acked is the highest events stream sequence this store has seen
	// written (or the stream's last when it opened it). Read under mu by
	// begin and mark, so that a claim begun after a mark was taken has a
	// floor at or above it.
	acked atomic.Uint64
	delay time.Duration
	// bytes sums the claims' states: those of the runs in flight here
	// that the owners bucket does not hold (janitor.go's used).
	bytes atomic.Int64
	// written is the last mark Beat wrote for each server (markDue).
	written map[string]writtenMark
}

// begin notes the first write of run runID, claimed by owner, as sent;
// state is the run's, as run_started has it.
func (c *claims) begin(runID, owner string, state []byte) {
	c.mu.Lock()
	c.forgetLocked(runID)
	c.runs[runID] = &claim{owner: owner, floor: c.acked.Load(), runState: state}
	c.bytes.Add(int64(len(state)))
	c.mu.Unlock()
}

// forget drops run runID's claim: it has an owners entry now.
func (c *claims) forget(runID string) {
	c.mu.Lock()
	c.forgetLocked(runID)
	c.mu.Unlock()
}

// forget drops run runID's claim. Callers hold mu.
func (c *claims) forgetLocked(runID string) {
	if cl := c.runs[runID]; cl != nil {
		c.bytes.Add(-int64(len(cl.runState)))
		delete(c.runs, runID)
	}
}

// sent notes how the first write of run runID ended.
func (c *claims) sent(runID string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl := c.runs[runID]
	if cl == nil || cl.state != claimSending {
		return
	}
	cl.at = time.Now()
	if ok {
		cl.state = claimPending
	} else {
		cl.state = claimUncertain
	}
}

// ack notes a journal message written at stream sequence seq.
func (c *claims) ack(seq uint64) {
	for {
		cur := c.acked.Load()
		if seq <= cur || c.acked.CompareAndSwap(cur, seq) {
			return
		}
	}
}

// mark returns owner's mark: at or below the first message of each of
// its claims without an owners entry, else the last sequence seen
// written.
func (c *claims) mark(owner string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.acked.Load()
	for _, cl := range c.runs {
		if cl.owner == owner {
			h = min(h, cl.floor)
		}
	}
	return h
}

// release forgets run runID's claim at the run's end, and reports whether
// it has an owners entry to delete.
func (c *claims) release(runID string) (purge bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl := c.runs[runID]
	if cl == nil {
		return true // not claimed here, or its owners entry was written
	}
	if cl.state == claimWriting {
		cl.released = true // deleted once written (writeClaim)
		return false
	}
	c.forgetLocked(runID)
	return false // its journal ends with run_finished: that is its release
}

// claimsInJournal: Manager.start claims a new run with its first journal
// write, unless the config says to claim it in the owners bucket
// (ClaimInOwners).
//
// Compatibility path, for servers before 2026-12-02 sharing the store
// (JetStreamConfig.ClaimInOwners): the store's only branch on it.
func (s *JetStream) ClaimsInJournal() bool { return !s.claimInOwners }

// claimed returns the claim of the run's journal: the server its last
// message names ("" when it has none, or no journal: every message the
// copy that claimed it writes names it), and whether the journal ends
// with run_finished.
func (s *JetStream) claimed(ctx context.Context, runID string) (owner string, finished bool, err error) {
	m, err := s.events.GetLastMsgForSubject(ctx, eventsSubject+runID)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	last, err := lastRawEvent(runID, m.Data, m.Header)
	if err != nil {
		return "", false, store.UnreadableRun(runID, err)
	}
	return m.Header.Get(claimHeader), last.Finished, nil
}

// firstState returns the state run_started carries, from the run's first
// journal message (nil when it has none).
func (s *JetStream) firstState(ctx context.Context, runID string) ([]byte, error) {
	m, err := s.events.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(eventsSubject+runID))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	evs, err := unpackEvents(m.Data, m.Header)
	if err != nil {
		return nil, store.UnreadableRun(runID, err)
	}
	if len(evs) == 0 || evs[0].Seq != 1 {
		return nil, nil
	}
	return evs[0].StateBytes(), nil
}

// markDue returns owner's mark, and whether Beat is to write it: it
// changed since the last written, or that one was sent every or longer
// ago.
func (c *claims) markDue(owner string, now time.Time, every time.Duration) (uint64, bool) {
	mark := c.mark(owner)
	c.mu.Lock()
	defer c.mu.Unlock()
	last, ok := c.written[owner]
	return mark, !ok || last.mark != mark || now.Sub(last.at) >= every
}

// markWritten notes owner's mark as written, sent at at.
func (c *claims) markWritten(owner string, mark uint64, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.written == nil {
		c.written = map[string]writtenMark{}
	}
	c.written[owner] = writtenMark{mark, at}
}

// writtenMark is the last mark Beat wrote for a server, and when it sent
// it.
type writtenMark struct {
	mark uint64
	at   time.Time
}

// claimMarks calls fn with every server's mark, its revision and when
// it was written.
func (s *JetStream) ClaimMarks(ctx context.Context, fn func(owner string, mark, rev uint64, written time.Time)) error {
	return eachEntry(ctx, s.marks, jetstream.AllKeys, func(e jetstream.KeyValueEntry) (bool, error) {
		mark, err := strconv.ParseUint(string(e.Value()), 10, 64)
		if err != nil {
			mark = 0 // read every journal from the start rather than miss a run
		}
		fn(e.Key(), mark, e.Revision(), e.Created())
		return true, nil
	})
}

// dropMark deletes owner's mark if it is still at revision rev: its runs
// have all been taken over.
func (s *JetStream) DropMark(ctx context.Context, owner string, rev uint64) error {
	opts := []jetstream.KVDeleteOpt{jetstream.LastRevision(rev)}
	if s.markerTTL > 0 {
		opts = append(opts, jetstream.PurgeTTL(s.markerTTL))
	}
	err := s.marks.Purge(ctx, owner, opts...)
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
		return nil // it wrote a mark since: alive after all
	}
	return err
}

// journalOrphans calls fn with every run claimed in its journal by a
// server of marks after that server's mark, that has no owners entry and
// has not finished. It reads the journal messages written after the
// lowest mark, headers only.
func (s *JetStream) JournalOrphans(ctx context.Context, marks map[string]uint64, fn func(runID, owner string)) error {
	if len(marks) == 0 {
		return nil
	}
	from := uint64(0)
	first := true
	for _, m := range marks {
		if first || m < from {
			from, first = m, false
		}
	}
	found := map[string]string{}
	scan := orderedRead{
		cfg: jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{eventsSubject + "*"},
			DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
			OptStartSeq:    from + 1,
			HeadersOnly:    true,
		},
		idle: idleWait,
		// Read to the end, or it is an error: a read cut short (a stalled
		// consumer) must not pass for the whole, or the mark would be
		// dropped with runs after it unread.
		whole: true,
	}
	err := eachOrdered(ctx, s.events, scan, func(msg jetstream.Msg, meta *jetstream.MsgMetadata) (bool, error) {
		if owner := msg.Headers().Get(claimHeader); owner != "" {
			if mark, ok := marks[owner]; ok && meta.Sequence.Stream > mark {
				found[strings.TrimPrefix(msg.Subject(), eventsSubject)] = owner
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("reading the journals after the marks of dead servers: %w", err)
	}
	for runID, owner := range found {
		if _, err := s.owners.Get(ctx, runID); err == nil {
			continue // listed with the owners bucket
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return err
		}
		ev, err := s.lastEvent(ctx, runID)
		if err != nil && !errors.Is(err, store.ErrUnreadable) {
			return err
		}
		if err == nil && ev.Finished {
			// Its server may have died before its index noted the end.
			s.IndexEnd(runID, ev)
			continue
		}
		fn(runID, owner)
	}
	return nil
}

// takeOverClaim makes owner the driver of run runID, claimed in its
// journal by from, with an owners entry of its own. ErrConflict if the
// journal names another, or another server wrote the entry first.
func (s *JetStream) takeOverClaim(ctx context.Context, runID, from, owner string) (exists bool, err error) {
	claimer, _, err := s.claimed(ctx, runID)
	if err != nil {
		return false, err
	}
	if claimer == "" {
		// A journal read from a node that lags may not have the run's
		// messages yet: not a conflict, which would let the scan drop
		// the dead server's mark; tried again at the next scan.
		return false, fmt.Errorf("run %s: its journal names no driver (a lagging read?)", runID)
	}
	if claimer != from {
		return false, fmt.Errorf("%w: run %s is claimed by %q", store.ErrConflict, runID, claimer)
	}
	_, err = s.owners.Create(ctx, runID, journalEntry(owner, nil))
	if errors.Is(err, jetstream.ErrKeyExists) {
		return true, nil
	}
	return false, err
}

// startClaims opens the marks bucket's table and starts the claim writer
// (until ctx ends).
func (s *JetStream) startClaims(ctx context.Context, last uint64) {
	s.claims.runs, s.claims.delay = map[string]*claim{}, s.lease
	s.claims.acked.Store(last)
	if claimDelay > 0 {
		s.claims.delay = claimDelay
	}
	s.claimsDone = make(chan struct{})
	go func() {
		defer close(s.claimsDone)
		s.claimWriter(ctx)
	}()
}

// claimWriter writes an owners entry for each run claimed here in its
// journal that has gone on for claimDelay, and settles the claims whose
// first write failed, until ctx ends.
func (s *JetStream) claimWriter(ctx context.Context) {
	t := time.NewTicker(max(s.claims.delay/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		var due []string
		s.claims.mu.Lock()
		for runID, cl := range s.claims.runs {
			if (cl.state == claimPending || cl.state == claimUncertain) && now.Sub(cl.at) >= s.claims.delay {
				due = append(due, runID)
			}
		}
		s.claims.mu.Unlock()
		for _, runID := range due {
			if ctx.Err() != nil {
				return
			}
			s.writeClaim(ctx, runID)
		}
	}
}

// writeClaim writes run runID's owners entry if it is claimed here in its
// journal and has none (claimWriter, PutState).
func (s *JetStream) writeClaim(ctx context.Context, runID string) {
	s.claims.mu.Lock()
	cl := s.claims.runs[runID]
	if cl == nil || cl.state != claimPending && cl.state != claimUncertain {
		s.claims.mu.Unlock()
		return
	}
	uncertain := cl.state == claimUncertain
	cl.state = claimWriting
	owner, runState := cl.owner, cl.runState
	s.claims.mu.Unlock()

	settle := func(state claimState) {
		s.claims.mu.Lock()
		cl.state, cl.at = state, time.Now()
		s.claims.mu.Unlock()
	}
	drop := func() {
		s.claims.mu.Lock()
		s.claims.forgetLocked(runID)
		s.claims.mu.Unlock()
	}
	// The journal says whether the claim is still this server's: its
	// first write landed (an uncertain one), and no other server took the
	// run over and ended it meanwhile (this one stalled past its lease).
	claimer, finished, err := s.claimed(ctx, runID)
	switch {
	case err != nil:
		settle(cl.stateBefore(uncertain)) // looked at again
		return
	case claimer == "" && uncertain && cl.misses+1 < uncertainReads:
		// Perhaps never written; perhaps a read from a node that lags.
		s.claims.mu.Lock()
		cl.misses++
		s.claims.mu.Unlock()
		settle(claimUncertain)
		return
	case claimer != owner || finished:
		drop() // never written, taken over, or ended: nothing to claim
		return
	}
	err = s.createOwner(ctx, runID, journalEntry(owner, runState))
	switch {
	case errors.Is(err, jetstream.ErrKeyExists):
		drop() // taken over: the entry names its new driver
	case err != nil:
		settle(claimPending) // tried again
	default:
		// Written: the owners entry names the driver now, and Release
		// deletes it.
		s.claims.mu.Lock()
		released := cl.released
		if s.claims.runs[runID] == cl {
			s.claims.forgetLocked(runID)
		}
		s.claims.mu.Unlock()
		if released {
			if err := s.purgeOwner(ctx, runID); err != nil {
				s.index.log.Warn("releasing a finished run", "run_id", runID, "err", err)
			}
		}
	}
}

// indexEnd hands the listing index a run's end read from its journal
// (endIndexer).
func (s *JetStream) IndexEnd(runID string, final store.Event) {
	s.index.note(runID, final.StateBytes())
}
