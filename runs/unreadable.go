package runs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// One unreadable run costs only that run (issue 30): a run whose stored
// state or journal cannot be decoded — a record damaged on disk, written
// by a buggy release, or holding data nested past protobuf's recursion
// limit (a delegate's answer before controls.MaxDataDepth) — is left out
// of every listing with an ERROR naming it, GetRun of it is ErrUnreadable,
// and Delete removes it without decoding it.

// ErrUnreadable: a run's stored records cannot be decoded.
var ErrUnreadable = errors.New("the run's stored records cannot be read")

// unreadableRun is ErrUnreadable for run id, with why.
func unreadableRun(id string, err error) error {
	return fmt.Errorf("%w: run %s: %v (it is left out of listings; DeleteRun removes it)", ErrUnreadable, id, err)
}

// readState decodes run id's stored state; its error is ErrUnreadable.
func readState(id string, data []byte) (*stubbornv1.ControlState, error) {
	st, err := decodeState(data)
	if err != nil {
		return nil, unreadableRun(id, err)
	}
	return st, nil
}

// Fields of ControlState that may nest deeply (a result's data, the spec):
// what peekState leaves out.
var deepStateFields = map[protowire.Number]bool{
	3: true, // result
	6: true, // failure_history
	7: true, // attempt_log
	9: true, // control
}

// peekState decodes what it can of a state that does not decode whole:
// its top-level fields but the deep ones (its run id, status, tenant,
// options, times). ok is false when even those do not decode.
func peekState(data []byte) (*stubbornv1.ControlState, bool) {
	var shallow []byte
	for b := data; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, false
		}
		if !deepStateFields[num] {
			shallow = append(shallow, b[:n+m]...)
		}
		b = b[n+m:]
	}
	st := &stubbornv1.ControlState{}
	if err := proto.Unmarshal(shallow, st); err != nil {
		return nil, false
	}
	return st, true
}

// rawStater is a store that can hand over a run's state undecoded (Delete
// of an unreadable run).
type rawStater interface {
	// rawState returns the encoding of the run's latest state, as State
	// would choose it, without decoding it; nil when there is none. tenant
	// is the run's tenant as another record of the run names it, if one
	// does (the listing index).
	rawState(ctx context.Context, runID string) (state []byte, tenant string, known bool, err error)
}

// deleteUnreadable deletes run id, whose stored records do not decode
// (readErr): it is treated as finished (no driver can make progress with
// a state no one can read; its tombstone keeps it from being resumed). Its
// tenant is read from what decodes of its state or, failing that, from
// its summary in the index; a run that names no tenant anywhere may be
// deleted by any caller that names it: nothing of it can be read by
// anyone.
func (m *Manager) deleteUnreadable(ctx context.Context, id string, readErr error) error {
	rs, ok := m.store.(rawStater)
	if !ok {
		return readErr
	}
	raw, tenant, known, err := rs.rawState(ctx, id)
	if err != nil {
		return err
	}
	key := ""
	if st, ok := peekState(raw); ok && st.GetRunId() == id {
		tenant, known, key = st.GetTenant(), true, st.GetOptions().GetIdempotencyKey()
	}
	if known {
		if err := visible(ctx, id, tenant); err != nil {
			return err
		}
	}
	m.log.Error("deleting a run whose stored records cannot be read", "run_id", id, "tenant_known", known, "err", readErr)
	var kerr error
	switch ks, isKS := m.store.(keyStore); {
	case key != "" && key != id && isKS:
		kerr = ks.ForgetKey(ctx, keyHash(tenant, key), id)
	case key == "":
		// Its options do not decode: any key that names it goes.
		if kr, ok := m.store.(keysOfRun); ok {
			kerr = kr.forgetKeysOf(ctx, id)
		}
	}
	if kerr != nil {
		return fmt.Errorf("deleting run %s: its idempotency key: %w", id, kerr)
	}
	d, ok := m.store.(runDeleter)
	if !ok {
		return fmt.Errorf("%w: this store cannot delete runs", ErrUnavailable)
	}
	if err := d.DeleteRun(ctx, id); err != nil {
		return fmt.Errorf("deleting run %s: %w", id, err)
	}
	m.forgetUnreadable(id)
	return nil
}

// keysOfRun is a store that can drop every idempotency key naming a run,
// whatever the key (a run whose options cannot be read).
type keysOfRun interface {
	forgetKeysOf(ctx context.Context, runID string) error
}

// forgetKeysOf implements keysOfRun.
func (s *Memory) forgetKeysOf(_ context.Context, runID string) error {
	k := &s.keys
	k.mu.Lock()
	defer k.mu.Unlock()
	for key, e := range k.entries {
		if e.RunID == runID {
			delete(k.entries, key)
		}
	}
	return nil
}

// forgetKeysOf implements keysOfRun: a scan of every key.
func (s *JetStream) forgetKeysOf(ctx context.Context, runID string) error {
	var named []KeyEntry
	var keys []string
	if err := eachEntry(ctx, s.keys, jetstream.AllKeys, func(e jetstream.KeyValueEntry) (bool, error) {
		if cur, ok := parseKeyEntry(e); ok && cur.RunID == runID {
			named, keys = append(named, cur), append(keys, e.Key())
		}
		return true, nil
	}); err != nil {
		return err
	}
	for i, key := range keys {
		if err := s.DropKey(ctx, key, named[i]); err != nil {
			return err
		}
	}
	return nil
}

