package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// The shipped scenarios' own processes are the bench binary run again in
// a role, named by its first argument (`bench -role NAME ...`):
//
//   - delegate: serves demo.Echo and a delegate whose attempts 1 and 2 fail
//     (failFirst, scenario 4's flaky2) on loopback ports and prints
//     "READY <echo address> <flaky2 address>";
//   - proxy -target ADDR: serves the plain proxy (scenario 2's) to the
//     delegate at ADDR, over one shared connection, and prints
//     "READY <address>";
//   - client -target ADDR -scenario direct|proxy|run|retry -concurrency N
//     -duration D -warmup W [-retry-wait D]: runs scenario 1–4's closed loop
//     against ADDR and prints one JSON line, a LoadResult (its cpu_us_per_op
//     and allocations are the client process's own);
//   - stream-delegate and sse-model [-pieces N -piece-bytes B -pace D]: the
//     streaming scenarios' delegates (streaming.go), a gRPC delegate
//     (delegatekit, ExecuteStream) and an OpenAI-shaped SSE server; each
//     prints "READY <address>" (the SSE model: its base URL);
//   - client -scenario stream-direct|stream-sse|stream-run|stream-run-sse
//     [-pieces N -piece-bytes B -pace D]: a streaming scenario's closed loop
//     (the SSE scenario's -target is the SSE model's base URL); its JSON
//     line also has each counted call's streamSample.
//
// delegate, proxy, stream-delegate and sse-model serve until they get
// SIGINT or SIGTERM or, with -exit-on-eof (as the bench starts them), their
// stdin closes: the bench stopped or died.

// roleArgs says whether args (without the program name) ask for a role.
func roleArgs(args []string) bool {
	return len(args) > 0 && (args[0] == "-role" || strings.HasPrefix(args[0], "-role="))
}

// runRole runs the role args ask for.
func runRole(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("bench -role", flag.ContinueOnError)
	role := fs.String("role", "", "delegate, proxy or client")
	target := fs.String("target", "", "proxy: the delegate to forward to; client: the server to call")
	scenario := fs.String("scenario", "", "client: direct, proxy, run or retry")
	conc := fs.Int("concurrency", 1, "client: concurrent callers")
	dur := fs.Duration("duration", time.Second, "client: measured time")
	warmup := fs.Duration("warmup", 0, "client: unmeasured warm-up before it")
	retryWait := fs.Duration("retry-wait", 0, "client, retry: base_wait and max_wait of the retry")
	exitOnEOF := fs.Bool("exit-on-eof", false, "delegate, proxy, stream-delegate, sse-model: exit when stdin closes")
	shape := defaultStreamShape
	shape.flags(fs, "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	serves := *role == "delegate" || *role == "stream-delegate" || *role == "sse-model"
	if !serves && *target == "" {
		return fmt.Errorf("-role %s needs -target", *role)
	}
	switch *role {
	case "stream-delegate", "sse-model":
		return serveStreamer(ctx, *role, shape, stdin, stdout, *exitOnEOF)
	case "delegate":
		echo, echoAddr, err := serveDelegate(demo.Echo{})
		if err != nil {
			return err
		}
		defer echo.Stop()
		flaky, flakyAddr, err := serveDelegate(&failFirst{n: 2})
		if err != nil {
			return err
		}
		defer flaky.Stop()
		fmt.Fprintf(stdout, "READY %s %s\n", echoAddr, flakyAddr)
		serveUntil(ctx, stdin, *exitOnEOF)
		return nil
	case "proxy":
		next, err := dial(*target)
		if err != nil {
			return err
		}
		defer next.Close()
		ps, addr, err := serveProxy(stubbornv1.NewDelegateServiceClient(next))
		if err != nil {
			return err
		}
		defer ps.Stop()
		fmt.Fprintf(stdout, "READY %s\n", addr)
		serveUntil(ctx, stdin, *exitOnEOF)
		return nil
	case "client":
		if *conc < 1 || *dur <= 0 || *warmup < 0 {
			return errors.New("-concurrency and -duration must be positive, -warmup not negative")
		}
		if streaming("proc-" + *scenario) {
			return streamClient(ctx, *target, *scenario, *conc, *warmup, *dur, shape, stdout)
		}
		conn, err := dial(*target)
		if err != nil {
			return err
		}
		defer conn.Close()
		fn, err := clientOp(conn, *scenario, *retryWait)
		if err != nil {
			return err
		}
		m := runLoad(ctx, *conc, *warmup, *dur, fn)
		return json.NewEncoder(stdout).Encode(summarize("proc-"+*scenario, "", *conc, m))
	}
	return fmt.Errorf("-role: unknown role %q (have delegate, proxy, client, stream-delegate, sse-model)", *role)
}

// clientOp is scenario's op over conn.
func clientOp(conn *grpc.ClientConn, scenario string, retryWait time.Duration) (op, error) {
	switch scenario {
	case "direct", "proxy":
		return directOp(stubbornv1.NewDelegateServiceClient(conn)), nil
	case "run":
		return runOp(stubbornv1.NewControlServiceClient(conn), oneAttemptRun(), 1), nil
	case "retry":
		return runOp(stubbornv1.NewControlServiceClient(conn), retryRun(flaky2Name, 2, retryWait, retryWait), 3), nil
	}
	return nil, fmt.Errorf("-scenario: unknown scenario %q (have direct, proxy, run, retry)", scenario)
}

// serveUntil returns when ctx ends or, with eof, when stdin is closed.
func serveUntil(ctx context.Context, stdin io.Reader, eof bool) {
	closed := make(chan struct{})
	if eof {
		go func() {
			_, _ = io.Copy(io.Discard, stdin)
			close(closed)
		}()
	}
	select {
	case <-ctx.Done():
	case <-closed:
	}
}
