package jsstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// The listing index (issue 20): on JetStream, a KV bucket of every run's
// summary (Summary), keyed by its tenant and its id, "<tenant key>.<run
// id>", so that listing a tenant's runs reads that tenant's summaries and
// nothing else: a subject-filtered read, not a scan of every run's state.
// A watch of the same keys follows the tenant's runs as they change, on
// every replica that shares the store.
//
// What writes it: every state the store writes (a claim, a saved state,
// the state in run_started and run_finished: a run's status changes are
// all among them) is handed to one indexer goroutine per store, which
// writes its summary after the write that carried it, off the run's path,
// one per status a run went through (consecutive states of one status are
// one write; maxPendingStates bounds what waits), after letting them
// gather for indexDelay: a run that ended meanwhile is one write, its end.
// A summary may lag its run by indexDelay and a write.
//
// What keeps it whole: on every start the store reconciles the index with
// the runs' states in the background (reconcile): a summary missing or
// behind is written, with compare-and-set, so that it never overwrites a
// newer one that a driver wrote meanwhile. Until this process has
// reconciled once, listing reads the states instead (indexReady). The
// janitor purges a run's summary with the rest of it.
//
// Caveat: during a rolling upgrade from a version without the index, the
// runs that older servers drive update their summaries only when a newer
// server starts (its reconcile).
const indexBucket = "stubborn_index"

// indexHistory is how many summaries of a run the index keeps: listing
// reads the last, a watch each one written (see NewJetStream).
const indexHistory = 8

// indexEntry is the index's entry of a run of tenant: the tenant's name
// (a key is a hash of it) and the summary, encoded as an owners entry is.
func indexEntry(tenant string, sum *stubbornv1.RunSummary) ([]byte, error) {
	b, err := proto.Marshal(sum)
	if err != nil {
		return nil, err
	}
	return ownerEntry(tenant, b), nil
}

// indexKey is run runID's key in the index: its tenant's key (a hash: a
// tenant's name may hold anything), a dot, its id.
func indexKey(tenant, runID string) string { return indexTenant(tenant) + "." + runID }

// indexTenant is the first token of tenant's keys in the index.
func indexTenant(tenant string) string {
	h := sha256.Sum256([]byte(tenant))
	return "t" + hex.EncodeToString(h[:16])
}

// indexer writes the summaries of the states the store writes, the
// latest of each run, in batches (writeBatch), off the runs' path.
type indexer struct {
	kv jetstream.KeyValue
	// async publishes a batch's writes at once (sendAll), with a timeout
	// of its own for their acknowledgements; nil: one at a time.
	async jetstream.JetStream
	log   *slog.Logger
	// deleted reads whether a run has a tombstone (JetStream.DeletedRun).
	deleted func(ctx context.Context, runID string) (bool, error)
	// anyDeleted reads whether the store holds any tombstone
	// (JetStream.anyTombstones).
	anyDeleted func(ctx context.Context) (bool, error)

	mu sync.Mutex
	// pending holds the states of each run not yet indexed, encoded, in
	// the order they were written: at most maxPendingStates a run (then
	// the last is replaced), so that a follower sees every status a run
	// goes through unless the index lags that far behind.
	pending map[string][][]byte
	// writing is the batch taken from pending that loop is writing;
	// written is closed once that batch is written and checked for
	// deleted runs (undeletedAll).
	writing map[string][][]byte
	written chan struct{}
	// revs holds what this indexer wrote to each key of a run not ended,
	// and at which revision (at most maxRevs): the run's next write
	// expects it, rather than finds the key taken and reads it first.
	revs map[string]wroteRev
	wake chan struct{}

	// ready is set once this process has reconciled the index.
	ready atomic.Bool
	// failing is set while writes to the index fail (logged once a
	// spell).
	failing atomic.Bool
	// unreadable holds when each run left out of a listing was last
	// logged (logUnreadable).
	unreadable sync.Map

	cancel context.CancelFunc
	done   chan struct{}
	// reconciled is closed when the start's reconcile has ended.
	reconciled chan struct{}
}

