package runs

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
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
}

// Names of the JetStream assets.
const (
	eventsStream   = "STUBBORN_EVENTS"
	eventsSubject  = "stubborn.events."
	statesBucket   = "stubborn_runs"
	ownersBucket   = "stubborn_owners"
	beatsBucket    = "stubborn_heartbeats"
	commandSubject = "stubborn.commands."
)

// JetStream is the Store on NATS JetStream: each run's events on their own
// subject of one stream, appended with the expected last sequence of that
// subject (a stale owner's append is refused); state snapshots, run owners
// and owner heartbeats in KV buckets (the heartbeats expire after the
// lease); commands for a run's owner as NATS requests.
type JetStream struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	events jetstream.Stream
	states jetstream.KeyValue
	owners jetstream.KeyValue
	beats  jetstream.KeyValue
	lease  time.Duration
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
}

var _ Store = (*JetStream)(nil)

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
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.Retention <= 0 {
		cfg.Retention = 7 * 24 * time.Hour
	}
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	storage := jetstream.FileStorage
	if cfg.Memory {
		storage = jetstream.MemoryStorage
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	if cfg.WriteRetry == 0 {
		cfg.WriteRetry = cfg.Lease
	}
	s := &JetStream{nc: nc, js: js, lease: cfg.Lease, saveFinal: cfg.SaveFinalStates, writeRetry: cfg.WriteRetry, apiTimeout: js.Options().DefaultTimeout, last: map[string]uint64{}}
	maxBytes := cfg.MaxBytes
	if maxBytes <= 0 {
		maxBytes = -1
	}
	// No MaxAge, and DiscardNew: the stream's own limits cannot tell a
	// finished run from one in flight, so they never remove anything;
	// Stubborn purges finished runs itself (janitor.go). A stream made by
	// an older version (MaxAge, DiscardOld) is updated in place.
	if s.events, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        eventsStream,
		Description: "Stubborn run events, one subject per run",
		Subjects:    []string{eventsSubject + "*"},
		Storage:     storage,
		Replicas:    cfg.Replicas,
		MaxBytes:    maxBytes,
		Discard:     jetstream.DiscardNew,
		AllowDirect: true,
	}); err != nil {
		return nil, fmt.Errorf("events stream: %w", err)
	}
	// A released run's owner entry leaves a purge marker; the markers go
	// after markerTTL, not after the retention: a full takeover scan reads
	// every entry of the owners bucket, markers included, and should cost
	// as many reads as there are live runs, not as many as ran this week.
	s.markerTTL = max(cfg.Lease, time.Second) // JetStream's shortest message TTL is 1 s
	// The states and owners entries have no TTL: a run in flight keeps
	// them however long it waits (a decision may take weeks); a finished
	// run's go with its journal (janitor.go).
	for _, b := range []struct {
		kv      *jetstream.KeyValue
		name    string
		ttl     time.Duration
		markers time.Duration
	}{
		{&s.states, statesBucket, 0, 0},
		{&s.owners, ownersBucket, 0, s.markerTTL},
		{&s.beats, beatsBucket, cfg.Lease, 0},
	} {
		kvCfg := jetstream.KeyValueConfig{
			Bucket: b.name, TTL: b.ttl, Storage: storage, Replicas: cfg.Replicas, History: 1,
			LimitMarkerTTL: b.markers,
		}
		*b.kv, err = js.CreateOrUpdateKeyValue(ctx, kvCfg)
		if errors.Is(err, jetstream.ErrLimitMarkerTTLNotSupported) {
			// A NATS server older than 2.11: markers stay for the
			// retention, as they did before.
			kvCfg.LimitMarkerTTL, s.markerTTL = 0, 0
			*b.kv, err = js.CreateOrUpdateKeyValue(ctx, kvCfg)
		}
		if err != nil {
			return nil, fmt.Errorf("bucket %s: %w", b.name, err)
		}
	}
	if limit := s.eventLimit(); limit < MaxEventBytes {
		log := cfg.Logger
		if log == nil {
			log = slog.Default()
		}
		log.Warn("the NATS server's max_payload is smaller than a run's largest event: larger events are kept with their texts cut (set max_payload to at least 4MB)",
			"max_payload", s.nc.MaxPayload(), "largest_event", MaxEventBytes)
	}
	if err := s.startJanitor(ctx, cfg); err != nil {
		return nil, err
	}
	return s, nil
}

