package jsstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc64"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// JetStreamConfig says where and how runs are kept in NATS JetStream.
type JetStreamConfig struct {
	// Replicas is the number of copies of every stream and bucket: 1 for
	// the embedded server, 3 for a production cluster. 0 means 1.
	Replicas int
	// Retention is how long a finished run is kept after its run_finished
	// was written; then it is purged whole (janitor.go). A run that has not
	// finished is never purged, however old. 0 means 7 days.
	Retention time.Duration
	// MaxBytes bounds the events stream. The stream refuses a write beyond
	// it rather than drop anything (DiscardNew). Counting what runs in
	// flight have yet to write, from 80 % of it finished runs are purged,
	// those that ended first, down to 60 %, and past 90 % Manager.Start
	// refuses new runs with ErrStoreFull (janitor.go). 0 means no bound.
	MaxBytes int64
	// PurgeEvery is how often finished runs are looked for to purge. 0
	// means a tenth of Retention, at most a minute; negative means never
	// (a test purges with a pass of its own).
	PurgeEvery time.Duration
	// Logger receives the purges' warnings. Nil means slog.Default().
	Logger *slog.Logger
	// Lease is how long a server may go without beating before it counts
	// as dead and its runs are taken over. 0 means DefaultLease.
	Lease time.Duration
	// Memory keeps everything in memory instead of files (tests).
	Memory bool
	// SaveFinalStates saves every run's final state in the states bucket,
	// as versions before 2026-11-30 did, and needed: they read a finished
	// run's state there only. Set it while such servers share the store
	// (a rolling upgrade), or they answer NotFound for the runs that newer
	// ones finish. Without it a run that saved no state before its end
	// (most do not) has its final state in its journal's run_finished
	// only: one write less per run.
	SaveFinalStates bool
	// WriteRetry is how long a write that failed for a reason that may
	// pass (no answer in time, no server to take it: a stream leader being
	// elected, a NATS server restarting, a reconnect) is made again before
	// it fails, and the run that made it is given up on this server. A
	// write that took effect although its answer was lost counts as made.
	// 0 means the lease; negative means no second try.
	WriteRetry time.Duration
	// KeyWindow is how long an idempotency key names its run (keys.go):
	// the keys bucket's TTL. 0 means DefaultKeyWindow.
	KeyWindow time.Duration
	// ClaimInOwners claims every new run with an owners entry of its own
	// and releases it at the run's end, as versions before 2026-12-02
	// did: two writes a run more. Set it while such servers share the
	// store (a rolling upgrade): they find a dead server's runs in the
	// owners bucket only, so they would not take over the runs that newer
	// ones claim in their journals (claims.go).
	ClaimInOwners bool
}

// Names of the JetStream assets.
const (
	eventsStream  = "STUBBORN_EVENTS"
	eventsSubject = "stubborn.events."
	statesBucket  = "stubborn_runs"
	ownersBucket  = "stubborn_owners"
	beatsBucket   = "stubborn_heartbeats"
	// indexBucket is in index.go.
	keysBucket     = "stubborn_keys"
	commandSubject = "stubborn.commands."
)

// buckets are the store's KV buckets.
type buckets struct {
	states  jetstream.KeyValue // each run's state
	owners  jetstream.KeyValue // each run's driver (an owners entry)
	beats   jetstream.KeyValue // each server's heartbeat
	keys    jetstream.KeyValue // the idempotency keys (js_keys.go)
	deleted jetstream.KeyValue // the deleted runs' tombstones (js_tombstone.go)
	marks   jetstream.KeyValue // each server's mark (claims.go)
}

