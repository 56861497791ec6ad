package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/server"
)

const defaultAddr = "127.0.0.1:7300"

// runFlags are the flags of `stubborn run` that build a RunRequest.
type runFlags struct {
	control, brief, target, list, request string
	attempts, maxRetries                  int
	maxWait, baseWait, runTimeout         time.Duration
	limit                                 limitFlags
	attemptTimeout, hedgeDelay            time.Duration
	firstOutputTimeout, idleTimeout       time.Duration
	onExhausted, idempotencyKey           string
	strategy                              string
	maxAttempts                           int
	metadata                              metadataFlag
}

// metadataFlag collects -metadata KEY=VALUE flags.
type metadataFlag map[string]string

func (m *metadataFlag) String() string { return "" }

func (m *metadataFlag) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", v)
	}
	if *m == nil {
		*m = metadataFlag{}
	}
	(*m)[k] = val
	return nil
}

func (f *runFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.control, "control", "fallback-chain", "retry | retry-with-learning | fallback-chain | race | balance")
	fs.StringVar(&f.brief, "brief", "", "the task brief (required unless -request)")
	fs.StringVar(&f.target, "target", "", "delegate for retry and retry-with-learning")
	fs.StringVar(&f.list, "delegates", "", "comma-separated delegates for fallback-chain, race and balance (balance: NAME or NAME:WEIGHT, as a:3,b)")
	fs.StringVar(&f.strategy, "strategy", "weighted", "balance: weighted | least-busy | latency | usage")
	fs.IntVar(&f.maxAttempts, "max-attempts", 0, "balance: how many of its deployments to try at most; 0: all of them")
	fs.IntVar(&f.attempts, "attempts", -1, "retry: the retries after the first try (RetrySpec.attempts; 2: at most 3 calls); -1: the server's default, 6")
	fs.IntVar(&f.maxRetries, "max-retries", 0, "retry-with-learning: every attempt, the first included (max_retries; 3: at most 3 calls); 0: the server's default, 3")
	fs.Var(&f.metadata, "metadata", "KEY=VALUE for options.metadata, sent to the delegates on every attempt (repeat for more)")
	fs.DurationVar(&f.maxWait, "max-wait", 0, "retry: longest wait (default 60s)")
	fs.DurationVar(&f.baseWait, "base-wait", 0, "retry: base of the backoff (default 1s)")
	fs.StringVar(&f.onExhausted, "on-exhausted", "ask", "retry: ask | fail")
	fs.DurationVar(&f.hedgeDelay, "hedge-delay", 0, "race: start each next candidate only after this (or once all before it failed); 0: all at once")
	fs.DurationVar(&f.runTimeout, "run-timeout", 0, "deadline of the whole run (default none)")
	fs.DurationVar(&f.attemptTimeout, "attempt-timeout", 0, "timeout of each delegate call (default: the delegate's)")
	fs.DurationVar(&f.firstOutputTimeout, "first-output-timeout", 0, "a streamed attempt that gives no output within this stalls, a transient failure (default: the delegate's first_output_timeout)")
	fs.DurationVar(&f.idleTimeout, "idle-timeout", 0, "a streamed attempt that goes this long between two outputs stalls, a transient failure (default: the delegate's idle_timeout)")
	fs.StringVar(&f.idempotencyKey, "idempotency-key", "", "options.idempotency_key: the same key again (within the server's -idempotency-window) gets the run it started instead of a new one")
	fs.StringVar(&f.request, "request", "", "read the whole RunRequest as protojson from this file (- for stdin)")
	f.limit.register(fs)
	fs.StringVar(&f.limit.onLimit, "on-limit", "ask", "what the run does when its spend limit stops it: ask (a person decides) | fail")
}

// limitFlags are a spend limit's flags: run's, and decide's raise.
type limitFlags struct {
	maxCost   float64
	maxTokens int64
	onLimit   string
}

func (l *limitFlags) register(fs *flag.FlagSet) {
	fs.Float64Var(&l.maxCost, "max-cost", 0, "spend limit: the most the run may cost, in the delegates' price unit (0: no cost limit)")
	fs.Int64Var(&l.maxTokens, "max-total-tokens", 0, "spend limit: the most tokens the run may use (0: no token limit)")
}

