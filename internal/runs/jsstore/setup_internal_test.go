package jsstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAnUnansweredCreationIsBoundTo: a creation left unanswered (as two
// made at the same moment on a cluster are) costs one short try, then the
// asset another server made is bound to; one refused for good is not
// tried again; one that keeps failing for a reason that may pass is tried
// until the setup deadline.
func TestAnUnansweredCreationIsBoundTo(t *testing.T) {
	hang := func(ctx context.Context) (string, error) { <-ctx.Done(); return "", ctx.Err() }
	made := false
	start := time.Now()
	got, err := createOrBind(context.Background(), func(ctx context.Context) (string, error) {
		made = true
		return hang(ctx)
	}, func(context.Context) (string, bool) { return "bound", made })
	require.NoError(t, err)
	assert.Equal(t, "bound", got)
	assert.Less(t, time.Since(start), 2*setupFirstTry)

	tries := 0
	refused := errors.New("refused for good")
	_, err = createOrBind(context.Background(), func(context.Context) (string, error) { tries++; return "", refused },
		func(context.Context) (string, bool) { return "", false })
	assert.ErrorIs(t, err, refused)
	assert.Equal(t, 1, tries)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	tries = 0
	_, err = createOrBind(ctx, func(ctx context.Context) (string, error) { tries++; return hang(ctx) },
		func(context.Context) (string, bool) { return "", false })
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.GreaterOrEqual(t, tries, 2, "tried again within the deadline")
}

// TestASetupStepTriesAgainWhatMayPass: what a cluster answers while
// replicas create the store at the same moment (a stream another replica
// creates, one not placed yet, a peer not joined yet, no answer) is tried
// again; a request the
// server refuses for good is not.
func TestASetupStepTriesAgainWhatMayPass(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&jetstream.APIError{Code: 404, ErrorCode: jetstream.JSErrCodeStreamNotFound, Description: "stream not found"}, true},
		{&jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamNameInUse, Description: "stream name already in use"}, true},
		{&jetstream.APIError{Code: 503, Description: "JetStream system temporarily unavailable"}, true},
		{&jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement, peer offline"}, true},
		{context.DeadlineExceeded, true},
		{&jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeBadRequest, Description: "bad request"}, false},
		{errors.New("invalid configuration"), false},
	} {
		assert.Equal(t, c.want, setupRetries(c.err), "%v", c.err)
	}
}