// JetStream is the Store on NATS JetStream: each run's events on their own
// subject of one stream, appended with the expected last sequence of that
// subject (a stale owner's append is refused); state snapshots, run owners
// and owner heartbeats in KV buckets (the heartbeats expire after the
// lease); commands for a run's owner as NATS requests.
type JetStream struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	events jetstream.Stream
	buckets
	lease time.Duration
	// saveFinal is JetStreamConfig.SaveFinalStates.
	saveFinal bool
	// markerTTL is how long a released run's purge marker stays in the
	// owners bucket.
	markerTTL time.Duration
	// writeRetry is JetStreamConfig.WriteRetry, the lease for 0.
	writeRetry time.Duration
	// apiTimeout is the client's timeout of a call whose context has no
	// deadline.
	apiTimeout time.Duration
	// beatAt is when the last heartbeat that was written was sent (Unix
	// nanoseconds; 0 before the first): a lease later, other servers may
	// take this one's runs over, and its writes are not made again.
	beatAt atomic.Int64

	mu   sync.Mutex
	last map[string]uint64 // stream sequence of the last event of each run this store wrote or read

	// janitor purges finished runs and admits new ones (janitor.go).
	janitor janitor
	// damaged says the store's files were found damaged (MarkDamaged).
	damaged atomic.Bool
	// index is the listing index's writer (index.go).
	index *indexer
	// forgetSubs follow the runs deleted (delete.go); guarded by mu.
	forgetSubs []*nats.Subscription
	// deleteHook is a test's (tombstone.go).
	deleteHook func(step string) error

	// claimInOwners is JetStreamConfig.ClaimInOwners; claims are the runs
	// claimed in their journals, marks the servers' marks (claims.go).
	claimInOwners bool
	claims        claims
	stopClaims    context.CancelFunc
	claimsDone    chan struct{}
}

var _ store.Store = (*JetStream)(nil)

// setupTimeout bounds NewJetStream's calls when its context has no deadline.
const setupTimeout = 30 * time.Second

// NewJetStream creates (or updates) the stream and buckets on nc's
// JetStream and returns the Store. Close closes nc.
func NewJetStream(ctx context.Context, nc *nats.Conn, cfg JetStreamConfig) (*JetStream, error) {
	if _, ok := ctx.Deadline(); !ok {
		// Without a deadline each call would have nats.go's default 5 s: a
		// cluster still placing its streams' leaders can take longer.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, setupTimeout)
		defer cancel()
	}
	cfg = cfg.withDefaults()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	s := &JetStream{nc: nc, js: js, lease: cfg.Lease, saveFinal: cfg.SaveFinalStates, writeRetry: cfg.WriteRetry, apiTimeout: js.Options().DefaultTimeout, last: map[string]uint64{}, claimInOwners: cfg.ClaimInOwners}
	if err := s.createEvents(ctx, cfg); err != nil {
		return nil, err
	}
	indexKV, err := s.createBuckets(ctx, cfg)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if limit := s.EventLimit(); limit < store.MaxEventBytes {
		log.Warn("the NATS server's max_payload is smaller than a run's largest event: larger events are kept with their texts cut (set max_payload to at least 4MB)",
			"max_payload", s.nc.MaxPayload(), "largest_event", store.MaxEventBytes)
	}
	if err := s.start(ctx, cfg, indexKV, log); err != nil {
		return nil, err
	}
	return s, nil
}

// withDefaults is cfg with its zero values replaced by their defaults.
func (cfg JetStreamConfig) withDefaults() JetStreamConfig {
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.Retention <= 0 {
		cfg.Retention = 7 * 24 * time.Hour
	}
	if cfg.Lease <= 0 {
		cfg.Lease = store.DefaultLease
	}
	if cfg.KeyWindow <= 0 {
		cfg.KeyWindow = store.DefaultKeyWindow
	}
	if cfg.WriteRetry == 0 {
		cfg.WriteRetry = cfg.Lease
	}
	return cfg
}

// storage is where cfg keeps the stream and buckets.
func (cfg JetStreamConfig) storage() jetstream.StorageType {
	if cfg.Memory {
		return jetstream.MemoryStorage
	}
	return jetstream.FileStorage
}

