package server_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/fleetguard/fleetguardtest"
	"github.com/stubbornhq/stubborn/internal/server"
	"github.com/stubbornhq/stubborn/internal/spend"
)

// callCost is what one call to spendConfig's "good" costs: chatModel
// reports 3 input and 4 output tokens, at 0.25 and 0.5 a token.
const callCost = 3*0.25 + 4*0.5

// spendConfig is a registry with one priced model, "good", and the
// tenants acme (tokenA) and beta (tokenB), acme with limit.
func spendConfig(t testing.TB, limit *delegates.TenantSpendLimit) *delegates.Config {
	return &delegates.Config{
		Delegates: []delegates.Delegate{{
			Name: "good", OpenAI: &delegates.OpenAI{ModelAPI: delegates.ModelAPI{BaseURL: chatModel(t, http.StatusOK, "The ", "answer."), Model: "m"}},
			ReadOnly: true, Timeout: delegates.Duration(time.Minute),
			Price: &delegates.Price{InputPerMTok: 250000, OutputPerMTok: 500000},
		}},
		Tenants: []delegates.Tenant{
			{Name: "acme", TokenSHA256: []string{delegates.HashToken(tokenA)}, SpendLimit: limit},
			{Name: "beta", TokenSHA256: []string{delegates.HashToken(tokenB)}},
		},
	}
}

// spendEnv is a server on ledger (nil: its own), its client and its
// HTTP listener (the doors).
type spendEnv struct {
	st     *server.Stubborn
	client stubbornv1.ControlServiceClient
	base   string
}

func spendServer(t testing.TB, cfg *delegates.Config, clock controls.Clock, ledger spend.Ledger) *spendEnv {
	t.Helper()
	st, err := server.New(server.Config{Registry: cfg, Logger: slog.New(slog.DiscardHandler), Clock: clock, Spend: ledger})
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = st.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	h, err := st.HTTPHandler()
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		srv.Close()
		_ = conn.Close()
		st.Stop(5 * time.Second)
	})
	return &spendEnv{st: st, client: stubbornv1.NewControlServiceClient(conn), base: srv.URL}
}

// runGood runs a chain of "good" to its end as ctx's tenant.
func runGood(t *testing.T, ctx context.Context, c stubbornv1.ControlServiceClient) *stubbornv1.ControlState {
	t.Helper()
	stream, err := c.Run(ctx, &stubbornv1.RunRequest{TaskBrief: "x", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"good"}}})
	require.NoError(t, err)
	st := lastState(t, collect(t, stream))
	require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus())
	return st
}

func startGood(ctx context.Context, c stubbornv1.ControlServiceClient) error {
	_, err := c.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "x", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"good"}}})
	return err
}

// refused says whether ctx's tenant's new runs are refused for its spend:
// it asks for a run of an unknown delegate, which the spend limit refuses
// before anything else and which otherwise starts (and spends) nothing.
func refused(ctx context.Context, c stubbornv1.ControlServiceClient) bool {
	_, err := c.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "x", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"nope"}}})
	return status.Code(err) == codes.ResourceExhausted
}

// spendRefusal asserts err is the tenant spend limit's refusal, naming
// its period, spend, limit and reset, and returns its RetryInfo's delay.
func spendRefusal(t *testing.T, err error, msg string) time.Duration {
	t.Helper()
	st := status.Convert(err)
	require.Equal(t, codes.ResourceExhausted, st.Code(), "%v", err)
	assert.Equal(t, msg, st.Message())
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	t.Fatal("no RetryInfo detail")
	return 0
}