// Close stops the janitor and closes the NATS connection.
func (s *JetStream) Close() error {
	s.stopJanitor()
	s.nc.Close()
	return nil
}

// Append publishes evs on their run's subject, expecting the subject's
// last message to be the last one this store knows of: in one message, or
// in as few as the server's largest payload allows (each a prefix of the
// rest, so the journal is whole at every step, as with a write per event).
func (s *JetStream) Append(ctx context.Context, evs ...Event) error {
	if err := checkAppend(evs); err != nil || len(evs) == 0 {
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
		if err := s.publish(ctx, evs[:n]); err != nil {
			if refusal(err) {
				return &RefusedError{Written: written, Err: err}
			}
			return err
		}
		written += n
		evs = evs[n:]
	}
	return nil
}

// eventOverhead is what a journal message needs besides its event: its
// subject, headers and the JetStream headers of an expected sequence.
const eventOverhead = 4 << 10

// eventLimit is the largest event a journal message takes.
func (s *JetStream) eventLimit() int {
	return min(MaxEventBytes, int(s.nc.MaxPayload())-eventOverhead)
}

// refusal reports whether a failed write (made again while it may pass)
// was refused for good: larger than the server takes, a stream still full,
// or a JetStream error that is neither a conflict nor one that may pass
// (transient).
func refusal(err error) bool {
	if errors.Is(err, nats.ErrMaxPayload) {
		return true
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant:
		return false
	case errCodeStoreFailed:
		// Still full after WriteRetry.
		return true
	}
	return !transient(err) && apiErr.Code >= 400 && apiErr.Code < 600
}

// publish writes evs as one journal message.
func (s *JetStream) publish(ctx context.Context, evs []Event) error {
	runID := evs[0].RunID
	s.mu.Lock()
	last := s.last[runID]
	s.mu.Unlock()
	msg := &nats.Msg{Subject: eventsSubject + runID, Data: evs[0].Data}
	if len(evs) > 1 {
		msg.Data = packEvents(evs)
		msg.Header = nats.Header{eventsHeader: []string{strconv.Itoa(len(evs))}}
	}
	var seq uint64
	err := s.write(ctx, func(ctx context.Context) error {
		ack, err := s.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(last))
		if err != nil {
			return err
		}
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
	if err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
			return fmt.Errorf("%w: %v", ErrConflict, err)
		}
		return err
	}
	s.mu.Lock()
	if evs[len(evs)-1].Finished {
		delete(s.last, runID)
	} else {
		s.last[runID] = seq
	}
	s.mu.Unlock()
	return nil
}

// Waits between the tries of a write (write): full jitter over an
// exponential backoff from retryBase, capped at retryCap.
const (
	retryBase = 50 * time.Millisecond
	retryCap  = 2 * time.Second
)

// write makes a store write with try, and again while it fails for a
// reason that may pass (transient), for up to writeRetry, unless ctx ends
// first or the channel it carries under stopWritesKey is closed; it
// returns the last try's error. A try after one whose answer was lost may
// be refused because that one took effect (a journal's expected sequence,
// a key created): landed, when not nil, is then asked whether the store
// holds this write, which makes it a success.
//
// Once this server has beaten, every try is fenced by its lease: a lease
// after the last heartbeat written, other servers may take its runs over
// and read their journals, so no try may still be under way then. A try
// gets a deadline no later than the fence (less margin, for a request
// already on the wire), and none starts after it. The fence is read again
// before every try: beats that land during an outage move it on.
func (s *JetStream) write(ctx context.Context, try func(context.Context) error, landed func(context.Context) (bool, error)) error {
	err := s.fenced(ctx, try)
	if err == nil || !transient(err) || s.writeRetry <= 0 {
		return err
	}
	stop, _ := ctx.Value(stopWritesKey{}).(<-chan struct{})
	until := time.Now().Add(s.writeRetry)
	for n := 0; ; n++ {
		wait := time.Duration(mrand.Int64N(int64(min(retryCap, retryBase<<min(n, 16))) + 1))
		if time.Now().Add(wait).After(until) {
			return err
		}
		if fence, ok := s.fence(); ok {
			// Tried before the fence, or not at all: a beat landing
			// meanwhile moves the fence on for the next wait.
			room := time.Until(fence) - minTry
			if room <= 0 {
				return err
			}
			wait = min(wait, room)
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return err
		case <-stop:
			timer.Stop()
			return err
		case <-timer.C:
		}
		err = s.fenced(ctx, try)
		if err == nil {
			return nil
		}
		if errors.Is(err, errFenced) {
			return err
		}
		if !transient(err) {
			if landed != nil {
				if ok, lerr := landed(ctx); lerr == nil && ok {
					return nil
				}
			}
			return err
		}
	}
}

