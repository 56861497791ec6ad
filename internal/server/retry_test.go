package server_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// failing returns a delegate that fails its first n calls with err, then
// answers "ok", and records every request.
func failing(n int32, err func() error) *demo.Scripted {
	var calls atomic.Int32
	return demo.NewScripted(func(context.Context, *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		if calls.Add(1) <= n {
			return nil, err()
		}
		return &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{Text: "ok"}}, nil
	})
}

func retryRun(target string, spec func(*stubbornv1.RetrySpec)) *stubbornv1.RunRequest {
	r := &stubbornv1.RetrySpec{Target: target}
	if spec != nil {
		spec(r)
	}
	return &stubbornv1.RunRequest{TaskBrief: "do it", Retry: r}
}

func events(evs []*stubbornv1.RunEvent, kind string) []*stubbornv1.RunEvent {
	var out []*stubbornv1.RunEvent
	for _, ev := range evs {
		if controlstest.Kind(ev) == kind {
			out = append(out, ev)
		}
	}
	return out
}

func TestRetryEndToEnd(t *testing.T) {
	unavailable := func() error { return status.Error(codes.Unavailable, "try later") }
	hinted := func() error {
		st, err := status.New(codes.Unavailable, "busy").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(2 * time.Second)})
		if err != nil {
			panic(err)
		}
		return st.Err()
	}
	twice := failing(2, unavailable)
	clock := controlstest.NewClock()
	e := startWith(t, setup{
		clock: clock,
		extra: map[string]stubbornv1.DelegateServiceServer{
			"twice":     twice,
			"invalid":   failing(100, func() error { return status.Error(codes.InvalidArgument, "bad brief") }),
			"hinted":    failing(100, hinted),
			"unsafe":    failing(100, unavailable),
			"exhausted": failing(100, unavailable),
		},
		notIdempotent: []string{"unsafe"},
	})
	ctx := testCtx(t)

	t.Run("UNAVAILABLE twice then success: two backoffs within their bounds", func(t *testing.T) {
		s, err := e.client.Run(ctx, retryRun("twice", nil))
		require.NoError(t, err)
		evs := collect(t, s)
		st := lastState(t, evs)
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus())
		assert.EqualValues(t, 3, st.GetAttempts())
		backoffs := events(evs, "backoff_scheduled")
		require.Len(t, backoffs, 2)
		for i, b := range backoffs {
			bo := b.GetBackoffScheduled()
			bound := time.Second << i // base 1s · 2^(n-1)
			assert.Equal(t, bound, bo.GetBound().AsDuration(), "retry %d", i+1)
			assert.LessOrEqual(t, bo.GetWait().AsDuration(), bound)
			assert.GreaterOrEqual(t, bo.GetWait().AsDuration(), time.Duration(0))
			assert.Equal(t, st.GetAttemptLog()[i+1].GetWaitBefore().AsDuration(), bo.GetWait().AsDuration(), "the wait announced is the wait before the attempt")
		}
		// Same idempotency key on every attempt.
		got := twice.Received()
		require.Len(t, got, 3)
		for _, r := range got {
			assert.Equal(t, st.GetRunId(), r.Request.GetIdempotencyKey())
			assert.Equal(t, "do it", r.Request.GetBrief())
		}
	})

	t.Run("INVALID_ARGUMENT: one attempt, no retry, reason recorded", func(t *testing.T) {
		s, err := e.client.Run(ctx, retryRun("invalid", nil))
		require.NoError(t, err)
		evs := collect(t, s)
		st := lastState(t, evs)
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, st.GetStatus())
		assert.EqualValues(t, 1, st.GetAttempts())
		assert.Empty(t, events(evs, "backoff_scheduled"))
		require.Len(t, st.GetFailureHistory(), 1)
		assert.Equal(t, "not transient: INVALID_ARGUMENT", st.GetFailureHistory()[0].GetNotRetriedReason())
		assert.Equal(t, stubbornv1.NotRetried_NOT_RETRIED_NOT_TRANSIENT, st.GetFailureHistory()[0].GetNotRetriedCode())
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_NOT_RETRIED, st.GetStatusReasonCode())
	})

	t.Run("RetryInfo 2s over max_wait 1s ends the retries with that reason", func(t *testing.T) {
		s, err := e.client.Run(ctx, retryRun("hinted", func(r *stubbornv1.RetrySpec) { r.MaxWait = durationpb.New(time.Second) }))
		require.NoError(t, err)
		st := lastState(t, collect(t, s))
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, st.GetStatus())
		assert.EqualValues(t, 1, st.GetAttempts())
		assert.Contains(t, st.GetStatusReason(), "exceeds max_wait")
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_NOT_RETRIED, st.GetStatusReasonCode())
		assert.Equal(t, stubbornv1.NotRetried_NOT_RETRIED_HINT_OVER_CAP, st.GetFailureHistory()[0].GetNotRetriedCode())
		assert.EqualValues(t, 2, st.GetAttemptLog()[0].GetError().GetRetryHint().AsDuration()/time.Second)
	})

	t.Run("a delegate neither idempotent nor read_only is not retried", func(t *testing.T) {
		s, err := e.client.Run(ctx, retryRun("unsafe", nil))
		require.NoError(t, err)
		st := lastState(t, collect(t, s))
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, st.GetStatus())
		assert.Contains(t, st.GetFailureHistory()[0].GetNotRetriedReason(), "neither idempotent nor read_only")
		assert.Equal(t, stubbornv1.NotRetried_NOT_RETRIED_NOT_IDEMPOTENT, st.GetFailureHistory()[0].GetNotRetriedCode())
	})

	t.Run("ASK: awaiting a decision, RETRY starts a new round, FAIL ends it", func(t *testing.T) {
		res, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{
			TaskBrief: "do it",
			Retry:     &stubbornv1.RetrySpec{Target: "exhausted", Attempts: ptr(int32(1))},
		})
		require.NoError(t, err)
		w, err := e.client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: res.GetRunId()})
		require.NoError(t, err)
		waitFor := func(kind string) *stubbornv1.RunEvent {
			for {
				m, err := w.Recv()
				require.NoError(t, err)
				if controlstest.Kind(m.GetEvent()) == kind {
					return m.GetEvent()
				}
			}
		}
		req := waitFor("decision_requested").GetDecisionRequested()
		assert.Len(t, req.GetFailureHistory(), 2, "the request carries the failure history")
		got, err := e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: res.GetRunId()})
		require.NoError(t, err)
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, got.GetState().GetStatus())
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED, got.GetState().GetStatusReasonCode())
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED, req.GetReasonCode())

		_, err = e.client.DecideRun(ctx, &stubbornv1.DecideRunRequest{RunId: res.GetRunId(), Decision: stubbornv1.Decision_DECISION_RETRY})
		require.NoError(t, err)
		assert.Equal(t, stubbornv1.Decision_DECISION_RETRY, waitFor("decision_received").GetDecisionReceived().GetDecision())
		b := waitFor("backoff_scheduled").GetBackoffScheduled()
		assert.Equal(t, time.Second, b.GetBound().AsDuration(), "the new round's backoff starts from the base")
		waitFor("decision_requested") // the new round ran out too

		_, err = e.client.DecideRun(ctx, &stubbornv1.DecideRunRequest{RunId: res.GetRunId(), Decision: stubbornv1.Decision_DECISION_FAIL})
		require.NoError(t, err)
		st := waitFor("run_finished").GetRunFinished().GetState()
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, st.GetStatus())
		assert.EqualValues(t, 3, st.GetAttempts(), "a try and one retry, then the round RETRY granted: one more retry")
		assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_DECISION_FAIL, st.GetStatusReasonCode())

		_, err = e.client.DecideRun(ctx, &stubbornv1.DecideRunRequest{RunId: res.GetRunId(), Decision: stubbornv1.Decision_DECISION_RETRY})
		assert.Equal(t, codes.FailedPrecondition, status.Code(err), "a finished run is not waiting")
	})

	t.Run("on_exhausted FAIL ends the run FAILED at once", func(t *testing.T) {
		s, err := e.client.Run(ctx, retryRun("exhausted", func(r *stubbornv1.RetrySpec) {
			r.Attempts = ptr(int32(2))
			r.OnExhausted = stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL
		}))
		require.NoError(t, err)
		evs := collect(t, s)
		st := lastState(t, evs)
		assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, st.GetStatus())
		assert.EqualValues(t, 3, st.GetAttempts())
		assert.Empty(t, events(evs, "decision_requested"))
	})

	// Every wait went through the fake clock: nothing slept for real.
	assert.NotEmpty(t, clock.Sleeps())
}