// proto is the spend limit the flags set; nil when they set none.
func (l *limitFlags) proto() (*stubbornv1.SpendLimit, error) {
	if l.maxCost == 0 && l.maxTokens == 0 {
		return nil, nil
	}
	out := &stubbornv1.SpendLimit{MaxCost: l.maxCost, MaxTotalTokens: l.maxTokens}
	switch strings.ToLower(l.onLimit) {
	case "", "ask":
	case "fail":
		out.OnExhausted = stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL
	default:
		return nil, fmt.Errorf("-on-limit: want ask or fail, got %q", l.onLimit)
	}
	return out, nil
}

// build turns the flags into a RunRequest.
func (f *runFlags) build(stdin io.Reader) (*stubbornv1.RunRequest, error) {
	if f.request != "" {
		var b []byte
		var err error
		if f.request == "-" {
			b, err = io.ReadAll(stdin)
		} else {
			b, err = os.ReadFile(f.request)
		}
		if err != nil {
			return nil, err
		}
		req := &stubbornv1.RunRequest{}
		if err := protojson.Unmarshal(b, req); err != nil {
			return nil, fmt.Errorf("-request: %w", err)
		}
		return req, nil
	}
	req := &stubbornv1.RunRequest{TaskBrief: f.brief, Options: &stubbornv1.RunOptions{IdempotencyKey: f.idempotencyKey, Metadata: f.metadata}}
	if f.runTimeout > 0 {
		req.Options.RunTimeout = durationpb.New(f.runTimeout)
	}
	limit, err := f.limit.proto()
	if err != nil {
		return nil, err
	}
	req.Options.SpendLimit = limit
	if f.attemptTimeout > 0 {
		req.Options.AttemptTimeout = durationpb.New(f.attemptTimeout)
	}
	if f.firstOutputTimeout > 0 {
		req.Options.FirstOutputTimeout = durationpb.New(f.firstOutputTimeout)
	}
	if f.idleTimeout > 0 {
		req.Options.IdleTimeout = durationpb.New(f.idleTimeout)
	}
	var names []string
	if f.list != "" {
		names = strings.Split(f.list, ",")
	}
	// Enum values in short form or the .proto's, any case: retry_with_learning,
	// RETRY-WITH-LEARNING; fail, ON_EXHAUSTED_FAIL.
	control := strings.ReplaceAll(strings.ToLower(f.control), "_", "-")
	if err := f.checkNames(control); err != nil {
		return nil, err
	}
	switch control {
	case "retry":
		r := &stubbornv1.RetrySpec{Target: f.target}
		if f.attempts >= 0 {
			r.Attempts = ptr(int32(f.attempts))
		}
		if f.maxWait > 0 {
			r.MaxWait = durationpb.New(f.maxWait)
		}
		if f.baseWait > 0 {
			r.BaseWait = durationpb.New(f.baseWait)
		}
		switch strings.TrimPrefix(strings.ToLower(f.onExhausted), "on_exhausted_") {
		case "ask":
			r.OnExhausted = stubbornv1.OnExhausted_ON_EXHAUSTED_ASK
		case "fail":
			r.OnExhausted = stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL
		default:
			return nil, fmt.Errorf("-on-exhausted must be ask or fail (or ON_EXHAUSTED_ASK, ON_EXHAUSTED_FAIL), got %q", f.onExhausted)
		}
		req.Retry = r
	case "retry-with-learning":
		r := &stubbornv1.RetryWithLearningSpec{Target: f.target}
		if f.maxRetries != 0 {
			r.MaxRetries = ptr(int32(f.maxRetries))
		}
		req.RetryWithLearning = r
	case "fallback-chain":
		req.FallbackChain = &stubbornv1.FallbackChainSpec{Chain: names}
	case "race":
		req.Race = &stubbornv1.RaceSpec{Candidates: names}
		if f.hedgeDelay != 0 {
			req.Race.HedgeDelay = durationpb.New(f.hedgeDelay) // a negative one is the server's to refuse
		}
	case "balance":
		b, err := f.balance(names)
		if err != nil {
			return nil, err
		}
		req.Balance = b
	default:
		return nil, fmt.Errorf("-control must be retry, retry-with-learning, fallback-chain, race or balance, got %q", f.control)
	}
	if err := f.checkComplete(control, names); err != nil {
		return nil, err
	}
	return req, nil
}

