package delegates

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

var (
	transientErr = &controls.CallError{Code: codes.Unavailable, Message: "down"}
	permanentErr = &controls.CallError{Code: codes.InvalidArgument, Message: "bad"}
	http404      = &controls.CallError{Code: codes.Unknown, HTTPStatus: 404}
	cancelled    = &controls.CallError{Code: codes.Canceled}
)

// Each transition of the circuit breaker, driven by a fake clock.
func TestBreakerTransitions(t *testing.T) {
	type step struct {
		advance time.Duration
		// call: "ok", "transient", "permanent", "cancelled"; "refused"
		// expects the breaker to refuse.
		call  string
		state BreakerState // after the step
	}
	cfg := CircuitBreaker{ConsecutiveFailures: 3, Cooldown: Duration(10 * time.Second), Probes: 1}
	for _, tc := range []struct {
		name  string
		cfg   CircuitBreaker
		steps []step
	}{
		{"opens after consecutive transient failures", cfg, []step{
			{call: "transient", state: breakerClosed}, {call: "transient", state: breakerClosed},
			{call: "transient", state: breakerOpen}, {call: "refused", state: breakerOpen},
		}},
		{"an answer resets the count", cfg, []step{
			{call: "transient"}, {call: "transient"}, {call: "ok"}, {call: "transient"}, {call: "transient", state: breakerClosed},
		}},
		{"permanent answers count as answers", cfg, []step{
			{call: "transient"}, {call: "transient"}, {call: "permanent"}, {call: "transient"}, {call: "transient", state: breakerClosed},
		}},
		{"cancellations count for nothing", cfg, []step{
			{call: "transient"}, {call: "transient"}, {call: "cancelled"}, {call: "transient", state: breakerOpen},
		}},
		{"half-open after the cooldown; a probe's answer closes it", cfg, []step{
			{call: "transient"}, {call: "transient"}, {call: "transient", state: breakerOpen},
			{advance: 9 * time.Second, call: "refused", state: breakerOpen},
			{advance: time.Second, state: breakerHalfOpen},
			{call: "ok", state: breakerClosed},
		}},
		{"a probe's transient failure opens it again", cfg, []step{
			{call: "transient"}, {call: "transient"}, {call: "transient", state: breakerOpen},
			{advance: 10 * time.Second, call: "transient", state: breakerOpen},
			{advance: 5 * time.Second, call: "refused", state: breakerOpen},
		}},
		{"by ratio, once min_calls were made within the window",
			CircuitBreaker{FailureRatio: 0.5, MinCalls: 4, Window: Duration(time.Minute), Cooldown: Duration(time.Second)}, []step{
				{call: "transient"}, {call: "transient"}, {call: "ok", state: breakerClosed},
				{call: "transient", state: breakerOpen},
			}},
		{"the window forgets old calls",
			CircuitBreaker{FailureRatio: 0.5, MinCalls: 4, Window: Duration(time.Minute), Cooldown: Duration(time.Second)}, []step{
				{call: "transient"}, {call: "transient"}, {call: "ok"},
				{advance: 2 * time.Minute, call: "transient", state: breakerClosed},
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := controlstest.NewClock()
			b := newBreaker(tc.cfg, clock.Now)
			for i, s := range tc.steps {
				require.NoError(t, clock.Sleep(context.Background(), s.advance))
				if s.call != "" {
					gen, ok, why, _ := b.allow()
					if s.call == "refused" {
						require.False(t, ok, "step %d", i)
						assert.Contains(t, why, "circuit breaker")
					} else {
						require.True(t, ok, "step %d: %s", i, why)
						var err error
						switch s.call {
						case "transient":
							err = transientErr
						case "permanent":
							err = permanentErr
						case "cancelled":
							err = cancelled
						}
						counted, failed := breakerCounts(err, nil)
						b.done(gen, counted, failed)
					}
				}
				if s.state != breakerClosed || i == len(tc.steps)-1 {
					assert.Equal(t, s.state, b.State(), "after step %d", i)
				}
			}
		})
	}
}

