// Package delegates resolves delegate names to gRPC services and calls them.
//
// A YAML file (see [Parse]) names the delegates and the limits Stubborn
// enforces. A [Pool] built from it holds one shared gRPC client connection per
// delegate and implements [controls.Delegates]: it sends
// stubborn.v1.DelegateService/Execute, applies the per-attempt timeout, and
// turns failures into classified [controls.CallError] values ([Classify]).
package delegates

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/stubbornhq/stubborn/internal/controls"
)

// Defaults applied when the config leaves a value unset or zero.
const (
	// defaultTimeout is a delegate's per-attempt timeout when none is given.
	defaultTimeout = 30 * time.Second
	// defaultMaxBriefBytes is the default cap on a task brief's size.
	defaultMaxBriefBytes = 64 << 10
	// defaultMaxAttempts is the default cap on retry attempts and max_retries.
	defaultMaxAttempts = 100
	// defaultMaxChain is the default cap on a fallback chain's or a race's
	// candidate list's length.
	defaultMaxChain = 32
	// defaultMaxWait is the default cap on a retry's max_wait.
	defaultMaxWait = time.Hour
	// defaultMaxResultBytes is the default cap on a delegate's answer.
	defaultMaxResultBytes = controls.MaxResultBytes
	// maxMaxResultBytes is the largest max_result_bytes: the largest
	// answer a CEL criterion evaluates (controls.MaxResultBytes); an
	// attempt's event carries its answer and its brief, and must fit a
	// store message and a gRPC message (runs.MaxEventBytes).
	maxMaxResultBytes = controls.MaxResultBytes
)

// errInvalidConfig is wrapped by every error [Parse] and load return for a
// config that is malformed or fails validation.
var errInvalidConfig = errors.New("invalid delegates config")

// Config is the delegates file: the registry of delegates plus server-wide
// settings. Fields are added here (with their yaml tags) as the file grows;
// unknown keys in a file are rejected.
type Config struct {
	// Judge names the default judge delegate for failure_criteria. Empty
	// means none; when set it must name a delegate in Delegates.
	Judge string `yaml:"judge,omitempty"`
	// Limits caps what requests may ask for. Zero fields take defaults.
	Limits Limits `yaml:"limits,omitempty"`
	// Delegates is the registry, in file order. Names are unique.
	Delegates []Delegate `yaml:"delegates"`
	// Presets are named control specs that runs may name like delegates.
	Presets []Preset `yaml:"presets,omitempty"`
	// RetryBudget, when set, limits the retry control's retries per delegate
	// the way gRPC's retry throttling does. Nil means no budget.
	RetryBudget *RetryBudget `yaml:"retry_budget,omitempty"`
	// SpendLimit is the default tenant's spend limit for a day or a month
	// (tenantspend.go); a config with tenants sets theirs instead.
	SpendLimit *TenantSpendLimit `yaml:"spend_limit,omitempty"`
	// Tenants are the callers the server lets in, each with its
	// credentials, allowed delegates and limits (see Tenant). Empty means
	// no authentication: every caller is the default tenant.
	Tenants []Tenant `yaml:"tenants,omitempty"`
	// Notify are the webhooks told when the default tenant's runs wait
	// for a person (docs/notifications.md).
	Notify []NotifyTarget `yaml:"notify,omitempty"`

	// keys says which of the keys whose loss a reload refuses
	// (guardedKeys) the file wrote, for [Config.CheckReplaces]. A Config
	// built in code writes none.
	keys map[string]bool
}

// guardedKeys are the top-level keys a file must not lose without saying
// so: a file cut short, or emptied, would otherwise drop the registry or
// every tenant, and with the tenants the authentication.
var guardedKeys = []string{"delegates", "tenants"}

// RetryBudget is a per-delegate token bucket: each transient failure costs
// a token, each answer refunds token_ratio, and retries stop while the
// tokens are at or below half of max_tokens.
type RetryBudget struct {
	// MaxTokens is the bucket's size; it starts full. Must be positive.
	MaxTokens float64 `yaml:"max_tokens"`
	// TokenRatio is what an answer refunds. Must be positive.
	TokenRatio float64 `yaml:"token_ratio"`
}