// checkComplete says which flag a run without -request lacks, in the
// flags' words: the server would name a proto field
// (fallback_chain.chain), which the person did not type.
func (f *runFlags) checkComplete(control string, names []string) error {
	dflt := ""
	if f.control == "fallback-chain" {
		dflt = " (the default)"
	}
	switch control {
	case "retry", "retry-with-learning":
		if strings.TrimSpace(f.target) == "" {
			return fmt.Errorf("run: -control %s needs -target DELEGATE, the delegate it calls again (or -control fallback-chain or race with -delegates a,b)", control)
		}
	case "fallback-chain", "race", "balance":
		if len(names) == 0 {
			return fmt.Errorf("run: -control %s%s needs -delegates a,b, the delegates it tries (or -control retry with -target for one delegate)", control, dflt)
		}
		for i, n := range names {
			if strings.TrimSpace(n) == "" {
				return fmt.Errorf("run: -delegates %q: name %d is empty", f.list, i+1)
			}
		}
	}
	if strings.TrimSpace(f.brief) == "" {
		return fmt.Errorf("run: -brief TEXT is required, the task the delegates are given (or -request FILE, a whole RunRequest)")
	}
	return nil
}

// checkNames refuses the flag of the other kind of control: a retry
// names its delegate with -target, a chain or a race with -delegates.
func (f *runFlags) checkNames(control string) error {
	switch control {
	case "retry", "retry-with-learning":
		if f.target == "" && f.list != "" {
			return fmt.Errorf("-control %s names its one delegate with -target, not -delegates (which is for fallback-chain and race): -target %s", control, strings.Split(f.list, ",")[0])
		}
	case "fallback-chain", "race", "balance":
		if f.list == "" && f.target != "" {
			return fmt.Errorf("-control %s names its delegates with -delegates, not -target (which is for retry and retry-with-learning): -delegates %s", control, f.target)
		}
	}
	return nil
}

// balance builds a BalanceSpec from -delegates (NAME or NAME:WEIGHT),
// -strategy and -max-attempts; the server checks the numbers' bounds.
func (f *runFlags) balance(names []string) (*stubbornv1.BalanceSpec, error) {
	b := &stubbornv1.BalanceSpec{}
	for _, n := range names {
		name, w, weighted := strings.Cut(n, ":")
		t := &stubbornv1.BalanceTarget{Name: name}
		if weighted {
			v, err := strconv.ParseInt(w, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("-delegates %q: the weight of %q must be a whole number, got %q", f.list, name, w)
			}
			t.Weight = ptr(int32(v))
		}
		b.Targets = append(b.Targets, t)
	}
	s := strings.ToUpper(strings.ReplaceAll(f.strategy, "-", "_"))
	if !strings.HasPrefix(s, "BALANCE_STRATEGY_") {
		s = "BALANCE_STRATEGY_" + s
	}
	v, ok := stubbornv1.BalanceStrategy_value[s]
	if !ok || v == 0 {
		return nil, fmt.Errorf("-strategy must be weighted, least-busy, latency or usage, got %q", f.strategy)
	}
	b.Strategy = stubbornv1.BalanceStrategy(v)
	if f.maxAttempts != 0 {
		b.MaxAttempts = ptr(int32(f.maxAttempts))
	}
	return b, nil
}

func ptr[T any](v T) *T { return &v }

// exitCode is 0 for a succeeded run, 1 otherwise.
func exitCode(st *stubbornv1.ControlState) int {
	if st.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED {
		return 0
	}
	return 1
}

