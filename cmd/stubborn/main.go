// Command stubborn is Stubborn's one binary: the server, a client for every
// RPC, demo delegates, and a self-contained demo.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/stubbornhq/stubborn/delegates"
	"github.com/stubbornhq/stubborn/server"
)

const usage = `stubborn runs resilience controls over delegate gRPC services.

Usage:
  stubborn serve  [-config FILE] [-listen ADDR] [-log-format text|json]
  stubborn run    [-addr ADDR] [-json] -control C -brief TEXT ...   (stubborn run -h)
  stubborn watch  RUN_ID [-after SEQ] [-json]
  stubborn get    RUN_ID
  stubborn list   [-status STATUS]
  stubborn cancel RUN_ID
  stubborn decide RUN_ID retry|fail
  stubborn delegates [-listen HOST:FIRST_PORT]   serve the demo delegates
  stubborn demo   a server, demo delegates and live runs in one process
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code, err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "stubborn:", err)
	}
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout io.Writer) (int, error) {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2, nil
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve":
		return cmdServe(ctx, rest)
	case "run":
		return cmdRun(ctx, rest, stdout)
	case "watch":
		return cmdWatch(ctx, rest, stdout)
	case "get", "cancel", "decide":
		return cmdUnary(ctx, cmd, rest, stdout)
	case "list":
		return cmdList(ctx, rest, stdout)
	case "delegates":
		return cmdDelegates(ctx, rest, stdout)
	case "demo":
		return cmdDemo(ctx, rest, stdout)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0, nil
	}
	fmt.Fprint(os.Stderr, usage)
	return 2, fmt.Errorf("unknown command %q", cmd)
}

// newFlagSet returns a flag set that reports errors instead of exiting.
func newFlagSet(name string) *flag.FlagSet {
	return flag.NewFlagSet(name, flag.ContinueOnError)
}

func newLogger(format string, level slog.Level) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("-log-format must be text or json, got %q", format)
}

func cmdServe(ctx context.Context, args []string) (int, error) {
	fs := newFlagSet("serve")
	configPath := fs.String("config", "stubborn.yaml", "delegates config (YAML)")
	listen := fs.String("listen", defaultAddr, "address to serve gRPC on")
	logFormat := fs.String("log-format", "text", "text or json")
	if err := fs.Parse(args); err != nil {
		return 2, err
	}
	logger, err := newLogger(*logFormat, slog.LevelInfo)
	if err != nil {
		return 2, err
	}
	cfg, err := delegates.Load(*configPath)
	if err != nil {
		return 2, err
	}
	s, err := server.New(server.Config{Registry: cfg, Logger: logger})
	if err != nil {
		return 1, err
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return 1, err
	}
	logger.Info("stubborn serving", "addr", lis.Addr().String(), "delegates", len(cfg.Delegates))
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(lis) }()
	select {
	case err = <-errc:
	case <-ctx.Done():
		logger.Info("shutting down")
		s.Stop(10 * time.Second)
		err = <-errc
	}
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return 1, err
	}
	return 0, nil
}