// fenceMargin is how long before its lease ends a server's last write may
// be under way, at most: the time a request already sent may take to be
// carried out (a quarter of a shorter lease). minTry is the shortest time
// a try is given.
const (
	fenceMargin = time.Second
	minTry      = 50 * time.Millisecond
)

// margin is fenceMargin for this store's lease.
func (s *JetStream) margin() time.Duration { return min(fenceMargin, s.lease/4) }

// errFenced is why a write was not tried: the lease of this server's last
// heartbeat is (nearly) over, and another server may drive its runs: a
// conflict, as if that server had written first.
var errFenced = fmt.Errorf("%w: not written: this server's lease is over (its heartbeats are not landing)", ErrConflict)

// fence returns when this server's writes must have ended: a lease after
// its last heartbeat written, less margin. ok is false before the
// first heartbeat.
func (s *JetStream) fence() (time.Time, bool) {
	at := s.beatAt.Load()
	if at == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, at).Add(s.lease - s.margin()), true
}

// fenced makes one try, with a deadline no later than the fence. A try
// with more than the client's own timeout left before the fence gets ctx
// as it is (no deadline, no timer to make).
func (s *JetStream) fenced(ctx context.Context, try func(context.Context) error) error {
	fence, ok := s.fence()
	if !ok {
		return try(ctx)
	}
	left := time.Until(fence)
	if left < minTry {
		return errFenced
	}
	if d, has := ctx.Deadline(); !has && left > s.apiTimeout+minTry || has && d.Before(fence) {
		return try(ctx)
	}
	tctx, cancel := context.WithDeadline(ctx, fence)
	defer cancel()
	return try(tctx)
}

// transient reports whether a failed NATS call may succeed if made again:
// no answer in time, or no server to take it (a stream's leader being
// elected, a NATS server restarting, the connection being restored).
func transient(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected) {
		return true
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.Code != http.StatusServiceUnavailable {
		return false
	}
	switch apiErr.ErrorCode {
	case errCodeInsufficientResources, errCodeClusteringRequired, errCodeNotSupportedClustered:
		// The server refuses the write for good: made again it would be
		// refused again, a lease later. (A stream over its -max-bytes,
		// errCodeStoreFailed, is made again: the janitor makes room.)
		return false
	}
	return true
}

// JetStream API error codes (nats-server's jetstream_errors_generated.go)
// that nats.go does not name: a write the stream refuses to store (its
// limits with DiscardNew: "maximum bytes exceeded"), a feature that needs
// or is not supported in clustered mode.
const (
	errCodeInsufficientResources jetstream.ErrorCode = 10023
	errCodeStoreFailed           jetstream.ErrorCode = 10077
	errCodeClusteringRequired    jetstream.ErrorCode = 10010
	errCodeNotSupportedClustered jetstream.ErrorCode = 10036
)

// packedSize is an event's size in a message that holds several.
func packedSize(ev Event) int { return binary.MaxVarintLen64 + len(ev.Data) }

// eventsHeader marks a journal message that holds several events, and
// says how many: each is its encoding after its length (a uvarint). A
// message without it is the encoding of one event.
const eventsHeader = "Stubborn-Events"

// packEvents lays evs out as a message with eventsHeader holds them.
func packEvents(evs []Event) []byte {
	n := 0
	for _, ev := range evs {
		n += packedSize(ev)
	}
	b := make([]byte, 0, n)
	for _, ev := range evs {
		b = binary.AppendUvarint(b, uint64(len(ev.Data)))
		b = append(b, ev.Data...)
	}
	return b
}

