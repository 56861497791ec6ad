package notify

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The buckets of the notices and of the signing key. The key's bucket
// has no TTL: a key that expired would void every link out.
const (
	noticesBucket = "stubborn_notices"
	keysBucket    = "stubborn_notify_keys"
	signingKeyKey = "decide"
)

// KV is a Queue in JetStream KV, on the runs' store's connection: durable
// as the runs are, shared by the replicas. Each replica keeps a copy of
// the bucket's records, fed by a watch, to find the due ones without a
// round trip.
type KV struct {
	notices jetstream.KeyValue
	keys    jetstream.KeyValue
	log     *slog.Logger
	stop    context.CancelFunc
	done    chan struct{}

	mu         sync.Mutex
	cache      map[string]Entry // guarded by mu: the records not settled
	signingKey []byte           // guarded by mu: nil until read (SigningKey)
}

var _ Queue = (*KV)(nil)

// OpenKV creates (or binds to) the buckets on nc with replicas copies
// (at least 1) and starts watching the notices.
func OpenKV(ctx context.Context, nc *nats.Conn, replicas int, logger *slog.Logger) (*KV, error) {
	if logger == nil {
		logger = slog.Default()
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	q := &KV{log: logger, cache: map[string]Entry{}, done: make(chan struct{})}
	if q.notices, err = bucket(ctx, js, jetstream.KeyValueConfig{
		Bucket: noticesBucket, History: 1, TTL: settledTTL, Storage: jetstream.FileStorage, Replicas: max(replicas, 1),
	}); err != nil {
		return nil, fmt.Errorf("bucket %s: %w", noticesBucket, err)
	}
	if q.keys, err = bucket(ctx, js, jetstream.KeyValueConfig{
		Bucket: keysBucket, History: 1, Storage: jetstream.FileStorage, Replicas: max(replicas, 1),
	}); err != nil {
		return nil, fmt.Errorf("bucket %s: %w", keysBucket, err)
	}
	wctx, stop := context.WithCancel(context.Background())
	w, err := q.notices.WatchAll(wctx)
	if err != nil {
		stop()
		return nil, fmt.Errorf("watching %s: %w", noticesBucket, err)
	}
	q.stop = stop
	go q.watch(w)
	return q, nil
}

// bucketTry bounds one try at creating or binding a bucket.
const bucketTry = 5 * time.Second

// bucket creates cfg's bucket, or binds to it as another replica made it.
// Each try has a deadline of its own: replicas starting together on a
// fresh cluster change the same streams at once, and JetStream's meta
// leader may leave such a request unanswered (make chaos's
// concurrent-start saw one try wait out the whole setup); the tries
// spread with a jittered backoff.
func bucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	wait := 100 * time.Millisecond
	for {
		tctx, cancel := context.WithTimeout(ctx, bucketTry)
		kv, err := js.CreateOrUpdateKeyValue(tctx, cfg)
		if err != nil {
			var berr error
			if kv, berr = js.KeyValue(tctx, cfg.Bucket); berr == nil {
				err = nil
			}
		}
		cancel()
		if err == nil {
			return kv, nil
		}
		t := time.NewTimer(time.Duration(mrand.Int64N(int64(wait))) + 1)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// watch keeps the cache of unsettled records until Close.
func (q *KV) watch(w jetstream.KeyWatcher) {
	defer close(q.done)
	defer func() { _ = w.Stop() }()
	for e := range w.Updates() {
		if e == nil {
			continue // the bucket's records so far are in
		}
		q.mu.Lock()
		if e.Operation() != jetstream.KeyValuePut {
			delete(q.cache, e.Key())
			q.mu.Unlock()
			continue
		}
		r, err := decodeRecord(e.Value())
		switch {
		case err != nil:
			q.log.Warn("notify: an unreadable notice is skipped", "key", e.Key(), "err", err)
			delete(q.cache, e.Key())
		case r.State != "":
			delete(q.cache, e.Key())
		default:
			if cur, ok := q.cache[e.Key()]; !ok || cur.Rev < e.Revision() {
				q.cache[e.Key()] = Entry{Key: e.Key(), Rev: e.Revision(), Record: r}
			}
		}
		q.mu.Unlock()
	}
}

// seen puts a record this replica wrote in the cache at once.
func (q *KV) seen(key string, rev uint64, r Record) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if r.State != "" {
		delete(q.cache, key)
		return
	}
	if cur, ok := q.cache[key]; !ok || cur.Rev < rev {
		q.cache[key] = Entry{Key: key, Rev: rev, Record: r}
	}
}

// Add implements Queue.
func (q *KV) Add(ctx context.Context, key string, r Record) (bool, error) {
	b, err := encodeRecord(r)
	if err != nil {
		return false, err
	}
	rev, err := q.notices.Create(ctx, key, b)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	q.seen(key, rev, r)
	return true, nil
}

// Pending implements Queue.
func (q *KV) Pending() []Entry {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make([]Entry, 0, len(q.cache))
	for _, e := range q.cache {
		out = append(out, e)
	}
	return out
}

// Update implements Queue.
func (q *KV) Update(ctx context.Context, key string, rev uint64, r Record) (uint64, error) {
	b, err := encodeRecord(r)
	if err != nil {
		return 0, err
	}
	n, err := q.notices.Update(ctx, key, b, rev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return 0, ErrConflict
	}
	if err != nil {
		return 0, err
	}
	q.seen(key, n, r)
	return n, nil
}

// Get implements Queue.
func (q *KV) Get(ctx context.Context, key string) (Entry, bool, error) {
	e, err := q.notices.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Entry{}, false, nil
	}
	if err != nil {
		return Entry{}, false, err
	}
	r, err := decodeRecord(e.Value())
	if err != nil {
		return Entry{}, false, err
	}
	return Entry{Key: key, Rev: e.Revision(), Record: r}, true, nil
}

// Delete implements Queue.
func (q *KV) Delete(ctx context.Context, key string, rev uint64) error {
	err := q.notices.Delete(ctx, key, jetstream.LastRevision(rev))
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return ErrConflict
	}
	if err == nil {
		q.mu.Lock()
		delete(q.cache, key)
		q.mu.Unlock()
	}
	return err
}

// SigningKey implements Queue: the first replica to ask makes it; once
// read, it is kept (it never changes).
func (q *KV) SigningKey(ctx context.Context) ([]byte, error) {
	q.mu.Lock()
	kept := q.signingKey
	q.mu.Unlock()
	if kept != nil {
		return kept, nil
	}
	key, err := q.readSigningKey(ctx)
	if err == nil {
		q.mu.Lock()
		q.signingKey = key
		q.mu.Unlock()
	}
	return key, err
}

// readSigningKey makes the signing key, or reads the one another replica
// made.
func (q *KV) readSigningKey(ctx context.Context) ([]byte, error) {
	key := make([]byte, 32)
	_, _ = rand.Read(key) // never fails (crypto/rand)
	if _, err := q.keys.Create(ctx, signingKeyKey, key); err == nil {
		return key, nil
	} else if !errors.Is(err, jetstream.ErrKeyExists) {
		return nil, err
	}
	e, err := q.keys.Get(ctx, signingKeyKey)
	if err != nil {
		return nil, err
	}
	if len(e.Value()) < 16 {
		return nil, fmt.Errorf("notify: the signing key in %s is too short (%d bytes)", keysBucket, len(e.Value()))
	}
	return e.Value(), nil
}

// Close stops the watch.
func (q *KV) Close() {
	if q.stop != nil {
		q.stop()
		<-q.done
	}
}
