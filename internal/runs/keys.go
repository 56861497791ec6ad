package runs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/runs/store"
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

// keyClaimGrace is how long an entry without a run is taken for a start
// under way before a new start replaces it. It must outlast a start that
// stalls, not only one that died: a start whose first write waits on a
// NATS node stopped for 12 s (make chaos nats-sigstop) lands it after
// that, and a replacement made meanwhile started the key's run twice
// (10 s was not enough; a replica stopped 13 s lands its start too). A
// start that died blocks its key this long: a client retrying for half a
// minute gets its run.
const keyClaimGrace = 20 * time.Second

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
// reserves the key for run id and returns how to free it again (drop).
func (m *Manager) existingRun(ctx context.Context, tenant, id string, task Task, spec *stubbornv1.ControlSpec, opts *stubbornv1.RunOptions) (drop func(), st *stubbornv1.ControlState, err error) {
	ks := m.store
	sum, err := requestHash(task, spec, opts)
	if err != nil {
		return nil, nil, err
	}
	key := keyHash(tenant, opts.GetIdempotencyKey())
	mine := store.KeyEntry{RunID: id, Request: sum, At: time.Now()}
	dropper := func(e store.KeyEntry) func() {
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
				mine.Rev = rev
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