// createEvents creates (or updates) the events stream.
func (s *JetStream) createEvents(ctx context.Context, cfg JetStreamConfig) error {
	maxBytes := cfg.MaxBytes
	if maxBytes <= 0 {
		maxBytes = -1
	}
	// No MaxAge, and DiscardNew: the stream's own limits cannot tell a
	// finished run from one in flight, so they never remove anything;
	// Stubborn purges finished runs itself (janitor.go). A stream made by
	// an older version (MaxAge, DiscardOld) is updated in place.
	// Created or bound to as several servers start together (setup.go).
	var err error
	if s.events, err = createStream(ctx, s.js, jetstream.StreamConfig{
		Name:        eventsStream,
		Description: "Stubborn run events, one subject per run",
		Subjects:    []string{eventsSubject + "*"},
		Storage:     cfg.storage(),
		Replicas:    cfg.Replicas,
		MaxBytes:    maxBytes,
		Discard:     jetstream.DiscardNew,
		AllowDirect: true,
		// Message ids (publish) are remembered for longer than a write is
		// made again.
		Duplicates: dupWindow(cfg.Lease, cfg.WriteRetry),
	}); err != nil {
		return fmt.Errorf("events stream: %w", err)
	}
	return nil
}

// bucketSpec is one KV bucket of the store, as createBuckets makes it.
type bucketSpec struct {
	kv      *jetstream.KeyValue
	name    string
	ttl     time.Duration
	markers time.Duration
	history uint8
	// leader: reads go to the stream's leader (leaderReads).
	leader bool
}

// createBuckets creates (or updates) the KV buckets, and returns the
// listing index's (the indexer's).
func (s *JetStream) createBuckets(ctx context.Context, cfg JetStreamConfig) (jetstream.KeyValue, error) {
	// A released run's owner entry leaves a purge marker; the markers go
	// after markerTTL, not after the retention: a full takeover scan reads
	// every entry of the owners bucket, markers included, and should cost
	// as many reads as there are live runs, not as many as ran this week.
	s.markerTTL = max(cfg.Lease, time.Second) // JetStream's shortest message TTL is 1 s
	var indexKV jetstream.KeyValue
	// The states, owners and index entries have no TTL: a run in flight keeps
	// them however long it waits (a decision may take weeks); a finished
	// run's go with its journal (janitor.go).
	for _, b := range []bucketSpec{
		{kv: &s.states, name: statesBucket, history: 1},
		{kv: &s.owners, name: ownersBucket, markers: s.markerTTL, history: 1, leader: true},
		// A server's mark lives as long as the server (claims.go).
		{kv: &s.marks, name: marksBucket, markers: s.markerTTL, history: 1, leader: true},
		{kv: &s.beats, name: beatsBucket, ttl: cfg.Lease, history: 1, leader: true},
		// A run's summaries in quick succession (RUNNING, then
		// AWAITING_DECISION a few ms later) must each reach the watches
		// (WatchRuns): with one a key, a summary is gone as soon as the
		// next is written, before a watch is sent it.
		{kv: &indexKV, name: indexBucket, history: indexHistory},
		{kv: &s.keys, name: keysBucket, ttl: cfg.KeyWindow, history: 1},
		// A deleted run's tombstone outlives all its records (tombstone.go).
		{kv: &s.deleted, name: deletedBucket, ttl: cfg.Retention, history: 1, leader: true},
	} {
		if err := s.openBucket(ctx, cfg, b); err != nil {
			return nil, fmt.Errorf("bucket %s: %w", b.name, err)
		}
	}
	return indexKV, nil
}

// openBucket creates (or updates) bucket b and sets *b.kv.
func (s *JetStream) openBucket(ctx context.Context, cfg JetStreamConfig, b bucketSpec) error {
	kvCfg := jetstream.KeyValueConfig{
		Bucket: b.name, TTL: b.ttl, Storage: cfg.storage(), Replicas: cfg.Replicas, History: b.history,
		LimitMarkerTTL: b.markers,
	}
	kv, err := createBucket(ctx, s.js, kvCfg)
	if errors.Is(err, jetstream.ErrLimitMarkerTTLNotSupported) {
		// A NATS server older than 2.11: markers stay for the
		// retention, as they did before.
		kvCfg.LimitMarkerTTL, s.markerTTL = 0, 0
		kv, err = createBucket(ctx, s.js, kvCfg)
	}
	if err != nil {
		return err
	}
	if b.leader {
		if kv, err = leaderReads(ctx, s.js, kv, b.name); err != nil {
			return err
		}
	}
	*b.kv = kv
	return nil
}