func TestATenantOverItsDailySpendLimitIsRefusedUntilMidnight(t *testing.T) {
	clock := controlstest.NewManualClock()
	clock.Advance(23*time.Hour + 55*time.Minute) // 2026-01-01T23:55:00Z: 5 minutes to midnight
	e := spendServer(t, spendConfig(t, &delegates.TenantSpendLimit{MaxCost: 5, Period: "day"}), clock, nil)
	ctx := testCtx(t)
	acme, beta := as(ctx, tokenA), as(ctx, tokenB)

	// Real runs over the priced model: 2.75 each, the limit 5.
	st := runGood(t, acme, e.client)
	assert.InDelta(t, callCost, st.GetCost().GetTotal(), 1e-9, "the fake model's usage × price")
	require.False(t, refused(acme, e.client), "2.75 of 5 spent: a run may start")
	runGood(t, acme, e.client) // its 2.75 reaches the limit

	want := `tenant "acme" reached its daily spend limit: spent 5.5 of spend_limit.max_cost 5; it resets at 2026-01-02T00:00:00Z`
	for _, err := range []error{
		startGood(acme, e.client),
		func() error {
			s, err := e.client.Run(acme, &stubbornv1.RunRequest{TaskBrief: "x", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"good"}}})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		}(),
	} {
		assert.Equal(t, 5*time.Minute, spendRefusal(t, err, want), "until midnight UTC")
	}
	require.NoError(t, startGood(beta, e.client), "another tenant's spend is its own")

	// The doors: 429 with Retry-After in each one's error shape.
	resp := postChat(t, e.base, tokenA, `{"model": "good", "messages": [{"role": "user", "content": "x"}]}`)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "300", resp.Header.Get("Retry-After"))
	var oe struct {
		Error struct{ Message, Type, Code string } `json:"error"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&oe))
	assert.Equal(t, want, oe.Error.Message)
	assert.Equal(t, "insufficient_quota", oe.Error.Type, "as OpenAI answers an account out of credit")
	assert.Equal(t, "insufficient_quota", oe.Error.Code)

	resp = postMessages(t, e.base, tokenA, `{"model": "good", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}`)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "300", resp.Header.Get("Retry-After"))
	var ae struct {
		Type  string                         `json:"type"`
		Error struct{ Type, Message string } `json:"error"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&ae))
	assert.Equal(t, "error", ae.Type)
	assert.Equal(t, "rate_limit_error", ae.Error.Type)
	assert.Equal(t, want, ae.Error.Message)

	// Midnight UTC: a new day, nothing spent in it.
	clock.Advance(5 * time.Minute)
	require.NoError(t, startGood(acme, e.client), "the limit reset at midnight")
}

func TestATenantsMonthlyLimitResetsOnTheFirstOfTheMonth(t *testing.T) {
	clock := controlstest.NewManualClock() // 2026-01-01T00:00:00Z
	e := spendServer(t, spendConfig(t, &delegates.TenantSpendLimit{MaxCost: 2, Period: "month"}), clock, nil)
	ctx := as(testCtx(t), tokenA)
	runGood(t, ctx, e.client)
	clock.Advance(30 * 24 * time.Hour) // 2026-01-31: another day, the same month
	err := startGood(ctx, e.client)
	retry := spendRefusal(t, err, `tenant "acme" reached its monthly spend limit: spent 2.75 of spend_limit.max_cost 2; it resets at 2026-02-01T00:00:00Z`)
	assert.Equal(t, 24*time.Hour, retry)
	clock.Advance(24 * time.Hour)
	require.NoError(t, startGood(ctx, e.client), "February")
}

// readAgain is cfg as a reload reads it from its file: delegates and
// tenants of its own. A pool resolves its model delegates' settings into
// their config (ModelAPI.check), while the runs the pool before it started
// still read theirs.
func readAgain(cfg *delegates.Config) *delegates.Config {
	c := *cfg
	c.Delegates = slices.Clone(cfg.Delegates)
	for i, d := range c.Delegates {
		if d.OpenAI != nil {
			o := *d.OpenAI
			c.Delegates[i].OpenAI = &o
		}
	}
	c.Tenants = slices.Clone(cfg.Tenants)
	return &c
}

