package delegates

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
)

// Request headers Pool.Call sends with every Execute, besides the request
// fields of the same meaning, so that interceptors and proxies can see them.
const (
	// headerAttempt carries the attempt number (decimal), when known.
	headerAttempt = "stubborn-attempt"
	// headerIdempotencyKey carries the run's idempotency key, when there is
	// one.
	headerIdempotencyKey = "stubborn-idempotency-key"
	// headerRunID carries the run id, when there is one.
	headerRunID = "stubborn-run-id"
)

const (
	// healthTimeout bounds one health check made by Pool.Serving.
	healthTimeout = 500 * time.Millisecond
	// healthCacheTTL is how long Pool.Serving reuses a health answer.
	healthCacheTTL = time.Second
)

// Pool is the delegate registry with one shared, lazily connecting gRPC client
// connection per delegate. It implements controls.Delegates and is safe for
// concurrent use. Close it when done.
type Pool struct {
	order   []string
	byKey   map[string]*entry
	presets map[string]*stubbornv1.ControlSpec
	// presetOrder is the presets' names in config order.
	presetOrder []string
	// presetLimits are the presets' spend limits (PresetLimit).
	presetLimits map[string]*stubbornv1.SpendLimit
	// maxResult is limits.max_result_bytes.
	maxResult int
	// wrapHTTP wraps the HTTP kinds' transports, or is nil.
	wrapHTTP func(http.RoundTripper) http.RoundTripper
	// guards are the server's, for Describe (nil: none).
	guards *Guards
	// failures are the server's record of failed calls, for Describe
	// (nil: none).
	failures *Failures
	// load counts the calls in flight and their latency (nil: none).
	load *Traffic

	mu     sync.Mutex
	health map[string]healthAnswer
	now    func() time.Time
}

type entry struct {
	cfg Delegate
	t   transport
}

type healthAnswer struct {
	health health
	at     time.Time
}

var (
	_ controls.Delegates = (*Pool)(nil)
	_ controls.Presets   = (*Pool)(nil)
)

// newPool is NewPoolWith with dial options only.
func newPool(cfg *Config, opts ...grpc.DialOption) (*Pool, error) {
	return NewPoolWith(cfg, PoolOptions{Dial: opts})
}

// PoolOptions adjust how a Pool reaches its delegates.
type PoolOptions struct {
	// Dial is appended to every gRPC delegate's dial options.
	Dial []grpc.DialOption
	// HTTPTransport, when set, wraps the transport of each HTTP kind's
	// client (tracing, metrics).
	HTTPTransport func(http.RoundTripper) http.RoundTripper
	// Guards, when set, are the delegates' guards, whose state Describe
	// reports (the caller configures them: Guards.Configure).
	Guards *Guards
	// Failures, when set, are the delegates' recent failures, which
	// Describe reports (the caller records them: Failures.Record).
	Failures *Failures
	// Previous, when set, is the pool this one replaces (a reload): what
	// it knew of an unchanged delegate's health is kept.
	Previous *Pool
	// Traffic, when set, counts each delegate's calls in flight and keeps
	// its recent latency (what a balance control weighs, through
	// StandingGuards). A server shares one across its pools.
	Traffic *Traffic
}

