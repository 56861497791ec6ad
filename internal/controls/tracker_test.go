package controls_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

func TestTracker(t *testing.T) {
	t.Parallel()

	t.Run("a nested control's attempts, failures and events carry its path", func(t *testing.T) {
		t.Parallel()
		f := newFixture(map[string][]controlstest.Reply{"target": {unavailable("down"), ok("done")}})
		f.env.Path = "chain[0]"
		r := f.run(t, testCtx(t), learning(nil))
		require.Equal(t, succeeded, r.out.Status)
		for _, a := range r.state.GetAttemptLog() {
			assert.Equal(t, "chain[0]", a.GetPath())
		}
		for _, rec := range r.state.GetFailureHistory() {
			assert.Equal(t, "chain[0]", rec.GetPath())
		}
		for _, ev := range f.events.All() {
			switch ev.GetKind().(type) {
			case *stubbornv1.RunEvent_RunStarted, *stubbornv1.RunEvent_RunFinished:
				assert.Empty(t, ev.GetPath(), "the run's own events")
			default:
				assert.Equal(t, "chain[0]", ev.GetPath(), controlstest.Kind(ev))
			}
		}
	})

	t.Run("Finish has an effect only once", func(t *testing.T) {
		t.Parallel()
		var events controlstest.Events
		tr := controls.NewTracker(&stubbornv1.ControlState{RunId: "r"}, controlstest.NewClock(), events.Sink)
		tr.Start()
		tr.Finish(cancelled, nil, "", "cancelled", stubbornv1.StatusReason_STATUS_REASON_CANCELLED)
		first := tr.Snapshot()
		tr.Finish(succeeded, &stubbornv1.Result{Text: "late"}, "x", "", stubbornv1.StatusReason_STATUS_REASON_UNSPECIFIED)
		again := tr.Snapshot()
		assert.Equal(t, cancelled, first.GetStatus())
		assert.Equal(t, cancelled, again.GetStatus())
		assert.Nil(t, again.GetResult())
		assert.Equal(t, "cancelled", again.GetStatusReason())
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_CANCELLED, again.GetStatusReasonCode())
		assert.Equal(t, []string{"run_started", "run_finished"}, events.Kinds())
	})

	t.Run("nothing follows run_finished", func(t *testing.T) {
		t.Parallel()
		// A race's losing preset may report its attempt after the race
		// returned and the run finished.
		var events controlstest.Events
		tr := controls.NewTracker(&stubbornv1.ControlState{RunId: "r"}, controlstest.NewClock(), events.Sink)
		tr.Start()
		n := tr.BeginAttempt("race[0]", "slow", "brief", 0)
		tr.Finish(succeeded, &stubbornv1.Result{Text: "fast won"}, "fast", "", stubbornv1.StatusReason_STATUS_REASON_UNSPECIFIED)
		tr.EndAttempt(n, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_CANCELLED, nil, context.Canceled, "")
		tr.Failure(&stubbornv1.FailureRecord{Attempt: n, Delegate: "slow"}, false, "")
		assert.Equal(t, []string{"run_started", "attempt_started", "run_finished"}, events.Kinds())
		assert.Equal(t, succeeded, tr.Snapshot().GetStatus())
	})

	t.Run("Snapshot is a copy", func(t *testing.T) {
		t.Parallel()
		tr := controls.NewTracker(&stubbornv1.ControlState{RunId: "r"}, controlstest.NewClock(), nil)
		s := tr.Snapshot()
		s.RunId = "changed"
		assert.Equal(t, "r", tr.Snapshot().GetRunId())
	})

	t.Run("Decide is refused when no decision is awaited", func(t *testing.T) {
		t.Parallel()
		tr := controls.NewTracker(&stubbornv1.ControlState{RunId: "r"}, controlstest.NewClock(), nil)
		assert.ErrorIs(t, tr.Decide(stubbornv1.Decision_DECISION_RETRY, nil), controls.ErrNotAwaitingDecision)
	})

	t.Run("AwaitDecision returns what Decide answers", func(t *testing.T) {
		t.Parallel()
		var events controlstest.Events
		requested := make(chan struct{})
		var waiting *stubbornv1.ControlState // as the decision is requested
		tr := controls.NewReplayTracker(&stubbornv1.ControlState{RunId: "r"}, controlstest.NewClock(), func(ev *stubbornv1.RunEvent, st *stubbornv1.ControlState) {
			events.Sink(proto.CloneOf(ev))
			if ev.GetDecisionRequested() != nil {
				waiting = proto.CloneOf(st)
				close(requested)
			}
		}, nil)
		type answer struct {
			d        stubbornv1.Decision
			timedOut bool
			err      error
		}
		got := make(chan answer, 1)
		ctx := testCtx(t)
		go func() {
			d, timedOut, err := tr.AwaitDecision(ctx, "", "retries exhausted", stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED, 0)
			got <- answer{d, timedOut, err}
		}()
		recv(t, requested, "decision_requested")
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, waiting.GetStatus())
		assert.Equal(t, "retries exhausted", waiting.GetStatusReason())
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED, waiting.GetStatusReasonCode())
		req := events.All()[0].GetDecisionRequested()
		assert.Equal(t, "retries exhausted", req.GetReason())
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED, req.GetReasonCode())
		require.NoError(t, tr.Decide(stubbornv1.Decision_DECISION_RETRY, nil))
		assert.Equal(t, answer{d: stubbornv1.Decision_DECISION_RETRY}, recv(t, got, "AwaitDecision to return"))
		assert.Equal(t, []string{"decision_requested", "decision_received"}, events.Kinds())
		decided := tr.Snapshot()
		assert.Empty(t, decided.GetStatusReason(), "decided, the run goes on")
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_UNSPECIFIED, decided.GetStatusReasonCode())
	})
}