// start starts what runs beside the store's calls: the janitor, the
// indexer and the claims' follower, and finishes the deletions a crash
// cut short.
func (s *JetStream) start(ctx context.Context, cfg JetStreamConfig, indexKV jetstream.KeyValue, log *slog.Logger) error {
	if err := s.startJanitor(ctx, cfg); err != nil {
		return err
	}
	s.startIndexer(indexKV, log)
	claimsCtx, stopClaims := context.WithCancel(context.Background())
	s.stopClaims = stopClaims
	last := uint64(0)
	if info := s.events.CachedInfo(); info != nil {
		last = info.State.LastSeq
	}
	s.startClaims(claimsCtx, last)
	if n := s.redoDeletes(ctx, log); n > 0 {
		log.Debug("purged again what was left of deleted runs", "runs", n)
	}
	return nil
}

// Close stops the janitor and closes the NATS connection.
func (s *JetStream) Close() error {
	s.stopJanitor()
	s.index.stop()
	s.stopClaims()
	<-s.claimsDone
	s.nc.Close()
	return nil
}

// Append publishes evs on their run's subject, expecting the subject's
// last message to be the last one this store knows of: in one message, or
// in as few as the server's largest payload allows (each a prefix of the
// rest, so the journal is whole at every step, as with a write per event).
func (s *JetStream) Append(ctx context.Context, w *store.Writer, evs ...store.Event) error {
	if err := store.CheckAppend(evs); err != nil || len(evs) == 0 {
		return err
	}
	limit := int(s.nc.MaxPayload()) - 256 // the header and the subject's share
	written := 0
	for len(evs) > 0 {
		n, size := 1, packedSize(evs[0])
		for n < len(evs) && size+packedSize(evs[n]) <= limit {
			size += packedSize(evs[n])
			n++
		}
		if err := s.publish(ctx, w, evs[:n]); err != nil {
			if refusal(err) {
				return &store.RefusedError{Written: written, Err: err}
			}
			return err
		}
		s.index.noteEvents(evs[:n])
		written += n
		evs = evs[n:]
	}
	return nil
}

// eventOverhead is what a journal message needs besides its event: its
// subject, headers and the JetStream headers of an expected sequence.
const eventOverhead = 4 << 10

// eventLimit is the largest event a journal message takes.
func (s *JetStream) EventLimit() int {
	return min(store.MaxEventBytes, int(s.nc.MaxPayload())-eventOverhead)
}

// publish writes evs as one journal message, expecting the subject's last
// message to be the one the writer's cursor names (a run's own copy), or,
// for a writer without one (w nil), the one this store last
// wrote or read. Each message has a Nats-Msg-Id (msgID): a try made
// again after a lost answer, or across a stream leader's change, is
// stored once, and its duplicate's ack names the message stored.
func (s *JetStream) publish(ctx context.Context, w *store.Writer, evs []store.Event) error {
	runID := evs[0].RunID
	last := s.expectedLast(w, runID)
	msg := journalMsg(evs)
	// A new run's first write is its claim, and every write of the copy
	// that claimed it says so (claims.go).
	var claimer string
	if w != nil {
		claimer = w.Claimer
	}
	claiming := claimer != "" && evs[0].Seq == 1
	if claimer != "" {
		if msg.Header == nil {
			msg.Header = nats.Header{}
		}
		msg.Header[claimHeader] = []string{claimer}
	}
	if claiming {
		s.claims.begin(runID, claimer, evs[0].StateBytes())
	}
	seq, err := s.publishMsg(ctx, msg, last, msgID(runID, evs[0].Seq, msg.Data))
	if claiming {
		s.claims.sent(runID, err == nil)
	}
	if err != nil {
		return journalConflict(err)
	}
	s.claims.ack(seq)
	s.moveCursor(w, evs, seq)
	return nil
}

