package jsstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// forgetSubject carries the ids of deleted runs to every server.
const forgetSubject = "stubborn.forget"

// DeleteRun implements runDeleter: the run's tombstone is written, its
// summaries this server has yet to index are dropped (indexer.settle),
// then its summary, state, owner entry and whole journal are purged, then every
// server is told (tombstone.go: a crash at any step resumes nothing).
func (s *JetStream) DeleteRun(ctx context.Context, runID string) error {
	if !validKey(runID) {
		return fmt.Errorf("%w: %.64q", store.ErrNotFound, runID)
	}
	if err := s.tombstone(ctx, runID); err != nil {
		return fmt.Errorf("recording its deletion: %w", err)
	}
	if err := s.crashAt("tombstone"); err != nil {
		return err
	}
	last := s.index.settle(ctx, runID)
	if err := s.purgeRecords(ctx, runID, 0, true, true, last); err != nil {
		return err
	}
	return s.nc.Publish(forgetSubject, []byte(runID))
}

// OnForget implements runDeleter: fn is called for each run any server
// deletes, as NATS delivers the news.
func (s *JetStream) OnForget(fn func(string)) {
	sub, err := s.nc.Subscribe(forgetSubject, func(msg *nats.Msg) { fn(string(msg.Data)) })
	if err != nil {
		return // the connection is closed: there is no one to forget for
	}
	s.mu.Lock()
	s.forgetSubs = append(s.forgetSubs, sub)
	s.mu.Unlock()
}

// ForgetKey deletes key's entry if it names run runID.
func (s *JetStream) ForgetKey(ctx context.Context, key, runID string) error {
	e, err := s.keys.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	cur, ok := parseKeyEntry(e)
	if !ok || cur.RunID != runID {
		return nil
	}
	return s.DropKey(ctx, key, cur)
}
