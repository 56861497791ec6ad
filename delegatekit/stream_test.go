package delegatekit_test

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stubbornhq/stubborn/delegatekit"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// words sends each word of the brief as a piece, then fails when the
// brief says so.
func words(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.Result, error) {
	for _, w := range []string{"one ", "two ", "three"} {
		if err := delegatekit.Send(ctx, w); err != nil {
			return nil, err
		}
	}
	if req.GetBrief() == "fail" {
		return nil, delegatekit.Transient("gave up midway")
	}
	return nil, nil
}

// received reads a whole ExecuteStream: its deltas, its result, its error.
func received(t *testing.T, s *served, brief string) (deltas []string, res *stubbornv1.Result, err error) {
	t.Helper()
	st, err := s.delegate.ExecuteStream(testCtx(t), &stubbornv1.ExecuteStreamRequest{Brief: brief, Attempt: 1})
	require.NoError(t, err)
	for {
		msg, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return deltas, res, nil
		}
		if err != nil {
			return deltas, res, err
		}
		if d, ok := msg.GetKind().(*stubbornv1.ExecuteStreamResponse_TextDelta); ok {
			deltas = append(deltas, d.TextDelta)
		}
		if r := msg.GetResult(); r != nil {
			res = r
		}
	}
}

func TestAFuncThatSendsStreams(t *testing.T) {
	s := serve(t, words)
	deltas, res, err := received(t, s, "go")
	require.NoError(t, err)
	assert.Equal(t, []string{"one ", "two ", "three"}, deltas)
	require.NotNil(t, res)
	assert.Empty(t, res.GetText(), "the deltas are the text: not sent again")

	deltas, _, err = received(t, s, "fail")
	assert.Len(t, deltas, 3)
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Equal(t, "gave up midway", status.Convert(err).Message())

	resp, err := s.delegate.Execute(testCtx(t), req("go"))
	require.NoError(t, err)
	assert.Equal(t, "one two three", resp.GetResult().GetText(), "Execute joins what the Func sent")
}

func TestAFuncThatDoesNotSendAnswersAStreamWithItsResult(t *testing.T) {
	s := serve(t, func(context.Context, *stubbornv1.ExecuteRequest) (*stubbornv1.Result, error) {
		return &stubbornv1.Result{Text: "whole"}, nil
	})
	deltas, res, err := received(t, s, "x")
	require.NoError(t, err)
	assert.Empty(t, deltas)
	assert.Equal(t, "whole", res.GetText())
	assert.NoError(t, delegatekit.Send(testCtx(t), "outside any call: nothing"))
}