// Half-open lets its probes through at once and refuses the others; a call
// sent before a change of state does not count after it.
func TestBreakerProbesAndGenerations(t *testing.T) {
	clock := controlstest.NewClock()
	b := newBreaker(CircuitBreaker{ConsecutiveFailures: 1, Cooldown: Duration(time.Second), Probes: 2}, clock.Now)
	early, ok, _, _ := b.allow()
	require.True(t, ok)
	g, _, _, _ := b.allow()
	require.NotNil(t, b.done(g, true, true), "opened")
	assert.Nil(t, b.done(early, true, false), "an answer from before the opening counts for nothing")
	require.NoError(t, clock.Sleep(context.Background(), time.Second))
	p1, ok, _, tr := b.allow()
	require.True(t, ok)
	require.NotNil(t, tr)
	assert.Equal(t, breakerHalfOpen, tr.To)
	p2, ok, _, _ := b.allow()
	require.True(t, ok)
	_, ok, why, _ := b.allow()
	require.False(t, ok, "a third call while two probes are in flight")
	assert.Contains(t, why, "probe")
	assert.Nil(t, b.done(p1, true, false))
	tr = b.done(p2, true, false)
	require.NotNil(t, tr)
	assert.Equal(t, breakerClosed, tr.To)
}

func newGuards(t *testing.T, clock controls.Clock, d Delegate) *Guards {
	t.Helper()
	g := NewGuards(clock)
	g.Configure(&Config{Delegates: []Delegate{d}})
	return g
}

// A bulkhead refuses a call once max_queue_wait has passed with every slot
// taken; a slot freed meanwhile lets the call through.
func TestBulkhead(t *testing.T) {
	ctx := context.Background()
	wait := Duration(50 * time.Millisecond)
	clock := controlstest.NewClock()
	g := newGuards(t, clock, Delegate{Name: "d", MaxConcurrent: 1, MaxQueueWait: &wait})
	var refused []stubbornv1.RefusedBy
	g.OnRefused = func(_ string, by stubbornv1.RefusedBy) { refused = append(refused, by) }
	done, err := g.Admit(ctx, "d")
	require.NoError(t, err)
	_, err = g.Admit(ctx, "d")
	var ce *controls.CallError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, stubbornv1.RefusedBy_REFUSED_BY_BULKHEAD, ce.RefusedBy)
	assert.True(t, ce.Refused)
	assert.True(t, ce.NotSent)
	assert.Contains(t, ce.Message, "1 calls in flight (max_concurrent)")
	assert.Equal(t, []time.Duration{50 * time.Millisecond}, clock.Sleeps(), "waited max_queue_wait")
	assert.Equal(t, []stubbornv1.RefusedBy{stubbornv1.RefusedBy_REFUSED_BY_BULKHEAD}, refused)
	done(nil, nil)
	done(nil, nil) // once only
	done2, err := g.Admit(ctx, "d")
	require.NoError(t, err, "the slot was given back")
	done2(nil, nil)

	// On the wall clock, a slot freed during the wait is taken.
	long := Duration(time.Minute)
	g = newGuards(t, nil, Delegate{Name: "d", MaxConcurrent: 1, MaxQueueWait: &long})
	first, err := g.Admit(ctx, "d")
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		_, err := g.Admit(ctx, "d")
		got <- err
	}()
	first(nil, nil)
	require.NoError(t, <-got)

	// A context that ends while the call waits ends the wait with its
	// error; one ended already is not admitted even to a free slot.
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		time.Sleep(10 * time.Millisecond)
		cancel()
	}()
	_, err = g.Admit(cctx, "d")
	assert.ErrorIs(t, err, context.Canceled)
	g = newGuards(t, nil, Delegate{Name: "d", MaxConcurrent: 1})
	_, err = g.Admit(cctx, "d")
	assert.ErrorIs(t, err, context.Canceled)

	// max_queue_wait 0 refuses at once.
	zero := Duration(0)
	clock = controlstest.NewClock()
	g = newGuards(t, clock, Delegate{Name: "d", MaxConcurrent: 1, MaxQueueWait: &zero})
	_, err = g.Admit(ctx, "d")
	require.NoError(t, err)
	_, err = g.Admit(ctx, "d")
	require.ErrorAs(t, err, &ce)
	assert.Empty(t, clock.Sleeps())
}

