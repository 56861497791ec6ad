package jsstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// ReserveKey implements keyStore: a create in the keys bucket, whose
// entries expire after the window (its TTL).
func (s *JetStream) ReserveKey(ctx context.Context, key string, e store.KeyEntry) (store.KeyEntry, bool, error) {
	v, err := json.Marshal(e)
	if err != nil {
		return store.KeyEntry{}, false, err
	}
	for {
		rev, err := s.keys.Create(ctx, key, v)
		if err == nil {
			e.Rev = rev
			return e, true, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return store.KeyEntry{}, false, fmt.Errorf("recording the idempotency key: %w", err)
		}
		cur, err := s.keys.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // expired meanwhile
		}
		if err != nil {
			return store.KeyEntry{}, false, fmt.Errorf("reading the idempotency key: %w", err)
		}
		got, ok := parseKeyEntry(cur)
		if !ok {
			return store.KeyEntry{}, false, errors.New("reading the idempotency key: an entry that does not decode")
		}
		return got, false, nil
	}
}

// parseKeyEntry decodes a keys bucket entry.
func parseKeyEntry(e jetstream.KeyValueEntry) (store.KeyEntry, bool) {
	var got store.KeyEntry
	if err := json.Unmarshal(e.Value(), &got); err != nil {
		return store.KeyEntry{}, false
	}
	got.Rev = e.Revision()
	return got, true
}

// ReplaceKey implements keyStore: an update at old's revision.
func (s *JetStream) ReplaceKey(ctx context.Context, key string, old, e store.KeyEntry) (uint64, error) {
	v, err := json.Marshal(e)
	if err != nil {
		return 0, err
	}
	rev, err := s.keys.Update(ctx, key, v, old.Rev)
	if wrongRevision(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("recording the idempotency key: %w", err)
	}
	return rev, nil
}

// DropKey implements keyStore: a delete at e's revision.
func (s *JetStream) DropKey(ctx context.Context, key string, e store.KeyEntry) error {
	err := s.keys.Delete(ctx, key, jetstream.LastRevision(e.Rev))
	if wrongRevision(err) {
		return nil
	}
	return err
}

// wrongRevision says err is a compare-and-set that found another revision.
func wrongRevision(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}