func TestRetryBudgetSuppressesRetries(t *testing.T) {
	e := startWith(t, setup{
		clock:  controlstest.NewClock(),
		budget: &delegates.RetryBudget{MaxTokens: 4, TokenRatio: 0.5},
		extra: map[string]stubbornv1.DelegateServiceServer{
			"overloaded": failing(1000, func() error { return status.Error(codes.ResourceExhausted, "overloaded") }),
		},
	})
	ctx := testCtx(t)
	s, err := e.client.Run(ctx, retryRun("overloaded", func(r *stubbornv1.RetrySpec) { r.OnExhausted = stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL }))
	require.NoError(t, err)
	st := lastState(t, collect(t, s))
	// 4 tokens: each failure costs one and retries stop at or below 2, so
	// the first try and one retry happen, out of the 7 allowed.
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, st.GetStatus())
	assert.EqualValues(t, 2, st.GetAttempts())
	last := st.GetFailureHistory()[len(st.GetFailureHistory())-1]
	assert.Equal(t, "retry budget exhausted", last.GetNotRetriedReason())
	assert.Equal(t, "retry budget exhausted", st.GetStatusReason())
	assert.Equal(t, stubbornv1.NotRetried_NOT_RETRIED_BUDGET, last.GetNotRetriedCode())
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_NOT_RETRIED, st.GetStatusReasonCode())
}

func ptr[T any](v T) *T { return &v }
