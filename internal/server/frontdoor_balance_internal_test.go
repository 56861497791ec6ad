package server

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// A front door's failure criteria go to a balance, as to a chain; a
// race's criteria do not.
func TestDoorCriteriaGoToABalance(t *testing.T) {
	run := &stubbornv1.RunRequest{Balance: &stubbornv1.BalanceSpec{Targets: []*stubbornv1.BalanceTarget{{Name: "a"}}}}
	got, err := withCriteria(run, map[string]string{"failure_when": `result.text == ""`, "failure_criteria": "empty"})
	require.NoError(t, err)
	assert.Equal(t, `result.text == ""`, got.GetBalance().GetFailureWhen())
	assert.Equal(t, "empty", got.GetBalance().GetFailureCriteria())

	_, err = withCriteria(run, map[string]string{"accept_when": "true"})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.ErrorContains(t, err, "the model's control (balance) does not take these criteria")
}
