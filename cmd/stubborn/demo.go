package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/stubbornhq/stubborn/delegatekit"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
	"github.com/stubbornhq/stubborn/internal/fakemodel"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/jsstore"
	"github.com/stubbornhq/stubborn/internal/server"
)

// demoDelegate is one demo delegate and how the registry declares it.
type demoDelegate struct {
	name       string
	svc        stubbornv1.DelegateServiceServer
	idempotent bool
	// idle is its idle_timeout (a streaming one); 0 none.
	idle time.Duration
}

// demoDelegates returns the demo delegates. Each answers after latency, so
// that progress is visible live.
func demoDelegates(latency time.Duration) []demoDelegate {
	slowly := func(svc stubbornv1.DelegateServiceServer) stubbornv1.DelegateServiceServer {
		return demo.NewScripted(func(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
			select {
			case <-time.After(latency):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return svc.Execute(ctx, req)
		})
	}
	return []demoDelegate{
		{name: "echo", svc: slowly(demo.Echo{}), idempotent: true},
		{name: "flaky", svc: slowly(&demo.Flaky{FailFirst: 2}), idempotent: true},
		{name: "down", svc: demo.Down{}},
		{name: "slow", svc: &demo.Slow{Delay: 30 * time.Second}, idempotent: true},
		{name: "flaky-api", svc: slowly(&demo.Flaky{FailFirst: 2}), idempotent: true},
		{name: "search-backup", svc: slowly(demo.NewScripted(func(context.Context, *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
			return nil, status.Error(codes.Internal, "search-backup: index is corrupt")
		}))},
		// A model that streams a word every latency/5 and stalls once,
		// after 3 words: its idle_timeout (4×latency, at least 1s) ends
		// that attempt, and a retry streams the whole answer.
		{name: "storyteller", svc: &demo.Storyteller{Pace: latency / 5, StallFirst: 1, StallAfter: 3}, idempotent: true, idle: max(4*latency, time.Second)},
	}
}

// demoGrace bounds how long the demo delegates' shutdown waits for the calls
// in flight (the slow one takes 30s).
const demoGrace = 2 * time.Second

// serveDemoDelegates serves each demo delegate on its own listener, with
// delegatekit, until ctx ends or stop is called, and returns the registry
// entries that reach them. stop shuts them down gracefully and returns once
// they have stopped.
func serveDemoDelegates(ctx context.Context, host string, firstPort int, latency time.Duration) ([]delegates.Delegate, func(), error) {
	ctx, cancel := context.WithCancel(ctx)
	var (
		entries []delegates.Delegate
		wg      sync.WaitGroup
	)
	stop := func() {
		cancel()
		wg.Wait()
	}
	for i, d := range demoDelegates(latency) {
		port := 0
		if firstPort > 0 {
			port = firstPort + i
		}
		lis, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			stop()
			return nil, nil, err
		}
		s := demo.NewServer(d.svc, delegatekit.WithGrace(demoGrace))
		wg.Go(func() { _ = s.Serve(ctx, lis) })
		entries = append(entries, delegates.Delegate{
			Name: d.name, Target: lis.Addr().String(), Idempotent: d.idempotent,
			Timeout: delegates.Duration(time.Minute), IdleTimeout: delegates.Duration(d.idle),
		})
	}
	return entries, stop, nil
}

// fakeModel is one of the fake models the demo serves, and the model
// delegate the registry declares over it.
type fakeModel struct {
	name     string
	behavior fakemodel.Behavior
	// kind is the delegate's API: delegates.KindOpenAI or KindAnthropic.
	kind string
}

// fakeModels are the built-in fake models: one that fails, one that
// streams, one that calls a tool (spoken to in Anthropic's API, so a Chat
// Completions request at the door is translated both ways).
var fakeModels = []fakeModel{
	{name: "fake-down", behavior: fakemodel.Fails, kind: delegates.KindOpenAI},
	{name: "fake-gpt", behavior: fakemodel.Streams, kind: delegates.KindOpenAI},
	{name: "fake-weather", behavior: fakemodel.Tools, kind: delegates.KindAnthropic},
}

// fakeModelPace is the pause between two streamed pieces of a fake model's
// answer: slow enough to watch a stream, quick enough for a test.
const fakeModelPace = 50 * time.Millisecond

