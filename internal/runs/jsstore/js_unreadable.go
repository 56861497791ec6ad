package jsstore

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
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// forgetKeysOf implements keysOfRun: a scan of every key.
func (s *JetStream) ForgetKeysOf(ctx context.Context, runID string) error {
	var named []store.KeyEntry
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

// rawState implements rawStater: the state in the journal's run_finished,
// else the saved one, else the claim's; the tenant as the index names it.
func (s *JetStream) RawState(ctx context.Context, runID string) ([]byte, string, bool, error) {
	if !validKey(runID) {
		return nil, "", false, fmt.Errorf("%w: %.64q", store.ErrNotFound, runID)
	}
	var state []byte
	if msg, err := s.events.GetLastMsgForSubject(ctx, eventsSubject+runID); err == nil {
		if last, err := lastRawEvent(runID, msg.Data, msg.Header); err == nil && last.Finished {
			state = last.StateBytes()
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
func lastRawEvent(runID string, data []byte, h nats.Header) (store.Event, error) {
	count := h.Get(eventsHeader)
	if count != "" {
		n, err := strconv.Atoi(count)
		if err != nil || n < 1 || n > len(data) {
			return store.Event{}, fmt.Errorf("journal message: bad %s header %q", eventsHeader, count)
		}
		var last []byte
		for i := 0; len(data) > 0; i++ {
			size, k := binary.Uvarint(data)
			if k <= 0 || size > uint64(len(data)-k) {
				return store.Event{}, errors.New("journal message: truncated event")
			}
			last = data[k : k+int(size) : k+int(size)]
			data = data[k+int(size):]
		}
		data = last
	}
	finished, ok := store.HasRunFinished(data)
	if !ok {
		return store.Event{}, errors.New("journal message: not an event")
	}
	return store.Event{RunID: runID, Finished: finished, Data: data}, nil
}

// lastRawEvents calls fn with the last event of every run's journal, read
// without decoding (lastRawEvent); a message that is not even that is
// passed as an error, and the scan goes on. It reads the stream's last
// sequence first and stops there, or when it has waited
// lastEventsIdle for the next message.
func (s *JetStream) lastRawEvents(ctx context.Context, fn func(runID string, last store.Event, err error)) error {
	scan := orderedRead{
		cfg: jetstream.OrderedConsumerConfig{
			FilterSubjects:    []string{eventsSubject + "*"},
			DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
			InactiveThreshold: lastEventsIdle,
		},
		idle: lastEventsIdle,
	}
	return eachOrdered(ctx, s.events, scan, func(msg jetstream.Msg, _ *jetstream.MsgMetadata) (bool, error) {
		runID := strings.TrimPrefix(msg.Subject(), eventsSubject)
		last, err := lastRawEvent(runID, msg.Data(), msg.Headers())
		fn(runID, last, err)
		return true, nil
	})
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