// forgetUnreadable drops run id from this server's memory, finished or not
// (a copy that could not read its own records drives nothing).
func (m *Manager) forgetUnreadable(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.runs, id)
}

// rawState implements rawStater.
func (s *Memory) rawState(_ context.Context, runID string) ([]byte, string, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	data, ok := s.states[runID]
	if !ok {
		return nil, "", false, fmt.Errorf("%w: %q", ErrNotFound, runID)
	}
	return data, "", false, nil
}

// rawState implements rawStater: the state in the journal's run_finished,
// else the saved one, else the claim's; the tenant as the index names it.
func (s *JetStream) rawState(ctx context.Context, runID string) ([]byte, string, bool, error) {
	if !validKey(runID) {
		return nil, "", false, fmt.Errorf("%w: %.64q", ErrNotFound, runID)
	}
	var state []byte
	if msg, err := s.events.GetLastMsgForSubject(ctx, eventsSubject+runID); err == nil {
		if last, err := lastRawEvent(runID, msg.Data, msg.Header); err == nil && last.Finished {
			state = last.state()
		}
	} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, "", false, err
	}
	if len(state) == 0 {
		if e, err := s.states.Get(ctx, runID); err == nil {
			state = e.Value()
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, "", false, err
		}
	}
	if len(state) == 0 {
		if o, err := s.owners.Get(ctx, runID); err == nil {
			_, state = parseOwnerEntry(o.Value())
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, "", false, err
		}
	}
	tenant, known := "", false
	_ = eachEntry(ctx, s.index.kv, "*."+runID, func(e jetstream.KeyValueEntry) (bool, error) {
		tenant, _ = parseOwnerEntry(e.Value())
		known = true
		return false, nil
	})
	return state, tenant, known, nil
}

// lastRawEvent is the last event of a journal message, read without
// decoding it: its run id, whether it is run_finished, its encoding (and
// so its state).
func lastRawEvent(runID string, data []byte, h nats.Header) (Event, error) {
	count := h.Get(eventsHeader)
	if count != "" {
		n, err := strconv.Atoi(count)
		if err != nil || n < 1 || n > len(data) {
			return Event{}, fmt.Errorf("journal message: bad %s header %q", eventsHeader, count)
		}
		var last []byte
		for i := 0; len(data) > 0; i++ {
			size, k := binary.Uvarint(data)
			if k <= 0 || size > uint64(len(data)-k) {
				return Event{}, errors.New("journal message: truncated event")
			}
			last = data[k : k+int(size) : k+int(size)]
			data = data[k+int(size):]
		}
		data = last
	}
	finished, ok := hasRunFinished(data)
	if !ok {
		return Event{}, errors.New("journal message: not an event")
	}
	return Event{RunID: runID, Finished: finished, Data: data}, nil
}

// hasRunFinished reports whether an event's encoding holds run_finished;
// ok is false when it is not a message's encoding.
func hasRunFinished(ev []byte) (finished, ok bool) {
	for len(ev) > 0 {
		num, typ, n := protowire.ConsumeTag(ev)
		if n < 0 {
			return false, false
		}
		m := protowire.ConsumeFieldValue(num, typ, ev[n:])
		if m < 0 {
			return false, false
		}
		if num == runFinishedField && typ == protowire.BytesType {
			finished = true
		}
		ev = ev[n+m:]
	}
	return finished, true
}

// lastRawEvents calls fn with the last event of every run's journal, read
// without decoding (lastRawEvent); a message that is not even that is
// passed as an error, and the scan goes on. It reads the stream's last
// sequence first and stops there, or when it has waited
// lastEventsIdle for the next message.
func (s *JetStream) lastRawEvents(ctx context.Context, fn func(runID string, last Event, err error)) error {
	info, err := s.events.Info(ctx)
	if err != nil {
		return err
	}
	end := info.State.LastSeq
	if info.State.Msgs == 0 {
		return nil
	}
	cons, err := s.events.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{eventsSubject + "*"},
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		InactiveThreshold: lastEventsIdle,
	})
	if err != nil {
		return err
	}
	if info := cons.CachedInfo(); info == nil || info.NumPending == 0 {
		return nil
	}
	it, err := cons.Messages()
	if err != nil {
		return err
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for {
		msg, err := it.Next(jetstream.NextMaxWait(lastEventsIdle))
		if errors.Is(err, nats.ErrTimeout) {
			return nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		meta, err := msg.Metadata()
		if err != nil {
			return err
		}
		runID := strings.TrimPrefix(msg.Subject(), eventsSubject)
		last, err := lastRawEvent(runID, msg.Data(), msg.Headers())
		fn(runID, last, err)
		if meta.Sequence.Stream >= end || meta.NumPending == 0 {
			return nil
		}
	}
}

// logUnreadable logs, at ERROR, a run left out of a listing: once every
// unreadableLogEvery a run (every listing meets it again).
func (s *JetStream) logUnreadable(runID string, err error) {
	now := time.Now()
	if at, ok := s.index.unreadable.Load(runID); ok && now.Sub(at.(time.Time)) < unreadableLogEvery {
		return
	}
	s.index.unreadable.Store(runID, now)
	s.index.log.Error("listing: a run whose stored records cannot be read is left out (DeleteRun removes it)", "run_id", runID, "err", err)
}

// unreadableLogEvery is how often one store logs the same unreadable run.
const unreadableLogEvery = time.Minute