// NewPoolWith creates a client connection for every delegate in cfg with
// grpc.NewClient (which does not connect until the first call). Connections
// are plaintext unless the delegate sets tls (see TLS), whose files are
// read here.
// gRPC's own policy retries are disabled (Stubborn's controls decide
// retries); its transparent retries of never-processed RPCs stay on. o.Dial
// is appended to every connection's options, so it can add dialers,
// interceptors or stats handlers, or replace the credentials.
func NewPoolWith(cfg *Config, o PoolOptions) (*Pool, error) {
	opts := o.Dial
	p := &Pool{
		wrapHTTP: o.HTTPTransport,
		guards:   o.Guards,
		failures: o.Failures,
		load:     o.Traffic,
		byKey:    make(map[string]*entry, len(cfg.Delegates)),
		presets:  make(map[string]*stubbornv1.ControlSpec, len(cfg.Presets)),
		health:   make(map[string]healthAnswer),
		now:      time.Now,
	}
	p.maxResult = cfg.Limits.MaxResultBytes
	if p.maxResult <= 0 {
		p.maxResult = defaultMaxResultBytes
	}
	for _, pr := range cfg.Presets {
		p.presets[pr.Name] = pr.Spec
		if pr.SpendLimit != nil {
			if p.presetLimits == nil {
				p.presetLimits = map[string]*stubbornv1.SpendLimit{}
			}
			p.presetLimits[pr.Name] = pr.SpendLimit.Proto()
		}
		p.presetOrder = append(p.presetOrder, pr.Name)
	}
	for i, d := range cfg.Delegates {
		if _, dup := p.byKey[d.Name]; dup || d.Name == "" {
			p.Close()
			return nil, fmt.Errorf("%w: delegates[%d] (%q): empty or duplicate name", errInvalidConfig, i, d.Name)
		}
		if msgs := d.checkKind(os.LookupEnv); len(msgs) > 0 {
			p.Close()
			return nil, fmt.Errorf("%w: delegates[%d] (%q): %s", errInvalidConfig, i, d.Name, strings.Join(msgs, "; "))
		}
		if d.Timeout <= 0 {
			d.Timeout = Duration(defaultTimeout)
		}
		t, err := p.newTransport(d, opts)
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("delegate %q: %w", d.Name, err)
		}
		p.order = append(p.order, d.Name)
		p.byKey[d.Name] = &entry{cfg: d, t: t}
	}
	p.keepHealth(o.Previous)
	return p, nil
}

