package controls

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// A context cancelled because its parent's deadline passed, as a resumed
// run's is (its cancellation is held back while its journal is replayed,
// then passed on with the run's cause), counts as the run's timeout.
func TestStoppedByADeadlineThatCameAsACancellation(t *testing.T) {
	parent, cancel := context.WithCancelCause(context.Background())
	child, stop := context.WithCancel(parent)
	defer stop()
	cancel(context.DeadlineExceeded)
	assert.ErrorIs(t, child.Err(), context.Canceled)
	assert.ErrorIs(t, ctxErr(child), context.DeadlineExceeded)
	got := stopped(child)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, got.Status)
	assert.Equal(t, "run timeout exceeded", got.Reason)
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_RUN_TIMEOUT, got.Code)

	cancelled, cancel2 := context.WithCancelCause(context.Background())
	cancel2(errors.New("cancelled by CancelRun"))
	got = stopped(cancelled)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_CANCELLED, got.Status)
	assert.Equal(t, "cancelled: cancelled by CancelRun", got.Reason)
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_CANCELLED, got.Code)
}
