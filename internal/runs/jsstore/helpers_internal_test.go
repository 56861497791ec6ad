package jsstore

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
	"github.com/stubbornhq/stubborn/internal/runs/memstore"
	"github.com/stubbornhq/stubborn/internal/runs/store"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// stores are the Store implementations every test here runs against. Each
// returns a function that opens a new view of one shared store, as each
// server has its own connection.
var stores = map[string]func(t *testing.T, lease time.Duration) func() store.Store{
	"memory": func(_ *testing.T, lease time.Duration) func() store.Store {
		m := memstore.NewMemory(lease)
		return func() store.Store { return m }
	},
	"jetstream": func(t *testing.T, lease time.Duration) func() store.Store {
		e, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir()})
		require.NoError(t, err)
		t.Cleanup(e.Close)
		return func() store.Store {
			nc, err := nats.Connect("", nats.InProcessServer(e.Server))
			require.NoError(t, err)
			s, err := NewJetStream(runstest.Ctx(t), nc, JetStreamConfig{Lease: lease})
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			return s
		}
	},
}

// openOn opens a JetStream store on e's server, closed when the test ends.
func openOn(t *testing.T, e *Embedded) *JetStream {
	t.Helper()
	nc, err := nats.Connect("", nats.InProcessServer(e.Server))
	require.NoError(t, err)
	s, err := NewJetStream(context.Background(), nc, JetStreamConfig{Lease: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// openStates opens the JetStream store's bucket of saved states.
func openStates(t *testing.T, nc *nats.Conn) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := js.KeyValue(runstest.Ctx(t), statesBucket)
	require.NoError(t, err)
	return kv
}

// savedState reads the run's entry in the JetStream store's states bucket:
// nil when there is none.
func savedState(t *testing.T, kv jetstream.KeyValue, id string) *stubbornv1.ControlState {
	t.Helper()
	e, err := kv.Get(runstest.Ctx(t), id)
	if err == jetstream.ErrKeyNotFound {
		return nil
	}
	require.NoError(t, err)
	st := &stubbornv1.ControlState{}
	require.NoError(t, proto.Unmarshal(e.Value(), st))
	return st
}

// startAsking starts a run on m whose one attempt fails, so that it asks
// for a decision, and waits until that status is saved in states.
func startAsking(t *testing.T, m *runs.Manager, g *runstest.Gated, states jetstream.KeyValue, brief string) string {
	t.Helper()
	ask := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{Target: "d", Attempts: new(int32)}}}
	st, err := runstest.Start(m, context.Background(), brief, ask, nil)
	require.NoError(t, err)
	g.Answer(brief, controlstest.Fail(codes.Unavailable, "busy"))
	require.Eventually(t, func() bool {
		saved := savedState(t, states, st.GetRunId())
		return saved != nil && saved.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION
	}, 5*time.Second, time.Millisecond, "the wait for a decision is saved")
	return st.GetRunId()
}

// stateDecodes is how many run states this process has decoded whole.
func stateDecodes() int64 { return store.StateDecodes.Load() }