// unpackEvents decodes a journal message: one event, or as many as its
// eventsHeader says.
func unpackEvents(data []byte, h nats.Header) ([]Event, error) {
	count := h.Get(eventsHeader)
	if count == "" {
		ev, _, err := DecodeEvent(data)
		return []Event{ev}, err
	}
	n, err := strconv.Atoi(count)
	if err != nil || n < 1 || n > len(data) {
		return nil, fmt.Errorf("journal message: bad %s header %q", eventsHeader, count)
	}
	evs := make([]Event, 0, n)
	for len(data) > 0 {
		size, k := binary.Uvarint(data)
		if k <= 0 || size > uint64(len(data)-k) {
			return nil, errors.New("journal message: truncated event")
		}
		ev, _, err := DecodeEvent(data[k : k+int(size) : k+int(size)])
		if err != nil {
			return nil, err
		}
		evs = append(evs, ev)
		data = data[k+int(size):]
	}
	if len(evs) != n {
		return nil, fmt.Errorf("journal message: %d events, its header says %d", len(evs), n)
	}
	return evs, nil
}

// Events reads the run's events after seq after and remembers where its
// journal ends, so that this store may append to it.
func (s *JetStream) Events(ctx context.Context, runID string, after int64) ([]Event, error) {
	if !validKey(runID) {
		return nil, nil // no such run's journal
	}
	subject := eventsSubject + runID
	lastMsg, err := s.events.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Event
	finished := false
	err = s.read(ctx, runID, func(evs []Event, seq uint64) (bool, error) {
		for _, ev := range evs {
			if ev.Seq > after {
				out = append(out, ev)
			}
		}
		finished = evs[len(evs)-1].Finished
		return seq < lastMsg.Sequence, nil
	})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if finished {
		// Nothing may follow run_finished: nothing to remember (a reader
		// of finished runs would otherwise keep an entry for each).
		delete(s.last, runID)
	} else {
		s.last[runID] = lastMsg.Sequence
	}
	s.mu.Unlock()
	return out, nil
}

// read delivers the run's journal messages in order, each as its events
// with its stream sequence, while fn returns true.
func (s *JetStream) read(ctx context.Context, runID string, fn func(evs []Event, seq uint64) (bool, error)) error {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{eventsSubject + runID}, DeliverPolicy: jetstream.DeliverAllPolicy}
	return s.consume(ctx, cfg, 0, func(_ string, evs []Event, meta *jetstream.MsgMetadata) (bool, error) {
		return fn(evs, meta.Sequence.Stream)
	})
}

