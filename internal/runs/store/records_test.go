package store

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// TestDecodeSummaryIsTheWholeStatesSummary encodes states with every
// field a run has and compares DecodeSummary's summary and tenant with
// those of the whole state decoded.
func TestDecodeSummaryIsTheWholeStatesSummary(t *testing.T) {
	params, err := structpb.NewStruct(map[string]any{"temperature": 0.2})
	require.NoError(t, err)
	full := &stubbornv1.ControlState{
		RunId: "run_x", Status: stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED,
		Result: &stubbornv1.Result{Text: "the answer"}, Winner: "b", Attempts: 3,
		FailureHistory: []*stubbornv1.FailureRecord{{Attempt: 1, Delegate: "a", Summary: "boom"}},
		AttemptLog:     []*stubbornv1.Attempt{{Number: 1, Delegate: "a", Result: &stubbornv1.Result{Text: "no"}}},
		TaskBrief:      strings.Repeat("brief é ", 30),
		Control: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{
			FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"a", "b"}}}},
		Options:      &stubbornv1.RunOptions{IdempotencyKey: "k"},
		StatusReason: "why", StatusReasonCode: stubbornv1.StatusReason_STATUS_REASON_SPEND_LIMIT_REACHED,
		CreateTime: timestamppb.New(timestamppb.Now().AsTime().Add(-1)), UpdateTime: timestamppb.Now(), EndTime: timestamppb.Now(),
		Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Tenant: "team a",
		ModelParams:  params,
		Conversation: &stubbornv1.Conversation{},
		Cost:         &stubbornv1.RunCost{Total: 0.25, TotalTokens: 1200, ByDelegate: map[string]float64{"a": 0.1, "b": 0.15}},
	}
	for name, st := range map[string]*stubbornv1.ControlState{
		"every field": full,
		"empty":       {},
		"a new run":   {RunId: "run_y", Status: stubbornv1.RunStatus_RUN_STATUS_RUNNING, TaskBrief: "short", CreateTime: timestamppb.Now()},
	} {
		t.Run(name, func(t *testing.T) {
			data, err := proto.Marshal(st)
			require.NoError(t, err)
			whole, err := DecodeState(data)
			require.NoError(t, err)
			sum, tenant, err := DecodeSummary(data)
			require.NoError(t, err)
			assert.True(t, proto.Equal(Summary(whole), sum), "got %v, want %v", sum, Summary(whole))
			assert.Equal(t, whole.GetTenant(), tenant)
		})
	}
	t.Run("not a message", func(t *testing.T) {
		_, _, err := DecodeSummary([]byte{0xff, 0xff, 0xff})
		assert.ErrorContains(t, err, "undecodable run state")
	})
}
