// Command bench measures Stubborn beside the physical limit of what it
// does, in one process, and prints a markdown table (issue #8):
//
//  1. direct: a unary Execute to the delegate (demo.Echo on loopback);
//  2. proxy: the same through a plain gRPC proxy that only forwards Execute;
//     2b. stream: a plain ControlService whose Run forwards Execute like the
//     proxy, then streams the events of a captured Stubborn run: the cost of
//     Run's shape (a server stream of four events) without Stubborn's work;
//     2c. stream-live: the same, but the events Stubborn records before it
//     calls the delegate (run_started, attempt_started) are sent before the
//     call, as Run sends them: the floor of Run's shape at concurrency 1;
//  3. run: a Stubborn Run with one successful attempt (fallback_chain
//     [echo]), its stream read to its end;
//  4. retry: a Stubborn retry run whose first two attempts fail UNAVAILABLE,
//     three attempts in all, with zero waits;
//  5. waiting: 10,000 runs waiting in backoff at once: heap, stack and RSS
//     per waiting run, and CPU used while they all wait;
//  6. watch: one run watched by 1,000 WatchRun streams: delivery latency of
//     each live event.
//
// 1–4 run closed-loop at each -concurrency, interleaved in slices so that
// other load on the machine weighs on them alike; 5 and 6 get a fresh
// Stubborn server each. Stubborn's scenarios run once per -store (memory,
// embedded-interval, embedded-always: see stores in fixture.go).
//
// The streaming scenarios (issue #33; streaming.go), "-scenarios
// streaming", measure streamed output the same way: time to first and to
// last output through `stubborn serve` beside the same streaming delegate
// called directly (a gRPC delegate streaming with delegatekit.Send, and an
// OpenAI-shaped SSE server as an openai delegate), each in its own process.
//
// The shipped scenarios (issue #21; shipped.go) are 1–4 as users run them,
// each piece in its own process: proc-direct, proc-proxy, proc-run and
// proc-retry ("-scenarios shipped" for all four; not in the default set).
// The bench builds the real binary (go build ./cmd/stubborn in -root) and
// runs `stubborn serve` once per -store (memory: -memory; embedded-interval:
// its default flags; embedded-always: -durability always), the delegate and
// the plain proxy as this binary in a hidden role (bench -role delegate,
// bench -role proxy: roles.go), and the callers as one client process per
// slice (bench -role client). It reports each process's CPU time per call
// from /proc and the server's peak RSS. With -temporal DIR it measures the
// Temporal peer in DIR (its own module; temporal.go) in the same rotation.
//
// Everything listens on 127.0.0.1, every loop is bounded, and every child
// process is stopped (on an error and on Ctrl-C too) and every temporary
// file removed before the bench exits.
//
//	go run ./bench -duration 5s -concurrency 1,32
//	go run ./bench -json run1.json ...; go run ./bench -median run1.json,run2.json,run3.json
//	go run ./bench -scenarios shipped -store memory,embedded-interval -json s1.json
//	go run ./bench -scenarios streaming -store memory,embedded-interval -slice 1s -json t1.json
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Report is everything one invocation measured.
type Report struct {
	Machine Machine         `json:"machine"`
	Command string          `json:"command"`
	Load    []LoadResult    `json:"load"`
	Waiting []WaitingResult `json:"waiting"`
	Watch   []WatchResult   `json:"watch"`
	// Ratios are computed from Load, within one run: its measurements are
	// interleaved, so other load on the machine weighs on both sides.
	Ratios []Ratio `json:"ratios"`
	// Streaming compares the streaming scenarios with their direct calls,
	// from Load like Ratios (streaming.go).
	Streaming []StreamRow `json:"streaming,omitempty"`
	// Runs is how many runs the figures are the medians of.
	Runs int `json:"runs"`
}