func cmdRun(ctx context.Context, args []string, stdout io.Writer) (int, error) {
	fs := newFlagSet("run")
	var cf clientFlags
	cf.register(fs)
	asJSON := fs.Bool("json", false, "print events as protojson lines")
	cancelOnInterrupt := fs.Bool("cancel-on-interrupt", false, "on Ctrl-C, cancel the run too (without it the run goes on on the server)")
	var f runFlags
	f.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return 2, err
	}
	req, err := f.build(os.Stdin)
	if err != nil {
		return 2, err
	}
	client, err := connect(ctx, cf)
	if err != nil {
		return 1, err
	}
	defer client.close()
	stream, err := client.Run(ctx, req)
	if err != nil {
		return 1, err
	}
	if h, herr := stream.Header(); herr == nil && len(h.Get(server.ReplayHeader)) > 0 {
		fmt.Fprintf(stderr, "stubborn: -idempotency-key %q already started a run: nothing new started, following that run from its start\n", req.GetOptions().GetIdempotencyKey())
	}
	p := printer{w: stdout, json: *asJSON, addr: cf.addr}
	st, err := client.follow(ctx, "", streamEventsOf(stream), &p)
	interrupted := err != nil && ctx.Err() != nil && p.runID != ""
	cancelRun := func() (int, error) {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, cerr := client.CancelRun(cctx, &stubbornv1.CancelRunRequest{RunId: p.runID})
		if cerr != nil {
			return 1, fmt.Errorf("cancelling run %s: %w", p.runID, cerr)
		}
		printState(stderr, res.GetState(), false)
		return 130, nil
	}
	if interrupted && *cancelOnInterrupt {
		return cancelRun()
	}
	if interrupted {
		// The run is the server's, and goes on.
		fmt.Fprintf(stderr, "stopped following run %s, which goes on on the server; %s, or cancel it with `stubborn cancel%s %s`\n",
			p.runID, p.followAgain(), p.addrFlag(), p.runID)
		if more, stop := moreInterrupts(); more != nil {
			defer stop()
			fmt.Fprintf(stderr, "press Ctrl-C again within %s to cancel it\n", secondInterruptWait)
			select {
			case <-more:
				return cancelRun()
			case <-time.After(secondInterruptWait):
			}
		}
		return 130, nil
	}
	if err != nil {
		return 1, err
	}
	return exitCode(st), nil
}

// secondInterruptWait is how long run waits, after a Ctrl-C, for a second
// one that cancels the run.
const secondInterruptWait = 2 * time.Second

// moreInterrupts delivers the Ctrl-Cs after the first (which ended run's
// context), or nil when no one is there to press one: stderr is not a
// terminal (a script, a pipe), and run exits at once. stop stops the
// delivery. Tests replace it.
var moreInterrupts = defaultMoreInterrupts

func defaultMoreInterrupts() (more <-chan os.Signal, stop func()) {
	if fi, err := os.Stderr.Stat(); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return nil, func() {}
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt)
	return ch, func() { signal.Stop(ch) }
}

func cmdWatch(ctx context.Context, args []string, stdout io.Writer) (int, error) {
	fs := newFlagSet("watch")
	var cf clientFlags
	cf.register(fs)
	after := fs.Int64("after", 0, "only events after this seq")
	asJSON := fs.Bool("json", false, "print events as protojson lines")
	id, _, err := parseWithID(fs, args)
	if err != nil {
		return 2, err
	}
	client, err := connect(ctx, cf)
	if err != nil {
		return 1, err
	}
	defer client.close()
	p := printer{w: stdout, json: *asJSON, addr: cf.addr, runID: id, lastSeq: *after}
	stream, err := client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: id, AfterSeq: *after})
	var st *stubbornv1.ControlState
	if err == nil {
		st, err = client.follow(ctx, id, streamEventsOf(stream), &p)
	}
	if err != nil && ctx.Err() != nil {
		// Ctrl-C: the run goes on.
		fmt.Fprintf(stderr, "stopped following run %s, which goes on on the server; %s\n", id, p.followAgain())
		return 130, nil
	}
	if err != nil {
		return 1, err
	}
	if st == nil {
		// The stream ended, so the run has, but its run_finished was at
		// or before -after: the exit code is its final state's.
		res, err := client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
		if err != nil {
			return 1, err
		}
		st = res.GetState()
		fmt.Fprintf(stderr, "run %s: %s, no events after seq %d\n", id, statusName(st.GetStatus()), *after)
	}
	return exitCode(st), nil
}

// decideWait is how long `decide RUN fail` waits for the run to end, to
// print how it ended.
const decideWait = 10 * time.Second

