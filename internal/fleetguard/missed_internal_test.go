package fleetguard

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readMissed brings what a dead watch would have: each record the
// breakers' stream holds from a sequence on, read by sequence, cached if
// newer than the one cached and told to OnBreaker; a sequence replaced by
// a later write of its key is skipped, a deleted record is closed.
func TestReadMissedCachesWhatTheStreamHolds(t *testing.T) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true, JetStream: true, StoreDir: t.TempDir()})
	require.NoError(t, err)
	ns.Start()
	t.Cleanup(ns.Shutdown)
	require.True(t, ns.ReadyForConnections(10*time.Second))
	open := func(replica string) *Fleet {
		nc, err := nats.Connect(ns.ClientURL())
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		f, err := Open(ctx, nc, Config{Replica: replica, Memory: true})
		require.NoError(t, err)
		t.Cleanup(func() { f.Close(); nc.Close() })
		require.Eventually(t, func() bool { up, _ := f.Scope(); return up }, 10*time.Second, 10*time.Millisecond)
		return f
	}
	writer, reader := open("w"), open("r")
	ctx := context.Background()
	set := func(name, state string) {
		_, wrote, err := writer.ChangeBreaker(ctx, name, func(Breaker) (Breaker, bool) {
			return Breaker{State: state, OpenedBy: "w"}, true
		})
		require.NoError(t, err)
		require.True(t, wrote)
	}
	set("a", StateHalfOpen) // seq 1, replaced by seq 2
	set("a", StateOpen)     // seq 2
	set("b", StateOpen)     // seq 3
	set("c", StateOpen)     // seq 4, deleted by seq 5
	require.NoError(t, writer.breakers.Delete(ctx, key("c")))
	require.Eventually(t, func() bool { _, rev := reader.Breaker("c"); return rev == 5 }, 10*time.Second, 10*time.Millisecond,
		"the watch brings every write")

	// As if the watch had brought none of it.
	reader.mu.Lock()
	reader.cache = map[string]cached{"b": {rec: Breaker{State: StateHalfOpen}, rev: 9}} // newer than seq 3
	reader.mu.Unlock()
	told := map[string]string{}
	reader.SetOnBreaker(func(name string, _, rec Breaker) { told[name] = rec.StateOf() })
	assert.EqualValues(t, 5, reader.readMissed(ctx, 1, 5))
	a, rev := reader.Breaker("a")
	assert.Equal(t, StateOpen, a.StateOf())
	assert.EqualValues(t, 2, rev)
	b, rev := reader.Breaker("b")
	assert.Equal(t, StateHalfOpen, b.StateOf(), "a newer record cached stays")
	assert.EqualValues(t, 9, rev)
	c, rev := reader.Breaker("c")
	assert.Equal(t, StateClosed, c.StateOf(), "deleted: closed")
	assert.EqualValues(t, 5, rev)
	assert.Equal(t, map[string]string{"a": StateOpen, "c": StateClosed}, told, "what changed is told, as from the watch")

	// Past the stream's end: nothing there, nothing cached.
	assert.EqualValues(t, 7, reader.readMissed(ctx, 6, 7))
	_, rev = reader.Breaker("d")
	assert.Zero(t, rev)
}
