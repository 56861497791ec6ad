package fleetguard

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Replicas started at the same moment on a fresh cluster all create the
// buckets; JetStream's meta leader may leave some of those requests
// unanswered, or refuse one while another creates the bucket (as the runs'
// store finds, internal/runs/jsstore/setup.go). So each creation is tried
// with a deadline of its own, again after a jittered backoff while it fails
// for a reason that may pass, and between tries a bucket another replica
// made the same way is bound to as it is.
const (
	setupTimeout  = 30 * time.Second // when Open's context has no deadline
	setupFirstTry = time.Second      // doubled at every try, up to setupTry
	setupTry      = 5 * time.Second
	setupBackoff  = 100 * time.Millisecond // doubled up to a second
)

// createBucket creates (or updates) bucket cfg, or binds to it as another
// replica made it.
func createBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, setupTimeout)
		defer cancel()
	}
	wait, try := setupBackoff, setupFirstTry
	for {
		tctx, cancel := context.WithTimeout(ctx, try)
		kv, err := js.CreateOrUpdateKeyValue(tctx, cfg)
		cancel()
		if err == nil || !mayPass(err) {
			return kv, err
		}
		if kv, ok := bindBucket(ctx, js, cfg); ok {
			return kv, nil
		}
		t := time.NewTimer(time.Duration(rand.Int64N(int64(wait))) + 1)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		wait, try = min(2*wait, time.Second), min(2*try, setupTry)
	}
}

// bindBucket returns the bucket if it exists as cfg says.
func bindBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, bool) {
	if ctx.Err() != nil {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(ctx, setupTry)
	defer cancel()
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if err != nil {
		return nil, false
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, false
	}
	info := st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config
	return kv, info.Replicas == max(cfg.Replicas, 1) && info.Storage == cfg.Storage && info.MaxAge == cfg.TTL
}

// errCodeNoPeers is JetStream's "no suitable peers for placement" (a peer
// offline, such as one of a cluster starting that has not joined yet):
// nats.go names no constant for it.
const errCodeNoPeers jetstream.ErrorCode = 10005

// mayPass says whether a failed creation may succeed if made again.
func mayPass(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
		errors.Is(err, nats.ErrConnectionReconnecting) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeStreamNameInUse, jetstream.JSErrCodeStreamNotFound, errCodeNoPeers:
			return true
		}
		return apiErr.Code == 500 || apiErr.Code == 503
	}
	return false
}