// cmdUnary runs get, cancel, decide and delete, which print the run's
// state (delete that it is gone).
func cmdUnary(ctx context.Context, name string, args []string, stdout io.Writer) (int, error) {
	fs := newFlagSet(name)
	var cf clientFlags
	cf.register(fs)
	asJSON := fs.Bool("json", false, "print the run's whole state as protojson")
	var raise limitFlags
	if name == "decide" {
		raise.register(fs) // a RETRY of a run its spend limit stopped raises it
	}
	id, rest, err := parseWithID(fs, args)
	if err != nil {
		return 2, err
	}
	var decision stubbornv1.Decision
	switch name {
	case "delete":
		if len(rest) > 1 || len(rest) == 1 && rest[0] != "cancel" {
			return 2, fmt.Errorf("usage: stubborn delete RUN_ID [cancel]")
		}
	case "decide":
		answer := ""
		if len(rest) > 0 {
			answer = rest[0]
		}
		switch strings.ToLower(answer) {
		case "retry":
			decision = stubbornv1.Decision_DECISION_RETRY
		case "fail":
			decision = stubbornv1.Decision_DECISION_FAIL
		default:
			return 2, fmt.Errorf("usage: stubborn decide RUN_ID retry|fail")
		}
	}
	client, err := connect(ctx, cf)
	if err != nil {
		return 1, err
	}
	defer client.close()
	var st *stubbornv1.ControlState
	switch name {
	case "get":
		var res *stubbornv1.GetRunResponse
		res, err = client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
		st = res.GetState()
	case "cancel":
		var res *stubbornv1.CancelRunResponse
		res, err = client.CancelRun(ctx, &stubbornv1.CancelRunRequest{RunId: id})
		st = res.GetState()
	case "delete":
		cancel := len(rest) == 1
		if _, err = client.DeleteRun(ctx, &stubbornv1.DeleteRunRequest{RunId: id, Cancel: cancel}); err != nil {
			if status.Code(err) == codes.FailedPrecondition && !cancel {
				err = fmt.Errorf("%w: `stubborn delete%s %s cancel` cancels it and deletes it", err, (&printer{addr: cf.addr}).addrFlag(), id)
			}
			return 1, runError(err)
		}
		fmt.Fprintf(stdout, "run %s: deleted\n", id)
		return 0, nil
	case "decide":
		var res *stubbornv1.DecideRunResponse
		limit, _ := raise.proto()
		res, err = client.DecideRun(ctx, &stubbornv1.DecideRunRequest{RunId: id, Decision: decision, SpendLimit: limit})
		st = res.GetState()
		if err == nil && decision == stubbornv1.Decision_DECISION_FAIL && !finished(st) {
			// The run ends at once: say how, rather than the status it
			// had when the decision was taken.
			st = client.awaitEnd(ctx, st, decideWait)
		}
	}
	if err != nil {
		return 1, runError(err)
	}
	if !*asJSON {
		printState(stdout, st, name == "get")
		return 0, nil
	}
	b, err := protojson.MarshalOptions{Multiline: true}.Marshal(st)
	if err != nil {
		return 1, err
	}
	fmt.Fprintf(stdout, "%s\n", b)
	return 0, nil
}

// runError adds to a call's error about a run what a person may want to
// know: a run not found may be gone, or not theirs.
func runError(err error) error {
	if status.Code(err) == codes.NotFound {
		return fmt.Errorf("%w (it may have been deleted, or be another tenant's)", err)
	}
	return err
}

// awaitEnd waits up to wait for the run of st to end, and returns its
// final state; st, or the last state read, when it has not ended by then.
func (c *client) awaitEnd(ctx context.Context, st *stubbornv1.ControlState, wait time.Duration) *stubbornv1.ControlState {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	stream, err := c.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: st.GetRunId()})
	if err != nil {
		return st
	}
	for {
		res, err := stream.Recv()
		if err != nil {
			break
		}
		if f := res.GetEvent().GetRunFinished(); f != nil {
			return f.GetState()
		}
	}
	if res, err := c.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: st.GetRunId()}); err == nil {
		return res.GetState()
	}
	return st
}