// Close closes every connection. Calls after Close fail.
func (p *Pool) Close() error {
	var errs []error
	for _, name := range p.order {
		if err := p.byKey[name].t.close(); err != nil {
			errs = append(errs, fmt.Errorf("delegate %q: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// Names returns the delegates' names in config order.
func (p *Pool) Names() []string {
	return append([]string(nil), p.order...)
}

// Lookup returns a delegate's registry entry (with defaults filled in).
func (p *Pool) Lookup(name string) (Delegate, bool) {
	e, ok := p.byKey[name]
	if !ok {
		return Delegate{}, false
	}
	return e.cfg, true
}

// Preset returns the control spec of a preset from the config.
func (p *Pool) Preset(name string) (*stubbornv1.ControlSpec, bool) {
	spec, ok := p.presets[name]
	return spec, ok
}

// PresetLimit returns the spend limit preset name gives the runs whose
// control names it at its top; nil for none.
func (p *Pool) PresetLimit(name string) *stubbornv1.SpendLimit {
	return p.presetLimits[name]
}

// Known reports whether name is a delegate or a preset.
func (p *Pool) Known(name string) bool {
	_, isDelegate := p.byKey[name]
	_, isPreset := p.presets[name]
	return isDelegate || isPreset
}

// Info returns what the registry declares about a delegate; zero for an
// unknown name.
func (p *Pool) Info(name string) controls.DelegateInfo {
	d, _ := p.Lookup(name)
	return d.Info()
}

// notFound returns the error for a delegate name that is not in the registry:
// NOT_FOUND, refused by Stubborn (so never retried).
func notFound(name string) *controls.CallError {
	return &controls.CallError{
		Code:    codes.NotFound,
		Message: fmt.Sprintf("delegate %q is not in the registry", name),
		Refused: true,
	}
}

// Call sends one attempt to the named delegate (an Execute to a gRPC
// delegate, a request to an HTTP kind's endpoint). It applies the
// delegate's timeout, or c.AttemptTimeout, to the attempt,
// and sends c's run id, idempotency key and metadata (in the
// request, plus the stubborn-* headers). When ctx itself ends (the run was
// cancelled or hit its deadline) Call returns ctx.Err() (or
// context.DeadlineExceeded when ctx's deadline has passed but its timer has
// not fired yet); every other failure is a *controls.CallError (see Classify).
// So an attempt that timed out while the run goes on is a DEADLINE_EXCEEDED
// CallError with the message "attempt timed out after <timeout>". An unset
// result is returned as an empty one, and one whose data nests deeper than
// controls.MaxDataDepth with its deeper parts as JSON text
// (controls.BoundResult).
//
// A delegate that streams (see streamAuto) gives each piece of its output
// to c.Output as it comes. Its first_output_timeout and idle_timeout (or
// c's) end a call whose output stalls, as a transient DEADLINE_EXCEEDED
// CallError whose message starts "stalled:" and says which timeout; the
// whole streamed text is bounded by max_result_bytes like an answer.
func (p *Pool) Call(ctx context.Context, c controls.Call) (*stubbornv1.Result, error) {
	e, ok := p.byKey[c.Delegate]
	if !ok {
		return nil, notFound(c.Delegate)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if p.load != nil {
		m := p.measure(&c)
		r, err := p.call(ctx, e, c)
		m.end(err)
		return r, err
	}
	return p.call(ctx, e, c)
}

// measurement is one call counted in flight (Pool.load) until its end,
// which measures its latency: to its first output when it streams one,
// else to its answer.
type measurement struct {
	p      *Pool
	start  time.Time
	flight flight
	out    func(text string)
	deltas func(ds []*stubbornv1.OutputDelta)

	mu    sync.Mutex
	first time.Duration // to the first output; -1 before it
}

// measure counts c in flight and has its output, if any, pass through the
// measurement. A call that failed fast says nothing of how fast the
// delegate answers, and is not measured (end); one that timed out is,
// since slow is what it was.
func (p *Pool) measure(c *controls.Call) *measurement {
	m := &measurement{p: p, start: p.now(), flight: p.load.begin(c.Delegate), out: c.Output, deltas: c.Deltas, first: -1}
	if c.Output != nil {
		c.Output = m.output
	}
	if c.Deltas != nil {
		c.Deltas = m.delta
	}
	return m
}

func (m *measurement) seen() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.first < 0 {
		m.first = m.p.now().Sub(m.start)
	}
}

func (m *measurement) output(text string) { m.seen(); m.out(text) }

func (m *measurement) delta(ds []*stubbornv1.OutputDelta) { m.seen(); m.deltas(ds) }

// end ends the call counted, which answered err.
func (m *measurement) end(err error) {
	m.mu.Lock()
	took := m.first
	m.mu.Unlock()
	if took < 0 {
		took = m.p.now().Sub(m.start)
	}
	ce, _ := errors.AsType[*controls.CallError](err)
	m.flight.end(took, err == nil || (ce != nil && ce.Code == codes.DeadlineExceeded))
}

// call is Call for entry e, once counted.
func (p *Pool) call(ctx context.Context, e *entry, c controls.Call) (*stubbornv1.Result, error) {
	timeout := e.cfg.Timeout.Std()
	if c.AttemptTimeout > 0 {
		timeout = c.AttemptTimeout
	}
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	first, idle := e.cfg.FirstOutputTimeout.Std(), e.cfg.IdleTimeout.Std()
	if c.FirstOutputTimeout > 0 {
		first = c.FirstOutputTimeout
	}
	if c.IdleTimeout > 0 {
		idle = c.IdleTimeout
	}
	sctx, s := actx, (*stream)(nil)
	if e.t.mayStream() {
		sctx, s = newStream(actx, c, p.maxResult, first, idle)
		defer s.end()
	}
	r, err := e.t.call(sctx, c, s)
	if err != nil {
		if cerr := ended(ctx); cerr != nil {
			return nil, cerr
		}
		if ce := stalled(sctx); ce != nil {
			return nil, ce
		}
		ce := Classify(err, nil)
		if (ce.Code == codes.DeadlineExceeded || ce.Code == codes.Canceled) && ended(actx) != nil {
			// The attempt's deadline ended it, even when the delegate's
			// server (which enforces the same deadline) reset the stream
			// before our own timer fired.
			ce.Code = codes.DeadlineExceeded
			ce.Message = fmt.Sprintf("attempt timed out after %s", timeout)
		}
		return nil, ce
	}
	if r == nil {
		return &stubbornv1.Result{}, nil
	}
	// Every kind's answer, as received (a gRPC delegate's Value as much as
	// the JSON an HTTP kind read): data nested past MaxDataDepth would
	// make the run's records unreadable (issue 30).
	r = controls.BoundResult(r)
	n := proto.Size(r)
	if len(r.GetChoices()) > 0 {
		n -= len(r.GetText()) // choice 0's text, carried twice, counts once
	}
	if n > p.maxResult {
		return nil, p.resultTooLarge(n)
	}
	return r, nil
}

// recvSlack is what a delegate's response may hold besides its Result.
const recvSlack = 16 << 10

// resultTooLarge is the error of an answer of n bytes (-1: too large for
// gRPC to read) over max_result_bytes.
func (p *Pool) resultTooLarge(n int) *controls.CallError {
	what := "the answer is larger than gRPC would receive"
	if n >= 0 {
		what = fmt.Sprintf("the answer is %d bytes", n)
	}
	return resultTooLarge(p.maxResult, what)
}

// ended returns ctx's error, or context.DeadlineExceeded once ctx's deadline
// has passed even if its timer has not fired yet: the delegate's server
// enforces the same deadline and may end the call first.
func ended(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// Serving asks the delegate whether it is serving (at most healthTimeout,
// and never past ctx): a gRPC delegate's grpc.health.v1 service about
// service "", an HTTP kind's health_url. It returns false only for an answer
// of NOT_SERVING (a non-2xx answer from a health_url); any other answer,
// UNIMPLEMENTED, an error, no health_url or an unknown name gives true,
// since a delegate that cannot be judged is worth trying. Answers are
// reused for healthCacheTTL.
func (p *Pool) Serving(ctx context.Context, name string) bool {
	e, ok := p.byKey[name]
	if !ok {
		return true
	}
	p.mu.Lock()
	a, hit := p.health[name]
	p.mu.Unlock()
	if hit && p.now().Sub(a.at) < healthCacheTTL {
		return a.health != healthNotServing
	}
	hctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	h := e.t.serving(hctx)
	if ctx.Err() != nil {
		// The caller gave up; that says nothing about the delegate.
		return true
	}
	p.mu.Lock()
	p.health[name] = healthAnswer{health: h, at: p.now()}
	p.mu.Unlock()
	// Unreachable is still worth trying, as before the answer was kept:
	// the call may get through where the health check did not.
	return h != healthNotServing
}

// RecentFailures returns the delegate's latest failed calls of runs of
// tenants (when the pool keeps them: PoolOptions.Failures), newest first.
func (p *Pool) RecentFailures(name string, tenants []string) []*stubbornv1.DelegateFailure {
	if p.failures == nil {
		return nil
	}
	return p.failures.Recent(name, tenants)
}

// LastCall returns what the latest call to the delegate of runs of
// tenants did (when the pool keeps it: PoolOptions.Failures).
func (p *Pool) LastCall(name string, tenants []string) LastCall {
	if p.failures == nil {
		return LastCall{}
	}
	return p.failures.Last(name, tenants)
}

// healthSeenFor is how long ListDelegates reports a health answer as seen.
const healthSeenFor = 5 * time.Minute

// Describe returns the registry for ListDelegates, in config order: each
// delegate with its kind, declarations, timeout and health as last seen
// (within healthSeenFor) and its guards' state, and each preset with its
// spec. Recent failures are a tenant's own: RecentFailures.
func (p *Pool) Describe() ([]*stubbornv1.DelegateDescription, []*stubbornv1.PresetDescription) {
	ds := make([]*stubbornv1.DelegateDescription, 0, len(p.order))
	now := p.now()
	p.mu.Lock()
	for _, name := range p.order {
		d := p.byKey[name].cfg
		h := stubbornv1.DelegateHealth_DELEGATE_HEALTH_UNSPECIFIED
		if a, ok := p.health[name]; ok && now.Sub(a.at) < healthSeenFor {
			h = a.health.proto()
		}
		desc := &stubbornv1.DelegateDescription{
			Name: name, Kind: d.Kind(), Idempotent: d.Idempotent, ReadOnly: d.ReadOnly,
			Timeout: durationpb.New(d.Timeout.Std()), Health: h,
			MaxConcurrent: int32(d.MaxConcurrent), RequestsPerMinute: int32(d.RequestsPerMinute), TokensPerMinute: d.TokensPerMinute,
			Price: d.Price.Proto(),
		}
		if d.RetryOn != nil {
			desc.RetryOn = d.RetryOn.Proto()
		}
		if d.FirstOutputTimeout > 0 {
			desc.FirstOutputTimeout = durationpb.New(d.FirstOutputTimeout.Std())
		}
		if d.IdleTimeout > 0 {
			desc.IdleTimeout = durationpb.New(d.IdleTimeout.Std())
		}
		desc.Stream = d.streamMode()
		ds = append(ds, desc)
	}
	p.mu.Unlock()
	if p.guards != nil {
		for _, d := range ds {
			p.guards.describe(d.GetName(), d)
		}
	}
	ps := make([]*stubbornv1.PresetDescription, 0, len(p.presetOrder))
	for _, name := range p.presetOrder {
		ps = append(ps, &stubbornv1.PresetDescription{Name: name, Spec: p.presets[name], SpendLimit: p.presetLimits[name]})
	}
	return ds, ps
}