// Limits are the configurable caps on requests. The delegates package only
// loads them; the server and the controls enforce them.
type Limits struct {
	// MaxBriefBytes caps the size of a task brief in bytes.
	MaxBriefBytes int `yaml:"max_brief_bytes,omitempty"`
	// MaxAttempts caps retry's attempts and retry-with-learning's max_retries.
	MaxAttempts int `yaml:"max_attempts,omitempty"`
	// MaxChain caps the length of a fallback chain or a race's candidates.
	MaxChain int `yaml:"max_chain,omitempty"`
	// MaxWait caps retry's max_wait, base_wait and decision_timeout, and
	// race's hedge_delay.
	MaxWait Duration `yaml:"max_wait,omitempty"`
	// MaxResultBytes caps a delegate's answer (its Result, encoded), a
	// judge's and an analyst's included: a larger one fails its attempt,
	// and is not retried. Server-wide only: not a tenant's limit.
	MaxResultBytes int `yaml:"max_result_bytes,omitempty"`

	// The limits below are off when zero, and have no default. In the
	// config's limits they bound the whole server (one process), in a
	// tenant's limits that tenant.

	// MaxConcurrentRuns caps the runs in progress (not yet finished,
	// waiting for a decision included).
	MaxConcurrentRuns int `yaml:"max_concurrent_runs,omitempty"`
	// RunStartsPerSecond caps how fast runs may be started (Run and
	// StartRun requests), with bursts of RunStartBurst.
	RunStartsPerSecond float64 `yaml:"run_starts_per_second,omitempty"`
	// RunStartBurst is how many starts may come at once; zero means
	// RunStartsPerSecond rounded up (at least 1).
	RunStartBurst int `yaml:"run_start_burst,omitempty"`
	// MaxWatchersPerRun caps the streams (Run, WatchRun) following one
	// run at a time.
	MaxWatchersPerRun int `yaml:"max_watchers_per_run,omitempty"`
	// MaxConcurrentReads caps the reads of one tenant in progress at a
	// time: ListRuns and GetRun calls, and WatchRun streams open. The
	// server's value applies to each tenant, a tenant's own when smaller.
	MaxConcurrentReads int `yaml:"max_concurrent_reads,omitempty"`
}

// defaultLimits returns the limits used for every field a config leaves zero.
func defaultLimits() Limits {
	return Limits{
		MaxBriefBytes:  defaultMaxBriefBytes,
		MaxAttempts:    defaultMaxAttempts,
		MaxChain:       defaultMaxChain,
		MaxWait:        Duration(defaultMaxWait),
		MaxResultBytes: defaultMaxResultBytes,
	}
}