func cmdList(ctx context.Context, args []string, stdout io.Writer) (int, error) {
	fs := newFlagSet("list")
	var cf clientFlags
	cf.register(fs)
	statusFlag := fs.String("status", "", "only runs with this status: "+strings.Join(statusNames(), ", "))
	limit := fs.Int("limit", 50, "how many runs to list, newest first (at most 1000 a page; pages are followed)")
	all := fs.Bool("all", false, "list every run (no -limit)")
	asJSON := fs.Bool("json", false, "print each run's summary as a protojson line (RunSummary), newest first; nothing for no runs")
	if err := parseFlags(fs, args); err != nil {
		return 2, err
	}
	if *all {
		*limit = math.MaxInt
	}
	if *limit < 1 {
		return 2, fmt.Errorf("-limit must be at least 1, got %d", *limit)
	}
	filter := stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED
	if *statusFlag != "" {
		v, ok := stubbornv1.RunStatus_value["RUN_STATUS_"+strings.TrimPrefix(strings.ToUpper(strings.ReplaceAll(*statusFlag, "-", "_")), "RUN_STATUS_")]
		if !ok || v == 0 {
			return 2, fmt.Errorf("unknown -status %q: want one of %s", *statusFlag, strings.Join(statusNames(), ", "))
		}
		filter = stubbornv1.RunStatus(v)
	}
	client, err := connect(ctx, cf)
	if err != nil {
		return 1, err
	}
	defer client.close()
	listed, token := 0, ""
	for {
		res, err := client.ListRuns(ctx, &stubbornv1.ListRunsRequest{Status: filter, View: stubbornv1.RunView_RUN_VIEW_SUMMARY, PageSize: int32(min(*limit-listed, 1000)), PageToken: token})
		if err != nil {
			return 1, err
		}
		for _, r := range res.GetSummaries() {
			if *asJSON {
				b, err := jsonLine.Marshal(r)
				if err != nil {
					return 1, err
				}
				fmt.Fprintf(stdout, "%s\n", b)
			} else {
				fmt.Fprintf(stdout, "%s  %-18s %-40s attempts=%d\n", r.GetRunId(), statusName(r.GetStatus()), summaryName(r), r.GetAttempts())
			}
			listed++
		}
		token = res.GetNextPageToken()
		if token == "" || listed >= *limit {
			break
		}
	}
	if *asJSON {
		// Every line of stdout is a run; what is said about the list goes
		// to stderr.
		if token != "" {
			fmt.Fprintf(stderr, "stubborn: %d shown, newest first; there are more: -limit N or -all\n", listed)
		}
		return 0, nil
	}
	switch {
	case listed == 0 && *statusFlag != "":
		fmt.Fprintf(stdout, "no %s runs\n", strings.ToLower(*statusFlag))
	case listed == 0:
		fmt.Fprintln(stdout, "no runs")
	case token != "":
		fmt.Fprintf(stdout, "(%d shown, newest first; there are more: -limit N or -all)\n", listed)
	}
	return 0, nil
}

// statusNames are the values of list's -status.
func statusNames() []string {
	var names []string
	for v := int32(1); ; v++ {
		n, ok := stubbornv1.RunStatus_name[v]
		if !ok {
			return names
		}
		names = append(names, strings.ToLower(strings.TrimPrefix(n, "RUN_STATUS_")))
	}
}

// parseWithID parses flags, which may come before or after the positional
// arguments, and returns the run id, which must come first.
func parseWithID(fs *flag.FlagSet, args []string) (string, []string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return "", nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(pos) == 0 {
		return "", nil, fmt.Errorf("usage: stubborn %s RUN_ID", fs.Name())
	}
	return pos[0], pos[1:], nil
}

// cmdRegistry lists the delegates and presets the caller may name, over
// ListDelegates.
// callHealth is what a delegate's last calls say, for registry's health
// column when no health check answered: "calls ok", "failing" or "no
// calls"; and a trait saying when (and, failing, since when and why).
func callHealth(d *stubbornv1.DelegateDescription, now time.Time) (health, trait string) {
	last := d.GetLastCallTime()
	switch {
	case last == nil:
		return "no calls", ""
	case d.GetLastCallCode() == 0:
		return "calls ok", "last call ok " + round(now.Sub(last.AsTime())).String() + " ago"
	}
	trait = "failing"
	if since := d.GetFailingSince(); since != nil {
		trait += " since " + since.AsTime().Local().Format("15:04:05") + " (" + round(now.Sub(since.AsTime())).String() + " ago)"
	}
	trait += ": " + codes.Code(uint32(d.GetLastCallCode())).String()
	if f := d.GetRecentFailures(); len(f) > 0 {
		trait += " " + quote(f[0].GetMessage(), 80)
	}
	return "failing", trait
}

