package server_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
	"github.com/stubbornhq/stubborn/internal/server"
)

// with returns a copy of cfg that changes what edit changes.
func with(cfg *delegates.Config, edit func(c *delegates.Config)) *delegates.Config {
	c := *cfg
	c.Delegates = slices.Clone(cfg.Delegates)
	c.Presets = slices.Clone(cfg.Presets)
	c.Tenants = slices.Clone(cfg.Tenants)
	edit(&c)
	return &c
}

// without drops the named delegate.
func without(name string) func(c *delegates.Config) {
	return func(c *delegates.Config) {
		c.Delegates = slices.DeleteFunc(c.Delegates, func(d delegates.Delegate) bool { return d.Name == name })
	}
}

func lookup(c *delegates.Config, name string) delegates.Delegate {
	for _, d := range c.Delegates {
		if d.Name == name {
			return d
		}
	}
	panic("no delegate " + name)
}

// A reload changes what new requests may name and the limits they meet;
// a run in flight, parked awaiting a decision, keeps the delegate it
// started with, though the reload removed it, and succeeds with it.
func TestReloadChangesNewRunsOnly(t *testing.T) {
	for _, js := range []bool{false, true} {
		t.Run(fmt.Sprintf("jetstream=%v", js), func(t *testing.T) {
			flip := &demo.Flaky{FailFirst: 1}
			e := startWith(t, setup{jetstream: js, extra: map[string]stubbornv1.DelegateServiceServer{"flip": flip}})
			ctx := testCtx(t)
			zero := int32(0)
			res, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "first", Retry: &stubbornv1.RetrySpec{
				Target: "flip", Attempts: &zero, OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_ASK,
			}})
			require.NoError(t, err)
			id := res.GetRunId()
			require.Eventually(t, func() bool {
				st, err := e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
				return err == nil && st.GetState().GetStatus() == stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION
			}, 10*time.Second, 5*time.Millisecond)

			// flip goes; "again", echo under another name, comes; briefs
			// get a smaller limit.
			echo := lookup(e.cfg, "echo")
			require.NoError(t, e.st.Reload(with(e.cfg, func(c *delegates.Config) {
				without("flip")(c)
				c.Delegates = append(c.Delegates, delegates.Delegate{Name: "again", Target: echo.Target, Idempotent: true})
				c.Limits.MaxBriefBytes = 10
			})))

			_, err = e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "x", Retry: &stubbornv1.RetrySpec{Target: "flip"}})
			require.Equal(t, codes.NotFound, status.Code(err), "%v", err)
			assert.ErrorContains(t, err, `"flip"`)
			_, err = e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "longer than ten", Retry: &stubbornv1.RetrySpec{Target: "again"}})
			require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
			assert.ErrorContains(t, err, "limit of 10")
			res2, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "hi", Retry: &stubbornv1.RetrySpec{Target: "again"}})
			require.NoError(t, err)
			runToEnd(t, ctx, e.client, res2.GetRunId())
			st, err := e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: res2.GetRunId()})
			require.NoError(t, err)
			assert.Equal(t, "echo: hi", st.GetState().GetResult().GetText())

			list, err := e.client.ListDelegates(ctx, &stubbornv1.ListDelegatesRequest{})
			require.NoError(t, err)
			var names []string
			for _, d := range list.GetDelegates() {
				names = append(names, d.GetName())
			}
			assert.Contains(t, names, "again")
			assert.NotContains(t, names, "flip")

			// The parked run still reaches flip, which now answers.
			_, err = e.client.DecideRun(ctx, &stubbornv1.DecideRunRequest{RunId: id, Decision: stubbornv1.Decision_DECISION_RETRY})
			require.NoError(t, err)
			runToEnd(t, ctx, e.client, id)
			st, err = e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
			require.NoError(t, err)
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetState().GetStatus(), "%v", st.GetState())
		})
	}
}

// A config that cannot be put to use changes nothing.
func TestReloadRefusedKeepsTheRegistry(t *testing.T) {
	e := start(t, delegates.Limits{})
	ctx := testCtx(t)
	err := e.st.Reload(with(e.cfg, func(c *delegates.Config) {
		without("echo")(c)
		c.Delegates = append(c.Delegates, delegates.Delegate{Name: "tls", Target: "127.0.0.1:1", TLS: delegates.TLS{Enabled: true, CA: "/nonexistent/ca.pem"}})
	}))
	require.Error(t, err)
	assert.ErrorContains(t, err, `"tls"`)
	res, err := e.client.StartRun(ctx, echoRun("still here"))
	require.NoError(t, err)
	runToEnd(t, ctx, e.client, res.GetRunId())
}