// indexDelay is how long the indexer lets states gather before it writes
// them: a run that ends within it is indexed once, by its end, instead of
// once a status (issue 21: each index write is a JetStream write, and a
// one-attempt run made two).
const indexDelay = 20 * time.Millisecond

// maxPendingStates bounds the states of one run waiting to be indexed.
const maxPendingStates = 8

// maxRevs bounds the revisions an indexer remembers (indexer.revs): the
// runs in flight it indexed, and those it indexed that ended elsewhere.
const maxRevs = 4096

// indexAckWait bounds the wait for the acknowledgement of a batch's
// write (sendAll); one that does not come is written again one at a time.
const indexAckWait = 5 * time.Second

// indexRetry is how long the indexer waits after a failed write before
// it tries again.
const indexRetry = time.Second

// startIndexer starts the indexer of s's index, and its reconcile.
func (s *JetStream) startIndexer(kv jetstream.KeyValue, log *slog.Logger) {
	ctx, cancel := context.WithCancel(context.Background())
	x := &indexer{kv: kv, log: log, deleted: s.DeletedRun, anyDeleted: s.anyTombstones, pending: map[string][][]byte{}, revs: map[string]wroteRev{}, wake: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{}), reconciled: make(chan struct{})}
	// Its own JetStream context: a write's acknowledgement it waits for
	// ends within indexAckWait, and async publishes of the runs' writes
	// never queue behind it.
	if js, err := jetstream.New(s.nc, jetstream.WithPublishAsyncTimeout(indexAckWait)); err == nil {
		x.async = js
	}
	s.index = x
	var wg sync.WaitGroup
	// The summaries of the runs that change are written from the first,
	// while the reconcile goes on: its compare-and-set leaves them alone.
	wg.Go(func() { x.loop(ctx) })
	wg.Go(func() {
		defer close(x.reconciled)
		if err := s.reconcile(ctx); err != nil {
			if ctx.Err() == nil {
				x.log.Warn("run index: reconciling it with the runs' states failed; listing reads the states instead until the next start", "err", err)
			}
			return
		}
		x.ready.Store(true)
	})
	go func() {
		wg.Wait()
		close(x.done)
	}()
}

// IndexReconciled returns a channel closed once this store's start has
// reconciled the listing index with the runs' states (or given up on it):
// from then on the store makes no request of its own until runs change.
func (s *JetStream) IndexReconciled() <-chan struct{} { return s.index.reconciled }

// stop ends the indexer; what it had yet to write is left to the next
// start's reconcile.
func (x *indexer) stop() {
	x.cancel()
	<-x.done
	// The async publisher's reply subscription and its goroutine end with
	// the store's connection (Close), not with CleanupPublisher here:
	// nats.go starts that goroutine as the first publish goes out, and
	// one that had not run yet when CleanupPublisher took its status
	// channel away would wait on a nil channel forever.
}

// note hands the indexer a state the store wrote (encoded).
func (x *indexer) note(runID string, state []byte) {
	if len(state) == 0 {
		return
	}
	x.mu.Lock()
	if q := x.pending[runID]; len(q) == maxPendingStates {
		q[len(q)-1] = state
	} else {
		x.pending[runID] = append(q, state)
	}
	x.mu.Unlock()
	x.poke()
}

func (x *indexer) poke() {
	select {
	case x.wake <- struct{}{}:
	default:
	}
}

// noteEvents hands the indexer the last state among evs (run_started's
// or run_finished's), if any.
func (x *indexer) noteEvents(evs []store.Event) {
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Finished || evs[i].Seq == 1 {
			x.note(evs[i].RunID, evs[i].StateBytes())
			return
		}
	}
}

