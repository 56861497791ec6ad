package spend

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Bucket is the JetStream KV bucket of the ledger.
const Bucket = "stubborn_spend"

const (
	// casTries bounds an Add's compare-and-set tries: each lost try is
	// another replica's Add landing, so this many in a row means a store
	// far busier than tenants' spend makes it.
	casTries = 32
	// opTimeout bounds each store call when ctx has no deadline.
	opTimeout = 5 * time.Second
	// maxValueBytes bounds a value read: a total is a short number.
	maxValueBytes = 64
	// setupTimeout bounds opening the bucket when ctx has no deadline.
	setupTimeout = 30 * time.Second
)

// ErrConflict is an Add that lost its compare-and-set casTries times.
var ErrConflict = errors.New("spend: the ledger's entry changed at every try")

// KVConfig configures the JetStream ledger.
type KVConfig struct {
	// Replicas is the bucket's copies; 0 means 1.
	Replicas int
	// Memory keeps the bucket in the NATS servers' memory (tests).
	Memory bool
}

// KV is a Ledger in a JetStream KV bucket (Bucket), shared by every
// replica on the NATS cluster: each Add reads the entry and writes the new
// total only if no other Add came between (the revision read), else reads
// it again. Entries expire TTL after their last change (the bucket's TTL).
type KV struct {
	kv jetstream.KeyValue
}

// OpenKV opens (creating it when missing) the ledger's bucket on nc.
func OpenKV(ctx context.Context, nc *nats.Conn, cfg KVConfig) (*KV, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	st := jetstream.FileStorage
	if cfg.Memory {
		st = jetstream.MemoryStorage
	}
	kv, err := createBucket(ctx, js, jetstream.KeyValueConfig{
		Bucket: Bucket, History: 1, Storage: st, Replicas: max(cfg.Replicas, 1), TTL: TTL,
		Description: "stubborn: each tenant's spend by day and month",
	})
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", Bucket, err)
	}
	return &KV{kv: kv}, nil
}

// createBucket creates (or updates) cfg's bucket; replicas starting
// together on a fresh cluster may each be refused for a while (as the
// runs' store and the fleet's guards find), so a refusal that may pass is
// tried again, with a jittered backoff, until ctx's end.
func createBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, setupTimeout)
		defer cancel()
	}
	wait := 100 * time.Millisecond
	for {
		tctx, cancel := context.WithTimeout(ctx, opTimeout)
		kv, err := js.CreateOrUpdateKeyValue(tctx, cfg)
		cancel()
		if err == nil || !mayPass(err) {
			return kv, err
		}
		t := time.NewTimer(time.Duration(rand.Int64N(int64(wait))) + 1)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}

// mayPass says whether a failed bucket creation may succeed if made again.
func mayPass(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
		errors.Is(err, nats.ErrConnectionReconnecting) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamNameInUse || apiErr.Code == 500 || apiErr.Code == 503
	}
	return false
}

// Add implements Ledger.
func (l *KV) Add(ctx context.Context, tenant, periodKey string, cost float64) error {
	key, err := entryKey(tenant, periodKey)
	if err != nil {
		return err
	}
	if err := checkCost(cost); err != nil {
		return err
	}
	if cost == 0 {
		return nil
	}
	for try := range casTries {
		total, rev, err := l.read(ctx, key)
		if err != nil {
			return err
		}
		value := []byte(strconv.FormatFloat(sum(total, cost), 'g', -1, 64))
		octx, cancel := opContext(ctx)
		if rev == 0 {
			_, err = l.kv.Create(octx, key, value)
		} else {
			_, err = l.kv.Update(octx, key, value, rev)
		}
		cancel()
		if err == nil {
			return nil
		}
		if !conflict(err) {
			return fmt.Errorf("spend: adding to %s: %w", key, err)
		}
		// Another replica's Add came between: read again, after a short
		// jittered pause that grows, so that many at once spread out.
		if err := pause(ctx, time.Duration(rand.Int64N(int64(time.Millisecond)<<min(try, 6)))); err != nil {
			return err
		}
	}
	return ErrConflict
}

// Spent implements Ledger.
func (l *KV) Spent(ctx context.Context, tenant, periodKey string) (float64, error) {
	key, err := entryKey(tenant, periodKey)
	if err != nil {
		return 0, err
	}
	total, _, err := l.read(ctx, key)
	return total, err
}

// read returns key's total and revision (0: no entry). A value that is
// not a total (written by hand, say) counts as 0 and is overwritten by
// the next Add.
func (l *KV) read(ctx context.Context, key string) (float64, uint64, error) {
	octx, cancel := opContext(ctx)
	defer cancel()
	e, err := l.kv.Get(octx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("spend: reading %s: %w", key, err)
	}
	v := e.Value()
	if len(v) > maxValueBytes {
		return 0, e.Revision(), nil
	}
	total, err := strconv.ParseFloat(string(v), 64)
	if err != nil || checkTotal(total) != nil {
		return 0, e.Revision(), nil
	}
	return total, e.Revision(), nil
}

// checkTotal reports a stored total that is not one.
func checkTotal(t float64) error {
	if t != t || t < 0 || t > MaxTotal {
		return ErrCost
	}
	return nil
}

// opContext bounds a store call by opTimeout when ctx has no deadline.
func opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, opTimeout)
}

// conflict says whether err is a compare-and-set's refusal.
func conflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

// pause waits d or until ctx ends.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
