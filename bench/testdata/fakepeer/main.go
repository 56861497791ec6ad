// Command fakepeer stands in for the Temporal peer (bench/temporal) in the
// bench's tests: it keeps the peer's contract (bench/temporal.go) without
// Temporal. FAKEPEER_FAIL=worker makes its worker fail to start.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: fakepeer server|worker|load ...")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	hostport := fs.String("temporal", "", "the server")
	delegate := fs.String("delegate", "", "worker: the echo delegate")
	flaky := fs.String("flaky-delegate", "", "worker: the flaky delegate")
	scenario := fs.String("scenario", "", "load: one or retry3")
	conc := fs.Int("concurrency", 1, "load: callers")
	dur := fs.Duration("duration", time.Second, "load: measured time")
	warmup := fs.Duration("warmup", 0, "load: warm-up")
	_ = fs.Parse(os.Args[2:])
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	switch os.Args[1] {
	case "server":
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fail(err)
		}
		go func() {
			for {
				c, err := lis.Accept()
				if err != nil {
					return
				}
				_ = c.Close()
			}
		}()
		fmt.Println("READY", lis.Addr())
		<-ctx.Done()
	case "worker":
		if os.Getenv("FAKEPEER_FAIL") == "worker" {
			fail(fmt.Errorf("cannot poll %s", *hostport))
		}
		// The real worker reaches the server and calls both delegates.
		for _, addr := range []string{*hostport, *delegate, *flaky} {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				fail(err)
			}
			_ = c.Close()
		}
		fmt.Println("READY")
		<-ctx.Done()
	case "load":
		if *scenario != "one" && *scenario != "retry3" {
			fail(fmt.Errorf("unknown scenario %q", *scenario))
		}
		c, err := net.Dial("tcp", *hostport)
		if err != nil {
			fail(err)
		}
		_ = c.Close()
		select {
		case <-time.After(*warmup + *dur):
		case <-ctx.Done():
			os.Exit(1)
		}
		ops := 10 * *conc
		_ = json.NewEncoder(os.Stdout).Encode(map[string]any{
			"scenario": "temporal-" + *scenario, "concurrency": *conc, "ops": ops, "errors": 0,
			"ops_per_sec": float64(ops) / dur.Seconds(), "p50_us": 24000.0, "p99_us": 50000.0,
		})
	default:
		fail(fmt.Errorf("unknown command %q", os.Args[1]))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "fakepeer:", err)
	os.Exit(1)
}