// wroteBatch ends the batch in flight, if any: settle waits no more.
func (x *indexer) wroteBatch() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.written != nil {
		close(x.written)
	}
	x.writing, x.written = nil, nil
}

// settleWait bounds settle's wait for a batch in flight.
const settleWait = indexAckWait + time.Second

// settle drops run runID's states yet to be indexed and waits until no
// batch in flight holds it (for up to settleWait, or ctx): DeleteRun
// calls it after the run's tombstone, before the purge, so that no
// summary of the run is written after the purge and seen until the
// batch's check takes it back (undeletedAll). A write from elsewhere (a
// takeover's indexEnd, another server's indexer) is still taken back that
// way. It returns the last of the run's states it dropped or saw in
// flight (nil if none): the deletion's purge marker is written under its
// tenant's key even if no summary of the run was (unindexDeleted).
func (x *indexer) settle(ctx context.Context, runID string) (last []byte) {
	ctx, cancel := context.WithTimeout(ctx, settleWait)
	defer cancel()
	for {
		x.mu.Lock()
		if q := x.pending[runID]; len(q) > 0 {
			last = q[len(q)-1]
		}
		delete(x.pending, runID)
		q, inFlight := x.writing[runID]
		if len(q) > 0 && last == nil {
			last = q[len(q)-1]
		}
		written := x.written
		x.mu.Unlock()
		if !inFlight {
			return last
		}
		select {
		case <-written:
		case <-ctx.Done():
			return last
		}
	}
}

// loop writes what the store noted, in batches, until ctx ends.
func (x *indexer) loop(ctx context.Context) {
	defer x.wroteBatch() // one stopped halfway: nobody waits for it (settle)
	for {
		select {
		case <-ctx.Done():
			return
		case <-x.wake:
		}
		// A moment for the runs that just changed to change again: a
		// short run ends within it, and is one write (its end).
		if !sleep(ctx, indexDelay) {
			return
		}
		x.mu.Lock()
		batch := x.pending
		x.pending = make(map[string][][]byte, len(batch))
		x.writing, x.written = batch, make(chan struct{})
		x.mu.Unlock()
		var done []indexed
		if !x.writeBatch(ctx, batch, &done) {
			return
		}
		if !x.undeletedAll(ctx, done) {
			return
		}
		x.wroteBatch()
		if x.failing.Load() {
			if !sleep(ctx, indexRetry) {
				return
			}
		}
	}
}

// indexed is a summary a batch wrote, to be taken back if its run has a
// tombstone (undeletedAll), with the states from it on, written again if
// that check fails.
type indexed struct {
	key, runID string
	states     [][]byte
}

// indexWrite is a summary of run runID (of tenant) a batch writes, with
// the run's states from it on, put back if the write fails.
type indexWrite struct {
	runID, tenant string
	sum           *stubbornv1.RunSummary
	states        [][]byte
}

// plan returns the summaries of run runID's states that the index must
// show, in order: the last of each status in a row, and once the run has
// ended, its end only.
func (x *indexer) plan(runID string, states [][]byte) []indexWrite {
	sums, tenants := x.summaries(runID, states)
	end := -1 // the last state that says the run ended
	for i, sum := range sums {
		if sum != nil && store.IsTerminal(sum.GetStatus()) {
			end = i
		}
	}
	var ws []indexWrite
	for i, sum := range sums {
		if sum == nil || i+1 < len(sums) && sums[i+1] != nil && sums[i+1].GetStatus() == sum.GetStatus() {
			continue // nothing to index, or the next state has its status too
		}
		if end >= 0 && i != end {
			continue // the run has ended: its end is all there is to say
		}
		ws = append(ws, indexWrite{runID: runID, tenant: tenants[i], sum: sum, states: states[i:]})
	}
	return ws
}

