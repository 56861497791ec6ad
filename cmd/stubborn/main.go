// Command stubborn is Stubborn's one binary: the server, a client for every
// RPC, demo delegates, and a self-contained demo.
package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/otel"
	"google.golang.org/grpc"

	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/notify"
	"github.com/stubbornhq/stubborn/internal/server"
	"github.com/stubbornhq/stubborn/internal/telemetry"
)

const usage = `stubborn runs resilience controls over delegate gRPC services and models.

Usage:
  stubborn serve  [-config FILE] [-listen ADDR] [-http-listen ADDR] [-data-dir DIR | -nats-url URL | -memory] ...
                  the server; -http-listen adds the web console and the model front doors (stubborn serve -h: its flags by purpose)
  stubborn run    -control C -brief TEXT (-target D | -delegates D,D,...) [-json] ...   start a run and print its events (stubborn run -h)
  stubborn watch  RUN_ID [-after SEQ] [-json]
  stubborn get    RUN_ID [-json]
  stubborn list   [-status STATUS] [-limit N | -all] [-json]
  stubborn cancel RUN_ID [-json]
  stubborn decide RUN_ID retry|fail [-max-cost F] [-max-total-tokens N] [-json]
  stubborn delete RUN_ID [cancel] [-json]   forget a finished run now (cancel: cancel it first if it runs)
  stubborn registry [-json]   the delegates and presets the server lets you name (kind, health, idempotent, presets' specs)
  stubborn delegates [-listen HOST:FIRST_PORT]   serve the demo delegates and fake models (the targets of stubborn.yaml)
  stubborn demo   [-exit] [-http-listen ADDR] [-json]   a server, demo delegates, fake models, live runs, the web console and the front doors in one process, until Ctrl-C (-exit: once the runs end)
  stubborn token  [-hash]   a new bearer token and its SHA-256 for a tenant's token_sha256 (-hash: hash stdin's)

-json prints protojson, one object a line (registry: one object), with the JSON names grpcurl and the HTTP API use.
Clients (run, watch, get, list, cancel, decide, delete, registry) read STUBBORN_ADDR (the default of -addr), STUBBORN_TOKEN (a bearer token) and, for TLS,
STUBBORN_TLS_CA, STUBBORN_TLS_SERVER_NAME, STUBBORN_TLS_CERT and STUBBORN_TLS_KEY from the environment. They wait up to -wait (10s) for a server
that is starting; run and watch follow a run on across a server restart. Each command's flags: stubborn COMMAND -h.
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
	code, err := command(ctx, args[0], args[1:], stdout)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0, nil // -h: parseFlags printed the flags
	case errors.Is(err, errInterrupted):
		return 130, nil
	}
	return code, err
}

// command runs one of stubborn's commands.
func command(ctx context.Context, cmd string, rest []string, stdout io.Writer) (int, error) {
	switch cmd {
	case "serve":
		return cmdServe(ctx, rest)
	case "run":
		return cmdRun(ctx, rest, stdout)
	case "watch":
		return cmdWatch(ctx, rest, stdout)
	case "get", "cancel", "decide", "delete":
		return cmdUnary(ctx, cmd, rest, stdout)
	case "list":
		return cmdList(ctx, rest, stdout)
	case "delegates":
		return cmdDelegates(ctx, rest, stdout)
	case "registry":
		return cmdRegistry(ctx, rest, stdout)
	case "demo":
		return cmdDemo(ctx, rest, stdout)
	case "token":
		return cmdToken(rest, os.Stdin, stdout)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0, nil
	}
	// A long argument is no mistyped command: not compared, and cut.
	if len(cmd) > 64 {
		return 2, fmt.Errorf("unknown command %q…: the commands are %s (`stubborn help` says what each does)", cmd[:64], strings.Join(commands, ", "))
	}
	if best := delegates.Closest(cmd, commands); best != "" {
		return 2, fmt.Errorf("unknown command %q: did you mean %s?", cmd, best)
	}
	return 2, fmt.Errorf("unknown command %q: the commands are %s (`stubborn help` says what each does)", cmd, strings.Join(commands, ", "))
}

// commands are stubborn's commands, for a guess at a mistyped one.
var commands = []string{"serve", "run", "watch", "get", "list", "cancel", "decide", "delete", "registry", "delegates", "demo", "token", "help"}

// newLogger returns serve's logger on stderr; with flushEvery > 0 through
// a logBuffer (returned, to Close), else writing each record at once.
func newLogger(format string, level slog.Level, flushEvery time.Duration) (*slog.Logger, *logBuffer, error) {
	opts := &slog.HandlerOptions{Level: level}
	var (
		w   io.Writer = os.Stderr
		buf *logBuffer
	)
	if flushEvery > 0 {
		buf = newLogBuffer(os.Stderr, flushEvery)
		w = buf
	}
	var h slog.Handler
	switch format {
	case "text":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		if buf != nil {
			_ = buf.Close()
		}
		return nil, nil, fmt.Errorf("-log-format must be text or json, got %q", format)
	}
	if buf != nil {
		h = bufferedHandler{h, buf}
	}
	return slog.New(h), buf, nil
}

// serveConfig is what serve's flags and config file say.
type serveConfig struct {
	listen, metricsListen string
	httpListen            string
	pprofListen           string
	// publicURL is -public-url: where people reach the HTTP listener.
	publicURL string
	logger    *slog.Logger
	// logs is the logger's buffer (nil: none), to Close when serve ends.
	logs     *logBuffer
	registry *delegates.Config
	// configPath is -config, which reloads read again; watchConfig is
	// -watch-config.
	configPath  string
	watchConfig bool
	// configSum is the SHA-256 of the config's bytes that were parsed.
	configSum  [sha256.Size]byte
	sec        securityFlags
	store      storeFlags
	serverOpts []grpc.ServerOption

	// httpAllowedHosts are -http-allowed-hosts: the hosts the HTTP
	// listener answers besides loopback and its own address.
	httpAllowedHosts []string
}

// parseServe reads serve's flags and config file, and refuses plaintext
// off loopback before anything is bound, naming the address as given. Its
// errors are usage errors (exit 2).
func parseServe(ctx context.Context, args []string) (*serveConfig, error) {
	fs := newFlagSet("serve")
	configPath := fs.String("config", "stubborn.yaml", "delegates config (YAML); SIGHUP reloads it")
	watchConfig := fs.Bool("watch-config", true, "reload the config when its file changes (it is validated whole; a bad one is logged and the one in use kept)")
	listen := fs.String("listen", defaultAddr, "address to serve gRPC on")
	logFormat := fs.String("log-format", "text", "text or json")
	logFlush := fs.Duration("log-flush", 100*time.Millisecond, "how long info and debug log lines may wait to be written out together (warnings and errors are written at once); 0 writes each line at once")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error (debug adds error messages and failure reasons, which may quote briefs and results)")
	metricsListen := fs.String("metrics-listen", "", "address to serve Prometheus metrics on, at /metrics (none when empty)")
	httpListen := fs.String("http-listen", "", "address to serve the web console, the model front doors (POST /v1/chat/completions, /v1/messages) and the API over HTTP on (Connect, gRPC-Web and JSON, for browsers and curl); none when empty; TLS and loopback rules as -listen")
	httpAllowedHosts := fs.String("http-allowed-hosts", "", "comma-separated hosts (names or addresses, each with an optional :port) whose Host the -http-listen listener answers besides loopback (localhost, 127.0.0.0/8, ::1) and its own address; any other Host is refused (421), against DNS rebinding")
	publicURL := fs.String("public-url", "", "the base URL people reach -http-listen at (https://stubborn.example.com, say): the notify targets' decision links and console links are built on it, and the listener answers its host; required when the config lists notify targets")
	pprofListen := fs.String("pprof-listen", "", "address to serve Go's profiles on, at /debug/pprof/ (net/http/pprof; none when empty); no authentication; TLS and loopback rules as -listen")
	c := &serveConfig{}
	c.sec.register(fs)
	c.store.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	c.listen, c.metricsListen, c.httpListen, c.pprofListen = *listen, *metricsListen, *httpListen, *pprofListen
	c.configPath, c.watchConfig = *configPath, *watchConfig
	c.publicURL = strings.TrimRight(*publicURL, "/")
	for _, h := range strings.Split(*httpAllowedHosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			c.httpAllowedHosts = append(c.httpAllowedHosts, h)
		}
	}
	if err := server.CheckAllowedHosts(c.httpAllowedHosts); err != nil {
		return nil, err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return nil, fmt.Errorf("-log-level must be debug, info, warn or error, got %q", *logLevel)
	}
	var err error
	if *logFlush < 0 {
		return nil, fmt.Errorf("-log-flush must not be negative, got %v", *logFlush)
	}
	if c.logger, c.logs, err = newLogger(*logFormat, level, *logFlush); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok && c.logs != nil {
			_ = c.logs.Close()
		}
	}()
	if c.registry, c.configSum, err = delegates.LoadSum(*configPath); err != nil {
		return nil, err
	}
	if c.serverOpts, err = c.sec.serverOptions(c.registry); err != nil {
		return nil, err
	}
	if err := checkPublicURL(c.registry, c.publicURL, c.httpListen); err != nil {
		return nil, err
	}
	if !c.sec.tls() {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := server.CheckPlaintextListen(cctx, c.listen, c.sec.insecure); err != nil {
			return nil, err
		}
		for _, l := range []struct{ flag, addr string }{{"-http-listen", c.httpListen}, {"-pprof-listen", c.pprofListen}} {
			if l.addr == "" {
				continue
			}
			if err := server.CheckPlaintextListen(cctx, l.addr, c.sec.insecure); err != nil {
				return nil, fmt.Errorf("%s: %w", l.flag, err)
			}
		}
	}
	ok = true
	return c, nil
}

// listeners are what serve binds: gRPC, and the HTTP API and the profiles
// when asked for.
type listeners struct {
	grpc, http, pprof net.Listener
}

func (l listeners) close() {
	for _, lis := range []net.Listener{l.grpc, l.http, l.pprof} {
		if lis != nil {
			_ = lis.Close()
		}
	}
}

// listenServe binds the gRPC listener (and -http-listen's and
// -pprof-listen's), serves the profiles with -pprof-listen (from here on,
// so that a slow start can be profiled too) and the metrics with
// -metrics-listen; stop shuts those two down.
func listenServe(c *serveConfig, sdk *telemetry.SDK) (l listeners, stop func(), err error) {
	if l, err = bind(c); err != nil {
		return listeners{}, nil, err
	}
	stopPprof := func() {}
	if l.pprof != nil {
		stopPprof = serveHandler(pprofHandler(), l.pprof, c, "pprof serving", pprofPath)
	}
	if c.metricsListen == "" {
		return l, stopPprof, nil
	}
	mlis, err := net.Listen("tcp", c.metricsListen)
	if err != nil {
		stopPprof()
		l.close()
		return listeners{}, nil, fmt.Errorf("-metrics-listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", sdk.MetricsHandler)
	metrics := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = metrics.Serve(mlis) }()
	c.logger.Info("metrics serving", "url", "http://"+mlis.Addr().String()+"/metrics")
	return l, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = metrics.Shutdown(sctx)
		cancel()
		stopPprof()
	}, nil
}

// bind binds -listen, -http-listen and -pprof-listen, checking plaintext
// again on the addresses bound, should a name now resolve to another.
func bind(c *serveConfig) (listeners, error) {
	var l listeners
	for _, b := range []struct {
		flag, addr string
		lis        *net.Listener
	}{{"-listen", c.listen, &l.grpc}, {"-http-listen", c.httpListen, &l.http}, {"-pprof-listen", c.pprofListen, &l.pprof}} {
		if b.addr == "" {
			continue
		}
		lis, err := net.Listen("tcp", b.addr)
		if err != nil {
			l.close()
			return listeners{}, fmt.Errorf("%s: %w", b.flag, err)
		}
		*b.lis = lis
		if c.sec.tls() {
			continue
		}
		if err := server.CheckPlaintext(lis.Addr(), c.sec.insecure); err != nil {
			l.close()
			return listeners{}, usageError{fmt.Errorf("%s: %w", b.flag, err)}
		}
	}
	return l, nil
}

// serveHTTP serves s's HTTP API on lis (over TLS when serve has it) until
// the returned function shuts it down. It answers a loopback Host, the
// host of -http-listen and of the address bound, and -http-allowed-hosts'.
func serveHTTP(s *server.Stubborn, lis net.Listener, c *serveConfig) (stop func(), err error) {
	own := server.ListenHosts(c.httpListen, lis.Addr())
	h, err := s.HTTPHandler(append(own, c.httpAllowedHosts...)...)
	if err != nil {
		return nil, err
	}
	if len(own) == 0 && len(c.httpAllowedHosts) == 0 {
		if tcp, ok := lis.Addr().(*net.TCPAddr); ok && !tcp.IP.IsLoopback() {
			c.logger.Warn("-http-listen binds every interface, and -http-allowed-hosts lists no host: only a loopback Host is served; list the names clients use",
				"addr", lis.Addr().String())
		}
	}
	stop = serveHandler(h, lis, c, "http api serving", "")
	scheme := "http"
	if c.sec.tc != nil {
		scheme = "https"
	}
	c.logger.Info("web console serving", "url", scheme+"://"+lis.Addr().String()+"/")
	return stop, nil
}

// serveHandler serves h on lis (over TLS when serve has it) until the
// returned function shuts it down, and logs msg with the URL of path on it.
func serveHandler(h http.Handler, lis net.Listener, c *serveConfig, msg, path string) (stop func()) {
	hs := server.NewHTTPServer(h)
	hs.ErrorLog = slog.NewLogLogger(c.logger.Handler(), slog.LevelWarn)
	scheme := "http"
	if c.sec.tc != nil {
		hs.TLSConfig = c.sec.tc.Clone()
		hs.TLSConfig.NextProtos = nil // h2 and http/1.1, as the server offers
		scheme = "https"
		go func() { _ = hs.ServeTLS(lis, "", "") }()
	} else {
		go func() { _ = hs.Serve(lis) }()
	}
	c.logger.Info(msg, "url", scheme+"://"+lis.Addr().String()+path)
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if hs.Shutdown(sctx) != nil {
			_ = hs.Close()
		}
	}
}

// usageError is an error of serve's flags found late (exit 2).
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

func cmdServe(ctx context.Context, args []string) (int, error) {
	c, err := parseServe(ctx, args)
	if err != nil {
		return 2, err
	}
	if c.logs != nil {
		defer func() { _ = c.logs.Close() }()
	}
	logger := c.logger
	// SIGHUP asks for a reload of the config (reload.go), once the server
	// is up; until then it waits.
	hup, stopHUP := notifyHUP()
	defer stopHUP()
	// Traces and metrics go where the OTEL_* environment says (nowhere when
	// it says nothing), metrics also to -metrics-listen.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { logger.Warn("opentelemetry", "err", err) }))
	sdk, err := telemetry.Setup(ctx, telemetry.SetupOptions{Prometheus: c.metricsListen != ""})
	if err != nil {
		return 2, fmt.Errorf("OpenTelemetry environment: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := sdk.Shutdown(sctx); err != nil {
			logger.Warn("flushing telemetry", "err", err)
		}
	}()
	l, stopSide, err := listenServe(c, sdk)
	if err != nil {
		if errors.As(err, new(usageError)) {
			return 2, err
		}
		return 1, err
	}
	defer stopSide()
	runsCfg, storeConn, closeStore, err := c.store.open(ctx, logger)
	if err != nil {
		l.close()
		return 1, err
	}
	defer closeStore()
	s, err := server.New(server.Config{
		Spend:    storeConn.spend,
		Registry: c.registry, Logger: logger, Telemetry: sdk.Config(logger), Runs: runsCfg,
		ServerOptions: c.serverOpts, NoReflection: !c.sec.reflection, Fleet: storeConn.fleet,
		Notify: server.NotifyConfig{PublicURL: c.publicURL, Queue: storeConn.notices},
	})
	if err != nil {
		l.close()
		return 1, err
	}
	storeConn.attach(s.SetServing)
	rl := &reloader{path: c.configPath, sec: &c.sec, logger: logger, apply: s.Reload}
	defer rl.start(hup, c.registry, c.configSum, c.watchConfig)()
	if l.http != nil {
		stopHTTP, err := serveHTTP(s, l.http, c)
		if err != nil {
			l.close()
			return 1, err
		}
		// After serveUntil: its Stop ends the runs and the streams, HTTP's
		// included.
		defer stopHTTP()
	}
	traces, metricsTo := sdk.Describe()
	logger.Info("stubborn serving", "addr", l.grpc.Addr().String(), "delegates", len(c.registry.Delegates),
		"tls", c.sec.describe(), "tenants", len(c.registry.Tenants), "traces", traces, "metrics", metricsTo)
	if c.logs != nil {
		_ = c.logs.Flush() // a supervisor waiting for this line sees it now
	}
	return serveUntil(ctx, s, l.grpc, storeConn.fatal, logger)
}

// serveUntil serves s on lis until it fails, ctx ends (a graceful stop)
// or the store is lost for good (fatal: exit 1, for a supervisor to start
// a server that can write again, which takes the runs over).
func serveUntil(ctx context.Context, s *server.Stubborn, lis net.Listener, fatalc <-chan error, logger *slog.Logger) (int, error) {
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(lis) }()
	var err error
	select {
	case err = <-errc:
	case fatal := <-fatalc:
		logger.Error("shutting down: the store cannot be reached again", "err", fatal)
		s.Stop(10 * time.Second)
		<-errc
		return 1, fatal
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

// checkPublicURL refuses notify targets without -public-url, and a
// -public-url without -http-listen to serve its links.
func checkPublicURL(reg *delegates.Config, publicURL, httpListen string) error {
	if publicURL == "" {
		if reg.HasNotify() {
			return errors.New("the config lists notify targets: give -public-url, the base URL people reach -http-listen at (the decision links are built on it)")
		}
		return nil
	}
	if err := notify.CheckPublicURL(publicURL); err != nil {
		return err
	}
	if httpListen == "" {
		return errors.New("-public-url needs -http-listen: the listener that serves the decision links")
	}
	return nil
}
