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

	"github.com/stubbornhq/stubborn/controls"
	"github.com/stubbornhq/stubborn/controls/controlstest"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/runs"
)

// byName is a Presets from a map, as a server's config gives them.
type byName map[string]*stubbornv1.ControlSpec

func (p byName) Preset(name string) (*stubbornv1.ControlSpec, bool) {
	s, ok := p[name]
	return s, ok
}

func presetRetryOf(target string) *stubbornv1.ControlSpec {
	attempts := int32(2)
	return &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
		Target: target, Attempts: &attempts, BaseWait: durationpb.New(0), OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL,
	}}}
}

// A config reload between a crash and the takeover changed the preset a
// run's chain names ("p": retry of x, then of y). The server that takes
// the run over replays its journal, finds the control asking for attempt
// 2 to y where the journal has it to x, and ends the run FAILED,
// NONDETERMINISTIC_REPLAY, logged at ERROR: y is never called, nor is the
// chain's next delegate, and x, in flight at the crash, is not called
// again. Before, the resumed run took x's recorded start for y's.
func TestARunWhosePresetChangedBeforeItsTakeoverEndsNondeterministic(t *testing.T) {
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			const lease = 300 * time.Millisecond
			open := newStore(t, lease)
			d := controlstest.NewDelegates(map[string][]controlstest.Reply{
				"x": {{Hang: true}}, "y": {controlstest.OK("y")}, "b": {controlstest.OK("b")},
			})
			for _, n := range []string{"x", "y", "b"} {
				d.SetInfo(n, controls.DelegateInfo{Idempotent: true})
			}
			spec := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"p", "b"}}}}
			a := newManager(t, d, runs.Config{Store: open(), Lease: lease, Owner: "a", Presets: byName{"p": presetRetryOf("x")}})
			st, err := a.Start(ctxFor(t), "brief", spec, nil)
			require.NoError(t, err)
			require.Eventually(t, func() bool { return len(d.Calls()) == 1 }, 5*time.Second, time.Millisecond, "x is called")
			a.Kill()

			h, logger := runs.NewCapturedLogs()
			b := newManager(t, d, runs.Config{Store: open(), Lease: lease, Owner: "b", Logger: logger, Presets: byName{"p": presetRetryOf("y")}})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var evs []*stubbornv1.RunEvent
			require.NoError(t, b.Watch(ctx, st.GetRunId(), 0, decoding(func(ev *stubbornv1.RunEvent) error {
				evs = append(evs, ev)
				return nil
			})))
			end := final(t, evs)
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, end.GetStatus())
			assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_NONDETERMINISTIC_REPLAY, end.GetStatusReasonCode())
			assert.Equal(t, `nondeterministic replay: the journal's attempt 2 went to "x" at chain[0], the control now asks for "y" at chain[0]`, end.GetStatusReason())
			calls := d.Calls()
			require.Len(t, calls, 1, "only x's call, before the crash: %v", calls)
			assert.Equal(t, "x", calls[0].Delegate)
			assert.True(t, proto.Equal(end, controls.Fold(evs)), "the journal folds to the final state:\n%v\n%v", controls.Fold(evs), end)
			line, ok := h.Find(slog.LevelError, "run ended: its replay went another way than its journal")
			assert.True(t, ok, "logged at ERROR: %v", h.Lines(slog.LevelInfo))
			assert.Equal(t, st.GetRunId(), line.Attrs["run_id"])
		})
	}
}