// consume delivers the journal messages cfg selects, in order, each as its
// run's id, its events and its metadata, while fn returns true. With idle
// it returns at once if there are none, or once it has waited idle for
// the next one; without, it waits for the next one until ctx ends.
func (s *JetStream) consume(ctx context.Context, cfg jetstream.OrderedConsumerConfig, idle time.Duration, fn func(runID string, evs []Event, meta *jetstream.MsgMetadata) (bool, error)) error {
	cons, err := s.events.OrderedConsumer(ctx, cfg)
	if err != nil {
		return err
	}
	it, err := cons.Messages()
	if err != nil {
		return err
	}
	defer it.Stop()
	var opts []jetstream.NextOpt
	if idle > 0 {
		if info := cons.CachedInfo(); info == nil || info.NumPending == 0 {
			return nil
		}
		opts = append(opts, jetstream.NextMaxWait(idle))
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for {
		msg, err := it.Next(opts...)
		if idle > 0 && errors.Is(err, nats.ErrTimeout) {
			return nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		runID := strings.TrimPrefix(msg.Subject(), eventsSubject)
		evs, err := unpackEvents(msg.Data(), msg.Headers())
		if err != nil {
			return fmt.Errorf("run %s: %w", runID, err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			return err
		}
		more, err := fn(runID, evs, meta)
		if err != nil || !more {
			return err
		}
	}
}

// Follow sends the run's events after seq after, then new ones, until
// run_finished.
func (s *JetStream) Follow(ctx context.Context, runID string, after int64, fn func(Event) error) error {
	if !validKey(runID) {
		return fmt.Errorf("%w: %.64q", ErrNotFound, runID)
	}
	finished := errors.New("finished")
	err := s.read(ctx, runID, func(evs []Event, _ uint64) (bool, error) {
		for _, ev := range evs {
			if ev.Seq <= after {
				continue
			}
			if err := fn(ev); err != nil {
				return false, err
			}
			if ev.Finished {
				return false, finished
			}
		}
		return true, nil
	})
	if errors.Is(err, finished) {
		return nil
	}
	return err
}

// PutState saves a snapshot.
func (s *JetStream) PutState(ctx context.Context, runID string, state []byte) error {
	return s.write(ctx, func(ctx context.Context) error {
		_, err := s.states.Put(ctx, runID, state)
		return err
	}, nil)
}

// State returns a run's state: the one its journal's run_finished
// carries once it has finished, else the last one saved, else the one its
// claim carries. A run writes its claim, its journal (and its saved
// states) and then lets its claim go, in that order, and State reads them
// in that order: a run whose claim is gone has finished, and its journal
// says so, or never was. The journal is read unless the saved state is
// final already: a run that saved no state before its end does not save
// its last one (finalInJournal), and a run whose last save failed has a
// stale one.
func (s *JetStream) State(ctx context.Context, runID string) (*stubbornv1.ControlState, error) {
	if !validKey(runID) {
		return nil, fmt.Errorf("%w: %.64q", ErrNotFound, runID)
	}
	var state []byte
	e, err := s.states.Get(ctx, runID)
	switch {
	case err == nil:
		st, err := decodeState(e.Value())
		if err != nil || isTerminal(st.GetStatus()) {
			return st, err
		}
		state = e.Value()
	case !errors.Is(err, jetstream.ErrKeyNotFound):
		return nil, err
	default:
		o, err := s.owners.Get(ctx, runID)
		if err == nil {
			_, state = parseOwnerEntry(o.Value())
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, err
		}
	}
	last, err := s.lastEvent(ctx, runID)
	if err != nil {
		return nil, err
	}
	if end := last.state(); last.Finished && len(end) > 0 {
		state = end
	}
	if len(state) == 0 {
		return nil, fmt.Errorf("%w: %.64q", ErrNotFound, runID)
	}
	return decodeState(state)
}

// lastEvent returns the last event of the run's journal; the zero Event
// when it has none.
func (s *JetStream) lastEvent(ctx context.Context, runID string) (Event, error) {
	msg, err := s.events.GetLastMsgForSubject(ctx, eventsSubject+runID)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Event{}, nil
	}
	if err != nil {
		return Event{}, err
	}
	evs, err := unpackEvents(msg.Data, msg.Header)
	if err != nil {
		return Event{}, fmt.Errorf("run %s: %w", runID, err)
	}
	return evs[len(evs)-1], nil
}

// finalInJournal: State and States read a finished run's state from its
// run_finished, so that a run that saved none before its end is not made
// to save its last one (a write per run), unless the config says to save
// it anyway (SaveFinalStates).
func (s *JetStream) finalInJournal() bool { return !s.saveFinal }

// States calls fn with every run's state: a finished run's from its
// journal's run_finished, the others' the last saved, else their claim's.
// It reads the claims, then the saved states, then the journals' last
// messages, the order in which a run writes them: a run that finishes
// meanwhile is still listed (with one of its states), not missed.
func (s *JetStream) States(ctx context.Context, fn func(*stubbornv1.ControlState) bool) error {
	all := map[string][]byte{}
	if err := eachEntry(ctx, s.owners, func(e jetstream.KeyValueEntry) (bool, error) {
		if _, state := parseOwnerEntry(e.Value()); len(state) > 0 {
			all[e.Key()] = state
		}
		return true, nil
	}); err != nil {
		return err
	}
	if err := eachEntry(ctx, s.states, func(e jetstream.KeyValueEntry) (bool, error) {
		all[e.Key()] = e.Value()
		return true, nil
	}); err != nil {
		return err
	}
	if err := s.lastEvents(ctx, func(runID string, last Event) {
		if state := last.state(); last.Finished && len(state) > 0 {
			all[runID] = state
		}
	}); err != nil {
		return err
	}
	for _, state := range all {
		st, err := decodeState(state)
		if err != nil {
			return err
		}
		if !fn(st) {
			return nil
		}
	}
	return nil
}

// lastEvents calls fn with the last event of every run's journal. It
// reads the stream's last sequence first and stops there (or when the
// server says nothing more is pending): a message of a run that arrives
// meanwhile is not waited for. A scan that waits lastEventsIdle for its
// next message ends too: the messages it was waiting for expired.
func (s *JetStream) lastEvents(ctx context.Context, fn func(runID string, last Event)) error {
	info, err := s.events.Info(ctx)
	if err != nil {
		return err
	}
	end := info.State.LastSeq
	if info.State.Msgs == 0 {
		return nil
	}
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{eventsSubject + "*"},
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		InactiveThreshold: lastEventsIdle,
	}
	return s.consume(ctx, cfg, lastEventsIdle, func(runID string, evs []Event, meta *jetstream.MsgMetadata) (bool, error) {
		fn(runID, evs[len(evs)-1])
		return meta.Sequence.Stream < end && meta.NumPending > 0, nil
	})
}

// lastEventsIdle bounds lastEvents' wait for its next message, and is how
// long its consumer outlives it on the server.
const lastEventsIdle = 5 * time.Second

// An owners entry is the driver's name after ownerMark and its length (a
// uvarint), followed by the run's state as it was claimed. An entry that
// does not start with ownerMark is a name alone (an older server's).
const ownerMark = 0

// ownerEntry encodes an owners entry.
func ownerEntry(owner string, state []byte) []byte {
	b := make([]byte, 0, 1+binary.MaxVarintLen64+len(owner)+len(state))
	b = append(b, ownerMark)
	b = binary.AppendUvarint(b, uint64(len(owner)))
	b = append(b, owner...)
	return append(b, state...)
}

// parseOwnerEntry decodes an owners entry.
func parseOwnerEntry(v []byte) (owner string, state []byte) {
	if len(v) == 0 || v[0] != ownerMark {
		return string(v), nil
	}
	n, k := binary.Uvarint(v[1:])
	if k <= 0 || n > uint64(len(v)-1-k) {
		return "", nil
	}
	rest := v[1+k:]
	return string(rest[:n]), rest[n:]
}

// eachEntry calls fn with every current entry of kv until fn returns false.
func eachEntry(ctx context.Context, kv jetstream.KeyValue, fn func(jetstream.KeyValueEntry) (bool, error)) error {
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	// nats.go's watcher (jetstream, v1.55) never says it has delivered
	// every current entry when one goes while it delivers them: a purge
	// marker that expires (markerTTL), say. So an entry that says none
	// follow (Delta 0) ends the scan too, and so does eachEntryIdle
	// without news: a scan never waits for good.
	idle := time.NewTimer(eachEntryIdle)
	defer idle.Stop()
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				return nil // every current entry delivered
			}
			if more, err := fn(e); err != nil || !more {
				return err
			}
			if e.Delta() == 0 {
				return nil // the last of the current entries
			}
			idle.Reset(eachEntryIdle)
		case <-idle.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// eachEntryIdle is how long eachEntry waits for the next entry before it
// takes the ones it has for all of them.
const eachEntryIdle = 2 * time.Second

// Beat creates or renews owner's heartbeat, which expires after the lease.
func (s *JetStream) Beat(ctx context.Context, owner string) error {
	sent := time.Now()
	_, err := s.beats.Put(ctx, owner, []byte(sent.UTC().Format(time.RFC3339Nano)))
	if err == nil {
		s.beatAt.Store(sent.UnixNano())
	}
	return err
}

// leftBeat is the heartbeat a server leaves behind when it stops (a beat
// is a time).
var leftBeat = []byte("left")

// Alive reports whether owner's heartbeat has not expired, and owner has
// not left.
func (s *JetStream) Alive(ctx context.Context, owner string) (bool, error) {
	e, err := s.beats.Get(ctx, owner)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	return !bytes.Equal(e.Value(), leftBeat), nil
}

// Live calls fn with every owner whose heartbeat has not expired.
func (s *JetStream) Live(ctx context.Context, fn func(owner string, left bool)) error {
	return eachEntry(ctx, s.beats, func(e jetstream.KeyValueEntry) (bool, error) {
		fn(e.Key(), bytes.Equal(e.Value(), leftBeat))
		return true, nil
	})
}

// Leave replaces owner's heartbeat with one that says it left, which
// expires after the lease like a beat.
func (s *JetStream) Leave(ctx context.Context, owner string) error {
	_, err := s.beats.Put(ctx, owner, leftBeat)
	return err
}

// Claim creates the run's owner key, with its state.
func (s *JetStream) Claim(ctx context.Context, runID, owner string, state []byte) error {
	entry := ownerEntry(owner, state)
	err := s.write(ctx, func(ctx context.Context) error {
		_, err := s.owners.Create(ctx, runID, entry)
		return err
	}, func(ctx context.Context) (bool, error) {
		e, err := s.owners.Get(ctx, runID)
		if err != nil {
			return false, err
		}
		return bytes.Equal(e.Value(), entry), nil
	})
	if errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("%w: run %s already has a driver", ErrConflict, runID)
	}
	return err
}

