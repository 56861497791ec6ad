package server_test

import (
	"bytes"
	"context"
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
