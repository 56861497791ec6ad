package runs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Idempotent starts (issue 22). A run request with an idempotency key of
// the caller's own is a request for one run: the first starts it, and
// those that follow within the key's window get that run (or, when they
// ask for something else under the same key, ErrKeyConflict). The store
// keeps each key's entry, keyed by a hash of tenant and key, with the
// run's id and a hash of the request (its brief, messages, model parameters, control and options but
// their metadata): across replicas sharing a store and across restarts.
//
// A key's entry is written before the run is claimed. One of concurrent
// starts with a key creates its entry (a create, which only one wins);
// the others wait for its run to exist, then get it. A start that dies
// between the two (a crash) leaves an entry without a run: after
// keyClaimGrace the next start with the key replaces it (compare-and-set)
// and starts the run, so a crash does not block a key for its window.

// DefaultKeyWindow is how long a key names its run when Config says
// nothing: a day, as Stripe's idempotency keys.
const DefaultKeyWindow = 24 * time.Hour

// keyClaimGrace is how long an entry without a run is taken for a start
// under way before a new start replaces it.
const keyClaimGrace = 10 * time.Second

// keyPoll is how often a start that found a key's entry without its run
// looks again, until keyClaimGrace.
const keyPoll = 10 * time.Millisecond

// ErrKeyConflict: the idempotency key names a run started with a
// different request.
var ErrKeyConflict = errors.New("the idempotency key names another run")

// KeyConflictError is ErrKeyConflict with the run the key names.
type KeyConflictError struct{ RunID string }

func (e *KeyConflictError) Error() string {
	return fmt.Sprintf("%v: run %s was started with this idempotency key and a different request (brief, control or options other than metadata); use a new key for a new run", ErrKeyConflict, e.RunID)
}

func (e *KeyConflictError) Unwrap() error { return ErrKeyConflict }

// KeyEntry is what the store keeps of an idempotency key.
type KeyEntry struct {
	// RunID is the run the key names.
	RunID string `json:"run_id"`
	// Request is the hash of the request that started it.
	Request string `json:"request"`
	// At is when the entry was written.
	At time.Time `json:"at"`
	// rev is the entry's revision in the store (compare-and-set).
	rev uint64
}

// keyStore is a store that keeps idempotency keys.
type keyStore interface {
	// ReserveKey writes e as key's entry unless it has one within its
	// window; then it returns that one and reserved false.
	ReserveKey(ctx context.Context, key string, e KeyEntry) (current KeyEntry, reserved bool, err error)
	// ReplaceKey writes e over old, key's current entry, unless it
	// changed meanwhile; it returns e's revision, 0 when not replaced.
	ReplaceKey(ctx context.Context, key string, old, e KeyEntry) (rev uint64, err error)
	// DropKey deletes key's entry if it is still e.
	DropKey(ctx context.Context, key string, e KeyEntry) error
	// ForgetKey deletes key's entry if it names run runID (a run
	// deleted).
	ForgetKey(ctx context.Context, key, runID string) error
}

// keyHash is the store's key of an idempotency key of tenant.
func keyHash(tenant, key string) string {
	h := sha256.New()
	h.Write([]byte(tenant))
	h.Write([]byte{0})
	h.Write([]byte(key))
	return "k" + hex.EncodeToString(h.Sum(nil))
}

// requestHash is the hash of what a run request asks for: its task
// (brief, messages and model parameters, or typed conversation), control
// and options but their metadata.
func requestHash(task Task, spec *stubbornv1.ControlSpec, opts *stubbornv1.RunOptions) (string, error) {
	o := proto.CloneOf(opts)
	o.Metadata = nil
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(&stubbornv1.ControlState{
		TaskBrief: task.Brief, TaskMessages: task.Messages, ModelParams: task.ModelParams, Conversation: task.Conversation,
		Control: spec, Options: o,
	})
	if err != nil {
		return "", err
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:]), nil
}

