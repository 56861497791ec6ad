package memstore

import (
	"bytes"

	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// A finished run's journal is kept packed: its events' encodings copied
// into one []byte (store.PackEvents). A store keeps up to DefaultMemoryRuns
// finished runs; a journal kept as a slice of events is an object with two
// pointers an event, which the garbage collector scans again in each cycle,
// and it keeps the run's encoding slab (runs' journal.go) whole. Packed, it
// is one object without pointers, which the run's final state shares
// (PutState): nothing else of the run is kept.
type packed []byte

// pack returns journal evs, whose last event is its run_finished, packed.
func pack(evs []store.Event) packed { return store.PackEvents(evs) }

// events returns the events after seq after of run id's packed journal.
// Their Data share p's bytes, which are never changed.
func (p packed) events(id string, after int64) []store.Event {
	var evs []store.Event
	seq := int64(0)
	err := store.EachPacked(p, func(data []byte) error {
		if seq++; seq > after {
			evs = append(evs, store.Event{RunID: id, Seq: seq, Data: data})
		}
		return nil
	})
	if len(evs) > 0 && err == nil {
		evs[len(evs)-1].Finished = true
	}
	return evs[:len(evs):len(evs)]
}

// share returns state, or the same bytes in p's run_finished when it holds
// them: the Manager saves a finished run's state as a part of its
// run_finished's encoding, and a state that shares p keeps nothing else of
// the run.
func (p packed) share(state []byte) []byte {
	var last []byte
	if store.EachPacked(p, func(data []byte) error { last = data; return nil }) != nil {
		return state // never: pack wrote p
	}
	if i := bytes.Index(last, state); i >= 0 && len(state) > 0 {
		return last[i : i+len(state) : i+len(state)]
	}
	return state
}
