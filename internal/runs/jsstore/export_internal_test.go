package jsstore

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// PurgeForTest makes one pass of the store's janitor as if it were now,
// and returns how many runs and leftovers it purged.
func (s *JetStream) PurgeForTest(ctx context.Context, now time.Time) (int, error) {
	return s.purge(ctx, now)
}

// IndexReady reports whether the store has reconciled its listing index.
func (s *JetStream) IndexReady() bool { return s.index.ready.Load() }

// RawJournalSeqs returns the seq of every event stored on run id's
// subject, in stream order, as stored: a message stored twice counts
// twice (readers drop the second).
func RawJournalSeqs(ctx context.Context, s *JetStream, id string) ([]int64, error) {
	last, err := s.events.GetLastMsgForSubject(ctx, eventsSubject+id)
	if err != nil {
		return nil, err
	}
	var seqs []int64
	err = s.read(ctx, id, func(evs []store.Event, seq uint64) (bool, error) {
		for _, ev := range evs {
			seqs = append(seqs, ev.Seq)
		}
		return seq < last.Sequence, nil
	})
	return seqs, err
}

// DeleteCrashAt has the store's DeleteRun stop with err right after step
// ("tombstone", "summary", "state", "owner's entry", "journal"), as a
// crash there would; "" stops nothing.
func (s *JetStream) DeleteCrashAt(step string, err error) {
	s.deleteHook = func(at string) error {
		if at == step {
			return err
		}
		return nil
	}
}

// OwnersEntryForTest returns the server the owners entry of s (a
// *JetStream) names for the run, "" when it has none.
func OwnersEntryForTest(ctx context.Context, s store.Store, runID string) (string, error) {
	e, err := s.(*JetStream).owners.Get(ctx, runID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	owner, _ := parseOwnerEntry(e.Value())
	return owner, nil
}

// HasMarkForTest reports whether s (a *JetStream) keeps owner's mark.
func HasMarkForTest(ctx context.Context, s store.Store, owner string) (bool, error) {
	_, err := s.(*JetStream).marks.Get(ctx, owner)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	return err == nil, err
}
