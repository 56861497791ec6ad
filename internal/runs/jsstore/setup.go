package jsstore

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Creating the stream and buckets when several servers start together
// (issue 29, item 7): on a fresh cluster, replicas started at the same
// moment all create the same assets, and JetStream's meta leader may
// leave some of those requests unanswered (each then waited for the whole
// setup deadline, and the replica failed to start), or refuse one because
// another is creating the asset. Each creation is tried with a deadline
// of its own (setupTry), and made again after a jittered backoff while it
// fails for a reason that may pass, until the setup deadline; between
// tries, an asset that exists already with a compatible configuration
// (made by another replica) is bound to as it is.

// One try of creating an asset is bounded by setupFirstTry, doubled at
// every try up to setupTry: two servers creating the same asset at the
// same moment may both be left unanswered although it was made (seen with
// nats-server 2.15.2), and the bind that follows finds it.
const (
	setupFirstTry = time.Second
	setupTry      = 5 * time.Second
)

// errCodeNoPeers is JetStream's "no suitable peers for placement" (a peer
// offline): nats.go names no constant for it.
const errCodeNoPeers jetstream.ErrorCode = 10005

// Backoff between tries: full jitter from setupBackoff, doubling up to
// setupBackoffCap.
const (
	setupBackoff    = 100 * time.Millisecond
	setupBackoffCap = time.Second
)

// setupRetries reports whether a failed creation may succeed if made
// again: no answer in time, no responders, a 503, an asset that is being
// created (or was just created differently) by another server, one that
// a server of a cluster does not know yet (stream not found: another
// replica, started at the same moment, created it an instant ago, or this
// one did and the cluster is still placing it), or too few servers up to
// place its copies (one of a cluster starting has not joined yet).
func setupRetries(err error) bool {
	if transient(err) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeStreamNameInUse, jetstream.JSErrCodeStreamNotFound, errCodeNoPeers:
			return true
		}
		// JetStream's own "temporarily unavailable" and "creation in
		// progress" answers are 500s or 503s.
		return apiErr.Code == 500 || apiErr.Code == 503
	}
	return false
}

// createOrBind makes an asset with create, trying again (see above) until
// ctx ends; between tries, bind returns the asset if another server made
// it compatibly (ok), so that its creation need not succeed here.
func createOrBind[T any](ctx context.Context, create func(context.Context) (T, error), bind func(context.Context) (T, bool)) (T, error) {
	wait, try := setupBackoff, setupFirstTry
	for {
		tryCtx, cancel := context.WithTimeout(ctx, try)
		v, err := create(tryCtx)
		cancel()
		if err == nil || !setupRetries(err) {
			return v, err
		}
		if ctx.Err() == nil {
			tryCtx, cancel := context.WithTimeout(ctx, setupTry)
			b, ok := bind(tryCtx)
			cancel()
			if ok {
				return b, nil
			}
		}
		if !sleep(ctx, time.Duration(mrand.Int64N(int64(wait))+1)) {
			return v, fmt.Errorf("%w (tried until the setup deadline)", err)
		}
		wait, try = min(2*wait, setupBackoffCap), min(2*try, setupTry)
	}
}

// createStream creates or updates stream cfg (createOrBind), or binds to
// it as another server made it: its subjects, replicas and storage the
// same.
func createStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	return createOrBind(ctx, func(ctx context.Context) (jetstream.Stream, error) {
		return js.CreateOrUpdateStream(ctx, cfg)
	}, func(ctx context.Context) (jetstream.Stream, bool) {
		s, err := js.Stream(ctx, cfg.Name)
		if err != nil {
			return nil, false
		}
		got := s.CachedInfo().Config
		return s, got.Replicas == max(cfg.Replicas, 1) && got.Storage == cfg.Storage && sameStrings(got.Subjects, cfg.Subjects) &&
			got.MaxBytes == cfg.MaxBytes && got.Discard == cfg.Discard
	})
}