// requests_per_minute: over the limit a call waits until the minute's
// oldest call ages out, or is refused when that is past max_queue_wait.
func TestRequestsPerMinute(t *testing.T) {
	ctx := context.Background()
	clock := controlstest.NewClock()
	wait := Duration(time.Minute)
	g := newGuards(t, clock, Delegate{Name: "d", RequestsPerMinute: 2, MaxQueueWait: &wait})
	for range 2 {
		done, err := g.Admit(ctx, "d")
		require.NoError(t, err)
		done(nil, nil)
	}
	require.NoError(t, clock.Sleep(ctx, 20*time.Second))
	done, err := g.Admit(ctx, "d")
	require.NoError(t, err, "waited for the first minute's calls to age out")
	done(nil, nil)
	// A second's calls count for 61 whole seconds: no 60 seconds ever
	// hold more than requests_per_minute, whatever their offsets.
	assert.Equal(t, []time.Duration{20 * time.Second, 41 * time.Second}, clock.Sleeps())

	short := Duration(time.Second)
	g = newGuards(t, clock, Delegate{Name: "d", RequestsPerMinute: 1, MaxQueueWait: &short})
	_, err = g.Admit(ctx, "d")
	require.NoError(t, err)
	_, err = g.Admit(ctx, "d")
	var ce *controls.CallError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, stubbornv1.RefusedBy_REFUSED_BY_RATE_LIMIT, ce.RefusedBy)
	assert.Contains(t, ce.Message, "requests_per_minute 1")
}

// tokens_per_minute counts the usage model answers report.
func TestTokensPerMinute(t *testing.T) {
	ctx := context.Background()
	clock := controlstest.NewClock()
	zero := Duration(0)
	g := newGuards(t, clock, Delegate{Name: "m", TokensPerMinute: 100, MaxQueueWait: &zero})
	usage := func(fields map[string]any) *stubbornv1.Result {
		v, err := structpb.NewValue(map[string]any{"usage": fields})
		require.NoError(t, err)
		return &stubbornv1.Result{Data: v}
	}
	done, err := g.Admit(ctx, "m")
	require.NoError(t, err)
	done(usage(map[string]any{"prompt_tokens": 60, "completion_tokens": 50}), nil)
	_, err = g.Admit(ctx, "m")
	var ce *controls.CallError
	require.ErrorAs(t, err, &ce, "110 tokens used of 100")
	assert.Equal(t, stubbornv1.RefusedBy_REFUSED_BY_RATE_LIMIT, ce.RefusedBy)
	require.NoError(t, clock.Sleep(ctx, 61*time.Second))
	_, err = g.Admit(ctx, "m")
	require.NoError(t, err, "a minute later")

	assert.EqualValues(t, 7, tokensUsed(usage(map[string]any{"total_tokens": 7, "input_tokens": 1})))
	assert.EqualValues(t, 5, tokensUsed(usage(map[string]any{"input_tokens": 2, "output_tokens": 3})))
	assert.EqualValues(t, 0, tokensUsed(&stubbornv1.Result{Text: "no usage"}))
}