// writeBatch writes the summaries the batch's states call for (plan) and
// adds them to done: the first of each run's all at once (sent together,
// their acknowledgements awaited together: sendAll), then the rest of
// each run's, and any first that was not written so, one at a time. A
// failed write puts the run's states from it on back (retryLater). It
// reports false when ctx ended meanwhile.
func (x *indexer) writeBatch(ctx context.Context, batch map[string][][]byte, done *[]indexed) bool {
	plans := make([][]indexWrite, 0, len(batch))
	for runID, states := range batch {
		if ws := x.plan(runID, states); len(ws) > 0 {
			plans = append(plans, ws)
		}
	}
	sent := x.sendAll(ctx, plans)
	for i, ws := range plans {
		for j, w := range ws {
			if j == 0 && sent[i] {
				*done = append(*done, indexed{key: indexKey(w.tenant, w.sum.GetRunId()), runID: w.runID, states: w.states})
				continue
			}
			key, err := x.write(ctx, w.tenant, w.sum)
			if err != nil {
				if ctx.Err() != nil {
					return false
				}
				x.retryLater(w.runID, w.states, err)
				break
			}
			if key != "" {
				*done = append(*done, indexed{key: key, runID: w.runID, states: w.states})
			}
		}
	}
	return true
}

// sendBatch bounds the writes sendAll has in flight at once.
const sendBatch = 256

// sendAll writes the first summary of each of plans as one burst of
// publishes, each expecting its key at the revision this indexer last
// wrote it at (revOf; empty if none), and awaits their acknowledgements:
// one round trip for the batch instead of one a run. sent[i] reports that
// plans[i]'s first was written (or needs no write: the index has it, or
// newer); any other (a key written by another server, a run deleted, a
// failed publish) is for the one-at-a-time write, which reads the key.
func (x *indexer) sendAll(ctx context.Context, plans [][]indexWrite) (sent []bool) {
	sent = make([]bool, len(plans))
	if x.async == nil {
		return sent
	}
	type inFlight struct {
		i   int
		key string
		sum *stubbornv1.RunSummary
		ack jetstream.PubAckFuture
	}
	for from := 0; from < len(plans); from += sendBatch {
		var flying []inFlight
		for i := from; i < min(from+sendBatch, len(plans)); i++ {
			w := plans[i][0]
			v, err := indexEntry(w.tenant, w.sum)
			if err != nil {
				continue
			}
			key := indexKey(w.tenant, w.sum.GetRunId())
			prev, ok := x.revOf(key)
			if ok && (newerIndexed(prev.sum, w.sum) || sameIndexed(prev.sum, w.sum)) {
				sent[i] = true
				continue
			}
			ack, err := x.async.PublishMsgAsync(&nats.Msg{Subject: kvSubject(indexBucket, key), Data: v},
				jetstream.WithExpectLastSequencePerSubject(prev.rev))
			if err != nil {
				break // the rest one at a time
			}
			flying = append(flying, inFlight{i: i, key: key, sum: w.sum, ack: ack})
		}
		for _, f := range flying {
			select {
			case pa := <-f.ack.Ok():
				x.wrote(f.key, pa.Sequence, f.sum)
				sent[f.i] = true
			case <-f.ack.Err():
				x.wrote(f.key, 0, nil)
			case <-ctx.Done():
				return sent
			}
		}
	}
	if slices.Contains(sent, true) && x.failing.CompareAndSwap(true, false) {
		x.log.Info("run index: writing it works again")
	}
	return sent
}

// undeletedAll takes back each summary in done whose run has a tombstone
// (undeleted), once every write of the batch is done. When the store
// holds no tombstone at all, read after those writes, none was deleted
// (a deletion writes its tombstone before it purges the index): one read
// a batch instead of one a summary. It reports false when ctx ended.
func (x *indexer) undeletedAll(ctx context.Context, done []indexed) bool {
	if len(done) == 0 {
		return true
	}
	if some, err := x.anyDeleted(ctx); err == nil && !some {
		return true
	}
	for _, w := range done {
		if err := x.undeleted(ctx, w.key, w.runID); err != nil {
			if ctx.Err() != nil {
				return false
			}
			x.retryLater(w.runID, w.states, err)
		}
	}
	return true
}

