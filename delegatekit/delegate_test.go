package delegatekit_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	answers := map[string]func() (*stubbornv1.Result, error){
		"text":     func() (*stubbornv1.Result, error) { return &stubbornv1.Result{Text: "hello"}, nil },
		"nil":      func() (*stubbornv1.Result, error) { return nil, nil },
		"plain":    func() (*stubbornv1.Result, error) { return nil, errors.New("disk full") },
		"deadline": func() (*stubbornv1.Result, error) { return nil, fmt.Errorf("search: %w", context.DeadlineExceeded) },
		"canceled": func() (*stubbornv1.Result, error) { return nil, context.Canceled },
		"status":   func() (*stubbornv1.Result, error) { return nil, status.Error(codes.NotFound, "no such doc") },
		"wrapped": func() (*stubbornv1.Result, error) {
			return nil, fmt.Errorf("search: %w", status.Error(codes.NotFound, "no doc"))
		},
		"panic": func() (*stubbornv1.Result, error) { panic("index out of range") },
		"both":  func() (*stubbornv1.Result, error) { return &stubbornv1.Result{Text: "ignored"}, errors.New("failed") },
	}
	logs := &syncBuffer{}
	s := serve(t, func(_ context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.Result, error) {
		return answers[req.GetBrief()]()
	}, delegatekit.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	for _, tt := range []struct {
		brief string
		code  codes.Code
		msg   string
		text  string
	}{
		{brief: "text", text: "hello"},
		{brief: "nil", text: ""},
		{brief: "plain", code: codes.Unknown, msg: "disk full"},
		{brief: "deadline", code: codes.DeadlineExceeded, msg: "search: context deadline exceeded"},
		{brief: "canceled", code: codes.Canceled, msg: "context canceled"},
		{brief: "status", code: codes.NotFound, msg: "no such doc"},
		{brief: "wrapped", code: codes.NotFound, msg: "search: no doc"},
		{brief: "panic", code: codes.Internal, msg: "delegate panicked"},
		{brief: "both", code: codes.Unknown, msg: "failed"},
	} {
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
