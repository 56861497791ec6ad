package runs_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
	"github.com/stubbornhq/stubborn/internal/runs/memstore"
	runstore "github.com/stubbornhq/stubborn/internal/runs/store"
)

func presetRetryOf(target string) *stubbornv1.ControlSpec {
	attempts := int32(2)
	return &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
		Target: target, Attempts: &attempts, BaseWait: durationpb.New(0), OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL,
	}}}
}

// presetRun starts, on a, a chain of preset "p" (a retry of x, whose first
// call hangs) and b, waits for x's call and kills a: a run taken over
// mid-preset.
func presetRun(t *testing.T, store runstore.Store, lease time.Duration, d *controlstest.Delegates) string {
	t.Helper()
	spec := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"p", "b"}}}}
	a := runstest.NewManager(t, d, runs.Config{Store: store, Lease: lease, Owner: "a", Presets: controls.PresetMap{"p": presetRetryOf("x")}})
	st, err := runstest.Start(a, runstest.Ctx(t), "brief", spec, nil)
	require.NoError(t, err)
	assert.True(t, proto.Equal(presetRetryOf("x"), st.GetPresets()["p"]), "the run records the presets it names: %v", st.GetPresets())
	require.Eventually(t, func() bool { return len(d.Calls()) == 1 }, 5*time.Second, time.Millisecond, "x is called")
	a.Kill()
	return st.GetRunId()
}

func presetDelegates() *controlstest.Delegates {
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{
		"x": {{Hang: true}, controlstest.OK("x")}, "y": {controlstest.OK("y")}, "b": {controlstest.OK("b")},
	})
	for _, n := range []string{"x", "y", "b"} {
		d.SetInfo(n, controls.DelegateInfo{Idempotent: true})
	}
	return d
}

func watchToEnd(t *testing.T, m *runs.Manager, id string) []*stubbornv1.RunEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var evs []*stubbornv1.RunEvent
	require.NoError(t, m.Watch(ctx, id, 0, runstest.Decoding(func(ev *stubbornv1.RunEvent) error {
		evs = append(evs, ev)
		return nil
	})))
	return evs
}

// A config reload between a crash and the takeover changed the preset a
// run's chain names ("p": retry of x, then of y). The server that takes
// the run over replays the tree the run was accepted with, recorded in
// its state: x, in flight at the crash, is called again (it is
// idempotent), answers, and y is never called. Before, the resumed run
// took x's recorded start for y's.
func TestARunReplaysThePresetsItWasAcceptedWith(t *testing.T) {
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			const lease = 300 * time.Millisecond
			open := newStore(t, lease)
			d := presetDelegates()
			id := presetRun(t, open(), lease, d)
			b := runstest.NewManager(t, d, runs.Config{Store: open(), Lease: lease, Owner: "b", Presets: controls.PresetMap{"p": presetRetryOf("y")}})
			evs := watchToEnd(t, b, id)
			end := runstest.Final(t, evs)
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, end.GetStatus(), end.GetStatusReason())
			assert.Equal(t, "x", end.GetResult().GetText())
			assert.Empty(t, d.CallsTo("y"), "the new preset's delegate is never called")
			assert.Len(t, d.CallsTo("x"), 2, "x again, after its interrupted call")
			assert.Empty(t, d.CallsTo("b"))
			assert.True(t, proto.Equal(end, controls.Fold(evs)), "the journal folds to the final state")
		})
	}
}

// The backstop: a run accepted by a release that did not record its
// presets (its journal copied here without them), whose preset changed
// before the takeover. The resumed run's control asks for attempt 2 to y
// where the journal has it to x: the run ends FAILED,
// NONDETERMINISTIC_REPLAY, logged at ERROR, and nothing is called (not y,
// not the chain's next delegate, not x again).
func TestAnOlderRunWhosePresetChangedEndsNondeterministic(t *testing.T) {
	const lease = 300 * time.Millisecond
	d := presetDelegates()
	mem := memstore.NewMemory(lease)
	id := presetRun(t, mem, lease, d)

	older := memstore.NewMemory(lease)
	stored, err := mem.Events(runstest.Ctx(t), id, 0)
	require.NoError(t, err)
	for i, e := range stored {
		ev := &stubbornv1.RunEvent{}
		require.NoError(t, proto.Unmarshal(e.Data, ev))
		if st := ev.GetRunStarted().GetState(); st != nil {
			st.Presets = nil // as an older release recorded it
			data, err := proto.Marshal(st)
			require.NoError(t, err)
			require.NoError(t, older.Claim(runstest.Ctx(t), id, "a", data))
		}
		stored[i], err = runstore.EncodeEvent(ev)
		require.NoError(t, err)
	}
	require.NoError(t, older.Append(runstest.Ctx(t), nil, stored...))

	h, logger := runstest.NewCapturedLogs()
	b := runstest.NewManager(t, d, runs.Config{Store: older, Lease: lease, Owner: "b", SoleOwner: true, Logger: logger,
		Presets: controls.PresetMap{"p": presetRetryOf("y")}})
	evs := watchToEnd(t, b, id)
	end := runstest.Final(t, evs)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, end.GetStatus())
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_NONDETERMINISTIC_REPLAY, end.GetStatusReasonCode())
	assert.Equal(t, `nondeterministic replay: the journal's attempt 2 went to "x" at chain[0], the control now asks for "y" at chain[0]`, end.GetStatusReason())
	assert.Len(t, d.Calls(), 1, "only x's call, before the crash: %v", d.Calls())
	assert.True(t, proto.Equal(end, controls.Fold(evs)), "the journal folds to the final state")
	line, ok := h.Find(slog.LevelError, "run ended: its replay went another way than its journal")
	require.True(t, ok, "logged at ERROR: %v", h.Lines(slog.LevelInfo))
	assert.Equal(t, id, line.Attrs["run_id"])
}
