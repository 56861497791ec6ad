package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// A balance on the fault suite's setting: three nats-server processes,
// three `serve -nats-url` replicas, a balance preset over two deployments
// weighted 3:1. The weights hold over the fleet; then the first deployment
// dies mid-run, and once its (fleet-wide) breaker opens no replica calls it
// but for the fleet's probes after the cooldown, while every run still
// succeeds through the other, with one NATS node of three killed.
func TestBalanceCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a balance on a cluster takes about a minute")
	}
	const (
		cooldown = 4 * time.Second
		probes   = 1
	)
	bin := buildNATSServer(t, t.TempDir())
	c := startChaosNATS(t, bin)

	log := &callLog{}
	var eastDown atomic.Bool
	deployment := func(name string, down *atomic.Bool) demo.Func {
		return func(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
			if down != nil && down.Load() {
				return nil, status.Error(codes.Unavailable, name+": down")
			}
			// Long enough that the killing meets calls in flight.
			if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
				return nil, err
			}
			if down != nil && down.Load() {
				return nil, status.Error(codes.Unavailable, name+": killed mid-call")
			}
			return ok(name), nil
		}
	}
	fns := map[string]demo.Func{"east": deployment("east", &eastDown), "west": deployment("west", nil)}
	// One listener per deployment and replica, so that every call is
	// logged with the replica that made it.
	dir := t.TempDir()
	var configs []string
	for r := range 3 {
		addrs := map[string]string{}
		for _, name := range []string{"east", "west"} {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			fn := fns[name]
			srv := demo.Serve(lis, demo.NewScripted(func(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
				cl := &call{at: time.Now(), delegate: name, replica: r, run: req.GetRunId(), attempt: req.GetAttempt()}
				log.add(cl)
				res, err := fn(ctx, req)
				if err != nil {
					log.finish(cl, status.Code(err).String())
				} else {
					log.finish(cl, "OK")
				}
				return res, err
			}))
			t.Cleanup(srv.Stop)
			addrs[name] = lis.Addr().String()
		}
		config := filepath.Join(dir, fmt.Sprintf("r%d.yaml", r))
		require.NoError(t, os.WriteFile(config, fmt.Appendf(nil, `delegates:
  - name: east
    target: %q
    idempotent: true
    timeout: 5s
    circuit_breaker: {consecutive_failures: 3, cooldown: %s, probes: %d}
  - {name: west, target: %q, idempotent: true, timeout: 5s}
presets:
  - name: gpt
    balance: {targets: [{name: east, weight: 3}, {name: west}], strategy: weighted}
`, addrs["east"], cooldown, probes, addrs["west"]), 0o600))
		configs = append(configs, config)
	}
	// A lease longer than the NATS failover's stall (up to ~9 s here): a
	// run taken over mid-call comes back with its call interrupted, which
	// a balance counts as that target's failure, as a chain does (the
	// chaos suite covers takeovers; this test is about the picks).
	rs := startReplicas(t, c, configs, 15*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, r := range rs {
		require.Eventually(t, func() bool {
			return describeDelegate(ctx, r, "east").GetGuardScope() == stubbornv1.GuardScope_GUARD_SCOPE_FLEET
		}, 10*time.Second, 50*time.Millisecond, "%s's guards are the fleet's", r.name())
	}
	req := &stubbornv1.StartRunRequest{TaskBrief: "balance", Retry: &stubbornv1.RetrySpec{
		Target: "gpt", Attempts: i32(0), OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL,
	}}

	t.Run("weights", func(t *testing.T) {
		// 400 runs, 16 at a time, spread over the replicas.
		var (
			wg   sync.WaitGroup
			sem  = make(chan struct{}, 16)
			outs = make([]balanceRun, 400)
		)
		for i := range outs {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				outs[i] = runToEnd(ctx, rs[i%len(rs)], req, 30*time.Second)
			})
		}
		wg.Wait()
		for i, o := range outs {
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, o.status, "run %d through r%d: %s", i, i%len(rs), o.why)
		}
		perReplica := map[int][2]int{}
		east, west := 0, 0
		for _, cl := range log.all() {
			n := perReplica[cl.replica]
			if cl.delegate == "east" {
				east++
				n[0]++
			} else {
				west++
				n[1]++
			}
			perReplica[cl.replica] = n
		}
		share := float64(east) / float64(east+west)
		t.Logf("weights 3:1, 400 runs over 3 replicas: east %d, west %d (%.1f %% to east); per replica (east, west): %v", east, west, 100*share, perReplica)
		assert.Equal(t, 400, east+west, "one call a run: nothing fails")
		assert.InDelta(t, 0.75, share, 0.07, "the first deployment's share")
		for r := range rs {
			assert.Positive(t, perReplica[r][0]+perReplica[r][1], "r%d balanced runs too", r)
		}
	})

	t.Run("killed", func(t *testing.T) {
		before := len(log.all())
		// A steady stream of runs over the replicas, 20 a second, until a
		// cooldown and a second after every replica showed east's breaker
		// open. A NATS node is killed after 0.5 s (and stays down), east
		// after 3 s (mid-run: calls are in flight).
		var (
			wg     sync.WaitGroup
			mu     sync.Mutex
			outs   []*balanceRun
			stop   = make(chan struct{})
			stream = make(chan struct{})
		)
		start := time.Now()
		go func() {
			defer close(stream)
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				o := &balanceRun{}
				mu.Lock()
				outs = append(outs, o)
				mu.Unlock()
				wg.Go(func() { *o = runToEnd(ctx, rs[i%len(rs)], req, 30*time.Second) })
			}
		}()
		// The node leading the runs' stream: the harder case, the runs
		// wait for a new leader.
		leader, err := c.eventsLeader(ctx)
		require.NoError(t, err)
		time.Sleep(500 * time.Millisecond)
		c.node(leader).kill(t)
		time.Sleep(time.Until(start.Add(3 * time.Second)))
		killedAt := time.Now()
		eastDown.Store(true)

		// Each replica's first sight of east's breaker open.
		type sight struct {
			at, until time.Time
			by        string
		}
		seen := make([]sight, len(rs))
		var watch sync.WaitGroup
		for i, r := range rs {
			watch.Go(func() {
				for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
					d := describeDelegate(ctx, r, "east")
					if d.GetCircuitBreaker() == stubbornv1.BreakerState_BREAKER_STATE_OPEN {
						seen[i] = sight{at: time.Now(), until: d.GetCircuitBreakerOpenUntil().AsTime(), by: d.GetCircuitBreakerOpenedBy()}
						return
					}
				}
			})
		}
		watch.Wait()
		for i, s := range seen {
			require.False(t, s.at.IsZero(), "r%d shows east's breaker open within 20 s of its killing", i)
		}
		first := seen[0].until // the end of the first cooldown
		for _, s := range seen {
			if s.until.Before(first) {
				first = s.until
			}
		}
		time.Sleep(time.Until(first.Add(cooldown + time.Second)))
		close(stop)
		<-stream
		wg.Wait()
		end := time.Now()

		var slowest time.Duration
		accepted := map[string]time.Time{}
		for i, o := range outs {
			accepted[o.id] = o.sent
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, o.status, "run %d through r%d: %s", i, i%len(rs), o.why)
			slowest = max(slowest, o.took)
		}
		t.Logf("%d runs over %s, NATS node %s and east killed: the slowest took %s to end", len(outs), end.Sub(start).Round(time.Millisecond), leader, slowest)

		owners := map[string]bool{}
		for _, r := range rs {
			owners[r.owner] = true
		}
		calls := log.all()[before:]
		for i, s := range seen {
			assert.True(t, owners[s.by], "r%d names a replica (%q) as the one that opened it", i, s.by)
			// Within the first cooldown, a run asked of r once r showed the
			// breaker open never calls east: its pick came after. (A run
			// asked for before may have picked before, however late its
			// call arrives on a loaded machine.)
			var during []string
			for _, cl := range calls {
				if cl.delegate == "east" && cl.replica == i && cl.at.Before(s.until) && accepted[cl.run].After(s.at) {
					during = append(during, cl.String())
				}
			}
			assert.Empty(t, during, "r%d's runs asked for after it showed the breaker open call east (shown %s, until %s)", i, s.at.Format("15:04:05.000"), s.until.Format("15:04:05.000"))
			t.Logf("r%d saw east's breaker open %s after east was killed (opened by %s, until %s)", i, s.at.Sub(killedAt).Round(time.Millisecond), s.by, s.until.Format("15:04:05.000"))
		}
		// After the cooldown: the fleet's probes, probes a cooldown at
		// most (each failing probe opens it again for a cooldown). A
		// replica cut off from the fleet's store meanwhile (the killed
		// node's stall) guards on its own breaker, which follows the
		// fleet's opening it last saw: its own probes, as many at most.
		cutOff := make([][]span, len(rs))
		for i, r := range rs {
			cutOff[i] = cutOffSpans(r.logs())
		}
		var after []string
		own := make([][]string, len(rs))
		for _, cl := range calls {
			if cl.delegate != "east" || cl.at.Before(first) {
				continue
			}
			if within(cutOff[cl.replica], cl.at) {
				own[cl.replica] = append(own[cl.replica], cl.String())
			} else {
				after = append(after, cl.String())
			}
		}
		most := probes * (1 + int(end.Sub(first)/cooldown))
		assert.LessOrEqual(t, len(after), most, "east's calls after the cooldown are the fleet's probes: %v", after)
		for i, o := range own {
			assert.LessOrEqual(t, len(o), most, "r%d, cut off from the fleet's store (%v), probes on its own: %v", i, cutOff[i], o)
		}
		assert.NotEmpty(t, slices.Concat(append(own, after)...), "east is probed after the cooldown")
		t.Logf("east's calls after its cooldown (%s of test left): the fleet's %d (bound %d): %v; cut-off replicas' own: %v", end.Sub(first).Round(time.Millisecond), len(after), most, after, own)
		if t.Failed() {
			logGuards(t, rs)
			for _, cl := range calls {
				if cl.delegate == "east" && !cl.at.Before(killedAt) {
					t.Logf("call: %s", cl)
				}
			}
		}
	})
}