// guardTraits describes a delegate's guards for registry: its circuit
// breaker's state (and why it last opened), calls in flight, limits.
func guardTraits(d *stubbornv1.DelegateDescription) []string {
	var out []string
	if st := d.GetCircuitBreaker(); st != stubbornv1.BreakerState_BREAKER_STATE_UNSPECIFIED {
		b := "breaker " + strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(st.String(), "BREAKER_STATE_")), "_", "-")
		if why := d.GetCircuitBreakerReason(); why != "" && st != stubbornv1.BreakerState_BREAKER_STATE_CLOSED {
			if by := d.GetCircuitBreakerOpenedBy(); by != "" {
				why += "; opened by " + by
			}
			b += " (" + why + ")"
		}
		out = append(out, b)
	}
	// Fleet-wide guards: said only when this server's are its own while it
	// shares a fleet's store.
	if d.GetGuardScope() == stubbornv1.GuardScope_GUARD_SCOPE_LOCAL {
		out = append(out, "guards this server's own ("+d.GetGuardScopeReason()+")")
	}
	if n := d.GetMaxConcurrent(); n > 0 {
		out = append(out, fmt.Sprintf("%d/%d in flight", d.GetInFlight(), n))
	}
	if n := d.GetRequestsPerMinute(); n > 0 {
		out = append(out, fmt.Sprintf("%d rpm", n))
	}
	if n := d.GetTokensPerMinute(); n > 0 {
		out = append(out, fmt.Sprintf("%d tpm", n))
	}
	if on := d.GetRetryOn(); on != nil {
		var what []string
		what = append(what, on.GetGrpcCodes()...)
		for _, h := range on.GetHttpStatuses() {
			what = append(what, fmt.Sprint(h))
		}
		out = append(out, "retry on "+strings.Join(what, " "))
	}
	return out
}

// streamTraits describes a delegate's streaming for registry: whether
// calls stream (when not "auto", the default) and its stall timeouts.
func streamTraits(d *stubbornv1.DelegateDescription) []string {
	var out []string
	if s := d.GetStream(); s != "" && s != "auto" {
		out = append(out, "stream "+s)
	}
	if t := d.GetFirstOutputTimeout(); t != nil {
		out = append(out, "first output within "+round(t.AsDuration()).String())
	}
	if t := d.GetIdleTimeout(); t != nil {
		out = append(out, "idle timeout "+round(t.AsDuration()).String())
	}
	return out
}

func cmdRegistry(ctx context.Context, args []string, stdout io.Writer) (int, error) {
	fs := newFlagSet("registry")
	var cf clientFlags
	cf.register(fs)
	asJSON := fs.Bool("json", false, "print the whole ListDelegatesResponse as protojson")
	if err := parseFlags(fs, args); err != nil {
		return 2, err
	}
	client, err := connect(ctx, cf)
	if err != nil {
		return 1, err
	}
	defer client.close()
	res, err := client.ListDelegates(ctx, &stubbornv1.ListDelegatesRequest{})
	if err != nil {
		return 1, err
	}
	if *asJSON {
		b, err := protojson.MarshalOptions{Multiline: true}.Marshal(res)
		if err != nil {
			return 1, err
		}
		fmt.Fprintf(stdout, "%s\n", b)
		return 0, nil
	}
	if len(res.GetDelegates()) == 0 && len(res.GetPresets()) == 0 {
		fmt.Fprintln(stdout, "no delegates or presets")
		return 0, nil
	}
	for _, d := range res.GetDelegates() {
		var traits []string
		if d.GetIdempotent() {
			traits = append(traits, "idempotent")
		}
		if d.GetReadOnly() {
			traits = append(traits, "read-only")
		}
		if d.GetTimeout() != nil {
			traits = append(traits, "timeout "+round(d.GetTimeout().AsDuration()).String())
		}
		traits = append(traits, streamTraits(d)...)
		traits = append(traits, guardTraits(d)...)
		health, calls := callHealth(d, time.Now())
		if d.GetHealth() != stubbornv1.DelegateHealth_DELEGATE_HEALTH_UNSPECIFIED {
			health = strings.ToLower(strings.TrimPrefix(d.GetHealth().String(), "DELEGATE_HEALTH_"))
		}
		if calls != "" {
			traits = append(traits, calls)
		}
		fmt.Fprintf(stdout, "delegate  %-24s %-9s %-12s %s\n", d.GetName(), d.GetKind(), health, strings.Join(traits, ", "))
	}
	for _, p := range res.GetPresets() {
		sum := &stubbornv1.RunSummary{Control: controls.ControlName(p.GetSpec()), Delegates: controls.Named(p.GetSpec())}
		fmt.Fprintf(stdout, "preset    %-24s %s\n", p.GetName(), summaryName(sum))
	}
	return 0, nil
}
