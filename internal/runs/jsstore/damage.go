package jsstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// StreamDamage is what one of the store's streams lost, as its NATS server
// reports it (JetStream's StreamInfo.State.Lost): messages that a damaged
// block file held and that could not be read back — at start, or later
// when the block was read.
type StreamDamage struct {
	// Stream is the stream's name: STUBBORN_EVENTS, or KV_<bucket>.
	Stream string
	// Seqs are the lost messages' stream sequences, in order.
	Seqs []uint64
	// Bytes is their size.
	Bytes uint64
}

// maxSeqsLogged bounds the sequences a damage line lists.
const maxSeqsLogged = 50

// Damage asks the store's server what each of Stubborn's streams lost —
// the events stream and the streams of the states, owners and heartbeats
// buckets — and logs an ERROR for each that lost messages ("store
// damaged: stream STUBBORN_EVENTS lost 3 messages", with stream=,
// messages=, bytes= and the first maxSeqsLogged sequences in seqs=). A
// stream it cannot ask about is logged at Warn and left out. It returns
// the damage found, nil when there is none.
//
// NATS keeps what a stream lost in memory, from its start: call Damage
// once the store is open, when the files were just read.
func (s *JetStream) Damage(ctx context.Context, logger *slog.Logger) []StreamDamage {
	if logger == nil {
		logger = slog.Default()
	}
	var found []StreamDamage
	for _, name := range []string{eventsStream, "KV_" + statesBucket, "KV_" + ownersBucket, "KV_" + beatsBucket} {
		st, err := s.js.Stream(ctx, name)
		if err != nil {
			logger.Warn("checking the store for damage", "stream", name, "err", err)
			continue
		}
		info, err := st.Info(ctx)
		if err != nil {
			logger.Warn("checking the store for damage", "stream", name, "err", err)
			continue
		}
		lost := info.State.Lost
		if lost == nil || len(lost.Msgs) == 0 {
			continue
		}
		s.MarkDamaged()
		d := StreamDamage{Stream: name, Seqs: lost.Msgs, Bytes: lost.Bytes}
		found = append(found, d)
		logger.Error(fmt.Sprintf("store damaged: stream %s lost %d messages", name, len(d.Seqs)),
			"stream", name, "messages", len(d.Seqs), "bytes", d.Bytes, "seqs", seqList(d.Seqs, maxSeqsLogged))
	}
	return found
}

// seqList is the first n sequences, comma-separated, and how many more.
func seqList(seqs []uint64, n int) string {
	var b strings.Builder
	for i, q := range seqs {
		if i == n {
			fmt.Fprintf(&b, " and %d more", len(seqs)-n)
			break
		}
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, q)
	}
	return b.String()
}

// MarkDamaged says the store's files were found damaged (Damage, or the
// embedded server's log: Embedded.Damaged). A run claimed but whose
// journal is empty may then have lost its journal: it is not resumed from
// its claim, which would call its delegates again, but ends FAILED
// (Manager.resume).
func (s *JetStream) MarkDamaged() { s.damaged.Store(true) }

// journalLost reports whether the empty journal of a claimed run was
// lost: the store was found damaged, the run saved a state that only a
// run that wrote its journal saves (not RUNNING before its first attempt,
// as older versions saved before the claim), or its owners entry was
// written after its journal's first write (claims.go).
func (s *JetStream) JournalLost(ctx context.Context, runID string) (bool, string, error) {
	if s.damaged.Load() {
		return true, "its journal is empty, and the store's files were found damaged", nil
	}
	lost, why, err := s.stateLost(ctx, runID)
	if err != nil || lost {
		return lost, why, err
	}
	if o, err := s.owners.Get(ctx, runID); err == nil && claimEntry(o.Value()) {
		return true, "its journal is empty, but it was claimed in its journal (its owners entry is written after that)", nil
	} else if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, "", err
	}
	return false, "", nil
}

// stateLost is journalLost's reading of the run's saved state.
func (s *JetStream) stateLost(ctx context.Context, runID string) (bool, string, error) {
	e, err := s.states.Get(ctx, runID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, "", nil
	}
	if err != nil {
		return false, "", err
	}
	st, err := store.DecodeState(e.Value())
	if err != nil {
		return true, "its journal is empty, and its saved state cannot be read", nil
	}
	// Compatibility path, for runs of older versions, which saved their
	// state RUNNING before the claim: a state before any attempt is no
	// sign of journal writes.
	if st.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_RUNNING && st.GetAttempts() == 0 && len(st.GetAttemptLog()) == 0 {
		return false, "", nil
	}
	return true, fmt.Sprintf("its journal is empty, but it saved a state (%s, %d attempts) that only follows journal writes", st.GetStatus(), st.GetAttempts()), nil
}