// serveFakeModels serves each fake model on its own listener (port
// firstPort, the next, …; 0: any free ones) until stop, which returns once
// they have stopped, and returns the model delegates that reach them.
func serveFakeModels(host string, firstPort int, pace time.Duration) ([]delegates.Delegate, func(), error) {
	var (
		entries []delegates.Delegate
		servers []*http.Server
		wg      sync.WaitGroup
	)
	stop := func() {
		for _, s := range servers {
			sctx, cancel := context.WithTimeout(context.Background(), demoGrace)
			if s.Shutdown(sctx) != nil {
				_ = s.Close()
			}
			cancel()
		}
		wg.Wait()
	}
	for i, m := range fakeModels {
		port := 0
		if firstPort > 0 {
			port = firstPort + i
		}
		lis, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			stop()
			return nil, nil, err
		}
		s := &http.Server{Handler: fakemodel.New(m.behavior, pace), ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, s)
		wg.Go(func() { _ = s.Serve(lis) })
		entries = append(entries, fakeModelEntry(m, lis.Addr().String()))
	}
	return entries, stop, nil
}

// fakeModelEntry is the registry entry of m served at addr.
func fakeModelEntry(m fakeModel, addr string) delegates.Delegate {
	d := delegates.Delegate{Name: m.name, ReadOnly: true, Timeout: delegates.Duration(time.Minute)}
	api := delegates.ModelAPI{BaseURL: "http://" + addr, Model: m.name}
	if m.kind == delegates.KindAnthropic {
		d.Anthropic = &delegates.Anthropic{ModelAPI: api}
	} else {
		api.BaseURL += "/v1"
		d.OpenAI = &delegates.OpenAI{ModelAPI: api}
	}
	return d
}

// configLine is e as a line of stubborn.yaml's delegates.
func configLine(e delegates.Delegate) string {
	switch {
	case e.OpenAI != nil:
		return fmt.Sprintf("  - {name: %s, openai: {base_url: %q, model: %s}, timeout: 1m}", e.Name, e.OpenAI.BaseURL, e.OpenAI.Model)
	case e.Anthropic != nil:
		return fmt.Sprintf("  - {name: %s, anthropic: {base_url: %q, model: %s}, timeout: 1m}", e.Name, e.Anthropic.BaseURL, e.Anthropic.Model)
	}
	idle := ""
	if e.IdleTimeout > 0 {
		idle = ", idle_timeout: " + e.IdleTimeout.String()
	}
	return fmt.Sprintf("  - {name: %s, target: %q, idempotent: %t, timeout: 1m%s}", e.Name, e.Target, e.Idempotent, idle)
}

func cmdDelegates(ctx context.Context, args []string, stdout io.Writer) (int, error) {
	fs := newFlagSet("delegates")
	listen := fs.String("listen", "127.0.0.1:7400", "host and first port; each demo delegate, then each fake model, takes the next port (port 0: any free ones)")
	latency := fs.Duration("latency", 300*time.Millisecond, "how long each demo answer takes")
	if err := parseFlags(fs, args); err != nil {
		return 2, err
	}
	host, portText, err := net.SplitHostPort(*listen)
	if err != nil {
		return 2, err
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return 2, fmt.Errorf("-listen: bad port %q", portText)
	}
	entries, stop, err := serveDemoDelegates(ctx, host, port, *latency)
	if err != nil {
		return 1, err
	}
	defer stop()
	// The fake models take the ports after the demo delegates' (7407-7409
	// by default, as stubborn.yaml says).
	modelPort := 0
	if port > 0 {
		modelPort = port + len(entries)
	}
	models, stopModels, err := serveFakeModels(host, modelPort, fakeModelPace)
	if err != nil {
		return 1, err
	}
	defer stopModels()
	// One write: a script that waits for a line of it reads it whole.
	var cfg strings.Builder
	cfg.WriteString("# demo delegates and fake models are serving; a config for `stubborn serve -config`:\ndelegates:\n")
	for _, e := range append(entries, models...) {
		cfg.WriteString(configLine(e) + "\n")
	}
	cfg.WriteString("  - {name: unreachable, target: \"127.0.0.1:1\", timeout: 5s}\n")
	cfg.WriteString("presets:\n  - {name: smart, fallback_chain: {chain: [fake-down, fake-gpt]}}\n")
	if _, err := io.WriteString(stdout, cfg.String()); err != nil {
		return 1, err
	}
	<-ctx.Done()
	return 0, nil
}

