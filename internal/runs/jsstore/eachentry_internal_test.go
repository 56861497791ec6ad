package jsstore

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stuckKV is a bucket whose watcher delivers entries and then neither the
// end of the current entries (nil) nor anything else: nats.go's watcher
// when an entry (an expiring purge marker) goes while it delivers them.
type stuckKV struct {
	jetstream.KeyValue
	entries []jetstream.KeyValueEntry
}

func (k stuckKV) Watch(context.Context, string, ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	ch := make(chan jetstream.KeyValueEntry, len(k.entries))
	for _, e := range k.entries {
		ch <- e
	}
	return stuckWatcher{ch}, nil
}

type stuckWatcher struct{ ch chan jetstream.KeyValueEntry }

func (w stuckWatcher) Updates() <-chan jetstream.KeyValueEntry { return w.ch }
func (w stuckWatcher) Stop() error                             { return nil }

type entry struct {
	jetstream.KeyValueEntry
	key   string
	delta uint64
}

func (e entry) Key() string   { return e.key }
func (e entry) Delta() uint64 { return e.delta }
func (e entry) Value() []byte { return nil }

// TestAScanNeverWaitsForGood: a scan of a bucket (the owners in a
// takeover scan, ListRuns' states) whose watcher never says it delivered
// every entry ends all the same: at the entry that says none follow, or
// after eachEntryIdle without news. Before, it waited for its context,
// which a takeover scan's never ends: ListRuns hung (found by FuzzAPI).
func TestAScanNeverWaitsForGood(t *testing.T) {
	for name, c := range map[string]struct {
		entries []jetstream.KeyValueEntry
		within  time.Duration
	}{
		"the last says so":        {[]jetstream.KeyValueEntry{entry{key: "a", delta: 1}, entry{key: "b", delta: 0}}, time.Second},
		"a marker that went last": {[]jetstream.KeyValueEntry{entry{key: "a", delta: 2}, entry{key: "b", delta: 1}}, eachEntryIdle + 2*time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			var keys []string
			start := time.Now()
			err := eachEntry(context.Background(), stuckKV{entries: c.entries}, jetstream.AllKeys, func(e jetstream.KeyValueEntry) (bool, error) {
				keys = append(keys, e.Key())
				return true, nil
			})
			require.NoError(t, err)
			assert.Equal(t, []string{"a", "b"}, keys)
			assert.Less(t, time.Since(start), c.within)
		})
	}
}
