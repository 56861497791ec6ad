package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The shipped scenarios (issue #21) measure what users run: the real
// binary, built from the module at -root, each piece in its own process.
//
//	bench (this process) ── starts, samples /proc/<pid>, stops ──┐
//	client   ── gRPC ──> [proxy | stubborn serve | peer server]  ──> delegate
//	(bench -role client, one per slice)                     (bench -role delegate)
//
// proc-direct calls the delegate; proc-proxy goes through the plain proxy
// (bench -role proxy); proc-run and proc-retry through `stubborn serve`,
// one process per -store. With -temporal DIR, the peer in DIR (its own Go
// module, see temporal.go) is measured in the same rotation.
var shippedNames = []string{"proc-direct", "proc-proxy", "proc-run", "proc-retry"}

// serveStores are `stubborn serve`'s flags for each -store. The embedded
// stores also get -data-dir in a temporary directory.
var serveStores = map[string][]string{
	"memory":            {"-memory"},
	"embedded-interval": {}, // serve's default: embedded JetStream, fsync every second
	"embedded-always":   {"-durability", "always"},
}

// servingLog matches the line `stubborn serve` logs once it serves, in its
// text (default) or JSON log format; its submatch is the address.
var servingLog = regexp.MustCompile(`msg="stubborn serving" addr=(\S+)|"msg":"stubborn serving","addr":"([^"]+)"`)

// shippedCase is one measurement: a client program, run once per slice,
// against one target at one concurrency.
type shippedCase struct {
	scenario, store string
	conc            int
	// client is the client's program and arguments, without
	// -concurrency, -duration and -warmup.
	client []string
	// server and worker are the processes between the client and the
	// delegate, whose CPU and memory are reported (nil: none).
	server, worker *child
	// delegate is the delegate process whose CPU is reported, when not
	// the bench's delegate (the streaming scenarios').
	delegate *child

	slices []LoadResult
	// CPU time of server, worker and the delegate over the sampled
	// windows, and the calls the clients counted, scaled to those windows.
	cpu       [3]time.Duration
	windowOps float64
	// windowBytes is the text the streaming clients received in those
	// windows (window), scaled like windowOps.
	windowBytes float64
	rss         [2]int64 // peak RSS of server and worker
}

func (sc *shippedCase) String() string {
	if sc.store == "" {
		return fmt.Sprintf("%s c=%d", sc.scenario, sc.conc)
	}
	return fmt.Sprintf("%s store=%s c=%d", sc.scenario, sc.store, sc.conc)
}

// shippedTarget is what a shippedCase measures, at every concurrency.
type shippedTarget struct {
	scenario, store          string
	client                   []string
	server, worker, delegate *child
}

// runShipped measures the shipped scenarios o selects, interleaved like
// runLoads: after one warm-up client per measurement (-warmup), rounds in
// which each measurement's client runs for one slice (after -proc-warmup
// of its own), until each has had -duration. Every child is stopped and
// every temporary file removed before it returns, on error too.
func runShipped(ctx context.Context, o options) ([]LoadResult, error) {
	tmp, err := os.MkdirTemp("", "stubborn-bench-shipped-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	var children []*child
	defer func() {
		for _, c := range slices.Backward(children) {
			c.stop()
		}
	}()
	// start starts a child that prints ready (and its fields) once it is.
	start := func(spec childSpec, ready string, timeout time.Duration) (*child, []string, error) {
		c, err := startChild(ctx, spec)
		if err != nil {
			return nil, nil, err
		}
		children = append(children, c)
		line, err := c.next(ctx, ready, timeout)
		if err != nil {
			return nil, nil, err
		}
		return c, strings.Fields(line)[1:], nil
	}

	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	delegate, addrs, err := start(childSpec{name: "delegate", path: self, args: []string{"-role", "delegate", "-exit-on-eof"}, stdin: true}, "READY", time.Minute)
	if err != nil {
		return nil, err
	}
	if len(addrs) != 2 {
		return nil, fmt.Errorf("delegate: READY with %d addresses, want 2", len(addrs))
	}
	echoAddr, flakyAddr := addrs[0], addrs[1]
	client := func(target, scenario string) []string {
		return []string{self, "-role", "client", "-target", target, "-scenario", scenario, "-retry-wait", o.retryWait.String()}
	}
	streamers, err := startStreamers(o, self, start)
	if err != nil {
		return nil, err
	}

	var targets []shippedTarget
	if o.scenarios["proc-direct"] {
		targets = append(targets, shippedTarget{scenario: "proc-direct", client: client(echoAddr, "direct")})
	}
	if o.scenarios["proc-proxy"] {
		px, f, err := start(childSpec{name: "proxy", path: self, args: []string{"-role", "proxy", "-exit-on-eof", "-target", echoAddr}, stdin: true}, "READY", time.Minute)
		if err != nil {
			return nil, err
		}
		if len(f) != 1 {
			return nil, fmt.Errorf("proxy: READY with %d addresses, want 1", len(f))
		}
		targets = append(targets, shippedTarget{scenario: "proc-proxy", client: client(f[0], "proxy"), server: px})
	}
	targets = append(targets, streamers.directTargets(o, client)...)
	if o.scenarios["proc-run"] || o.scenarios["proc-retry"] || o.scenarios["proc-stream-run"] || o.scenarios["proc-stream-run-sse"] || wantsFrontDoor(o) {
		cfg := filepath.Join(tmp, "stubborn.yaml")
		if err := os.WriteFile(cfg, append(serveConfig(echoAddr, flakyAddr), streamers.config()...), 0o600); err != nil {
			return nil, err
		}
		trees := []struct{ root, flag, suffix string }{{o.root, "-root", ""}}
		if o.besideRoot != "" {
			trees = append(trees, struct{ root, flag, suffix string }{o.besideRoot, "-beside-root", "@beside"})
		}
		for i, tree := range trees {
			bin := filepath.Join(tmp, fmt.Sprintf("stubborn%d", i))
			progress("shipped: go build -o %s ./cmd/stubborn (in %s)", bin, tree.root)
			if _, err := os.Stat(filepath.Join(tree.root, "cmd", "stubborn")); err != nil {
				return nil, fmt.Errorf("%s %s is not Stubborn's module root (run the bench from it or pass -root): %w", tree.flag, tree.root, err)
			}
			if err := goBuild(ctx, tree.root, bin, "./cmd/stubborn"); err != nil {
				return nil, err
			}
			for _, storeName := range o.stores {
				store := storeName + tree.suffix
				storeFlags, ok := serveStores[storeName]
				if !ok {
					return nil, fmt.Errorf("-store %s: no `stubborn serve` flags for it in serveStores", storeName)
				}
				args := []string{"serve", "-config", cfg, "-listen", "127.0.0.1:0"}
				if storeName != "memory" {
					args = append(args, "-data-dir", filepath.Join(tmp, "data-"+store))
				}
				var httpBase string
				if wantsFrontDoor(o) {
					hl, err := freeHTTPListen()
					if err != nil {
						return nil, err
					}
					args, httpBase = append(args, "-http-listen", hl), "http://"+hl+"/v1"
				}
				args = append(append(args, storeFlags...), o.serveFlags...)
				progress("shipped: stubborn %s", strings.Join(args, " "))
				s, err := startChild(ctx, childSpec{name: "stubborn serve (" + store + ")", path: bin, args: args, watch: servingLog})
				if err != nil {
					return nil, err
				}
				children = append(children, s)
				addr, err := s.match(ctx, 2*time.Minute)
				if err != nil {
					return nil, err
				}
				if err := waitServing(ctx, s, addr, time.Minute); err != nil {
					return nil, err
				}
				if o.scenarios["proc-run"] {
					targets = append(targets, shippedTarget{scenario: "proc-run", store: store, client: client(addr, "run"), server: s})
				}
				if o.scenarios["proc-retry"] {
					targets = append(targets, shippedTarget{scenario: "proc-retry", store: store, client: client(addr, "retry"), server: s})
				}
				targets = append(targets, streamers.runTargets(o, client, s, store, addr)...)
				if httpBase != "" {
					if err := waitHTTP(ctx, s, httpBase, time.Minute); err != nil {
						return nil, err
					}
					targets = append(targets, streamers.frontDoorTargets(o, client, s, store, httpBase)...)
				}
			}
		}
	}
	if o.temporalDir != "" {
		peer, err := startTemporal(ctx, o.temporalDir, tmp, echoAddr, flakyAddr, start)
		if err != nil {
			return nil, err
		}
		targets = append(targets, peer...)
	}

	var cases []*shippedCase
	for _, c := range o.concurrency {
		for _, t := range targets {
			cases = append(cases, &shippedCase{scenario: t.scenario, store: t.store, conc: c, client: t.client, server: t.server, worker: t.worker, delegate: t.delegate})
		}
	}
	if len(cases) == 0 {
		return nil, nil
	}
	if o.warmup > 0 {
		progress("shipped warm-up: %d measurements × %v", len(cases), o.warmup)
		for _, sc := range cases {
			if err := sc.measure(ctx, delegate, 0, o.warmup, false); err != nil {
				return nil, fmt.Errorf("%v, warm-up: %w", sc, err)
			}
		}
	}
	rounds, slice := slicing(o.duration, o.slice)
	for i := range rounds {
		progress("shipped round %d of %d: %d measurements × (%v + %v)", i+1, rounds, len(cases), o.procWarmup, slice)
		for _, sc := range cases {
			if err := sc.measure(ctx, delegate, o.procWarmup, slice, true); err != nil {
				return nil, fmt.Errorf("%v: %w", sc, err)
			}
		}
	}
	out := make([]LoadResult, 0, len(cases))
	for _, sc := range cases {
		r := sc.result(slice)
		mergeStreaming(&r, sc.slices, o.serveFlags)
		out = append(out, r)
	}
	return out, nil
}

// slicing splits duration into rounds of about slice each.
func slicing(duration, slice time.Duration) (rounds int, each time.Duration) {
	rounds = max(1, int((duration+slice/2)/slice))
	return rounds, duration / time.Duration(rounds)
}

// serveConfig is `stubborn serve`'s config: the delegates of scenarios 3
// and 4, as the in-process registry has them.
func serveConfig(echoAddr, flakyAddr string) []byte {
	return fmt.Appendf(nil, "delegates:\n  - {name: %s, target: %q, idempotent: true, timeout: 1m}\n  - {name: %s, target: %q, idempotent: true, timeout: 1m}\n",
		echoName, echoAddr, flaky2Name, flakyAddr)
}

// goBuild builds the package pkg of the module in dir to out.
func goBuild(ctx context.Context, dir, out, pkg string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s in %s: %w\n%s", pkg, dir, err, b)
	}
	return nil
}

// waitServing waits until the gRPC health service at addr, s's, says
// SERVING.
func waitServing(ctx context.Context, s *child, addr string, timeout time.Duration) error {
	conn, err := dial(addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(timeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		r, err := hc.Check(cctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		if err := s.alive(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return s.failure(fmt.Sprintf("not SERVING at %s within %v (%v, %v)", addr, timeout, r.GetStatus(), err))
		}
		if err := sleepUntil(ctx, time.Now().Add(50*time.Millisecond)); err != nil {
			return err
		}
	}
}

// measure runs sc's client once: warmup, then dur measured. With record,
// it samples the CPU time of sc's server and worker and of the delegate
// over the client's measured window and keeps the result; without, it only
// checks that no call failed (a warm-up).
func (sc *shippedCase) measure(ctx context.Context, delegate *child, warmup, dur time.Duration, record bool) error {
	if sc.delegate != nil {
		delegate = sc.delegate
	}
	procs := []*child{sc.server, sc.worker, delegate}
	for _, p := range procs {
		if p == nil {
			continue
		}
		if err := p.alive(); err != nil {
			return err
		}
	}
	args := append(slices.Clip(sc.client[1:]), "-concurrency", strconv.Itoa(sc.conc), "-duration", dur.String(), "-warmup", warmup.String())
	cl, err := startChild(ctx, childSpec{name: sc.String() + " client", path: sc.client[0], args: args})
	if err != nil {
		return err
	}
	defer cl.stop()
	started := time.Now()
	var before, after [3]time.Duration
	var window time.Duration
	if record {
		// The client's window starts warmup after its own start, a few
		// milliseconds after started: this one lies within its load.
		if err := sleepUntil(ctx, started.Add(warmup)); err != nil {
			return err
		}
		t0 := time.Now()
		before = cpuOf(procs)
		if err := sleepUntil(ctx, started.Add(warmup+dur)); err != nil {
			return err
		}
		after = cpuOf(procs)
		window = time.Since(t0)
	}
	line, err := cl.next(ctx, "{", warmup+dur+time.Minute)
	if err != nil {
		return err
	}
	var r LoadResult
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		return fmt.Errorf("client printed %q: %w", line, err)
	}
	if !record {
		if r.FirstError != "" {
			return fmt.Errorf("%d calls failed, the first: %s", r.Errors, r.FirstError)
		}
		return nil
	}
	sc.slices = append(sc.slices, r)
	for i := range sc.cpu {
		sc.cpu[i] += after[i] - before[i]
	}
	sc.windowOps += float64(r.Ops) * window.Seconds() / dur.Seconds()
	sc.windowBytes += float64(r.WindowBytes) * window.Seconds() / dur.Seconds()
	for i, p := range procs[:2] {
		if p == nil {
			continue
		}
		if rss, err := procMaxRSS(p.pid()); err == nil {
			sc.rss[i] = max(sc.rss[i], rss)
		}
	}
	return nil
}

// cpuOf returns the CPU time each of procs has used: 0 for nil, and where
// /proc cannot be read.
func cpuOf(procs []*child) (out [3]time.Duration) {
	for i, p := range procs {
		if p == nil {
			continue
		}
		if d, err := procCPU(p.pid()); err == nil {
			out[i] = d
		}
	}
	return out
}

// result merges sc's slices: calls and errors add up, throughput is the
// calls over the slices' time, p50 and p99 are the medians of the slices'
// (a client reports percentiles, not latencies), CPU per call is each
// process's CPU time over the calls counted in the windows it was sampled
// in, and CPUusPerOp their sum with the clients'.
func (sc *shippedCase) result(slice time.Duration) LoadResult {
	r := LoadResult{Scenario: sc.scenario, Store: sc.store, Concurrency: sc.conc}
	var clientCPU float64
	for _, s := range sc.slices {
		r.Ops += s.Ops
		r.Errors += s.Errors
		clientCPU += s.CPUusPerOp * float64(s.Ops)
		if r.FirstError == "" {
			r.FirstError = s.FirstError
		}
	}
	if len(sc.slices) > 0 {
		r.OpsPerSec = float64(r.Ops) / (float64(len(sc.slices)) * slice.Seconds())
	}
	r.P50us = median(sc.slices, func(v LoadResult) float64 { return v.P50us })
	r.P99us = median(sc.slices, func(v LoadResult) float64 { return v.P99us })
	if r.Ops > 0 {
		r.ClientCPUusPerOp = clientCPU / float64(r.Ops)
	}
	if sc.windowOps > 0 {
		r.ServerCPUusPerOp = us(sc.cpu[0]) / sc.windowOps
		r.WorkerCPUusPerOp = us(sc.cpu[1]) / sc.windowOps
		r.DelegateCPUusPerOp = us(sc.cpu[2]) / sc.windowOps
	}
	r.CPUusPerOp = r.ClientCPUusPerOp + r.ServerCPUusPerOp + r.WorkerCPUusPerOp + r.DelegateCPUusPerOp
	if sc.windowBytes > 0 {
		r.ServerCPUusPerKB = us(sc.cpu[0]) / (sc.windowBytes / 1000)
		r.DelegateCPUusPerKB = us(sc.cpu[2]) / (sc.windowBytes / 1000)
	}
	r.ServerRSSBytes, r.WorkerRSSBytes = sc.rss[0], sc.rss[1]
	return r
}

// isShipped says whether a result is of the shipped scenarios (or their
// peer's), not of the in-process ones.
func isShipped(scenario string) bool {
	return strings.HasPrefix(scenario, "proc-") || strings.HasPrefix(scenario, "temporal-")
}

// sleepUntil sleeps until t or until ctx ends.
func sleepUntil(ctx context.Context, t time.Time) error {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stopped: %w", ctx.Err())
	}
}