// Delegate is one registry entry.
type Delegate struct {
	// Name is how runs refer to the delegate. Required and unique.
	Name string `yaml:"name"`
	// Target is any gRPC target string: host:port, dns:///host:port,
	// unix:///path, …: the delegate serves stubborn.v1.DelegateService.
	// A delegate sets exactly one of Target, HTTP, OpenAI and Anthropic.
	Target string `yaml:"target,omitempty"`
	// HTTP makes the delegate a JSON-over-HTTP endpoint (see HTTP).
	HTTP *HTTP `yaml:"http,omitempty"`
	// OpenAI makes the delegate a model behind the OpenAI Chat Completions
	// API (see OpenAI).
	OpenAI *OpenAI `yaml:"openai,omitempty"`
	// Anthropic makes the delegate a model behind Anthropic's Messages
	// API (see Anthropic).
	Anthropic *Anthropic `yaml:"anthropic,omitempty"`
	// Idempotent says a repeated call has no further side effect.
	Idempotent bool `yaml:"idempotent,omitempty"`
	// ReadOnly says a call has no side effect at all. In a config file,
	// the model kinds (OpenAI, Anthropic) are read-only unless the entry
	// sets read_only (modelsReadOnly): a model's answer has no side effect
	// of its own, so retry may retry a 429.
	ReadOnly bool `yaml:"read_only,omitempty"`
	// Timeout is the per-attempt timeout; zero means defaultTimeout. A run
	// may override it per attempt (controls.Call.AttemptTimeout).
	Timeout Duration `yaml:"timeout,omitempty"`
	// Stream says whether calls to it stream their output: "auto"
	// (empty means it), "on" or "off".
	Stream string `yaml:"stream,omitempty"`
	// FirstOutputTimeout, when positive, fails a streamed attempt that
	// has made no output this long after it was sent (time to first
	// token); a run's options may override it. Zero means none.
	FirstOutputTimeout Duration `yaml:"first_output_timeout,omitempty"`
	// IdleTimeout, when positive, fails a streamed attempt that has made
	// no output this long since its last; a run's options may override
	// it. Zero means none.
	IdleTimeout Duration `yaml:"idle_timeout,omitempty"`
	// TLS makes a gRPC connection use TLS (see TLS); the zero value is
	// plaintext. For the HTTP kinds, https:// URLs always use TLS; its ca,
	// server_name, cert and key apply to them too.
	TLS TLS `yaml:"tls,omitempty"`

	// The delegate's guards (guards.go), shared by every run on the
	// server. CircuitBreaker, when set, refuses calls for a while after
	// it failed too often.
	CircuitBreaker *CircuitBreaker `yaml:"circuit_breaker,omitempty"`
	// MaxConcurrent caps the calls in flight to it from this server (a
	// bulkhead); 0 means no limit.
	MaxConcurrent int `yaml:"max_concurrent,omitempty"`
	// RequestsPerMinute caps the calls sent to it in any minute from this
	// server; 0 means no limit.
	RequestsPerMinute int `yaml:"requests_per_minute,omitempty"`
	// TokensPerMinute caps the model tokens its answers report using
	// (tokensUsed) in any minute: no call goes while the last minute's
	// reach it; 0 means no limit.
	TokensPerMinute int64 `yaml:"tokens_per_minute,omitempty"`
	// MaxQueueWait bounds how long a call waits for a MaxConcurrent slot
	// or a rate limit before it is refused (never retried). Unset means
	// defaultMaxQueueWait; 0 refuses at once.
	MaxQueueWait *Duration `yaml:"max_queue_wait,omitempty"`
	// RetryOn, when set, lists the failures retries of it treat as
	// transient (and its circuit breaker counts), in place of the retry
	// control's rules; a run's retry.retry_on overrides it.
	RetryOn *RetryOn `yaml:"retry_on,omitempty"`
	// Price, when set, prices its calls from the usage they report
	// (price.go); unset, its calls cost nothing.
	Price *Price `yaml:"price,omitempty"`
}

// Info returns what the controls need to know about the delegate.
func (d Delegate) Info() controls.DelegateInfo {
	info := controls.DelegateInfo{Idempotent: d.Idempotent, ReadOnly: d.ReadOnly, Price: d.Price.Proto()}
	if d.RetryOn != nil {
		info.RetryOn = d.RetryOn.Proto()
	}
	return info
}

// Duration is a time.Duration written in YAML as a Go duration string
// ("500ms", "5s", "1m30s").
type Duration time.Duration

// Std returns d as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// String formats d like time.Duration.
func (d Duration) String() string { return time.Duration(d).String() }

// UnmarshalYAML parses a scalar with time.ParseDuration.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return nodeError(n, "", n.Line, `a duration must be a string such as "5s"`)
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		msg := fmt.Sprintf("invalid duration %q: use Go duration syntax such as 500ms, 5s, 1m30s", n.Value)
		if _, nerr := strconv.ParseFloat(n.Value, 64); nerr == nil {
			msg = fmt.Sprintf("invalid duration %q: durations need a unit, such as %ss", n.Value, n.Value)
		}
		return nodeError(n, "", n.Line, msg)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes d as a duration string.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// load reads and parses the delegates file at path.
func load(path string) (*Config, error) {
	cfg, _, err := LoadSum(path)
	return cfg, err
}

// LoadSum is Load, and the SHA-256 of the bytes it parsed: what a watch of
// the file, armed later, compares the file with to see a change it missed.
func LoadSum(path string) (*Config, [sha256.Size]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, [sha256.Size]byte{}, fmt.Errorf("delegates config: %w", err)
	}
	cfg, err := ParseAt(b, path)
	if err != nil {
		return nil, [sha256.Size]byte{}, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, sha256.Sum256(b), nil
}

// ParseAt is Parse of b, the content of the file at path: the relative
// paths it names (delegates' tls ca, cert, key) are read from path's
// directory, as Load reads them (a reload reads the file itself, then
// parses it here).
func ParseAt(b []byte, path string) (*Config, error) {
	cfg, err := Parse(b)
	if err != nil {
		return nil, err
	}
	for i := range cfg.Delegates {
		cfg.Delegates[i].TLS.resolve(filepath.Dir(path))
	}
	return cfg, nil
}

