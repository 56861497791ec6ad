package store

import (
	"encoding/binary"
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Event is one recorded event of a run, as the journal keeps it: encoded
// once, when it is recorded, and never changed after. Every watcher is
// sent Data as it is, the store writes it as it is, and a finished run kept
// in memory is a few pointer-free byte slices the garbage collector does
// not have to scan.
type Event struct {
	// RunID and Seq are the event's run_id and seq.
	RunID string
	Seq   int64
	// Finished says this is the run_finished event: nothing follows.
	Finished bool
	// Data is the stubborn.v1.RunEvent, wire-encoded.
	Data []byte
}

// EncodeEvent encodes ev as the journal keeps it.
func EncodeEvent(ev *stubbornv1.RunEvent) (Event, error) {
	data, err := proto.Marshal(ev)
	if err != nil {
		return Event{}, fmt.Errorf("encoding event %d of run %s: %w", ev.GetSeq(), ev.GetRunId(), err)
	}
	return Event{RunID: ev.GetRunId(), Seq: ev.GetSeq(), Finished: ev.GetRunFinished() != nil, Data: data}, nil
}

// DecodeEvent decodes a journal entry written by EncodeEvent (or by another
// server: the store's bytes).
func DecodeEvent(data []byte) (Event, *stubbornv1.RunEvent, error) {
	ev := &stubbornv1.RunEvent{}
	if err := proto.Unmarshal(data, ev); err != nil {
		return Event{}, nil, fmt.Errorf("undecodable event: %w", err)
	}
	return Event{RunID: ev.GetRunId(), Seq: ev.GetSeq(), Finished: ev.GetRunFinished() != nil, Data: data}, ev, nil
}

// Decode returns the event as a message of its own.
func (e Event) Decode() (*stubbornv1.RunEvent, error) {
	ev := &stubbornv1.RunEvent{}
	if err := proto.Unmarshal(e.Data, ev); err != nil {
		return nil, fmt.Errorf("run %s: undecodable event %d: %w", e.RunID, e.Seq, err)
	}
	return ev, nil
}

// Field numbers of the RunEvent kinds that carry a state, and of their state.
const (
	runStartedField  protowire.Number = 10 // RunEvent.run_started
	runFinishedField protowire.Number = 17 // RunEvent.run_finished
	stateField       protowire.Number = 1  // RunStarted.state, RunFinished.state
)

// state returns the encoding of the ControlState that a run_started or a
// run_finished event carries: a part of the event's own encoding, so the
// state the store saves alongside is not encoded a second time. It returns
// nil for other events.
func (e Event) StateBytes() []byte {
	b := e.Data
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		if typ == protowire.BytesType && (num == runStartedField || num == runFinishedField) {
			kind, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil
			}
			return fieldBytes(kind, stateField)
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return nil
		}
		b = b[n:]
	}
	return nil
}

// fieldBytes returns the last occurrence of bytes field num in msg (as
// proto.Unmarshal would read it), or nil.
func fieldBytes(msg []byte, num protowire.Number) []byte {
	var found []byte
	for len(msg) > 0 {
		n, typ, k := protowire.ConsumeTag(msg)
		if k < 0 {
			return nil
		}
		msg = msg[k:]
		if n == num && typ == protowire.BytesType {
			v, k := protowire.ConsumeBytes(msg)
			if k < 0 {
				return nil
			}
			found = v
			msg = msg[k:]
			continue
		}
		k = protowire.ConsumeFieldValue(n, typ, msg)
		if k < 0 {
			return nil
		}
		msg = msg[k:]
	}
	return found
}

// CheckAppend checks that evs are consecutive events of one run, as
// Store.Append takes them.
func CheckAppend(evs []Event) error {
	for i, ev := range evs {
		if ev.RunID != evs[0].RunID || ev.Seq != evs[0].Seq+int64(i) {
			return fmt.Errorf("appending to run %s: event %d of run %s does not follow event %d", evs[0].RunID, ev.Seq, ev.RunID, evs[0].Seq+int64(i)-1)
		}
	}
	return nil
}

// PackEvents lays evs out one after the other, each its encoding after its
// length (a uvarint): a JetStream journal message that holds several events,
// and a finished run's journal in the memory store.
func PackEvents(evs []Event) []byte {
	n := 0
	for _, ev := range evs {
		n += protowire.SizeVarint(uint64(len(ev.Data))) + len(ev.Data)
	}
	b := make([]byte, 0, n)
	for _, ev := range evs {
		b = binary.AppendUvarint(b, uint64(len(ev.Data)))
		b = append(b, ev.Data...)
	}
	return b
}

// EachPacked calls fn with each encoding PackEvents laid out in b, in order,
// as a part of b; it stops at fn's first error, and fails on a b cut short.
func EachPacked(b []byte, fn func(data []byte) error) error {
	for len(b) > 0 {
		size, k := binary.Uvarint(b)
		if k <= 0 || size > uint64(len(b)-k) {
			return errors.New("packed events: truncated event")
		}
		end := k + int(size)
		if err := fn(b[k:end:end]); err != nil {
			return err
		}
		b = b[end:]
	}
	return nil
}