// demoRun is one run the demo shows, and the status it must end with.
type demoRun struct {
	title string
	req   *stubbornv1.RunRequest
	want  stubbornv1.RunStatus
}

// demoHTTPListen is where the demo serves the console and the HTTP API
// unless -http-listen says otherwise; when it is taken, any free port.
const demoHTTPListen = "127.0.0.1:7301"

// demoPresets are presets for the console's runs: a fallback chain whose
// first step is itself a retry, so the timeline shows nesting.
func demoPresets() []delegates.Preset {
	return []delegates.Preset{
		{Name: "api-with-retry", Spec: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
			Target: "flaky-api", Attempts: ptr(int32(3)), BaseWait: durationpb.New(200 * time.Millisecond),
			MaxWait: durationpb.New(2 * time.Second), OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL,
		}}}},
		{Name: "careful-search", Spec: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{
			Chain: []string{"api-with-retry", "echo"},
		}}}},
		smartPreset(),
	}
}

// smartPreset is the front door's example model: a fallback chain from a
// model that fails to one that answers.
func smartPreset() delegates.Preset {
	return delegates.Preset{Name: "smart", Spec: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{
		Chain: []string{"fake-down", "fake-gpt"},
	}}}}
}

func cmdDemo(ctx context.Context, args []string, stdout io.Writer) (int, error) {
	fs := newFlagSet("demo")
	latency := fs.Duration("latency", 300*time.Millisecond, "how long each demo delegate answer takes")
	asJSON := fs.Bool("json", false, "print events as protojson lines")
	exit := fs.Bool("exit", false, "exit once the demo runs have ended, instead of serving the console until interrupted")
	httpListen := fs.String("http-listen", demoHTTPListen, "loopback address to serve the web console, the model front doors and the HTTP API on (when the default is taken, any free port)")
	if err := parseFlags(fs, args); err != nil {
		return 2, err
	}
	httpSet := false
	fs.Visit(func(f *flag.Flag) { httpSet = httpSet || f.Name == "http-listen" })
	entries, stopDelegates, err := serveDemoDelegates(ctx, "127.0.0.1", 0, *latency)
	if err != nil {
		return 1, err
	}
	defer stopDelegates()
	models, stopModels, err := serveFakeModels("127.0.0.1", 0, fakeModelPace)
	if err != nil {
		return 1, err
	}
	defer stopModels()
	entries = append(entries, delegates.Delegate{Name: "unreachable", Target: "127.0.0.1:1", Timeout: delegates.Duration(5 * time.Second)})
	entries = append(entries, models...)
	cfg := &delegates.Config{Delegates: entries, Presets: demoPresets()}
	// The embedded default: runs kept in an in-process JetStream, here in a
	// directory of its own that goes away with the demo.
	dataDir, err := os.MkdirTemp("", "stubborn-demo-")
	if err != nil {
		return 1, err
	}
	defer func() { _ = os.RemoveAll(dataDir) }()
	quiet := slog.New(slog.DiscardHandler)
	store := storeFlags{dataDir: dataDir, durability: string(jsstore.SyncInterval), syncPeriod: time.Second, lease: runs.DefaultLease, outputFlush: runs.DefaultOutputFlushInterval, outputFlushBytes: runs.DefaultOutputFlushBytes}
	runsCfg, _, closeStore, err := store.open(ctx, quiet)
	if err != nil {
		return 1, err
	}
	defer closeStore()
	s, err := server.New(server.Config{Registry: cfg, Logger: quiet, Runs: runsCfg})
	if err != nil {
		return 1, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 1, err
	}
	go func() { _ = s.Serve(lis) }()
	stopServer := sync.OnceFunc(func() { s.Stop(5 * time.Second) })
	defer stopServer()

	consoleURL, stopHTTP, code, err := demoHTTP(s, *httpListen, httpSet, quiet)
	if err != nil {
		return code, err
	}
	defer stopHTTP()
	// Before stopHTTP: its Stop ends the runs and the streams, HTTP's
	// included.
	defer stopServer()

	client, err := dial(lis.Addr().String())
	if err != nil {
		return 1, err
	}
	defer client.close()

	api := lis.Addr().String()
	if *exit {
		fmt.Fprintf(stdout, "Console: %s (up only while the runs below play: `stubborn demo` without -exit keeps it up)\n", consoleURL)
	} else {
		fmt.Fprintf(stdout, "Console: %s (open it to follow the runs below live)\n", consoleURL)
	}
	self := selfCommand()
	fmt.Fprintf(stdout, "Stubborn demo: API on %s (gRPC: from another shell, `%s list -addr %s`%s), demo delegates echo, flaky and flaky-api (each fails its first 2 calls), down (health NOT_SERVING), search-backup (always fails), storyteller (streams its answer, stalls once), unreachable (nothing listens).\n", api, self.cmd, api, self.buildHint())
	fmt.Fprintf(stdout, "Front door: fake models fake-down (always fails), fake-gpt (streams its answer) and fake-weather (calls get_weather), and the preset smart (fallback-chain [fake-down, fake-gpt]) answer OpenAI's and Anthropic's APIs on %s; try\n  %s\n", strings.TrimSuffix(consoleURL, "/"), doorCurl(consoleURL))
	failed, interrupted, err := playDemoRuns(ctx, client, stdout, *asJSON)
	if err != nil {
		return 1, err
	}
	if interrupted {
		return 0, nil
	}
	if failed == nil {
		fmt.Fprintln(stdout, "\nDemo finished: every run ended as expected.")
	}
	if *exit {
		if failed != nil {
			return 1, failed
		}
		return 0, nil
	}

	leaveRunForPerson(ctx, client, stdout, consoleURL)
	fmt.Fprintf(stdout, "\nServing the console on %s, the front door (`%s`) and the API on %s (gRPC: `%s list -addr %s`) until interrupted: press Ctrl-C to stop.\n", consoleURL, doorCurl(consoleURL), api, self.cmd, api)
	<-ctx.Done()
	fmt.Fprintln(stdout, "\nStopping.")
	if failed != nil {
		return 1, failed
	}
	return 0, nil
}

