package runs

import (
	"fmt"

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

// decodeAll decodes a journal for replay.
func decodeAll(evs []Event) ([]*stubbornv1.RunEvent, error) {
	out := make([]*stubbornv1.RunEvent, len(evs))
	for i, e := range evs {
		ev, err := e.Decode()
		if err != nil {
			return nil, err
		}
		out[i] = ev
	}
	return out, nil
}
