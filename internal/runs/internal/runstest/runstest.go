// Package runstest holds what the tests of the engine (package runs) and
// of its stores share: a Manager over fake delegates, watching a run to
// its end, the stores every test runs against, a gated delegate and a log
// handler that keeps every record.
package runstest

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/runs/memstore"
	"github.com/stubbornhq/stubborn/internal/runs/store"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Chain is a fallback chain over names.
func Chain(names ...string) *stubbornv1.ControlSpec {
	return &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: names}}}
}

// NewManager starts a Manager over d with cfg (a fake clock and a memory
// store unless cfg has its own), closed when the test ends.
func NewManager(t *testing.T, d controls.Delegates, cfg runs.Config) *runs.Manager {
	t.Helper()
	cfg.Delegates = d
	if cfg.Clock == nil {
		cfg.Clock = controlstest.NewClock()
	}
	if cfg.Store == nil {
		cfg.Store = memstore.NewMemory(cmp.Or(cfg.Lease, runs.DefaultLease))
	}
	m, err := runs.New(cfg)
	require.NoError(t, err)
	t.Cleanup(m.Close)
	return m
}

// Ctx is a context that ends with the test, or after 10 s.
func Ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// WatchAll returns run id's events after seq after, to its end.
func WatchAll(t *testing.T, m *runs.Manager, id string, after int64) []*stubbornv1.RunEvent {
	t.Helper()
	var evs []*stubbornv1.RunEvent
	require.NoError(t, m.Watch(Ctx(t), id, after, Decoding(func(ev *stubbornv1.RunEvent) error {
		evs = append(evs, ev)
		return nil
	})))
	return evs
}

// Decoding turns a function of decoded events into a watcher of recorded
// ones.
func Decoding(fn func(*stubbornv1.RunEvent) error) func(runs.Event) error {
	return func(e runs.Event) error {
		ev, err := e.Decode()
		if err != nil {
			return err
		}
		return fn(ev)
	}
}

// DecodeAll decodes a journal read from a store.
func DecodeAll(t *testing.T, evs []runs.Event) []*stubbornv1.RunEvent {
	t.Helper()
	out := make([]*stubbornv1.RunEvent, 0, len(evs))
	for _, e := range evs {
		ev, err := e.Decode()
		require.NoError(t, err)
		assert.Equal(t, e.Seq, ev.GetSeq())
		assert.Equal(t, e.RunID, ev.GetRunId())
		assert.Equal(t, e.Finished, ev.GetRunFinished() != nil)
		out = append(out, ev)
	}
	return out
}

// Final is the state the run_finished ending evs carries.
func Final(t *testing.T, evs []*stubbornv1.RunEvent) *stubbornv1.ControlState {
	t.Helper()
	require.NotEmpty(t, evs)
	require.NotNil(t, evs[len(evs)-1].GetRunFinished(), "the last event is run_finished")
	return evs[len(evs)-1].GetRunFinished().GetState()
}

// Gated is a Delegates whose calls wait for the test to answer them, by
// brief, and which records every call.
type Gated struct {
	mu      sync.Mutex
	calls   []controls.Call
	answers map[string]chan controlstest.Reply
	info    controls.DelegateInfo
}

// NewGated returns a Gated whose delegates say info.
func NewGated(info controls.DelegateInfo) *Gated {
	return &Gated{answers: map[string]chan controlstest.Reply{}, info: info}
}

func (g *Gated) queue(brief string) chan controlstest.Reply {
	g.mu.Lock()
	defer g.mu.Unlock()
	q, ok := g.answers[brief]
	if !ok {
		q = make(chan controlstest.Reply, 100)
		g.answers[brief] = q
	}
	return q
}

// Answer queues the answer of the next call with this brief.
func (g *Gated) Answer(brief string, r controlstest.Reply) { g.queue(brief) <- r }