// Tenants come and go with a reload: a removed tenant's token stops
// working at once, its streams included, while the other tenant's go on;
// a server that had no tenants starts authenticating, and stops again.
func TestReloadTenants(t *testing.T) {
	e := startWith(t, setup{tenants: twoTenants(delegates.Limits{}, delegates.Limits{})})
	ctx := testCtx(t)
	watchA, err := e.client.WatchRuns(as(ctx, tokenA), &stubbornv1.WatchRunsRequest{})
	require.NoError(t, err)
	watchB, err := e.client.WatchRuns(as(ctx, tokenB), &stubbornv1.WatchRunsRequest{})
	require.NoError(t, err)
	for _, w := range []stubbornv1.ControlService_WatchRunsClient{watchA, watchB} {
		first, err := w.Recv()
		require.NoError(t, err)
		require.Nil(t, first.GetRun(), "following")
	}

	onlyB := with(e.cfg, func(c *delegates.Config) { c.Tenants = c.Tenants[1:] })
	require.NoError(t, e.st.Reload(onlyB))
	_, err = e.client.StartRun(as(ctx, tokenA), echoRun("a"))
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	_, err = watchA.Recv()
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	assert.ErrorContains(t, err, "config reload")

	res, err := e.client.StartRun(as(ctx, tokenB), echoRun("b"))
	require.NoError(t, err)
	got, err := watchB.Recv()
	require.NoError(t, err, "b's stream goes on")
	assert.Equal(t, res.GetRunId(), got.GetRun().GetRunId())

	// No tenants: every caller is the default tenant; b's stream, of a
	// tenant that is no more, ends.
	require.NoError(t, e.st.Reload(with(e.cfg, func(c *delegates.Config) { c.Tenants = nil })))
	_, err = e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{})
	require.NoError(t, err)
	for {
		_, err = watchB.Recv()
		if err != nil {
			break
		}
	}
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)

	require.NoError(t, e.st.Reload(onlyB))
	_, err = e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{})
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	_, err = e.client.ListRuns(as(ctx, tokenB), &stubbornv1.ListRunsRequest{})
	require.NoError(t, err)
}

// Reloads while runs start every few milliseconds lose no run and start
// none twice: every start answered OK is one run, which ends SUCCEEDED
// after exactly one call to its delegate.
func TestReloadUnderLoad(t *testing.T) {
	for _, js := range []bool{false, true} {
		t.Run(fmt.Sprintf("jetstream=%v", js), func(t *testing.T) { reloadUnderLoad(t, js) })
	}
}

func reloadUnderLoad(t *testing.T, js bool) {
	var mu sync.Mutex
	calls := map[string]int{}
	counted := demo.NewScripted(func(_ context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
		mu.Lock()
		calls[req.GetRunId()]++
		mu.Unlock()
		return &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{Text: "ok"}}, nil
	})
	e := startWith(t, setup{jetstream: js, extra: map[string]stubbornv1.DelegateServiceServer{"counted": counted}})
	ctx := testCtx(t)
	configs := []*delegates.Config{
		e.cfg,
		with(e.cfg, func(c *delegates.Config) {
			without("echo")(c)
			c.Limits.MaxBriefBytes = 1 << 10
		}),
	}
	stop := make(chan struct{})
	var reloads atomic.Int64
	reloaded := make(chan struct{})
	go func() {
		defer close(reloaded)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			if err := e.st.Reload(configs[i%2]); err != nil {
				t.Errorf("reload: %v", err)
				return
			}
			reloads.Add(1)
		}
	}()
	const starters, each = 4, 60
	ids := make(chan string, starters*each)
	var wg sync.WaitGroup
	for g := range starters {
		wg.Go(func() {
			for i := range each {
				res, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{
					TaskBrief: "load", Retry: &stubbornv1.RetrySpec{Target: "counted"},
					Options: &stubbornv1.RunOptions{IdempotencyKey: fmt.Sprintf("load-%d-%d", g, i)},
				})
				if err != nil {
					t.Errorf("start %d-%d: %v", g, i, err)
					return
				}
				ids <- res.GetRunId()
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	close(stop)
	<-reloaded
	close(ids)
	require.Greater(t, reloads.Load(), int64(10), "reloads happened while runs started")
	seen := map[string]bool{}
	for id := range ids {
		require.False(t, seen[id], "run %s answered twice", id)
		seen[id] = true
		runToEnd(t, ctx, e.client, id)
		st, err := e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
		require.NoError(t, err)
		require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetState().GetStatus(), "%v", st.GetState())
	}
	require.Len(t, seen, starters*each)
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, calls, starters*each, "one delegate call each")
	for id, n := range calls {
		assert.Equal(t, 1, n, "run %s", id)
	}
	list, err := e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{PageSize: 1000})
	require.NoError(t, err)
	assert.Len(t, list.GetRuns(), starters*each, "no run more, none less")
	// Every registry a reload replaced is let go (its connections closed)
	// once its runs have ended.
	require.Eventually(t, func() bool { return server.RegistriesClosed(e.st) == int(reloads.Load()) }, 10*time.Second, 5*time.Millisecond,
		"%d registries let go of %d replaced", server.RegistriesClosed(e.st), reloads.Load())
}