// Parse decodes a delegates file, rejects unknown keys, fills in defaults
// (Limits, delegate timeouts) and validates it. Every problem found is
// reported, each naming the entry and field it is about. An empty document
// (nothing, or comments only) is refused, as is a `delegates:` or
// `tenants:` written without a value: both are what a file cut short, or
// emptied by mistake, looks like. A config with none says `delegates: []`.
func Parse(b []byte) (*Config, error) {
	return parse(b, os.LookupEnv)
}

// parse is Parse reading environment variables with lookupEnv.
func parse(b []byte, lookupEnv func(string) (string, bool)) (*Config, error) {
	var cfg Config
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		return nil, decodeError(b, err)
	}
	keys, err := topKeys(b)
	if err != nil {
		return nil, err
	}
	cfg.keys = keys
	if err := cfg.modelsReadOnly(b); err != nil {
		return nil, err
	}
	cfg.applyDefaults()
	if err := cfg.validate(lookupEnv); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// topKeys returns the guarded keys the file b writes, and refuses a file
// that is empty or writes one of them without a value.
func topKeys(b []byte) (map[string]bool, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(b, &root); err != nil {
		return nil, fmt.Errorf("%w: %w", errInvalidConfig, err)
	}
	if len(root.Content) == 0 || isNull(root.Content[0]) {
		return nil, fmt.Errorf("%w: the file is empty (or holds only comments): a config with no delegates says `delegates: []`", errInvalidConfig)
	}
	doc := root.Content[0]
	keys := map[string]bool{}
	var errs []error
	for i := 0; doc.Kind == yaml.MappingNode && i+1 < len(doc.Content); i += 2 {
		k, v := doc.Content[i], doc.Content[i+1]
		if !slices.Contains(guardedKeys, k.Value) {
			continue
		}
		keys[k.Value] = true
		if isNull(v) {
			errs = append(errs, fmt.Errorf("%w: %s: no value (line %d; is the file cut short?): list them, or write `%s: []` for none", errInvalidConfig, k.Value, k.Line, k.Value))
		}
	}
	return keys, errors.Join(errs...)
}