// existingRun returns the run an idempotency key names (st), or
// reserves the key for run id and returns how to free it again (drop), or
// neither when the store keeps no keys.
func (m *Manager) existingRun(ctx context.Context, tenant, id string, task Task, spec *stubbornv1.ControlSpec, opts *stubbornv1.RunOptions) (drop func(), st *stubbornv1.ControlState, err error) {
	ks, ok := m.store.(keyStore)
	if !ok {
		return nil, nil, nil
	}
	sum, err := requestHash(task, spec, opts)
	if err != nil {
		return nil, nil, err
	}
	key := keyHash(tenant, opts.GetIdempotencyKey())
	mine := KeyEntry{RunID: id, Request: sum, At: time.Now()}
	dropper := func(e KeyEntry) func() {
		return func() {
			if err := ks.DropKey(m.letGo, key, e); err != nil {
				m.log.Warn("freeing the idempotency key of a run that did not start", "run_id", id, "err", err)
			}
		}
	}
	for {
		cur, reserved, err := ks.ReserveKey(ctx, key, mine)
		if err != nil {
			return nil, nil, err
		}
		if reserved {
			return dropper(cur), nil, nil
		}
		st, err := m.Get(ctx, cur.RunID)
		if err == nil {
			if cur.Request != sum {
				return nil, nil, &KeyConflictError{RunID: cur.RunID}
			}
			return nil, st, nil
		}
		if !errors.Is(err, ErrNotFound) {
			return nil, nil, err
		}
		// Its start is under way (wait), or died (replace it).
		if time.Since(cur.At) > keyClaimGrace {
			mine.At = time.Now()
			rev, err := ks.ReplaceKey(ctx, key, cur, mine)
			if err != nil {
				return nil, nil, err
			}
			if rev != 0 {
				mine.rev = rev
				return dropper(mine), nil, nil
			}
			continue
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(keyPoll):
		}
	}
}

// memoryKeys keeps a Memory store's idempotency keys.
type memoryKeys struct {
	mu      sync.Mutex
	entries map[string]KeyEntry
	rev     uint64
	pruned  time.Time // when the expired entries went last
}

// ReserveKey implements keyStore.
func (s *Memory) ReserveKey(_ context.Context, key string, e KeyEntry) (KeyEntry, bool, error) {
	k := &s.keys
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.entries == nil {
		k.entries = map[string]KeyEntry{}
	}
	now, window := s.clock(), s.keyWindow()
	if now.Sub(k.pruned) > time.Minute {
		// The expired go, a minute at a time: a map no larger than a
		// window's keys, and no scan a start.
		k.pruned = now
		for h, old := range k.entries {
			if now.Sub(old.At) > window {
				delete(k.entries, h)
			}
		}
	}
	if cur, ok := k.entries[key]; ok && now.Sub(cur.At) <= window {
		return cur, false, nil
	}
	k.rev++
	e.rev = k.rev
	k.entries[key] = e
	return e, true, nil
}

// ReplaceKey implements keyStore.
func (s *Memory) ReplaceKey(_ context.Context, key string, old, e KeyEntry) (uint64, error) {
	k := &s.keys
	k.mu.Lock()
	defer k.mu.Unlock()
	if cur, ok := k.entries[key]; !ok || cur.rev != old.rev {
		return 0, nil
	}
	k.rev++
	e.rev = k.rev
	k.entries[key] = e
	return e.rev, nil
}

// DropKey implements keyStore.
func (s *Memory) DropKey(_ context.Context, key string, e KeyEntry) error {
	k := &s.keys
	k.mu.Lock()
	defer k.mu.Unlock()
	if cur, ok := k.entries[key]; ok && cur.rev == e.rev {
		delete(k.entries, key)
	}
	return nil
}

// ReserveKey implements keyStore: a create in the keys bucket, whose
// entries expire after the window (its TTL).
func (s *JetStream) ReserveKey(ctx context.Context, key string, e KeyEntry) (KeyEntry, bool, error) {
	v, err := json.Marshal(e)
	if err != nil {
		return KeyEntry{}, false, err
	}
	for {
		rev, err := s.keys.Create(ctx, key, v)
		if err == nil {
			e.rev = rev
			return e, true, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return KeyEntry{}, false, fmt.Errorf("recording the idempotency key: %w", err)
		}
		cur, err := s.keys.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // expired meanwhile
		}
		if err != nil {
			return KeyEntry{}, false, fmt.Errorf("reading the idempotency key: %w", err)
		}
		got, ok := parseKeyEntry(cur)
		if !ok {
			return KeyEntry{}, false, errors.New("reading the idempotency key: an entry that does not decode")
		}
		return got, false, nil
	}
}

// parseKeyEntry decodes a keys bucket entry.
func parseKeyEntry(e jetstream.KeyValueEntry) (KeyEntry, bool) {
	var got KeyEntry
	if err := json.Unmarshal(e.Value(), &got); err != nil {
		return KeyEntry{}, false
	}
	got.rev = e.Revision()
	return got, true
}

// ReplaceKey implements keyStore: an update at old's revision.
func (s *JetStream) ReplaceKey(ctx context.Context, key string, old, e KeyEntry) (uint64, error) {
	v, err := json.Marshal(e)
	if err != nil {
		return 0, err
	}
	rev, err := s.keys.Update(ctx, key, v, old.rev)
	if wrongRevision(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("recording the idempotency key: %w", err)
	}
	return rev, nil
}

// DropKey implements keyStore: a delete at e's revision.
func (s *JetStream) DropKey(ctx context.Context, key string, e KeyEntry) error {
	err := s.keys.Delete(ctx, key, jetstream.LastRevision(e.rev))
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