// summaries decodes run runID's states into their summaries and tenants;
// a state that does not decode has none (and is logged).
func (x *indexer) summaries(runID string, states [][]byte) ([]*stubbornv1.RunSummary, []string) {
	sums := make([]*stubbornv1.RunSummary, len(states))
	tenants := make([]string, len(states))
	for i, state := range states {
		var ok bool
		if sums[i], tenants[i], ok = summaryOf(state); !ok {
			x.log.Error("run index: a state written of the run does not decode; it is not indexed", "run_id", runID)
		}
	}
	return sums, tenants
}

// summaryOf decodes a state's summary and tenant (store.DecodeSummary:
// the fields they are read from alone); ok is false when those do not
// decode.
func summaryOf(state []byte) (sum *stubbornv1.RunSummary, tenant string, ok bool) {
	sum, tenant, err := store.DecodeSummary(state)
	return sum, tenant, err == nil
}

// write indexes one summary of tenant, unless the index has a newer one
// (newerIndexed): several servers write a run's summaries — the one that
// lost it may write one it had queued after the one that took it over
// wrote the run's end — and the index must end with the journal's. It
// returns the summary's key, "" when there was nothing to index.
//
// A summary written of a run deleted meanwhile is taken back once the
// batch is written (undeletedAll).
func (x *indexer) write(ctx context.Context, tenant string, sum *stubbornv1.RunSummary) (string, error) {
	v, err := indexEntry(tenant, sum)
	if err != nil {
		return "", nil // nothing to index
	}
	key := indexKey(tenant, sum.GetRunId())
	if err := x.put(ctx, key, v, tenant, sum); err != nil {
		return "", err
	}
	if x.failing.CompareAndSwap(true, false) {
		x.log.Info("run index: writing it works again")
	}
	return key, nil
}

// put writes entry v of run sum to key, unless the index has a newer one.
//
// A key whose last message is a purge marker belongs to a run deleted
// (unindexDeleted, undeleted): it is never written again, so that no
// summary of the run reaches the index's followers after its deletion.
// (jetstream's Create would write over the marker: each write here
// expects the key's subject to be empty, or at the revision it read.)
func (x *indexer) put(ctx context.Context, key string, v []byte, tenant string, sum *stubbornv1.RunSummary) error {
	// Most runs are indexed once (their end, or their start and their
	// end): created at the first try, or updated at the revision this
	// indexer wrote the run's start at, without a read before.
	prev, ok := x.revOf(key)
	if ok && (newerIndexed(prev.sum, sum) || sameIndexed(prev.sum, sum)) {
		return nil
	}
	rev, err := x.kv.Update(ctx, key, v, prev.rev)
	if err == nil {
		x.wrote(key, rev, sum)
		return nil
	}
	x.wrote(key, 0, nil)
	if !conflict(err) {
		return err
	}
	for range 3 {
		e, err := x.kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			// A marker (Get says not found, the subject is not empty),
			// or the entry was purged meanwhile: tried again once read.
			_, err = x.kv.Update(ctx, key, v, 0)
		case err != nil:
			return err
		default:
			if have, ok := parseIndexEntry(e.Value(), tenant); ok && (newerIndexed(have, sum) || sameIndexed(have, sum)) {
				return nil // newer, or the same (an end noted again: indexEnd)
			}
			rev, err = x.kv.Update(ctx, key, v, e.Revision())
		}
		if err == nil {
			x.wrote(key, rev, sum)
		}
		if !conflict(err) {
			return err
		}
		// Written meanwhile by another server, or deleted: read again.
	}
	return nil // deleted (or written by others each time: theirs stands)
}

