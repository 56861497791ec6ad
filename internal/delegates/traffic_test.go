package delegates_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// A Pool with a Traffic counts each call in flight while it runs and
// measures its latency once it answers.
func TestPoolCountsCallsInFlight(t *testing.T) {
	gate := make(chan struct{})
	entered := make(chan struct{}, 2)
	svc := demo.NewScripted(func(ctx context.Context, _ *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		entered <- struct{}{}
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		time.Sleep(20 * time.Millisecond)
		return &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{Text: "ok"}}, nil
	})
	traffic := delegates.NewTraffic()
	p, err := delegates.NewPoolWith(&delegates.Config{Delegates: []delegates.Delegate{{Name: "d", Target: serve(t, svc)}}},
		delegates.PoolOptions{Traffic: traffic})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	s := delegates.StandingGuards{Traffic: traffic}
	ctx := testCtx(t)
	done := make(chan error, 2)
	for i := range 2 {
		go func() {
			_, err := p.Call(ctx, controls.Call{Delegate: "d", Brief: "b", Attempt: int32(i + 1)})
			done <- err
		}()
	}
	<-entered
	<-entered
	assert.Equal(t, 2, s.Standing("d").InFlight)
	assert.Zero(t, s.Standing("d").Latency, "nothing measured yet")
	close(gate)
	require.NoError(t, <-done)
	require.NoError(t, <-done)
	st := s.Standing("d")
	assert.Zero(t, st.InFlight)
	assert.GreaterOrEqual(t, st.Latency, 20*time.Millisecond)

	// A call to an unknown delegate is never counted.
	_, err = p.Call(ctx, controls.Call{Delegate: "nobody"})
	require.Error(t, err)
	assert.Zero(t, s.Standing("nobody").InFlight)
}