// Driver reads the run's owner key.
func (s *JetStream) Driver(ctx context.Context, runID string) (string, error) {
	if !validKey(runID) {
		return "", nil
	}
	e, err := s.owners.Get(ctx, runID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	owner, _ := parseOwnerEntry(e.Value())
	return owner, nil
}

// Owners calls fn with every run that has a driver.
func (s *JetStream) Owners(ctx context.Context, fn func(runID, owner string) bool) error {
	return eachEntry(ctx, s.owners, func(e jetstream.KeyValueEntry) (bool, error) {
		owner, _ := parseOwnerEntry(e.Value())
		return fn(e.Key(), owner), nil
	})
}

// TakeOver swaps the run's owner from from to owner at the revision read,
// so that of several servers trying, exactly one wins.
func (s *JetStream) TakeOver(ctx context.Context, runID, from, owner string) error {
	e, err := s.owners.Get(ctx, runID)
	if err != nil {
		return err
	}
	was, state := parseOwnerEntry(e.Value())
	if was != from {
		return fmt.Errorf("%w: run %s is driven by %q", ErrConflict, runID, was)
	}
	if _, err := s.owners.Update(ctx, runID, ownerEntry(owner, state), e.Revision()); err != nil {
		return fmt.Errorf("%w: %v", ErrConflict, err)
	}
	return nil
}

// Release deletes the run's owner key; its marker expires after markerTTL
// (0: the janitor purges it after the retention).
func (s *JetStream) Release(ctx context.Context, runID string) error {
	return s.write(ctx, func(ctx context.Context) error {
		if s.markerTTL == 0 {
			return s.owners.Purge(ctx, runID)
		}
		return s.owners.Purge(ctx, runID, jetstream.PurgeTTL(s.markerTTL))
	}, nil)
}

// commandReply is the answer to a Command.
type commandReply struct {
	State    []byte `json:"state,omitempty"`
	Error    string `json:"error,omitempty"`
	NotFound bool   `json:"not_found,omitempty"`
	NotReady bool   `json:"not_awaiting,omitempty"`
}

// Serve answers commands sent to owner until stop, once the NATS server
// has the subscription.
func (s *JetStream) Serve(ctx context.Context, owner string, handle func(context.Context, *Command) (*stubbornv1.ControlState, error)) (func(), error) {
	sub, err := s.nc.Subscribe(commandSubject+owner, func(msg *nats.Msg) {
		go func() {
			var cmd Command
			reply := commandReply{}
			if err := json.Unmarshal(msg.Data, &cmd); err != nil {
				reply.Error = err.Error()
			} else {
				hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				st, err := handle(hctx, &cmd)
				cancel()
				switch {
				case err != nil:
					reply.Error = err.Error()
					reply.NotFound = errors.Is(err, ErrNotFound)
					reply.NotReady = errors.Is(err, ErrNotAwaitingDecision)
				default:
					reply.State, _ = proto.Marshal(st)
				}
			}
			data, _ := json.Marshal(reply)
			_ = msg.Respond(data)
		}()
	})
	if err != nil {
		return nil, err
	}
	fctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	if err := s.nc.FlushWithContext(fctx); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// Send asks owner to carry out cmd and waits for its answer.
func (s *JetStream) Send(ctx context.Context, owner string, cmd *Command) (*stubbornv1.ControlState, error) {
	data, err := json.Marshal(cmd)
	if err != nil {
		return nil, err
	}
	msg, err := s.nc.RequestWithContext(ctx, commandSubject+owner, data)
	if err != nil {
		return nil, err
	}
	var reply commandReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return nil, err
	}
	switch {
	case reply.NotFound:
		return nil, fmt.Errorf("%w: %s", ErrNotFound, reply.Error)
	case reply.NotReady:
		return nil, fmt.Errorf("%w: %s", ErrNotAwaitingDecision, strings.TrimPrefix(reply.Error, ErrNotAwaitingDecision.Error()))
	case reply.Error != "":
		return nil, errors.New(reply.Error)
	}
	st := &stubbornv1.ControlState{}
	return st, proto.Unmarshal(reply.State, st)
}

// maxKeyBytes bounds a run id used in a subject or a key: far below
// NATS's 4 KiB control line, past which the server closes the connection
// (the API checks run ids first: at most 64 bytes).
const maxKeyBytes = 256

// validKey reports whether s can be a KV key (run ids always can; a
// client's typo may not).
func validKey(s string) bool {
	if s == "" || len(s) > maxKeyBytes {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