// wroteRev is a summary this indexer wrote, and its revision.
type wroteRev struct {
	rev uint64
	sum *stubbornv1.RunSummary
}

// revOf returns what this indexer last wrote to key, of a run not ended;
// ok false (a zero revision: the key expected empty) if nothing.
func (x *indexer) revOf(key string) (wroteRev, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	w, ok := x.revs[key]
	return w, ok
}

// wrote remembers that key holds sum, of a run not ended, at rev; a run's
// end (or a failed write, sum nil) forgets it. When maxRevs are held (runs
// that ended on other servers), they are all forgotten: their next writes
// read the key first.
func (x *indexer) wrote(key string, rev uint64, sum *stubbornv1.RunSummary) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if sum == nil || store.IsTerminal(sum.GetStatus()) {
		delete(x.revs, key)
		return
	}
	if len(x.revs) >= maxRevs {
		clear(x.revs)
	}
	x.revs[key] = wroteRev{rev: rev, sum: sum}
}

// conflict reports whether err is a write's refusal for the key's
// revision: another write came first (or, on a replicated bucket, is in
// process: JSErrCodeStreamWrongLastSequenceConstant).
func conflict(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) ||
		errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// undeleted takes back the entry at key of run runID if the run has a
// tombstone. Any write of a run's summary may come after its deletion
// purged the index: a state noted before it (a cancelled run's end,
// written as the deletion waited for its driver to let go), an end a
// takeover scan read (indexEnd), the start's reconcile. DeleteRun writes
// the tombstone before it purges, and a writer reads it after it wrote:
// either the purge comes after the write, or the read sees the
// tombstone. The purge marker left tells the index's followers the run
// is gone (FollowSummaries), after the summary they were just sent.
func (x *indexer) undeleted(ctx context.Context, key, runID string) error {
	gone, err := x.deleted(ctx, runID)
	if err != nil || !gone {
		return err
	}
	return x.kv.Purge(ctx, key)
}

// newerIndexed reports whether have, the summary indexed, is newer than
// sum: a run's end is never replaced by a status before it, and of two
// statuses the later update wins.
func newerIndexed(have, sum *stubbornv1.RunSummary) bool {
	switch ht, st := store.IsTerminal(have.GetStatus()), store.IsTerminal(sum.GetStatus()); {
	case ht && !st:
		return true
	case st && !ht:
		return false
	}
	return have.GetUpdateTime().AsTime().After(sum.GetUpdateTime().AsTime())
}

// sameIndexed reports whether have, the summary indexed, says what sum
// says: its status at its time (an end noted again: indexEnd).
func sameIndexed(have, sum *stubbornv1.RunSummary) bool {
	return have.GetStatus() == sum.GetStatus() && have.GetUpdateTime().AsTime().Equal(sum.GetUpdateTime().AsTime())
}

// retryLater puts the states of a run whose write failed back, before
// any that came meanwhile (the last of them kept if they are too many).
func (x *indexer) retryLater(runID string, states [][]byte, err error) {
	if x.failing.CompareAndSwap(false, true) {
		x.log.Warn("run index: writing a run's summary failed; the index lags until it works again (listing may show a run's older status)", "run_id", runID, "err", err)
	}
	x.mu.Lock()
	q := append(states, x.pending[runID]...)
	if len(q) > maxPendingStates {
		q = append(q[:maxPendingStates-1], q[len(q)-1])
	}
	x.pending[runID] = q
	x.mu.Unlock()
	x.poke()
}

