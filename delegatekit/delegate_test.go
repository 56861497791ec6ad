package delegatekit_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/stubbornhq/stubborn/delegatekit"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// TestFuncResults covers what a Func's plain returns reach the caller as.
func TestFuncResults(t *testing.T) {
	type answer func() (*stubbornv1.Result, error)
	fails := func(err error) answer { return func() (*stubbornv1.Result, error) { return nil, err } }
	tests := []struct {
		brief  string
		answer answer
		code   codes.Code
		msg    string
		text   string
	}{
		{brief: "text", answer: func() (*stubbornv1.Result, error) { return &stubbornv1.Result{Text: "hello"}, nil }, text: "hello"},
		{brief: "nil", answer: func() (*stubbornv1.Result, error) { return nil, nil }, text: ""},
		{brief: "plain", answer: fails(errors.New("disk full")), code: codes.Unknown, msg: "disk full"},
		{
			brief: "deadline", answer: fails(fmt.Errorf("search: %w", context.DeadlineExceeded)),
			code: codes.DeadlineExceeded, msg: "search: context deadline exceeded",
		},
		{brief: "canceled", answer: fails(context.Canceled), code: codes.Canceled, msg: "context canceled"},
		{brief: "status", answer: fails(status.Error(codes.NotFound, "no such doc")), code: codes.NotFound, msg: "no such doc"},
		{
			brief: "wrapped status", answer: fails(fmt.Errorf("search: %w", status.Error(codes.NotFound, "no doc"))),
			code: codes.NotFound, msg: "search: no doc",
		},
		{brief: "status type of the user's", answer: fails(statusSlice{"a", "b"}), code: codes.Aborted, msg: "conflict on a, b"},
		{
			brief: "wrapped status type of the user's", answer: fails(fmt.Errorf("step 2: %w", statusSlice{"a"})),
			code: codes.Aborted, msg: "step 2: conflict on a",
		},
		{brief: "panic", answer: func() (*stubbornv1.Result, error) { panic("index out of range") }, code: codes.Internal, msg: "delegate panicked"},
		{
			brief: "result and error", answer: func() (*stubbornv1.Result, error) { return &stubbornv1.Result{Text: "ignored"}, errors.New("failed") },
			code: codes.Unknown, msg: "failed",
		},
	}
	answers := make(map[string]answer, len(tests))
	for _, tt := range tests {
		answers[tt.brief] = tt.answer
	}
	logs := &syncBuffer{}
	s := serve(t, func(_ context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.Result, error) {
		return answers[req.GetBrief()]()
	}, delegatekit.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	for _, tt := range tests {
		t.Run(tt.brief, func(t *testing.T) {
			resp, err := s.delegate.Execute(testCtx(t), req(tt.brief))
			if tt.code != codes.OK {
				st := status.Convert(err)
				assert.Equal(t, tt.code, st.Code())
				assert.Equal(t, tt.msg, st.Message())
				return
			}
			require.NoError(t, err)
			require.NotNil(t, resp.GetResult(), "a result is always set")
			assert.Equal(t, tt.text, resp.GetResult().GetText())
		})
	}
	// The panic and where it happened go to the log, not to the caller.
	assert.Contains(t, logs.String(), "delegatekit: panic in delegate")
	assert.Contains(t, logs.String(), "index out of range")
	assert.Contains(t, logs.String(), "delegate_test.go")

	// The server survived the panic.
	_, err := s.delegate.Execute(testCtx(t), req("text"))
	require.NoError(t, err)
}

// TestRegister puts the delegate on a server of the caller's: panics are
// still recovered.
func TestRegister(t *testing.T) {
	gs := grpc.NewServer()
	delegatekit.Register(gs, func(_ context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.Result, error) {
		if req.GetBrief() == "panic" {
			panic("boom")
		}
		return &stubbornv1.Result{Text: "own server: " + req.GetBrief()}, nil
	})
	lis := bufconn.Listen(1 << 20)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(lis)
	}()
	defer func() {
		gs.Stop()
		<-served
	}()
	client := stubbornv1.NewDelegateServiceClient(dialBuf(t, lis))

	resp, err := client.Execute(testCtx(t), req("hi"))
	require.NoError(t, err)
	assert.Equal(t, "own server: hi", resp.GetResult().GetText())
	_, err = client.Execute(testCtx(t), req("panic"))
	assert.Equal(t, codes.Internal, status.Code(err))
}

func TestNilFunc(t *testing.T) {
	assert.PanicsWithValue(t, "delegatekit: nil Func", func() { delegatekit.NewServer(nil) })
	assert.PanicsWithValue(t, "delegatekit: nil Func", func() { delegatekit.Register(grpc.NewServer(), nil) })
}

// statusSlice is an error type of a user's that is a gRPC status; it cannot
// be compared with ==.
type statusSlice []string

func (e statusSlice) Error() string { return "statusSlice: " + strings.Join(e, ", ") }

func (e statusSlice) GRPCStatus() *status.Status {
	return status.New(codes.Aborted, "conflict on "+strings.Join(e, ", "))
}