// modelsReadOnly makes the model kinds' entries of b that do not set
// read_only read-only: a chat completion or a message has no side effect
// of its own (tools are the caller's to run), so the retry control retries
// a model's 429 and 5xx unless the entry says read_only: false.
func (c *Config) modelsReadOnly(b []byte) error {
	var sets struct {
		Delegates []struct {
			ReadOnly *bool `yaml:"read_only"`
		} `yaml:"delegates"`
	}
	if err := yaml.Unmarshal(b, &sets); err != nil {
		return fmt.Errorf("%w: %w", errInvalidConfig, err)
	}
	for i := range c.Delegates {
		d := &c.Delegates[i]
		if (d.OpenAI != nil || d.Anthropic != nil) && i < len(sets.Delegates) && sets.Delegates[i].ReadOnly == nil {
			d.ReadOnly = true
		}
	}
	return nil
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// CheckReplaces says whether c may replace old, the config in use, on a
// reload: a reload never loosens the security, or empties the registry,
// by accident. c must have been parsed from a file (Parse or Load) that
// keeps every guarded key old has entries under (`delegates:`,
// `tenants:`); removing all of them takes an explicit `delegates: []` or
// `tenants: []`. A file that lost the key (cut short, say) is refused.
func (c *Config) CheckReplaces(old *Config) error {
	if old == nil {
		return nil
	}
	var errs []error
	for _, g := range []struct {
		key string
		had int
	}{{"delegates", len(old.Delegates)}, {"tenants", len(old.Tenants)}} {
		if g.had > 0 && !c.keys[g.key] {
			errs = append(errs, fmt.Errorf("%w: the file has no `%s:` while %d are in use (is it cut short?): to remove them all, write `%s: []`", errInvalidConfig, g.key, g.had, g.key))
		}
	}
	return errors.Join(errs...)
}

// WithDefaults returns l with every zero field set from defaultLimits, for
// a Config built in code rather than by Parse.
func (l Limits) WithDefaults() Limits {
	def := defaultLimits()
	if l.MaxBriefBytes == 0 {
		l.MaxBriefBytes = def.MaxBriefBytes
	}
	if l.MaxAttempts == 0 {
		l.MaxAttempts = def.MaxAttempts
	}
	if l.MaxChain == 0 {
		l.MaxChain = def.MaxChain
	}
	if l.MaxWait == 0 {
		l.MaxWait = def.MaxWait
	}
	if l.MaxResultBytes == 0 {
		l.MaxResultBytes = def.MaxResultBytes
	}
	return l
}

func (c *Config) applyDefaults() {
	c.Limits = c.Limits.WithDefaults()
	c.applyTenantDefaults()
	for i := range c.Delegates {
		if c.Delegates[i].Timeout == 0 {
			c.Delegates[i].Timeout = Duration(defaultTimeout)
		}
	}
}

func (c *Config) validate(lookupEnv func(string) (string, bool)) error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s", errInvalidConfig, fmt.Sprintf(format, args...)))
	}
	validateLimits("limits", c.Limits, bad)
	c.validateTenantSpend(bad)
	seen := make(map[string]int, len(c.Delegates))
	for i, d := range c.Delegates {
		where := fmt.Sprintf("delegates[%d]", i)
		if d.Name == "" {
			bad("%s: name is empty", where)
		} else {
			where = fmt.Sprintf("delegates[%d] (%q)", i, d.Name)
			if err := CheckName(d.Name); err != nil {
				bad("%s: name: %v", where, err)
			}
			if j, dup := seen[d.Name]; dup {
				bad("%s: name: duplicate of delegates[%d]", where, j)
			} else {
				seen[d.Name] = i
			}
		}
		for _, msg := range c.Delegates[i].checkKind(lookupEnv) {
			bad("%s: %s", where, msg)
		}
		if d.Timeout < 0 {
			bad("%s: timeout: must not be negative (got %s)", where, d.Timeout)
		}
		for _, msg := range d.checkStream() {
			bad("%s: %s", where, msg)
		}
		for _, msg := range d.TLS.check() {
			bad("%s: %s", where, msg)
		}
		for _, msg := range d.checkGuards() {
			bad("%s: %s", where, msg)
		}
		for _, msg := range d.Price.check() {
			bad("%s: %s", where, msg)
		}
	}
	if c.Judge != "" {
		if _, ok := seen[c.Judge]; !ok {
			bad("judge: %q is not a delegate in the registry", c.Judge)
		}
	}
	if b := c.RetryBudget; b != nil && (b.MaxTokens <= 0 || b.TokenRatio <= 0) {
		bad("retry_budget: max_tokens and token_ratio must be positive (got %g and %g)", b.MaxTokens, b.TokenRatio)
	}
	errs = append(errs, c.validatePresets(seen)...)
	names := make(map[string]bool, len(seen)+len(c.Presets))
	for n := range seen {
		names[n] = true
	}
	for _, p := range c.Presets {
		names[p.Name] = true
	}
	c.validateTenants(names, bad)
	c.validateNotify(lookupEnv, bad)
	return errors.Join(errs...)
}

// yamlLine matches the "line N: message" form of yaml.v3's type errors.
var yamlLine = regexp.MustCompile(`^line (\d+): (.*)$`)

// yamlUnknownField matches yaml.v3's wording for an unknown key.
var yamlUnknownField = regexp.MustCompile(`^field (\S+) not found in type (\S+)$`)

// yamlNodeError matches nodeError's errors (after yamlLine's "line N: ").
var yamlNodeError = regexp.MustCompile(`^at (\d+):(\d+)(?: (\S+))?: (.*)$`)

// yamlBadValue matches yaml.v3's wording for a value of the wrong type.
var yamlBadValue = regexp.MustCompile("^cannot unmarshal \\S+ `(.*)` into ")