// span is a time a replica's guards were cut off from the fleet's store;
// to is zero while they still are.
type span struct{ from, to time.Time }

func (s span) String() string {
	if s.to.IsZero() {
		return s.from.Format("15:04:05.000") + "–"
	}
	return s.from.Format("15:04:05.000") + "–" + s.to.Format("15:04:05.000")
}

// cutOffSpans reads from a replica's log the times its guards fell back to
// its own counts, to when they were the fleet's again.
func cutOffSpans(logs string) []span {
	var spans []span
	for l := range strings.Lines(logs) {
		var line struct {
			Time time.Time `json:"time"`
			Msg  string    `json:"msg"`
		}
		if json.Unmarshal([]byte(l), &line) != nil {
			continue
		}
		switch {
		case line.Msg == "guards fall back to this replica's own counts":
			if len(spans) == 0 || !spans[len(spans)-1].to.IsZero() {
				spans = append(spans, span{from: line.Time})
			}
		case line.Msg == "guards are the fleet's again" && len(spans) > 0 && spans[len(spans)-1].to.IsZero():
			spans[len(spans)-1].to = line.Time
		}
	}
	return spans
}

// within reports whether a call that reached a delegate at at was admitted
// while its replica was cut off: within a span, or up to a second after
// its end (the journal's write of the attempt comes between the two).
func within(spans []span, at time.Time) bool {
	for _, s := range spans {
		if !at.Before(s.from) && (s.to.IsZero() || at.Before(s.to.Add(time.Second))) {
			return true
		}
	}
	return false
}