// createBucket creates or updates bucket cfg (createOrBind), or binds to
// it as another server made it: its replicas, storage, TTL and history the
// same.
func createBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	return createOrBind(ctx, func(ctx context.Context) (jetstream.KeyValue, error) {
		return js.CreateOrUpdateKeyValue(ctx, cfg)
	}, func(ctx context.Context) (jetstream.KeyValue, bool) {
		kv, err := js.KeyValue(ctx, cfg.Bucket)
		if err != nil {
			return nil, false
		}
		st, err := kv.Status(ctx)
		if err != nil {
			return nil, false
		}
		info := st.(*jetstream.KeyValueBucketStatus).StreamInfo()
		history := int64(max(cfg.History, 1))
		return kv, info.Config.Replicas == max(cfg.Replicas, 1) && info.Config.Storage == cfg.Storage &&
			info.Config.MaxAge == cfg.TTL && info.Config.MaxMsgsPerSubject == history &&
			info.Config.SubjectDeleteMarkerTTL == cfg.LimitMarkerTTL
	})
}

func sameStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// bindStream returns stream name, trying again (createOrBind) while
// reading it fails for a reason that may pass.
func bindStream(ctx context.Context, js jetstream.JetStream, name string) (jetstream.Stream, error) {
	return createOrBind(ctx, func(ctx context.Context) (jetstream.Stream, error) {
		return js.Stream(ctx, name)
	}, func(context.Context) (jetstream.Stream, bool) { return nil, false })
}

// leaderReads makes the reads of bucket kv go to its stream's leader:
// nats.go's KeyValue reads with direct gets when the stream allows them
// (CreateOrUpdateKeyValue always does), and a direct get may be answered by
// any replica, also one that lags — a NATS node just back from a stop
// answered "no driver" and a stale owner for runs taken over meanwhile
// (issue 29's fault suite). Who drives a run, whether a server is alive,
// whether a run was deleted: those reads decide takeovers, so they read
// what the cluster agreed on. The stream's AllowDirect is turned off and
// the bucket bound again.
func leaderReads(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, bucket string) (jetstream.KeyValue, error) {
	// A get reads with direct gets while the bucket's cached stream info
	// says they are allowed: the info it ends with must say not. Servers
	// that open the store at the same moment turn them on again (each
	// creation does): turned off again, and read again, until the
	// bucket's own view agrees. Each read and update is bounded by a try's
	// deadline and made again while it fails for a reason that may pass,
	// as creations are (createOrBind): JetStream's meta leader may leave a
	// request unanswered while several servers change the same stream (a
	// replica started with another failed after the whole setup deadline,
	// "bucket stubborn_heartbeats: context deadline exceeded", make chaos
	// concurrent-start, once in six runs).
	wait, undone := setupBackoff, 0
	for {
		cfg, err := tryStep(ctx, func(ctx context.Context) (jetstream.StreamConfig, error) {
			st, err := kv.Status(ctx) // refreshes the bucket's cached info
			if err != nil {
				return jetstream.StreamConfig{}, err
			}
			return st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config, nil
		})
		if err == nil && !cfg.AllowDirect {
			return kv, nil
		}
		if err == nil {
			if undone == 20 {
				return nil, fmt.Errorf("stream KV_%s: direct gets are turned on again and again (a server of an older release?)", bucket)
			}
			cfg.AllowDirect = false
			_, err = tryStep(ctx, func(ctx context.Context) (jetstream.Stream, error) { return js.UpdateStream(ctx, cfg) })
			undone++
		}
		if err != nil && !setupRetries(err) {
			return nil, err
		}
		if !sleep(ctx, time.Duration(mrand.Int64N(int64(wait))+1)) {
			if err == nil {
				err = ctx.Err()
			}
			return nil, fmt.Errorf("%w (tried until the setup deadline)", err)
		}
		wait = min(2*wait, setupBackoffCap)
	}
}

// tryStep calls step with a deadline of setupTry, within ctx.
func tryStep[T any](ctx context.Context, step func(context.Context) (T, error)) (T, error) {
	tryCtx, cancel := context.WithTimeout(ctx, setupTry)
	defer cancel()
	return step(tryCtx)
}