// decodeError rewrites a yaml decoding error so that each problem names the
// entry and field it is about (for example `delegates[1] ("search").tmeout:
// unknown field (line 7)`).
func decodeError(src []byte, err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return fmt.Errorf("%w: %w", errInvalidConfig, err)
	}
	var root yaml.Node
	if yaml.Unmarshal(src, &root) != nil {
		return fmt.Errorf("%w: %w", errInvalidConfig, err)
	}
	errs := make([]error, 0, len(te.Errors))
	for _, e := range te.Errors {
		m := yamlLine.FindStringSubmatch(e)
		if m == nil {
			errs = append(errs, fmt.Errorf("%w: %s", errInvalidConfig, e))
			continue
		}
		line, _ := strconv.Atoi(m[1])
		msg, key := m[2], ""
		var path string
		ok := false
		if u := yamlUnknownField.FindStringSubmatch(msg); u != nil {
			msg, key = "unknown field"+didYouMean(u[1], u[2]), u[1]
		}
		if ne := yamlNodeError.FindStringSubmatch(msg); ne != nil {
			// About a node (a duration's value, a preset), which names
			// where it is, not which key it is under.
			l, _ := strconv.Atoi(ne[1])
			c, _ := strconv.Atoi(ne[2])
			if path, ok = locateAt(&root, l, c); ok && ne[3] != "" {
				path += "." + ne[3]
			}
			msg = ne[4]
		}
		if bv := yamlBadValue.FindStringSubmatch(msg); bv != nil && !ok {
			// The key whose value it is, not the first on its line.
			path, ok = locateValue(&root, line, bv[1])
		}
		// The unknown key itself, even when it shares its line with others
		// ({name: a, tmeout: 5s}); else the first key on the line.
		if !ok {
			path, ok = locate(&root, line, key)
		}
		if !ok && key != "" {
			path, ok = locate(&root, line, "")
		}
		if !ok || path == "" {
			path = "config"
		}
		errs = append(errs, fmt.Errorf("%w: %s: %s (line %d)", errInvalidConfig, path, msg, line))
	}
	return errors.Join(errs...)
}

// locate returns the path (such as `delegates[1] ("search").timeout`) of the
// node on the given line of a parsed document: of the key named key when
// it is not empty, else of the first key on the line, else of the
// innermost entry that holds the line.
func locate(root *yaml.Node, line int, key string) (string, bool) {
	onLine := func(_ string, k, _ *yaml.Node) bool {
		return k != nil && k.Line == line && (key == "" || k.Value == key)
	}
	if p, ok := locateBy(root, "", onLine); ok || key != "" {
		return p, ok
	}
	holder := ""
	locateBy(root, "", func(path string, _, v *yaml.Node) bool {
		if within(v, line) {
			holder = path
		}
		return false
	})
	return holder, holder != ""
}

// within says whether line falls between n's first and last line.
func within(n *yaml.Node, line int) bool {
	return line >= n.Line && line <= lastLine(n)
}

func lastLine(n *yaml.Node) int {
	last := n.Line
	for _, c := range n.Content {
		if l := lastLine(c); l > last {
			last = l
		}
	}
	return last
}

// mappingValue returns the scalar value of key in mapping node n, or "".
func mappingValue(n *yaml.Node, key string) string {
	if n.Kind != yaml.MappingNode {
		return ""
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key && n.Content[i+1].Kind == yaml.ScalarNode {
			return n.Content[i+1].Value
		}
	}
	return ""
}

// checkStream reports what is wrong with d's stream settings.
func (d Delegate) checkStream() []string {
	var bad []string
	switch d.Stream {
	case "", streamAuto, streamOn, streamOff:
	default:
		bad = append(bad, fmt.Sprintf("stream: %q is not one of auto, on, off", d.Stream))
	}
	for _, t := range []struct {
		name string
		d    Duration
	}{{"first_output_timeout", d.FirstOutputTimeout}, {"idle_timeout", d.IdleTimeout}} {
		if t.d < 0 || t.d.Std() > MaxStallTimeout {
			bad = append(bad, fmt.Sprintf("%s: must be between 0 and %s (got %s)", t.name, MaxStallTimeout, t.d))
		}
	}
	if d.Stream == streamOn && d.HTTP != nil && d.HTTP.StreamFormat == "" {
		bad = append(bad, "stream: on needs http.stream_format (sse or ndjson)")
	}
	return bad
}

// streamMode is d's stream setting as ListDelegates shows it: "off" for
// an http kind without stream_format, which cannot stream.
func (d Delegate) streamMode() string {
	switch {
	case d.HTTP != nil && d.HTTP.StreamFormat == "", d.Stream == streamOff:
		return streamOff
	case d.Stream == "":
		return streamAuto
	}
	return d.Stream
}