// A reload after Stop changes nothing and says so.
func TestReloadAfterStop(t *testing.T) {
	e := start(t, delegates.Limits{})
	e.st.Stop(time.Second)
	err := e.st.Reload(e.cfg)
	require.Error(t, err)
	assert.ErrorContains(t, err, "stopped")
}

// TestTurningTenantsOnKeepsTheEarlierRunsOwned: runs started while the
// server had no tenants (one awaiting a decision) belong to the default
// tenant. Once tenants are configured, the tenant with default_runs owns
// them: it lists, gets, follows and decides them as its own, besides its
// own runs; another tenant sees none of them. Moving default_runs away in
// a reload ends its streams. On the memory store and on JetStream (whose
// listing reads the index by tenant).
func TestTurningTenantsOnKeepsTheEarlierRunsOwned(t *testing.T) {
	for _, js := range []bool{false, true} {
		t.Run(map[bool]string{false: "memory", true: "jetstream"}[js], func(t *testing.T) {
			e := startWith(t, setup{jetstream: js})
			ctx := testCtx(t)
			earlier := awaiting(t, ctx, e.client)

			tenants := twoTenants(delegates.Limits{}, delegates.Limits{})
			tenants[0].DefaultRuns = true
			require.NoError(t, e.st.Reload(with(e.cfg, func(c *delegates.Config) { c.Tenants = tenants })))
			a, b := as(ctx, tokenA), as(ctx, tokenB)
			follow, err := e.client.WatchRuns(a, &stubbornv1.WatchRunsRequest{})
			require.NoError(t, err)
			first, err := follow.Recv()
			require.NoError(t, err)
			require.Nil(t, first.GetRun(), "following")
			own := awaiting(t, a, e.client)

			got, err := e.client.GetRun(a, &stubbornv1.GetRunRequest{RunId: earlier})
			require.NoError(t, err, "a owns the default tenant's runs")
			assert.Equal(t, "", got.GetState().GetTenant(), "the run keeps its tenant")
			_, err = e.client.GetRun(b, &stubbornv1.GetRunRequest{RunId: earlier})
			assert.Equal(t, codes.NotFound, status.Code(err), "b does not: %v", err)
			_, err = e.client.GetRun(b, &stubbornv1.GetRunRequest{RunId: own})
			assert.Equal(t, codes.NotFound, status.Code(err))

			listed := func(ctx context.Context) []string {
				var ids []string
				require.Eventually(t, func() bool {
					resp, err := e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{})
					require.NoError(t, err)
					ids = ids[:0]
					for _, r := range resp.GetRuns() {
						ids = append(ids, r.GetRunId())
					}
					return len(ids) == 2 || ctx == b
				}, 10*time.Second, 10*time.Millisecond, "%v", ids)
				return ids
			}
			assert.ElementsMatch(t, []string{earlier, own}, listed(a))
			assert.Empty(t, listed(b))

			_, err = e.client.DecideRun(b, &stubbornv1.DecideRunRequest{RunId: earlier, Decision: stubbornv1.Decision_DECISION_FAIL})
			assert.Equal(t, codes.NotFound, status.Code(err))
			_, err = e.client.DecideRun(a, &stubbornv1.DecideRunRequest{RunId: earlier, Decision: stubbornv1.Decision_DECISION_FAIL})
			require.NoError(t, err, "a decides the earlier run")
			seen := map[string]bool{}
			for !seen[earlier] {
				m, err := follow.Recv()
				require.NoError(t, err)
				seen[m.GetRun().GetRunId()] = true
			}

			// default_runs moved to b: a's stream ends, b owns the run.
			tenants[0].DefaultRuns, tenants[1].DefaultRuns = false, true
			require.NoError(t, e.st.Reload(with(e.cfg, func(c *delegates.Config) { c.Tenants = tenants })))
			for {
				if _, err = follow.Recv(); err != nil {
					break
				}
			}
			assert.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
			_, err = e.client.GetRun(a, &stubbornv1.GetRunRequest{RunId: earlier})
			assert.Equal(t, codes.NotFound, status.Code(err))
			_, err = e.client.GetRun(b, &stubbornv1.GetRunRequest{RunId: earlier})
			assert.NoError(t, err)
		})
	}
}
