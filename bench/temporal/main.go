// Command temporal puts Temporal beside Stubborn in the bench harness (issue
// #21, item 4): the peer people would otherwise pick for "call a delegate,
// retry it when it fails", measured in the same process layout as Stubborn's
// shipped binary. It is a module of its own so that the main module never
// carries Temporal's dependencies.
//
// Subcommands (a contract the harness relies on; see README.md):
//
//	server    [-port N] [-untuned]
//	worker    -temporal HOSTPORT -delegate ADDR -flaky-delegate ADDR [-untuned]
//	load      -temporal HOSTPORT -scenario one|retry3 -concurrency N -duration D -warmup W
//	delegates
//
// Everything listens on 127.0.0.1 only, and every loop is bounded.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

const (
	namespace = "default"
	taskQueue = "bench"
	// workflowName and activityName are the names the worker registers and
	// the load starts.
	workflowName = "Run"
	activityName = "Execute"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "temporal:", err)
		}
		os.Exit(2)
	}
}

const usage = `usage:
  temporal server    [-port N] [-untuned]
  temporal worker    -temporal HOSTPORT -delegate ADDR -flaky-delegate ADDR [-untuned]
  temporal load      -temporal HOSTPORT -scenario one|retry3 -concurrency N -duration D -warmup W
  temporal delegates`

// run runs one subcommand until it is done or ctx ends (SIGTERM, SIGINT).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return errors.New("no subcommand")
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	switch args[0] {
	case "server":
		return serverCmd(ctx, fs, args[1:], stdout, stderr)
	case "worker":
		return workerCmd(ctx, fs, args[1:], stdout, stderr)
	case "load":
		return loadCmd(ctx, fs, args[1:], stdout, stderr)
	case "delegates":
		return delegatesCmd(ctx, fs, args[1:], stdout)
	default:
		fmt.Fprintln(stderr, usage)
		return fmt.Errorf("unknown subcommand %q", args[0])
	}
}