// The guards admit through the breaker, report its transitions, say so in
// the note of the call that changed it, and keep their state across a
// Configure with the same settings.
func TestGuardsBreaker(t *testing.T) {
	ctx := context.Background()
	clock := controlstest.NewClock()
	d := Delegate{Name: "d", CircuitBreaker: &CircuitBreaker{ConsecutiveFailures: 2, Cooldown: Duration(time.Second)}}
	g := newGuards(t, clock, d)
	var trs []Transition
	g.OnTransition = func(_ string, tr Transition) { trs = append(trs, tr) }
	for i := range 2 {
		done, err := g.Admit(ctx, "d")
		require.NoError(t, err)
		note := done(nil, transientErr)
		if i == 1 {
			assert.Equal(t, "circuit breaker closed → open: 2 transient failures in a row", note)
		}
	}
	g.Configure(&Config{Delegates: []Delegate{d}})
	_, err := g.Admit(ctx, "d")
	var ce *controls.CallError
	require.ErrorAs(t, err, &ce, "still open after a Configure with the same settings")
	assert.Equal(t, stubbornv1.RefusedBy_REFUSED_BY_CIRCUIT_BREAKER, ce.RefusedBy)
	desc := &stubbornv1.DelegateDescription{}
	g.describe("d", desc)
	assert.Equal(t, stubbornv1.BreakerState_BREAKER_STATE_OPEN, desc.GetCircuitBreaker())
	assert.Equal(t, "2 transient failures in a row", desc.GetCircuitBreakerReason())

	require.NoError(t, clock.Sleep(ctx, time.Second))
	done, err := g.Admit(ctx, "d")
	require.NoError(t, err)
	note := done(&stubbornv1.Result{}, nil)
	assert.Contains(t, note, "this call was a probe")
	assert.Contains(t, note, "half-open → closed")
	require.Len(t, trs, 3)
	assert.Equal(t, []BreakerState{breakerOpen, breakerHalfOpen, breakerClosed}, []BreakerState{trs[0].To, trs[1].To, trs[2].To})

	// A delegate without guards is admitted as is.
	done, err = g.Admit(ctx, "other")
	require.NoError(t, err)
	assert.Empty(t, done(nil, errors.New("x")))

	// retry_on decides what the breaker counts: here 404 is transient.
	d.RetryOn = &RetryOn{HTTPStatuses: []int32{404}}
	d.CircuitBreaker = &CircuitBreaker{ConsecutiveFailures: 1}
	g = newGuards(t, clock, d)
	done, err = g.Admit(ctx, "d")
	require.NoError(t, err)
	assert.Contains(t, done(nil, http404), "→ open")
}

// The guards' keys in YAML, and their checks naming the key.
func TestGuardsConfig(t *testing.T) {
	cfg, err := Parse([]byte(`
delegates:
  - name: model
    target: "127.0.0.1:1"
    circuit_breaker: {consecutive_failures: 3, cooldown: 10s}
    max_concurrent: 4
    max_queue_wait: 0s
    requests_per_minute: 60
    tokens_per_minute: 100000
    retry_on: {grpc_codes: [unavailable, INTERNAL], http_statuses: [429, 503]}
`))
	require.NoError(t, err)
	d := cfg.Delegates[0]
	assert.Equal(t, 3, d.CircuitBreaker.ConsecutiveFailures)
	assert.Equal(t, 10*time.Second, d.CircuitBreaker.Cooldown.Std())
	assert.Equal(t, 4, d.MaxConcurrent)
	require.NotNil(t, d.MaxQueueWait)
	assert.Zero(t, *d.MaxQueueWait)
	assert.Equal(t, 60, d.RequestsPerMinute)
	assert.EqualValues(t, 100000, d.TokensPerMinute)
	assert.Equal(t, []string{"unavailable", "INTERNAL"}, d.Info().RetryOn.GetGrpcCodes())

	_, err = Parse([]byte(`
delegates:
  - name: bad
    target: "127.0.0.1:1"
    circuit_breaker: {failure_ratio: 1.5, probes: -1}
    max_concurrent: -1
    retry_on: {grpc_codes: [OK, nope], http_statuses: [302, 503, 503]}
`))
	require.Error(t, err)
	for _, want := range []string{
		`delegates[0] ("bad"): circuit_breaker.failure_ratio: must be between 0 and 1, got 1.5`,
		`circuit_breaker.probes: must be between 0 and 1000, got -1`,
		`max_concurrent: must be between 0 and 1048576, got -1`,
		`retry_on.grpc_codes[0]: OK is not a failure`,
		`retry_on.grpc_codes[1]: "nope" is not a gRPC code name`,
		`retry_on.http_statuses[0]: must be between 400 and 599, got 302`,
		`retry_on.http_statuses[2]: 503 is listed twice`,
	} {
		assert.ErrorContains(t, err, want)
	}
}

// tickingClock moves on by step each time it is read, as time does between
// two reads of a real clock.
type tickingClock struct {
	*controlstest.Clock
	step time.Duration
}

func (c tickingClock) Now() time.Time {
	now := c.Clock.Now()
	_ = c.Clock.Sleep(context.Background(), c.step)
	return now
}