// demoHTTP serves s's web console and HTTP API on listen, loopback only
// (the demo has no TLS and no tenants), or on any free loopback port when
// listen is the default and taken. code is the exit code of an error.
func demoHTTP(s *server.Stubborn, listen string, set bool, logger *slog.Logger) (url string, stop func(), code int, err error) {
	hlis, err := net.Listen("tcp", listen)
	if err != nil && !set {
		hlis, err = net.Listen("tcp", "127.0.0.1:0")
	}
	if err != nil {
		return "", nil, 1, fmt.Errorf("-http-listen: %w", err)
	}
	if err := server.CheckPlaintext(hlis.Addr(), false); err != nil {
		_ = hlis.Close()
		return "", nil, 2, fmt.Errorf("-http-listen: %w", err)
	}
	stop, err = serveHTTP(s, hlis, &serveConfig{logger: logger})
	if err != nil {
		_ = hlis.Close()
		return "", nil, 1, err
	}
	return "http://" + hlis.Addr().String() + "/", stop, 0, nil
}

// playDemoRuns runs the demo's runs one after the other, printing their
// events. failed says which run did not end as it should; interrupted that
// ctx ended meanwhile.
func playDemoRuns(ctx context.Context, client *client, stdout io.Writer, asJSON bool) (failed error, interrupted bool, err error) {
	demoRuns := []demoRun{
		{
			title: "fallback-chain [down, unreachable, search-backup, echo]: down is skipped on its health check, unreachable refuses the connection, search-backup fails, echo wins",
			req: &stubbornv1.RunRequest{
				TaskBrief:     "find the 2026 rainfall report",
				FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"down", "unreachable", "search-backup", "echo"}},
			},
			want: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED,
		},
		{
			title: "retry-with-learning of flaky (max_retries 3): two failures, each retry's brief carries the failure history, the third attempt succeeds",
			req: &stubbornv1.RunRequest{
				TaskBrief:         "summarise the rainfall report in one line",
				RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "flaky", MaxRetries: ptr(int32(3))},
			},
			want: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED,
		},
		{
			title: "retry of flaky-api (idempotent, base_wait 250ms): UNAVAILABLE twice, a full-jitter backoff before each retry, then success",
			req: &stubbornv1.RunRequest{
				TaskBrief: "fetch today's rainfall",
				Retry: &stubbornv1.RetrySpec{
					Target: "flaky-api", BaseWait: durationpb.New(250 * time.Millisecond), MaxWait: durationpb.New(2 * time.Second),
				},
			},
			want: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED,
		},
		{
			title: "retry of storyteller, a model that streams its answer: the first attempt stalls after 3 words (idle_timeout), its output is discarded, the retry streams the whole story",
			req: &stubbornv1.RunRequest{
				TaskBrief: "tell a short story about retries",
				Retry: &stubbornv1.RetrySpec{
					Target: "storyteller", BaseWait: durationpb.New(250 * time.Millisecond), MaxWait: durationpb.New(2 * time.Second),
				},
			},
			want: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED,
		},
	}
	for i, r := range demoRuns {
		fmt.Fprintf(stdout, "\n== run %d: %s\n", i+1, r.title)
		stream, err := client.Run(ctx, r.req)
		if err != nil {
			return nil, false, err
		}
		st, err := client.follow(ctx, "", streamEventsOf(stream), &printer{w: stdout, json: asJSON})
		if err != nil {
			if ctx.Err() != nil {
				return nil, true, nil
			}
			return nil, false, err
		}
		if st.GetStatus() != r.want && failed == nil {
			failed = fmt.Errorf("run %d ended %s, want %s", i+1, statusName(st.GetStatus()), statusName(r.want))
		}
	}
	return failed, false, nil
}