// balanceRun is how one run of TestBalanceCluster ended.
type balanceRun struct {
	id     string
	sent   time.Time // when the StartRun that created it was sent
	status stubbornv1.RunStatus
	why    string
	took   time.Duration
}

// runToEnd starts req through r, retrying while the cluster elects
// leaders, and polls it until it ends, within bound from now.
func runToEnd(ctx context.Context, r *replica, req *stubbornv1.StartRunRequest, bound time.Duration) balanceRun {
	start := time.Now()
	deadline := start.Add(bound)
	var (
		id   string
		sent time.Time
		last error
	)
	for id == "" && time.Now().Before(deadline) {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		at := time.Now()
		res, err := r.api().StartRun(cctx, req)
		cancel()
		if err == nil {
			id, sent = res.GetRunId(), at
			break
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	if id == "" {
		return balanceRun{why: fmt.Sprintf("never started through %s: %v", r.name(), last), took: time.Since(start)}
	}
	for time.Now().Before(deadline) {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		res, err := r.api().GetRun(cctx, &stubbornv1.GetRunRequest{RunId: id})
		cancel()
		if err == nil && terminal(res.GetState().GetStatus()) {
			st := res.GetState()
			why := st.GetStatusReason()
			if st.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED {
				why = "answered by " + st.GetResult().GetText()
			} else {
				for _, a := range st.GetAttemptLog() {
					why += fmt.Sprintf("; %s %s %s: %s %s", a.GetPath(), a.GetDelegate(), a.GetStartDetail(), a.GetOutcome(), a.GetError())
				}
			}
			return balanceRun{id: id, sent: sent, status: st.GetStatus(), why: why, took: time.Since(start)}
		}
		if err != nil {
			last = err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return balanceRun{id: id, sent: sent, why: fmt.Sprintf("run %s not ended within %s through %s (last error %v)", id, bound, r.name(), last), took: time.Since(start)}
}
