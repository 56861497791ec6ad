package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"
)

// The Temporal peer (issue #21, item 4) is a program in a Go module of its
// own (bench/temporal, so that Stubborn's module does not carry Temporal's
// dependencies), given to -temporal as its directory. The bench builds it
// (go build -o X . in that directory) and holds it to this contract:
//
//   - X server: starts Temporal's embedded dev server, prints
//     "READY <host:port>" on stdout and serves until SIGTERM;
//   - X worker -temporal HOSTPORT -delegate ADDR -flaky-delegate ADDR:
//     prints "READY" once it polls; its activities call the bench's
//     delegate process (the same one Stubborn's runs call): ADDR is
//     demo.Echo, the flaky one fails attempts 1 and 2 (ExecuteRequest.attempt);
//   - X load -temporal HOSTPORT -scenario one|retry3 -concurrency N
//     -duration D -warmup W: runs a closed loop of workflows (one attempt;
//     three attempts of the flaky delegate, 1 ms waits) and prints one JSON
//     line with LoadResult's fields, scenario temporal-one or
//     temporal-retry3.
//
// The server process is the result's server (its CPU and RSS), the worker
// its worker.

// startTemporal builds the peer in dir into tmp, starts its server and its
// worker with start (which stops them with the bench's other children) and
// returns its two targets.
func startTemporal(ctx context.Context, dir, tmp, echoAddr, flakyAddr string,
	start func(spec childSpec, ready string, timeout time.Duration) (*child, []string, error),
) ([]shippedTarget, error) {
	bin := filepath.Join(tmp, "temporal-peer")
	progress("shipped: go build -o %s . (in %s)", bin, dir)
	if err := goBuild(ctx, dir, bin, "."); err != nil {
		return nil, fmt.Errorf("-temporal: %w", err)
	}
	server, f, err := start(childSpec{name: "temporal server", path: bin, args: []string{"server"}}, "READY", 3*time.Minute)
	if err != nil {
		return nil, err
	}
	if len(f) != 1 {
		return nil, fmt.Errorf("temporal server: READY with %d addresses, want 1", len(f))
	}
	hostport := f[0]
	progress("shipped: temporal server on %s", hostport)
	worker, _, err := start(childSpec{name: "temporal worker", path: bin, args: []string{
		"worker", "-temporal", hostport, "-delegate", echoAddr, "-flaky-delegate", flakyAddr,
	}}, "READY", 2*time.Minute)
	if err != nil {
		return nil, err
	}
	load := func(scenario string) []string {
		return []string{bin, "load", "-temporal", hostport, "-scenario", scenario}
	}
	return []shippedTarget{
		{scenario: "temporal-one", client: load("one"), server: server, worker: worker},
		{scenario: "temporal-retry3", client: load("retry3"), server: server, worker: worker},
	}, nil
}
