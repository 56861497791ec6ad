package server

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stubbornhq/stubborn/internal/runs"
)

// TestAStoreThatDoesNotAnswerIsUnavailable (issue 29, finding 10): a
// write fenced by the lease, and a store that had no server to take a
// call, tell the client to try again (UNAVAILABLE), not INTERNAL.
func TestAStoreThatDoesNotAnswerIsUnavailable(t *testing.T) {
	for name, err := range map[string]error{
		"fenced":      fmt.Errorf("recording the run: %w: not written: this server's lease is over", runs.ErrConflict),
		"no response": fmt.Errorf("recording the idempotency key: %w", jetstream.ErrNoStreamResponse),
	} {
		t.Run(name, func(t *testing.T) {
			got := status.Convert(toStatus(err))
			assert.Equal(t, codes.Unavailable, got.Code(), got.Message())
			assert.Contains(t, got.Message(), "try again")
		})
	}
}

// TestAnUnreadableRunIsDataLoss (issue 30): GetRun of a run whose stored
// records do not decode is DATA_LOSS naming the run, not INTERNAL.
func TestAnUnreadableRunIsDataLoss(t *testing.T) {
	got := status.Convert(toStatus(fmt.Errorf("%w: run run_x: undecodable run state: proto: exceeded maximum recursion depth", runs.ErrUnreadable)))
	assert.Equal(t, codes.DataLoss, got.Code())
	assert.Contains(t, got.Message(), "run_x")
}
