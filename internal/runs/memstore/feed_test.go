package memstore

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

type followed struct {
	sum     *stubbornv1.RunSummary
	deleted string
}

// follow starts FollowSummaries of tenants on s and returns what it tells,
// once it follows.
func follow(t *testing.T, s *Memory, tenants ...string) (<-chan followed, <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	got := make(chan followed, 100)
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- s.FollowSummaries(ctx, tenants, func(sum *stubbornv1.RunSummary, deleted string) error {
			if sum == nil && deleted == "" {
				close(ready)
				return nil
			}
			got <- followed{sum, deleted}
			return nil
		})
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("FollowSummaries: %v", err)
	}
	return got, done
}

func stateOf(t *testing.T, id, tenant string, status stubbornv1.RunStatus) []byte {
	t.Helper()
	b, err := proto.Marshal(&stubbornv1.ControlState{RunId: id, Tenant: tenant, Status: status, TaskBrief: "brief"})
	require.NoError(t, err)
	return b
}

func next(t *testing.T, c <-chan followed) followed {
	t.Helper()
	select {
	case f := <-c:
		return f
	case <-time.After(5 * time.Second):
		t.Fatal("nothing followed")
		return followed{}
	}
}

// TestTheMemoryStoreFeedsItsStates: a follower is told of its tenant's
// runs as their states are saved (the claim's, then each PutState), and of
// their deletion; another tenant's runs never reach it.
func TestTheMemoryStoreFeedsItsStates(t *testing.T) {
	ctx := context.Background()
	s := NewMemory(time.Second)
	got, _ := follow(t, s, "a")

	require.NoError(t, s.Claim(ctx, "run_b", "me", stateOf(t, "run_b", "b", stubbornv1.RunStatus_RUN_STATUS_RUNNING)))
	require.NoError(t, s.Claim(ctx, "run_a", "me", stateOf(t, "run_a", "a", stubbornv1.RunStatus_RUN_STATUS_RUNNING)))
	f := next(t, got)
	assert.Equal(t, "run_a", f.sum.GetRunId(), "another tenant's run is not told")
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_RUNNING, f.sum.GetStatus())

	require.NoError(t, s.PutState(ctx, "run_a", stateOf(t, "run_a", "a", stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED)))
	f = next(t, got)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, f.sum.GetStatus())
	assert.Equal(t, "brief", f.sum.GetBrief())

	require.NoError(t, s.DeleteRun(ctx, "run_b"))
	require.NoError(t, s.DeleteRun(ctx, "run_a"))
	assert.Equal(t, followed{deleted: "run_a"}, next(t, got))
	assert.Empty(t, got)
}

// TestAFollowerThatFallsBehindIsEnded: a follower that does not keep up
// never holds a write back: its follow ends with errFellBehind.
func TestAFollowerThatFallsBehindIsEnded(t *testing.T) {
	ctx := context.Background()
	s := NewMemory(time.Second)
	block := make(chan struct{})
	done := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		done <- s.FollowSummaries(ctx, []string{"a"}, func(sum *stubbornv1.RunSummary, _ string) error {
			if sum == nil {
				close(ready)
				return nil
			}
			<-block
			return nil
		})
	}()
	<-ready
	state := stateOf(t, "run_a", "a", stubbornv1.RunStatus_RUN_STATUS_RUNNING)
	for range followBuffer + 2 {
		require.NoError(t, s.PutState(ctx, "run_a", state))
	}
	close(block)
	select {
	case err := <-done:
		require.ErrorIs(t, err, errFellBehind)
	case <-time.After(5 * time.Second):
		t.Fatal("a follower that fell behind was not ended")
	}
	assert.Zero(t, s.feed.n.Load(), "the follower is gone")
}
