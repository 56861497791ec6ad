package delegatekit

import (
	"context"
	"flag"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
)

// DefaultListen is the address [Main] serves on when neither -listen nor the
// PORT environment variable says otherwise: loopback only.
const DefaultListen = "127.0.0.1:50051"

// Main serves fn until SIGINT or SIGTERM, for a main function of one line:
//
//	func main() { delegatekit.Main(execute) }
//
// The address is the -listen flag of flag.CommandLine, which Main defines
// unless the program did (define your own flags before calling Main). Its
// default is ":$PORT" when the environment variable PORT is set, as container
// platforms do, else [DefaultListen]. Main parses the command line unless the
// program did.
//
// Main logs the address it serves on, then serves as [Serve] does. The first
// SIGINT or SIGTERM starts the graceful shutdown; a second one kills the
// program. Main returns when the server has stopped. If it cannot serve (the
// address is taken, say) it logs why and exits with status 1.
func Main(fn Func, opts ...Option) {
	logger := newConfig(opts).logger
	if err := runMain(fn, listenAddr(), logger, opts); err != nil {
		logger.Error("delegatekit: cannot serve", "error", err)
		os.Exit(1)
	}
}

// runMain is Main but for the flag and the exit.
func runMain(fn Func, addr string, logger *slog.Logger, opts []Option) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Once the shutdown has begun, the next signal gets its default
	// handling again: it ends the program.
	context.AfterFunc(ctx, stop)
	var lc net.ListenConfig
	lis, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	logger.Info("delegatekit: delegate serving", "addr", lis.Addr().String())
	err = Serve(ctx, lis, fn, opts...)
	logger.Info("delegatekit: delegate stopped")
	return err
}

// listenAddr is the -listen flag of flag.CommandLine, defined and parsed as
// Main says.
func listenAddr() string {
	if flag.Lookup("listen") == nil {
		flag.String("listen", defaultListen(os.Getenv), "the address to serve the delegate on, host:port")
	}
	if !flag.Parsed() {
		flag.Parse()
	}
	return flag.Lookup("listen").Value.String()
}

// defaultListen is -listen's default: ":$PORT", else DefaultListen.
func defaultListen(getenv func(string) string) string {
	if p := getenv("PORT"); p != "" {
		return ":" + p
	}
	return DefaultListen
}