// Machine describes where the numbers come from.
type Machine struct {
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	CPU        string `json:"cpu"`
	Go         string `json:"go"`
	OS         string `json:"os"`
	// LoadAvg is /proc/loadavg's 1-minute figure before and after: other
	// processes' load skews every number.
	LoadAvgBefore string `json:"load_avg_before"`
	LoadAvgAfter  string `json:"load_avg_after"`
}

var scenarioNames = []string{"direct", "proxy", "stream", "stream-live", "run", "retry", "waiting", "watch"}

type options struct {
	duration, warmup, slice time.Duration
	concurrency             []int
	stores                  []string
	scenarios               map[string]bool

	waitingRuns int
	idle        time.Duration

	watchers, watchConns, watchAttempts int
	watchBatches                        []int
	watchPace                           time.Duration
	watchFloor                          bool

	jsonOut, median, cpuProfile, memProfile, heapProfile, idleProfile, execTrace string

	// The shipped scenarios.
	root, temporalDir     string
	besideRoot            string // a second tree measured in the same rotation (-beside-root)
	serveFlags            []string
	procWarmup, retryWait time.Duration
	// The streaming scenarios' answer.
	stream streamShape
}

func main() { os.Exit(exitCode(run)) }

// exitCode runs the role the arguments ask for, or else orElse, until
// SIGINT or SIGTERM, and returns the exit code.
func exitCode(orElse func(context.Context) error) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if roleArgs(os.Args[1:]) {
		err = runRole(ctx, os.Args[1:], os.Stdin, os.Stdout)
	} else {
		err = orElse(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	return 0
}

func run(ctx context.Context) error {
	var o options
	var conc, storeList, scen, batches, serveFlags string
	flag.DurationVar(&o.duration, "duration", 5*time.Second, "measured time of each load measurement, and of each watch mode")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured warm-up of each load measurement")
	flag.DurationVar(&o.slice, "slice", 500*time.Millisecond, "load measurements take turns in slices of this length")
	flag.StringVar(&conc, "concurrency", "1,32", "comma-separated numbers of concurrent callers for scenarios 1–4")
	flag.StringVar(&storeList, "store", "memory", "comma-separated run stores for Stubborn's scenarios (have: "+storeNames()+")")
	flag.StringVar(&scen, "scenarios", strings.Join(scenarioNames, ","), "comma-separated scenarios to run; the shipped ones, each process on its own, are "+strings.Join(shippedNames, ",")+" (shipped: all four) and the streaming ones "+strings.Join(streamingNames, ",")+" (streaming: all four) and the front door's "+strings.Join(frontDoorNames, ",")+" (frontdoor: these and proc-stream-sse)")
	o.stream.flags(flag.CommandLine, "stream-")
	flag.StringVar(&o.root, "root", ".", "shipped scenarios: Stubborn's module root, where cmd/stubborn is built from")
	flag.StringVar(&o.besideRoot, "beside-root", "", "shipped scenarios: a second module root (another commit's tree, e.g. a git worktree) whose `stubborn serve` is measured in the same rotation as -root's, slice by slice: its rows' store is named STORE@beside (before/after comparisons that share the machine's load)")
	flag.DurationVar(&o.procWarmup, "proc-warmup", 250*time.Millisecond, "shipped scenarios: unmeasured warm-up of each slice's client process (a new process and connection)")
	flag.DurationVar(&o.retryWait, "retry-wait", 0, "shipped scenarios: proc-retry's base_wait and max_wait (full jitter: each wait is drawn from [0, this]); 1ms to match the Temporal peer's retry3")
	flag.StringVar(&serveFlags, "serve-flags", "", "shipped scenarios: more flags for every `stubborn serve`, split at spaces (e.g. \"-log-level warn\")")
	flag.StringVar(&o.temporalDir, "temporal", "", "shipped scenarios: also measure the Temporal peer, the Go program in this directory (bench/temporal), in the same rotation; none when empty. Its calls take tens of ms: give a -slice of seconds")
	flag.IntVar(&o.waitingRuns, "waiting", 10_000, "runs waiting in backoff at once (scenario 5)")
	flag.DurationVar(&o.idle, "idle", 5*time.Second, "CPU measurement window, without runs and while they all wait (scenario 5)")
	flag.StringVar(&batches, "watch-batch", "1,100", "comma-separated WatchRunRequest.max_batch values the watchers use, each measured in turn (scenario 6); 1 is one event per message")
	flag.IntVar(&o.watchers, "watchers", 1000, "WatchRun streams on the watched run (scenario 6)")
	flag.IntVar(&o.watchConns, "watch-conns", 10, "client connections the watchers are spread over (scenario 6): 1,000 watchers are many clients")
	flag.IntVar(&o.watchAttempts, "watch-attempts", 20, "attempts of the watched run, the last one succeeding (scenario 6)")
	flag.BoolVar(&o.watchFloor, "watch-floor", true, "after each watch measurement, the same against the floor: a server that only streams a captured run's events at the pace Stubborn emitted them (scenario 6)")
	flag.DurationVar(&o.watchPace, "watch-pace", 10*time.Millisecond, "paced mode's max backoff wait; 0 runs only the burst mode (scenario 6)")
	flag.StringVar(&o.jsonOut, "json", "", "also write the results to this JSON file")
	flag.StringVar(&o.median, "median", "", "comma-separated JSON files from earlier -json runs: print their medians and measure nothing")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the measurements to this file")
	flag.StringVar(&o.execTrace, "trace", "", "write an execution trace of the measurements to this file (go tool trace; -pprof=sched shows scheduling delays)")
	flag.StringVar(&o.memProfile, "memprofile", "", "write an allocation profile to this file at the end")
	flag.StringVar(&o.heapProfile, "heapprofile", "", "write a heap profile to this file while every run of scenario 5 waits")
	flag.StringVar(&o.idleProfile, "idleprofile", "", "write a CPU profile of scenario 5's waiting window to this file (not with -cpuprofile)")
	flag.Parse()

	if o.median != "" {
		rep, err := medianOf(strings.Split(o.median, ","))
		if err != nil {
			return err
		}
		printReport(os.Stdout, rep, fmt.Sprintf("medians of %d runs", len(strings.Split(o.median, ","))))
		return nil
	}
	var err error
	if o.concurrency, err = ints(conc); err != nil {
		return fmt.Errorf("-concurrency: %w", err)
	}
	if o.watchBatches, err = ints(batches); err != nil {
		return fmt.Errorf("-watch-batch: %w", err)
	}
	o.stores = strings.Split(storeList, ",")
	for _, s := range o.stores {
		if _, ok := stores[s]; !ok {
			return fmt.Errorf("-store: unknown store %q (have %s)", s, storeNames())
		}
	}
	o.scenarios = map[string]bool{}
	for _, s := range strings.Split(scen, ",") {
		switch {
		case s == "shipped":
			for _, n := range shippedNames {
				o.scenarios[n] = true
			}
		case s == "streaming":
			for _, n := range streamingNames {
				o.scenarios[n] = true
			}
		case s == "frontdoor":
			for _, n := range frontDoorGroup {
				o.scenarios[n] = true
			}
		case slices.Contains(scenarioNames, s) || slices.Contains(shippedNames, s) || slices.Contains(streamingNames, s) || slices.Contains(frontDoorNames, s):
			o.scenarios[s] = true
		default:
			return fmt.Errorf("-scenarios: unknown scenario %q (have %s, %s, shipped, %s, streaming, %s, frontdoor)", s, strings.Join(scenarioNames, ","), strings.Join(shippedNames, ","), strings.Join(streamingNames, ","), strings.Join(frontDoorNames, ","))
		}
	}
	o.serveFlags = strings.Fields(serveFlags)
	if o.duration <= 0 || o.slice <= 0 || o.warmup < 0 || o.procWarmup < 0 {
		return errors.New("-duration and -slice must be positive, -warmup and -proc-warmup not negative")
	}
	if o.watchAttempts < 1 || o.watchers < 1 || o.watchConns < 1 || o.waitingRuns < 1 {
		return errors.New("-watchers, -watch-conns, -watch-attempts and -waiting must be at least 1")
	}
	if err := o.stream.check(); err != nil {
		return err
	}

	if o.cpuProfile != "" && o.idleProfile != "" {
		return errors.New("-cpuprofile and -idleprofile cannot be used together")
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if o.execTrace != "" {
		f, err := os.Create(o.execTrace)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := trace.Start(f); err != nil {
			return err
		}
		defer trace.Stop()
	}

	rep, err := measure(ctx, o)
	if err != nil {
		return err
	}
	rep.Machine.LoadAvgAfter = loadAvg()
	printReport(os.Stdout, rep, "one run")
	if o.jsonOut != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(o.jsonOut, b, 0o644); err != nil {
			return err
		}
	}
	if o.memProfile != "" {
		f, err := os.Create(o.memProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		return pprof.Lookup("allocs").WriteTo(f, 0)
	}
	return nil
}

func measure(ctx context.Context, o options) (*Report, error) {
	rep := &Report{Machine: machine(), Command: strings.Join(append([]string{"go run ./bench"}, os.Args[1:]...), " "), Runs: 1}
	// Bounds the whole invocation, in case a server stops answering.
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()

	if slices.ContainsFunc(scenarioNames, func(s string) bool { return o.scenarios[s] }) {
		if err := measureInProcess(ctx, o, rep); err != nil {
			return nil, err
		}
	}
	procScenario := func(s string) bool { return o.scenarios[s] }
	if o.temporalDir != "" || slices.ContainsFunc(shippedNames, procScenario) || slices.ContainsFunc(streamingNames, procScenario) || slices.ContainsFunc(frontDoorNames, procScenario) {
		load, err := runShipped(ctx, o)
		if err != nil {
			return nil, fmt.Errorf("shipped: %w", err)
		}
		rep.Load = append(rep.Load, load...)
	}
	rep.Ratios = ratios(rep.Load)
	rep.Streaming = streamRows(rep.Load)
	return rep, nil
}

// measureInProcess measures the in-process scenarios into rep.
func measureInProcess(ctx context.Context, o options, rep *Report) error {
	w, err := newWorld(o.watchAttempts)
	if err != nil {
		return err
	}
	defer w.close()

	load, err := runLoads(ctx, w, o)
	if err != nil {
		return err
	}
	rep.Load = load
	if o.scenarios["waiting"] {
		for _, store := range o.stores {
			progress("waiting runs=%d store=%s", o.waitingRuns, store)
			runtime.GC()
			r, err := runWaiting(ctx, w, store, o.waitingRuns, o.idle, 32, o.heapProfile, o.idleProfile)
			if err != nil {
				return fmt.Errorf("waiting: %w", err)
			}
			rep.Waiting = append(rep.Waiting, r)
		}
	}
	if o.scenarios["watch"] {
		modes := []struct {
			name string
			pace time.Duration
		}{{"burst", 0}, {"paced", o.watchPace}}
		for _, store := range o.stores {
			for _, m := range modes {
				if m.name == "paced" && m.pace <= 0 {
					continue
				}
				progress("watch %s watchers=%d store=%s", m.name, o.watchers, store)
				runtime.GC()
				for _, batch := range o.watchBatches {
					r, events, err := runWatch(ctx, w, store, m.name, o.watchers, o.watchConns, o.watchAttempts, batch, m.pace, o.duration)
					if err != nil {
						return fmt.Errorf("watch %s: %w", m.name, err)
					}
					rep.Watch = append(rep.Watch, r)
					if !o.watchFloor {
						continue
					}
					// The floor emits as fast as Stubborn did under this load.
					gap := time.Duration(r.EmitMs * float64(time.Millisecond) / float64(max(r.EventsPerWatcher-1, 1)))
					progress("watch %s floor batch=%d gap=%v", m.name, batch, gap)
					runtime.GC()
					f, err := runFloor(ctx, w, m.name, o.watchers, o.watchConns, batch, events, gap, o.duration)
					if err != nil {
						return fmt.Errorf("watch %s floor: %w", m.name, err)
					}
					rep.Watch = append(rep.Watch, f)
				}
			}
		}
	}
	return nil
}

// runLoads measures scenarios 1–4 at every concurrency. The measurements
// are interleaved: each takes one slice of -slice in turn, round after
// round, until each has had -duration, so that other load on the machine
// weighs on all of them alike. One Stubborn server per store serves all its
// measurements; it keeps up to 10,000 finished runs, as it would in
// production.
func runLoads(ctx context.Context, w *world, o options) ([]LoadResult, error) {
	type loadCase struct {
		scenario, store string
		conc            int
		fn              op
		m               measured
	}
	var cases []*loadCase
	var stream, streamLive stubbornv1.ControlServiceClient
	servers := map[string]*stubborn{}
	defer func() {
		for _, s := range servers {
			s.stop()
		}
	}()
	for _, c := range o.concurrency {
		if o.scenarios["direct"] {
			cases = append(cases, &loadCase{scenario: "direct", conc: c, fn: directOp(w.direct)})
		}
		if o.scenarios["proxy"] {
			cases = append(cases, &loadCase{scenario: "proxy", conc: c, fn: directOp(w.proxied)})
		}
		if (o.scenarios["stream"] || o.scenarios["stream-live"]) && stream == nil {
			s, err := startStubborn(w, o.stores[0], 1)
			if err != nil {
				return nil, err
			}
			evs, err := capture(ctx, s.client, oneAttemptRun())
			s.stop()
			if err != nil {
				return nil, fmt.Errorf("capturing a run: %w", err)
			}
			if stream, err = w.startStreamer(evs, false); err != nil {
				return nil, err
			}
			if streamLive, err = w.startStreamer(evs, true); err != nil {
				return nil, err
			}
		}
		if o.scenarios["stream"] {
			cases = append(cases, &loadCase{scenario: "stream", conc: c, fn: runOp(stream, oneAttemptRun(), 1)})
		}
		if o.scenarios["stream-live"] {
			cases = append(cases, &loadCase{scenario: "stream-live", conc: c, fn: runOp(streamLive, oneAttemptRun(), 1)})
		}
		for _, store := range o.stores {
			if !o.scenarios["run"] && !o.scenarios["retry"] {
				continue
			}
			s := servers[store]
			if s == nil {
				var err error
				if s, err = startStubborn(w, store, 1); err != nil {
					return nil, err
				}
				servers[store] = s
			}
			if o.scenarios["run"] {
				cases = append(cases, &loadCase{scenario: "run", store: store, conc: c, fn: runOp(s.client, oneAttemptRun(), 1)})
			}
			if o.scenarios["retry"] {
				cases = append(cases, &loadCase{scenario: "retry", store: store, conc: c, fn: runOp(s.client, retryRun(flaky2Name, 2, 0, 0), 3)})
			}
		}
	}
	if len(cases) == 0 {
		return nil, nil
	}
	progress("warm-up: %d measurements × %v", len(cases), o.warmup)
	for _, lc := range cases {
		if m := runLoad(ctx, lc.conc, 0, o.warmup, lc.fn); m.firstErr != nil {
			return nil, fmt.Errorf("%s c=%d: %w", lc.scenario, lc.conc, m.firstErr)
		}
	}
	rounds, slice := slicing(o.duration, o.slice)
	for i := range rounds {
		progress("round %d of %d: %d measurements × %v", i+1, rounds, len(cases), slice)
		for _, lc := range cases {
			lc.m.add(runLoad(ctx, lc.conc, 0, slice, lc.fn))
		}
	}
	out := make([]LoadResult, 0, len(cases))
	for _, lc := range cases {
		out = append(out, summarize(lc.scenario, lc.store, lc.conc, lc.m))
	}
	return out, nil
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func machine() Machine {
	m := Machine{
		CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0),
		Go: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH,
	}
	m.LoadAvgBefore = loadAvg()
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}
