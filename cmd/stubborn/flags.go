package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stubbornhq/stubborn/internal/delegates"
)

// newFlagSet returns a flag set that reports errors instead of exiting,
// and prints nothing itself: parseFlags words its errors, and prints the
// flags on -h.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// flagErrors match the flag package's wording of a flag not defined and
// of a value that does not parse.
var (
	flagUndefined = regexp.MustCompile(`^flag provided but not defined: -+(.*)$`)
	flagBadValue  = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for flag -(\S+): `)
)

// parseFlags parses args with fs, and words its errors for a person: an
// unknown flag gets the closest one's name (not the whole usage), a
// duration without a unit the unit it needs. -h prints the flags on
// stderr and returns flag.ErrHelp, which run turns into exit 0.
func parseFlags(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	if err == nil {
		return nil
	}
	if errors.Is(err, flag.ErrHelp) {
		printFlags(stderr, fs)
		return err
	}
	return flagError(fs, err)
}

// flagError words a flag parsing error of fs.
func flagError(fs *flag.FlagSet, err error) error {
	list := fmt.Sprintf("(`stubborn %s -h` lists its flags)", fs.Name())
	if m := flagUndefined.FindStringSubmatch(err.Error()); m != nil {
		name, _, _ := strings.Cut(m[1], "=")
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		if best := delegates.Closest(name, names); best != "" {
			return fmt.Errorf("unknown flag -%s: did you mean -%s? %s", name, best, list)
		}
		return fmt.Errorf("unknown flag -%s %s", name, list)
	}
	if m := flagBadValue.FindStringSubmatch(err.Error()); m != nil {
		value, name := m[1], m[2]
		if f := fs.Lookup(name); f != nil {
			if g, ok := f.Value.(flag.Getter); ok {
				if _, isDuration := g.Get().(time.Duration); isDuration {
					hint := "such as 500ms, 10s, 1m30s"
					if _, err := strconv.ParseFloat(value, 64); err == nil {
						hint = value + "s"
					}
					return fmt.Errorf("-%s %s: durations need a unit: %s", name, value, hint)
				}
			}
			return fmt.Errorf("-%s %q: %s (%s)", name, value, strings.TrimSpace(err.Error()[len(m[0]):]), f.Usage)
		}
	}
	return err
}

// flagGroup is a heading of a command's -h, what it says, and its flags in
// the order shown.
type flagGroup struct {
	title, about string
	names        []string
}

// helpOf is, for the commands whose -h groups their flags by purpose, what
// it says first and the groups; the other commands list their flags
// alphabetically, as the flag package does.
var helpOf = map[string]struct {
	intro  string
	groups []flagGroup
}{
	"serve": {
		intro: `Usage: stubborn serve [flags]

Serves the gRPC API on -listen and, with -http-listen, the web console, the HTTP API (Connect, gRPC-Web, JSON) and the
model front doors (OpenAI's POST /v1/chat/completions, Anthropic's POST /v1/messages) on a second address. Runs are kept in
an embedded NATS JetStream under -data-dir unless -nats-url or -memory says otherwise.`,
		groups: []flagGroup{
			{title: "Configuration", names: []string{"config", "watch-config"}},
			{title: "Listening", names: []string{"listen", "http-listen", "public-url", "reflection"}},
			{title: "Store", about: "Where runs are kept, and how they are written.", names: []string{
				"data-dir", "nats-url", "memory", "durability", "sync-period", "replicas", "lease", "write-retry", "output-flush-interval", "output-flush-bytes",
			}},
			{title: "Security", about: "TLS, and the hosts the HTTP listener answers; tenants and their tokens are in the config.", names: []string{
				"tls-cert", "tls-key", "tls-client-ca", "insecure", "http-allowed-hosts",
			}},
			{title: "Observability", about: "Logs, metrics and profiles; traces and metrics also go where the OTEL_* environment says.", names: []string{
				"log-level", "log-format", "log-flush", "metrics-listen", "pprof-listen",
			}},
			{title: "Limits", about: "How long and how much is kept; what a request may ask for is bounded by the config's limits.", names: []string{
				"retention", "max-runs", "max-bytes", "idempotency-window",
			}},
			{title: "Upgrading", about: "Only while replicas of an older release share the store.", names: []string{
				"claim-in-owners", "save-final-states",
			}},
		},
	},
	"run": {
		intro: `Usage: stubborn run -control C -brief TEXT (-target D | -delegates D,D,...) [flags]

Starts a run and prints its events as they happen; exit 0 only if it succeeded.`,
		groups: []flagGroup{
			{title: "The run", names: []string{"control", "target", "delegates", "brief", "request", "json", "idempotency-key", "metadata", "cancel-on-interrupt"}},
			{title: "How many attempts", about: `The two count differently because each control keeps the contract it implements, as that contract is
written: retry's attempts are the retries after the first try (-attempts 2: at most 3 calls), retry-with-learning's
max_retries is every attempt, the first included (-max-retries 3: at most 3 calls). A run, a preset and an API call
written against either contract mean what it says.`, names: []string{"attempts", "max-retries"}},
			{title: "Retry's backoff", names: []string{"base-wait", "max-wait", "on-exhausted"}},
			{title: "Race", names: []string{"hedge-delay"}},
			{title: "Balance", about: "-delegates names its deployments, each NAME or NAME:WEIGHT (a:3,b).", names: []string{"strategy", "max-attempts"}},
			{title: "Timeouts", names: []string{"run-timeout", "attempt-timeout", "first-output-timeout", "idle-timeout"}},
			{title: "Spend limit", about: "Priced by the delegates' prices (their price in the config); a call that would pass the limit is not made.", names: []string{"max-cost", "max-total-tokens", "on-limit"}},
			{title: "Connecting", names: []string{"addr", "wait"}},
		},
	},
}

// printFlags writes fs's flags to w: by group when helpOf has fs's
// command (a flag no group names comes last, under Other, never lost),
// else alphabetically.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	h, grouped := helpOf[fs.Name()]
	if !grouped {
		fmt.Fprintf(w, "Usage of stubborn %s:\n", fs.Name())
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
		return
	}
	fmt.Fprintln(w, h.intro)
	shown := map[string]bool{}
	groups := h.groups
	var other []string
	fs.VisitAll(func(f *flag.Flag) {
		for _, g := range groups {
			if slices.Contains(g.names, f.Name) {
				return
			}
		}
		other = append(other, f.Name)
	})
	if len(other) > 0 {
		groups = append(groups[:len(groups):len(groups)], flagGroup{title: "Other", names: other})
	}
	for _, g := range groups {
		fmt.Fprintf(w, "\n%s:\n", g.title)
		if g.about != "" {
			fmt.Fprintf(w, "  %s\n", strings.ReplaceAll(g.about, "\n", "\n  "))
		}
		for _, name := range g.names {
			if f := fs.Lookup(name); f != nil && !shown[name] {
				shown[name] = true
				printFlag(w, f)
			}
		}
	}
}

// printFlag writes one flag as flag.PrintDefaults does, through a flag set
// of that flag alone, so the wording of types and defaults stays the flag
// package's.
func printFlag(w io.Writer, f *flag.Flag) {
	one := flag.NewFlagSet("", flag.ContinueOnError)
	one.Var(f.Value, f.Name, f.Usage)
	one.Lookup(f.Name).DefValue = f.DefValue // the default, not what flags before -h set
	one.SetOutput(w)
	one.PrintDefaults()
}