// expectedLast is the stream sequence the run's journal is expected to
// end with before w's write: w's cursor, or for a writer without one (w
// nil) the one this store last wrote or read.
func (s *JetStream) expectedLast(w *store.Writer, runID string) uint64 {
	if w != nil {
		return w.Cursor
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last[runID]
}

// journalMsg is the journal message of evs: one event's encoding, or
// several packed (eventsHeader).
func journalMsg(evs []store.Event) *nats.Msg {
	msg := &nats.Msg{Subject: eventsSubject + evs[0].RunID, Data: evs[0].Data}
	if len(evs) > 1 {
		msg.Data = store.PackEvents(evs)
		msg.Header = nats.Header{eventsHeader: []string{strconv.Itoa(len(evs))}}
	}
	return msg
}

// publishMsg writes journal message msg with id, expecting its subject to
// end at stream sequence last, and returns the message's sequence.
func (s *JetStream) publishMsg(ctx context.Context, msg *nats.Msg, last uint64, id string) (seq uint64, err error) {
	err = s.write(ctx, func(ctx context.Context) error {
		ack, err := s.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(last), jetstream.WithMsgID(id))
		if err != nil {
			return err
		}
		// A duplicate is this very message, stored by an earlier try:
		// its id has its contents' checksum (msgID).
		seq = ack.Sequence
		return nil
	}, func(ctx context.Context) (bool, error) {
		// A try whose answer was lost, then refused: the journal ends
		// with this message if that try wrote it.
		m, err := s.events.GetLastMsgForSubject(ctx, msg.Subject)
		if err != nil {
			return false, err
		}
		if m.Sequence <= last || !bytes.Equal(m.Data, msg.Data) || m.Header.Get(eventsHeader) != msg.Header.Get(eventsHeader) {
			return false, nil
		}
		seq = m.Sequence
		return true, nil
	})
	return seq, err
}

// journalConflict is err, a failed journal write, as ErrConflict when the
// journal did not end where the writer expected: another writer wrote.
func journalConflict(err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return fmt.Errorf("%w: %v", store.ErrConflict, err)
	}
	return err
}

// moveCursor moves the writer's view of the run's journal (w's cursor, or
// for w nil this store's) to seq, where evs, just written, end it.
func (s *JetStream) moveCursor(w *store.Writer, evs []store.Event, seq uint64) {
	if w != nil {
		w.Cursor = seq
		return
	}
	runID := evs[0].RunID
	s.mu.Lock()
	if evs[len(evs)-1].Finished {
		delete(s.last, runID)
	} else {
		s.last[runID] = seq
	}
	s.mu.Unlock()
}

// msgID is the Nats-Msg-Id of run runID's journal message data, whose
// first event is seq: the run, the seq and a checksum of the data, so
// that only a try of the same write is taken for a duplicate — another
// writer's event of the same seq (a stale copy's, the end of a run whose
// journal was lost) is not, and is fenced by the expected sequence.
func msgID(runID string, seq int64, data []byte) string {
	return runID + ":" + strconv.FormatInt(seq, 10) + ":" + strconv.FormatUint(crc64.Checksum(data, crcTable), 36)
}

var crcTable = crc64.MakeTable(crc64.ECMA)

// dupWindow is how long the events stream remembers a message id: longer
// than any write is made again (WriteRetry, the lease by default).
func dupWindow(lease, writeRetry time.Duration) time.Duration {
	return max(2*lease, writeRetry+lease, 30*time.Second)
}

// packedSize is an event's size in a message that holds several.
func packedSize(ev store.Event) int { return binary.MaxVarintLen64 + len(ev.Data) }

// eventsHeader marks a journal message that holds several events, and
// says how many: each is its encoding after its length (a uvarint). A
// message without it is the encoding of one event.
const eventsHeader = "Stubborn-Events"