// Call waits for the answer queued for c.Brief.
func (g *Gated) Call(ctx context.Context, c controls.Call) (*stubbornv1.Result, error) {
	g.mu.Lock()
	g.calls = append(g.calls, c)
	g.mu.Unlock()
	select {
	case r := <-g.queue(c.Brief):
		if r.Err != nil {
			return nil, r.Err
		}
		return &stubbornv1.Result{Text: r.Text}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Info is the delegates' info.
func (g *Gated) Info(string) controls.DelegateInfo    { return g.info }
func (g *Gated) Serving(context.Context, string) bool { return true }

// Called is how many calls had brief ("" any).
func (g *Gated) Called(brief string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, c := range g.calls {
		if brief == "" || c.Brief == brief {
			n++
		}
	}
	return n
}

// RetrySpec is a retry of delegate "d", attempts times, 1 ms apart.
func RetrySpec(attempts int32) *stubbornv1.ControlSpec {
	return &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
		Target: "d", Attempts: &attempts, BaseWait: durationpb.New(time.Millisecond), MaxWait: durationpb.New(time.Millisecond),
		OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL,
	}}}
}

// AskSpec is a retry that asks a person at its first failure.
func AskSpec() *stubbornv1.ControlSpec {
	zero := int32(0)
	return &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
		Target: "d", Attempts: &zero, BaseWait: durationpb.New(time.Millisecond),
		OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_ASK,
	}}}
}

// NotSent is a delegate, not idempotent, whose calls fail without
// reaching it: a retry may ask a person about them.
func NotSent() *controlstest.Delegates {
	return controlstest.NewDelegates(map[string][]controlstest.Reply{"d": {{Err: &controls.CallError{Code: codes.Unavailable, Message: "connection refused", NotSent: true}}}})
}

// Summaries lists every summary of ctx's tenant on m, by run id.
func Summaries(t *testing.T, ctx context.Context, m *runs.Manager) map[string]*stubbornv1.RunSummary {
	t.Helper()
	list, next, err := m.ListSummaries(ctx, runs.Filter{}, 100, "")
	require.NoError(t, err)
	require.Empty(t, next)
	out := map[string]*stubbornv1.RunSummary{}
	for _, s := range list {
		out[s.GetRunId()] = s
	}
	return out
}

// AwaitingOn starts a run on m that awaits a decision after one failed
// call, and waits until it does.
func AwaitingOn(t *testing.T, m *runs.Manager) string {
	t.Helper()
	st, err := Start(m, Ctx(t), "brief", AskSpec(), nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		got, err := m.Get(Ctx(t), st.GetRunId())
		return err == nil && got.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION
	}, 10*time.Second, 5*time.Millisecond)
	return st.GetRunId()
}

// JournalHas reports whether run id's journal has an event kind says.
func JournalHas(t *testing.T, store store.Store, id string, kind func(*stubbornv1.RunEvent) bool) bool {
	t.Helper()
	evs, err := store.Events(Ctx(t), id, 0)
	require.NoError(t, err)
	return slices.ContainsFunc(DecodeAll(t, evs), kind)
}

// Start starts a run of brief on m (Manager.Start).
func Start(m *runs.Manager, ctx context.Context, brief string, spec *stubbornv1.ControlSpec, opts *stubbornv1.RunOptions) (*stubbornv1.ControlState, error) {
	st, _, err := m.Start(ctx, runs.Task{Brief: brief}, spec, opts)
	return st, err
}

// StatesBucket opens the JetStream store's bucket of saved states.
func StatesBucket(t *testing.T, nc *nats.Conn) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := js.KeyValue(Ctx(t), "stubborn_runs")
	require.NoError(t, err)
	return kv
}

// SavedState reads the run's entry in the JetStream store's states bucket:
// nil when there is none.
func SavedState(t *testing.T, kv jetstream.KeyValue, id string) *stubbornv1.ControlState {
	t.Helper()
	e, err := kv.Get(Ctx(t), id)
	if err == jetstream.ErrKeyNotFound {
		return nil
	}
	require.NoError(t, err)
	st := &stubbornv1.ControlState{}
	require.NoError(t, proto.Unmarshal(e.Value(), st))
	return st
}

// StartAsking starts a run on m whose one attempt fails, so that it asks
// for a decision, and waits until that status is saved in states.
func StartAsking(t *testing.T, m *runs.Manager, g *Gated, states jetstream.KeyValue, brief string) string {
	t.Helper()
	ask := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{Target: "d", Attempts: new(int32)}}}
	st, err := Start(m, context.Background(), brief, ask, nil)
	require.NoError(t, err)
	g.Answer(brief, controlstest.Fail(codes.Unavailable, "busy"))
	require.Eventually(t, func() bool {
		saved := SavedState(t, states, st.GetRunId())
		return saved != nil && saved.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION
	}, 5*time.Second, time.Millisecond, "the wait for a decision is saved")
	return st.GetRunId()
}