func TestAReloadChangesATenantsSpendLimit(t *testing.T) {
	clock := controlstest.NewManualClock()
	cfg := spendConfig(t, nil) // no limit: the spend is counted all the same
	e := spendServer(t, cfg, clock, nil)
	ctx := as(testCtx(t), tokenA)
	runGood(t, ctx, e.client)
	require.NoError(t, startGood(ctx, e.client))

	lower := readAgain(cfg)
	lower.Tenants[0].SpendLimit = &delegates.TenantSpendLimit{MaxCost: 1, Period: "day"}
	require.NoError(t, e.st.Reload(lower))
	require.True(t, refused(ctx, e.client), "a limit set by a reload counts the day's spend so far")

	higher := readAgain(cfg)
	higher.Tenants[0].SpendLimit = &delegates.TenantSpendLimit{MaxCost: 1000, Period: "day"}
	require.NoError(t, e.st.Reload(higher))
	require.NoError(t, startGood(ctx, e.client), "raised")
}

func TestTheDefaultTenantsSpendLimit(t *testing.T) {
	cfg := spendConfig(t, nil)
	cfg.Tenants = nil
	cfg.SpendLimit = &delegates.TenantSpendLimit{MaxCost: 1, Period: "day"}
	e := spendServer(t, cfg, controlstest.NewManualClock(), nil)
	ctx := testCtx(t)
	runGood(t, ctx, e.client)
	spendRefusal(t, startGood(ctx, e.client), "the default tenant reached its daily spend limit: spent 2.75 of spend_limit.max_cost 1; it resets at 2026-01-02T00:00:00Z")
}

// Two replicas sharing a store share the ledger: what runs spend on one
// counts on the other, and a restarted server finds it.
func TestReplicasShareATenantsSpend(t *testing.T) {
	n := fleetguardtest.StartNATS(t)
	kv := func() spend.Ledger {
		nc, err := nats.Connect(n.ClientURL())
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		l, err := spend.OpenKV(context.Background(), nc, spend.KVConfig{})
		require.NoError(t, err)
		return l
	}
	clock := controlstest.NewManualClock()
	limit := &delegates.TenantSpendLimit{MaxCost: 5, Period: "day"}
	a := spendServer(t, spendConfig(t, limit), clock, kv())
	b := spendServer(t, spendConfig(t, limit), clock, kv())
	ctx := as(testCtx(t), tokenA)
	runGood(t, ctx, a.client)
	runGood(t, ctx, b.client)
	for _, s := range []*spendEnv{a, b} {
		require.Eventually(t, func() bool { return refused(ctx, s.client) }, 10*time.Second, 20*time.Millisecond,
			"each replica counts the other's spend")
	}
	a.st.Stop(5 * time.Second)
	b.st.Stop(5 * time.Second)

	c := spendServer(t, spendConfig(t, limit), clock, kv())
	spendRefusal(t, startGood(ctx, c.client), `tenant "acme" reached its daily spend limit: spent 5.5 of spend_limit.max_cost 5; it resets at 2026-01-02T00:00:00Z`)
}

// The ledger total is what the runs cost, judges included, summed per
// day and month.
func TestTheLedgerHasEveryPricedCall(t *testing.T) {
	clock := controlstest.NewManualClock()
	ledger := spend.NewMemory(clock.Now)
	cfg := spendConfig(t, nil)
	e := spendServer(t, cfg, clock, ledger)
	ctx := as(testCtx(t), tokenA)
	// A judged chain: the judge is "good" too, whose answer ("The
	// answer.") is read as a verdict; each call is priced.
	stream, err := e.client.Run(ctx, &stubbornv1.RunRequest{TaskBrief: "x",
		FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"good"}, FailureCriteria: "the answer is wrong"},
		Options:       &stubbornv1.RunOptions{Judge: "good"}})
	require.NoError(t, err)
	st := lastState(t, collect(t, stream))
	total := st.GetCost().GetTotal()
	require.Greater(t, total, callCost, "the attempt and its judge: %v", st.GetCost())
	e.st.Stop(5 * time.Second) // writes what is left
	for _, key := range []string{spend.PeriodKey(spend.Day, clock.Now()), spend.PeriodKey(spend.Month, clock.Now())} {
		got, err := ledger.Spent(context.Background(), "acme", key)
		require.NoError(t, err)
		assert.InDelta(t, total, got, 1e-9, key)
	}
	got, err := ledger.Spent(context.Background(), "beta", spend.PeriodKey(spend.Day, clock.Now()))
	require.NoError(t, err)
	assert.Zero(t, got)
}