// leaveRunForPerson starts one more run, left for a person: a retry of
// unreachable whose retries run out, so it awaits a decision that the
// console's Retry and Fail buttons give.
func leaveRunForPerson(ctx context.Context, client stubbornv1.ControlServiceClient, stdout io.Writer, consoleURL string) {
	res, err := client.StartRun(ctx, &stubbornv1.StartRunRequest{
		TaskBrief: "reach the unreachable",
		Retry: &stubbornv1.RetrySpec{
			Target: "unreachable", Attempts: ptr(int32(2)), BaseWait: durationpb.New(200 * time.Millisecond),
			OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_ASK,
		},
	})
	if err == nil {
		fmt.Fprintf(stdout, "\nA fifth run awaits your decision (a retry of unreachable whose retries ran out): %s#/runs/%s\n", consoleURL, res.GetRunId())
	} else if ctx.Err() == nil {
		fmt.Fprintf(stdout, "\nThe run that awaits a decision could not start: %v\n", err)
	}
}

// doorCurl is a curl command that asks the front door at base (the
// console's URL) for the preset smart.
func doorCurl(base string) string {
	return "curl -s " + strings.TrimSuffix(base, "/") + "/v1/chat/completions -H 'Content-Type: application/json' " +
		`-d '{"model": "smart", "messages": [{"role": "user", "content": "What is the answer?"}]}'`
}

// self is how the person who started this process runs it again: the
// command line the demo's hints start with.
type self struct {
	// cmd is the command: `go run ./cmd/stubborn` for a go run build, else
	// the binary as it was invoked.
	cmd string
	// goRun says the binary is a go run build, which leaves no binary to run.
	goRun bool
}

// buildHint is what a hint adds for a go run build: the one-line build
// that makes the command shorter.
func (s self) buildHint() string {
	if !s.goRun {
		return ""
	}
	return "; or build it once, `go build -o stubborn ./cmd/stubborn`, and run `./stubborn list -addr …`"
}

// selfCommand is self of this process.
func selfCommand() self {
	exe, _ := os.Executable()
	return selfOf(exe, os.Args[0])
}

// selfOf is self of a process whose executable is exe (os.Executable, ""
// when unknown) and which was invoked as arg0 (os.Args[0]). go run builds
// into a go-build temporary directory (…/go-build123/b001/exe/stubborn)
// and deletes it afterwards: the binary's path is no use to the person.
func selfOf(exe, arg0 string) self {
	if exe != "" && filepath.Base(filepath.Dir(exe)) == "exe" && strings.Contains(exe, string(filepath.Separator)+"go-build") {
		return self{cmd: "go run ./cmd/stubborn", goRun: true}
	}
	if arg0 == "" {
		arg0 = "stubborn"
	}
	return self{cmd: shellQuote(arg0)}
}

// shellQuote quotes s for a POSIX shell when it needs quoting.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./+:@%,=") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