// A call that meets the breaker just as its cooldown ends does not leave a
// probe counted that never ends: the breaker lets a later call through.
func TestBreakerCooldownBoundary(t *testing.T) {
	ctx := context.Background()
	base := controlstest.NewClock()
	d := Delegate{Name: "d", CircuitBreaker: &CircuitBreaker{ConsecutiveFailures: 1, Cooldown: Duration(time.Second)}}
	g := newGuards(t, base, d)
	done, err := g.Admit(ctx, "d")
	require.NoError(t, err)
	done(nil, transientErr)
	// Each read of the clock now moves it on by a millisecond; the next
	// Admit reads it across the end of the cooldown.
	require.NoError(t, base.Sleep(ctx, time.Second-time.Millisecond))
	g.clock = tickingClock{base, time.Millisecond}
	g.get("d").breaker.now = g.clock.Now
	if done, err := g.Admit(ctx, "d"); err == nil {
		done(&stubbornv1.Result{}, nil)
	}
	done, err = g.Admit(ctx, "d")
	require.NoError(t, err, "not stuck half-open behind a probe that never ends")
	done(&stubbornv1.Result{}, nil)
	assert.Equal(t, breakerClosed, g.get("d").breaker.State())
}

// A call the bulkhead or the breaker refuses is not counted by the rate
// limits: only calls sent are.
func TestRefusedCallsDoNotUseTheRate(t *testing.T) {
	ctx := context.Background()
	zero := Duration(0)
	g := newGuards(t, controlstest.NewClock(), Delegate{Name: "d", MaxConcurrent: 1, RequestsPerMinute: 3, MaxQueueWait: &zero})
	held, err := g.Admit(ctx, "d")
	require.NoError(t, err)
	for range 2 {
		_, err := g.Admit(ctx, "d")
		var ce *controls.CallError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, stubbornv1.RefusedBy_REFUSED_BY_BULKHEAD, ce.RefusedBy)
	}
	held(nil, nil)
	for i := range 2 {
		done, err := g.Admit(ctx, "d")
		require.NoError(t, err, "call %d: three sent in the minute, the limit", i+2)
		done(nil, nil)
	}
	_, err = g.Admit(ctx, "d")
	var ce *controls.CallError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, stubbornv1.RefusedBy_REFUSED_BY_RATE_LIMIT, ce.RefusedBy)
	assert.Contains(t, ce.Message, "(requests_per_minute 3)")
}

// A Configure changes a guard part by part: a breaker whose settings did
// not change stays open, a bulkhead keeps counting its calls in flight.
func TestConfigureKeepsLiveState(t *testing.T) {
	ctx := context.Background()
	clock := controlstest.NewClock()
	d := Delegate{Name: "d", MaxConcurrent: 2, CircuitBreaker: &CircuitBreaker{ConsecutiveFailures: 1, Cooldown: Duration(time.Hour)}}
	g := newGuards(t, clock, d)
	a, err := g.Admit(ctx, "d")
	require.NoError(t, err)
	b, err := g.Admit(ctx, "d")
	require.NoError(t, err)
	b(nil, transientErr) // opens the breaker
	d.RetryOn = &RetryOn{GRPCCodes: []string{"UNAVAILABLE"}}
	d.MaxConcurrent = 1
	g.Configure(&Config{Delegates: []Delegate{d}})
	desc := &stubbornv1.DelegateDescription{}
	g.describe("d", desc)
	assert.Equal(t, stubbornv1.BreakerState_BREAKER_STATE_OPEN, desc.GetCircuitBreaker(), "retry_on changed, the breaker did not")
	assert.EqualValues(t, 1, desc.GetInFlight(), "a's call is still in flight")
	d.CircuitBreaker = nil
	g.Configure(&Config{Delegates: []Delegate{d}})
	zero := Duration(0)
	d.MaxQueueWait = &zero
	g.Configure(&Config{Delegates: []Delegate{d}})
	_, err = g.Admit(ctx, "d")
	var ce *controls.CallError
	require.ErrorAs(t, err, &ce, "max_concurrent 1, and a's call holds it")
	assert.Equal(t, stubbornv1.RefusedBy_REFUSED_BY_BULKHEAD, ce.RefusedBy)
	a(nil, nil)
	_, err = g.Admit(ctx, "d")
	require.NoError(t, err)
}
