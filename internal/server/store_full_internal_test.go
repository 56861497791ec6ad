package server

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stubbornhq/stubborn/internal/runs"
)

// TestAFullStoreIsResourceExhausted: a run refused because the store is
// full is RESOURCE_EXHAUSTED, with the store's message (naming -max-bytes)
// and a QuotaFailure on the store.
func TestAFullStoreIsResourceExhausted(t *testing.T) {
	st := status.Convert(toStatus(fmt.Errorf("%w: -max-bytes 65536", runs.ErrStoreFull)))
	assert.Equal(t, codes.ResourceExhausted, st.Code())
	assert.Contains(t, st.Message(), "the run store is full: -max-bytes 65536")
	require.Len(t, st.Details(), 1)
	qf, ok := st.Details()[0].(*errdetails.QuotaFailure)
	require.True(t, ok, "a QuotaFailure: %T", st.Details()[0])
	assert.Equal(t, "store", qf.GetViolations()[0].GetSubject())
}
