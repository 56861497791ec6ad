package fleetguard

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
)

// What a cluster answers while replicas start at the same moment (a
// bucket another replica creates, one not placed yet, a peer not joined
// yet, no answer) is tried again; a request refused for good is not.
func TestABucketsCreationTriesAgainWhatMayPass(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&jetstream.APIError{Code: 404, ErrorCode: jetstream.JSErrCodeStreamNotFound, Description: "stream not found"}, true},
		{&jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamNameInUse, Description: "stream name already in use"}, true},
		{&jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement, peer offline"}, true},
		{&jetstream.APIError{Code: 503, Description: "JetStream system temporarily unavailable"}, true},
		{context.DeadlineExceeded, true},
		{&jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeBadRequest, Description: "bad request"}, false},
		{errors.New("invalid configuration"), false},
	} {
		assert.Equal(t, c.want, mayPass(c.err), "%v", c.err)
	}
}
