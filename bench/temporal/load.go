package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	sdkclient "go.temporal.io/sdk/client"
)

// loadResult is the one JSON line `load` prints; its fields are those of
// the main bench's LoadResult (bench/load.go) that apply here.
type loadResult struct {
	Scenario    string  `json:"scenario"`
	Store       string  `json:"store"`
	Concurrency int     `json:"concurrency"`
	Ops         int64   `json:"ops"`
	Errors      int64   `json:"errors"`
	OpsPerSec   float64 `json:"ops_per_sec"`
	P50us       float64 `json:"p50_us"`
	P99us       float64 `json:"p99_us"`
	FirstError  string  `json:"first_error,omitempty"`
}

// callTimeout bounds one call, start to result, so a lost workflow cannot
// hold a caller past the end (which cancels it before that anyway).
const callTimeout = 30 * time.Second

func loadCmd(ctx context.Context, fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	hostPort := fs.String("temporal", "", "Temporal frontend HOST:PORT")
	scenario := fs.String("scenario", scenarioOne, "one (echo, one attempt) or retry3 (fail-first-2, three attempts 1 ms apart)")
	conc := fs.Int("concurrency", 1, "callers in the closed loop")
	dur := fs.Duration("duration", 5*time.Second, "measured window, after the warmup")
	warmup := fs.Duration("warmup", time.Second, "calls ending before this are not counted")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *hostPort == "" {
		return errors.New("load needs -temporal")
	}
	if _, err := retryPolicy(*scenario); err != nil {
		return err
	}
	if *conc < 1 || *dur <= 0 || *warmup < 0 {
		return errors.New("load needs -concurrency ≥ 1, -duration > 0, -warmup ≥ 0")
	}
	c, err := sdkclient.DialContext(ctx, sdkclient.Options{HostPort: *hostPort, Namespace: namespace, Logger: sdkLogger(stderr)})
	if err != nil {
		return fmt.Errorf("dial %s: %w", *hostPort, err)
	}
	defer c.Close()
	r := runLoad(ctx, c, *scenario, *conc, *warmup, *dur)
	return json.NewEncoder(stdout).Encode(r)
}

// runLoad runs conc callers in a closed loop for warmup+dur, each starting
// the workflow "Run" and waiting for its result. Only calls that end after
// the warmup and before the end are counted (latency, ops, errors); the
// calls still under way at the end are cancelled and not counted.
func runLoad(ctx context.Context, c sdkclient.Client, scenario string, conc int, warmup, dur time.Duration) loadResult {
	start := time.Now()
	from, end := start.Add(warmup), start.Add(warmup+dur)
	ctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	prefix := "bench-" + scenario + "-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatUint(rand.Uint64()>>32, 36)

	var (
		mu       sync.Mutex
		lat      []time.Duration
		errs     int64
		firstErr string
		wg       sync.WaitGroup
	)
	for g := range conc {
		wg.Go(func() {
			var mine []time.Duration
			for n := 0; ctx.Err() == nil; n++ {
				t0 := time.Now()
				err := call(ctx, c, fmt.Sprintf("%s-%d-%d", prefix, g, n), scenario)
				t1 := time.Now()
				if t1.Before(from) || t1.After(end) || ctx.Err() != nil {
					continue // warmup, or cut off by the end
				}
				if err != nil {
					mu.Lock()
					if errs == 0 {
						firstErr = err.Error()
					}
					errs++
					mu.Unlock()
					continue
				}
				mine = append(mine, t1.Sub(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.Sort(lat)
	ops := int64(len(lat))
	return loadResult{
		Scenario: "temporal-" + scenario, Store: "temporal", Concurrency: conc,
		Ops: ops, Errors: errs,
		OpsPerSec:  float64(ops) / dur.Seconds(),
		P50us:      us(percentile(lat, 0.50)),
		P99us:      us(percentile(lat, 0.99)),
		FirstError: firstErr,
	}
}

// call starts one workflow and waits for its result.
func call(ctx context.Context, c sdkclient.Client, id, scenario string) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	// No WorkflowExecutionTimeout: it would add a timer per workflow that
	// the server loads and drops 30 s later, after the workflow is done;
	// ctx bounds the caller.
	run, err := c.ExecuteWorkflow(ctx, sdkclient.StartWorkflowOptions{ID: id, TaskQueue: taskQueue},
		workflowName, "bench brief", scenario)
	if err != nil {
		return err
	}
	var text string
	return run.Get(ctx, &text)
}

// percentile is the main bench's (bench/load.go): nearest rank.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