// reconcile writes every run's summary that the index lacks or has
// wrong: the index is read first, then the states (a run that changes
// between the two reads is written by its driver too, and the
// compare-and-set below leaves that newer write alone).
func (s *JetStream) reconcile(ctx context.Context) error {
	type have struct {
		rev uint64
		val []byte
	}
	index := map[string]have{}
	if err := eachEntry(ctx, s.index.kv, jetstream.AllKeys, func(e jetstream.KeyValueEntry) (bool, error) {
		index[e.Key()] = have{e.Revision(), e.Value()}
		return true, nil
	}); err != nil {
		return err
	}
	var werr error
	if err := s.States(ctx, func(st *stubbornv1.ControlState) bool {
		key := indexKey(st.GetTenant(), st.GetRunId())
		v, err := indexEntry(st.GetTenant(), store.Summary(st))
		if err != nil {
			return true
		}
		h, ok := index[key]
		switch {
		case ok && string(h.val) == string(v):
			return true
		case ok:
			_, err = s.index.kv.Update(ctx, key, v, h.rev)
		default:
			// Over a purge marker only if it is not a deleted run's
			// (indexer.put): one left by a hand that damaged the index.
			if _, err = s.index.kv.Update(ctx, key, v, 0); conflict(err) {
				if gone, derr := s.DeletedRun(ctx, st.GetRunId()); derr != nil || !gone {
					_, err = s.index.kv.Create(ctx, key, v)
				}
			}
		}
		if err != nil && !conflict(err) {
			werr = err // a conflict is a newer write: left alone
			return false
		}
		if err == nil {
			// A run deleted since its state was read (indexer.undeleted).
			if err := s.index.undeleted(ctx, key, st.GetRunId()); err != nil {
				werr = err
				return false
			}
		}
		return true
	}); err != nil {
		return err
	}
	return werr
}

// Summaries calls fn with the summary of every run of tenant in the
// index, until fn returns false. ok is false when the index cannot be
// trusted yet (this process has not reconciled it): read the states.
func (s *JetStream) Summaries(ctx context.Context, tenant string, fn func(*stubbornv1.RunSummary) bool) (ok bool, err error) {
	if !s.index.ready.Load() {
		return false, nil
	}
	return true, eachEntry(ctx, s.index.kv, indexTenant(tenant)+".*", func(e jetstream.KeyValueEntry) (bool, error) {
		sum, ok := parseIndexEntry(e.Value(), tenant)
		if !ok {
			return true, nil
		}
		return fn(sum), nil
	})
}

// parseIndexEntry decodes an index entry of tenant; ok is false for one
// of another tenant (a key's hash matched) or one that does not decode.
func parseIndexEntry(v []byte, tenant string) (*stubbornv1.RunSummary, bool) {
	name, b := parseOwnerEntry(v)
	if name != tenant {
		return nil, false
	}
	sum := &stubbornv1.RunSummary{}
	if err := proto.Unmarshal(b, sum); err != nil {
		return nil, false
	}
	return sum, true
}

// FollowSummaries calls fn with nil and "" once it follows, then with the
// summary of each run of tenants as the index is written, or with the id
// of a run deleted (the deletion's purge marker: deleteIndexed), until
// ctx ends or fn fails, whichever replica drives the run.
func (s *JetStream) FollowSummaries(ctx context.Context, tenants []string, fn func(sum *stubbornv1.RunSummary, deleted string) error) error {
	keys := make([]string, len(tenants))
	for i, t := range tenants {
		keys[i] = indexTenant(t) + ".*"
	}
	w, err := s.index.kv.WatchFiltered(ctx, keys, jetstream.UpdatesOnly())
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	if err := fn(nil, ""); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, open := <-w.Updates():
			if !open {
				return errors.New("run index: the watch ended")
			}
			if e == nil {
				continue
			}
			if e.Operation() != jetstream.KeyValuePut {
				// A marker has no value to tell its tenant by: its key's
				// hash, which the watch's filter matched, does.
				if _, id, ok := strings.Cut(e.Key(), "."); ok {
					if err := fn(nil, id); err != nil {
						return err
					}
				}
				continue
			}
			for _, tenant := range tenants {
				if sum, ok := parseIndexEntry(e.Value(), tenant); ok {
					if err := fn(sum, ""); err != nil {
						return err
					}
				}
			}
		}
	}
}