// unpackEvents decodes a journal message: one event, or as many as its
// eventsHeader says.
func unpackEvents(data []byte, h nats.Header) ([]store.Event, error) {
	count := h.Get(eventsHeader)
	if count == "" {
		ev, _, err := store.DecodeEvent(data)
		return []store.Event{ev}, err
	}
	n, err := strconv.Atoi(count)
	if err != nil || n < 1 || n > len(data) {
		return nil, fmt.Errorf("journal message: bad %s header %q", eventsHeader, count)
	}
	evs := make([]store.Event, 0, n)
	var undecodable error
	err = store.EachPacked(data, func(enc []byte) error {
		ev, _, err := store.DecodeEvent(enc)
		evs, undecodable = append(evs, ev), err
		return err
	})
	switch {
	case undecodable != nil:
		return nil, undecodable
	case err != nil:
		return nil, errors.New("journal message: truncated event")
	}
	if len(evs) != n {
		return nil, fmt.Errorf("journal message: %d events, its header says %d", len(evs), n)
	}
	return evs, nil
}

// Events reads the run's events after seq after and remembers where its
// journal ends, so that this store may append to it (a writer without a
// cursor of its own: see publish).
func (s *JetStream) Events(ctx context.Context, runID string, after int64) ([]store.Event, error) {
	out, end, finished, err := s.journal(ctx, runID, after)
	if err != nil || end == 0 {
		return out, err
	}
	s.mu.Lock()
	if finished {
		// Nothing may follow run_finished: nothing to remember (a reader
		// of finished runs would otherwise keep an entry for each).
		delete(s.last, runID)
	} else {
		s.last[runID] = end
	}
	s.mu.Unlock()
	return out, nil
}

// journalFrom reads the run's whole journal and sets cur to where it ends
// (cursorReader): what a run's copy resumed from it starts from.
func (s *JetStream) JournalFrom(ctx context.Context, runID string, w *store.Writer) ([]store.Event, error) {
	out, end, _, err := s.journal(ctx, runID, 0)
	if err == nil {
		w.Cursor = end
	}
	return out, err
}

// journal reads the run's events after seq after, each seq once (a
// message stored twice is read once: the first), and returns the stream
// sequence of its journal's last message (0: none) and whether its last
// event is run_finished.
func (s *JetStream) journal(ctx context.Context, runID string, after int64) (out []store.Event, end uint64, finished bool, err error) {
	if !validKey(runID) {
		return nil, 0, false, nil // no such run's journal
	}
	subject := eventsSubject + runID
	lastMsg, err := s.events.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, 0, false, nil
	}
	if err != nil {
		return nil, 0, false, err
	}
	var once seqOnce
	err = s.read(ctx, runID, func(evs []store.Event, seq uint64) (bool, error) {
		for _, ev := range evs {
			if !once.first(ev) {
				continue
			}
			if ev.Seq > after {
				out = append(out, ev)
			}
			finished = ev.Finished
		}
		return seq < lastMsg.Sequence, nil
	})
	if err != nil {
		return nil, 0, false, err
	}
	return out, lastMsg.Sequence, finished, nil
}

// seqOnce passes each seq of a run's journal once, the first stored.
//
// Compatibility path, for journals a release before message ids (msgID)
// wrote twice in part: seqs 1 2 3 2 3, a write made again across a stream
// leader's change. A copy of an earlier run_finished that a stale writer
// of such a release stored after later events is not the journal's end.
// Every journal read (journal, Follow) goes through it.
type seqOnce struct{ seen int64 } // the highest seq read

// first reports whether ev is the first stored of its seq.
func (o *seqOnce) first(ev store.Event) bool {
	if ev.Seq <= o.seen {
		return false
	}
	o.seen = ev.Seq
	return true
}

// read delivers the run's journal messages in order, each as its events
// with its stream sequence, while fn returns true.
func (s *JetStream) read(ctx context.Context, runID string, fn func(evs []store.Event, seq uint64) (bool, error)) error {
	return s.readFrom(ctx, runID, 0, fn)
}

