package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
)

// syncBuffer is a bytes.Buffer for concurrent log writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLogsHoldNoBriefResultOrToken runs, over authenticated gRPC, runs
// whose briefs and results carry a marker, with the server logging at its
// default level (info), and at debug: the logs name the calls and the
// tenant, never a brief or result (at info) nor a token (at any level).
func TestLogsHoldNoBriefResultOrToken(t *testing.T) {
	const secret = "SECRET-7f3a9c"
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		t.Run(level.String(), func(t *testing.T) {
			var logs syncBuffer
			tenants := twoTenants(delegates.Limits{RunStartsPerSecond: 1000}, delegates.Limits{})
			e := startWith(t, setup{
				tenants: tenants,
				logger:  slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: level})),
				limits:  delegates.Limits{MaxBriefBytes: 200},
			})
			ctx := testCtx(t)
			ctxA := as(ctx, tokenA)
			brief := "brief " + secret

			s, err := e.client.Run(ctxA, &stubbornv1.RunRequest{TaskBrief: brief, FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"broken", "echo"}}})
			require.NoError(t, err)
			st := lastState(t, collect(t, s))
			require.Equal(t, "echo: "+brief, st.GetResult().GetText())
			res, err := e.client.StartRun(ctxA, &stubbornv1.StartRunRequest{TaskBrief: brief, RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "flaky", FailureWhen: `result.text.contains("` + secret + `")`}})
			require.NoError(t, err)
			w, err := e.client.WatchRun(ctxA, &stubbornv1.WatchRunRequest{RunId: res.GetRunId()})
			require.NoError(t, err)
			collect(t, w)
			_, err = e.client.GetRun(ctxA, &stubbornv1.GetRunRequest{RunId: res.GetRunId()})
			require.NoError(t, err)
			_, err = e.client.ListRuns(ctxA, &stubbornv1.ListRunsRequest{})
			require.NoError(t, err)
			// Refused ones: too long, a wrong token, a bad header.
			_, err = e.client.StartRun(ctxA, echoRun(strings.Repeat(secret, 30)))
			assert.Equal(t, codes.InvalidArgument, status.Code(err))
			_, err = e.client.StartRun(as(ctx, "wrong-"+secret), echoRun(brief))
			assert.Equal(t, codes.Unauthenticated, status.Code(err))
			_, err = e.client.StartRun(as(context.Background(), tokenB+" "+secret), echoRun(brief))
			assert.Equal(t, codes.Unauthenticated, status.Code(err))

			out := logs.String()
			assert.Contains(t, out, "finished call")
			assert.Contains(t, out, "tenant=a", "the calls' lines name the tenant")
			assert.Contains(t, out, "run finished")
			for _, tok := range []string{tokenA, tokenB, "wrong-" + secret} {
				assert.NotContains(t, out, tok, "a token is logged")
			}
			if level == slog.LevelInfo {
				assert.NotContains(t, out, secret, "a brief, result or criteria is logged at info")
			}
		})
	}
}

// TestTheCallLineHasItsFieldsAndOnlyWhenWritten reads the "finished call"
// lines of a Run that succeeds and a StartRun refused, with the server at
// info and at debug: a refused call's line at info has the call's fields,
// its code and error, the run's tenant; a call that succeeded has its
// line at debug only, with the run's id.
func TestTheCallLineHasItsFieldsAndOnlyWhenWritten(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		t.Run(level.String(), func(t *testing.T) {
			var logs syncBuffer
			e := startWith(t, setup{
				tenants: twoTenants(delegates.Limits{}, delegates.Limits{}),
				logger:  slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: level})),
				limits:  delegates.Limits{MaxBriefBytes: 200},
			})
			ctxA := as(testCtx(t), tokenA)
			s, err := e.client.Run(ctxA, &stubbornv1.RunRequest{TaskBrief: "hello", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}})
			require.NoError(t, err)
			runID := lastState(t, collect(t, s)).GetRunId()
			_, err = e.client.StartRun(ctxA, echoRun(strings.Repeat("x", 300)))
			require.Equal(t, codes.InvalidArgument, status.Code(err))

			lines := map[string]map[string]any{}
			for l := range strings.Lines(logs.String()) {
				var m map[string]any
				require.NoError(t, json.Unmarshal([]byte(l), &m), l)
				if m["msg"] == "finished call" {
					lines[m["grpc.method"].(string)] = m
				}
			}
			refused := lines["StartRun"]
			require.NotNil(t, refused, "the refused call's line, at info")
			assert.Equal(t, "INFO", refused["level"])
			for k, want := range map[string]any{
				"protocol": "grpc", "grpc.component": "server", "grpc.service": "stubborn.v1.ControlService",
				"grpc.method_type": "unary", "grpc.code": "InvalidArgument", "tenant": "a",
			} {
				assert.Equal(t, want, refused[k], k)
			}
			for _, k := range []string{"peer.address", "grpc.start_time", "grpc.request.deadline", "grpc.error", "grpc.time_ms"} {
				assert.NotEmpty(t, refused[k], k)
			}
			assert.Contains(t, refused["grpc.error"], "task_brief")
			run, ok := lines["Run"]
			if level > slog.LevelDebug {
				assert.False(t, ok, "a call that succeeded is logged at debug")
				return
			}
			require.True(t, ok, "the Run's line, at debug")
			assert.Equal(t, "DEBUG", run["level"])
			assert.Equal(t, runID, run["run_id"])
			assert.Equal(t, "OK", run["grpc.code"])
			assert.Equal(t, "server_stream", run["grpc.method_type"])
			assert.NotContains(t, run, "grpc.error")
		})
	}
}