// Follow sends the run's events after seq after, then new ones, until
// run_finished. A finished run's journal ends there whatever after is: at
// or past its last event, Follow returns at once, having sent nothing.
func (s *JetStream) Follow(ctx context.Context, runID string, after int64, fn func(store.Event) error) error {
	if !validKey(runID) {
		return fmt.Errorf("%w: %.64q", store.ErrNotFound, runID)
	}
	if after > 0 && s.finishedBy(ctx, runID, after) {
		return nil
	}
	finished := errors.New("finished")
	var once seqOnce
	deliver := func(evs []store.Event, _ uint64) (bool, error) {
		for _, ev := range evs {
			if !once.first(ev) {
				continue
			}
			if ev.Seq > after {
				after = ev.Seq
				if err := fn(ev); err != nil {
					return false, err
				}
			} // else at or before after: sent before, or not wanted
			if ev.Finished {
				// Nothing follows it, even when it was not sent (after
				// at or past it): no message is coming to wait for.
				return false, finished
			}
		}
		return true, nil
	}
	// What is stored is read message by message (direct gets: no
	// consumer to create, which a stream whose leader moves can take
	// nats.go's 10 s to answer), then what follows with a consumer from
	// there: a finished run's journal is read without one.
	next, err := s.readStored(ctx, runID, deliver)
	if err == nil {
		err = s.readFrom(ctx, runID, next, deliver)
	}
	if errors.Is(err, finished) {
		return nil
	}
	return err
}

// finishedBy says whether the run's journal is finished (its last message
// holds run_finished) at seq after or before: then there is nothing after
// after to send, nor to wait for. One direct get; false when unsure (the
// journal is read then).
func (s *JetStream) finishedBy(ctx context.Context, runID string, after int64) bool {
	m, err := s.events.GetLastMsgForSubject(ctx, eventsSubject+runID)
	if err != nil {
		return false
	}
	evs, err := unpackEvents(m.Data, m.Header)
	if err != nil || len(evs) == 0 {
		return false
	}
	last := evs[len(evs)-1]
	return last.Finished && last.Seq <= after
}

// maxDirectReads bounds the messages Follow reads one by one before it
// follows the rest with a consumer.
const maxDirectReads = 64

// readStored delivers the run's journal messages stored now, as read
// delivers them, one direct get each, up to maxDirectReads; it returns
// the stream sequence to go on from (0: from the start).
func (s *JetStream) readStored(ctx context.Context, runID string, fn func(evs []store.Event, seq uint64) (bool, error)) (next uint64, err error) {
	subject := eventsSubject + runID
	for range maxDirectReads {
		m, err := s.events.GetMsg(ctx, max(next, 1), jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return next, nil
		}
		if err != nil {
			return next, nil // the consumer reads it instead
		}
		evs, err := unpackEvents(m.Data, m.Header)
		if err != nil {
			return next, fmt.Errorf("run %s: %w", runID, err)
		}
		more, err := fn(evs, m.Sequence)
		if err != nil || !more {
			return m.Sequence + 1, err
		}
		next = m.Sequence + 1
	}
	return next, nil
}

// readFrom is read from stream sequence from on (0: the start): it waits
// for the next message until ctx ends or fn stops it.
func (s *JetStream) readFrom(ctx context.Context, runID string, from uint64, fn func(evs []store.Event, seq uint64) (bool, error)) error {
	follow := orderedRead{cfg: jetstream.OrderedConsumerConfig{FilterSubjects: []string{eventsSubject + runID}, DeliverPolicy: jetstream.DeliverAllPolicy}}
	if from > 0 {
		follow.cfg.DeliverPolicy, follow.cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	return eachOrdered(ctx, s.events, follow, func(msg jetstream.Msg, meta *jetstream.MsgMetadata) (bool, error) {
		evs, err := unpackEvents(msg.Data(), msg.Headers())
		if err != nil {
			return false, fmt.Errorf("run %s: %w", runID, err)
		}
		return fn(evs, meta.Sequence.Stream)
	})
}
