package delegates

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"

	"github.com/stubbornhq/stubborn/controls"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Request headers Pool.Call sends with every Execute, besides the request
// fields of the same meaning, so that interceptors and proxies can see them.
const (
	// HeaderAttempt carries the attempt number (decimal), when known.
	HeaderAttempt = "stubborn-attempt"
	// HeaderIdempotencyKey carries the run's idempotency key, when there is
	// one.
	HeaderIdempotencyKey = "stubborn-idempotency-key"
	// HeaderRunID carries the run id, when there is one.
	HeaderRunID = "stubborn-run-id"
)

const (
	// HealthTimeout bounds one health check made by Pool.Serving.
	HealthTimeout = 500 * time.Millisecond
	// HealthCacheTTL is how long Pool.Serving reuses a health answer.
	HealthCacheTTL = time.Second
)

// Pool is the delegate registry with one shared, lazily connecting gRPC client
// connection per delegate. It implements controls.Delegates and is safe for
// concurrent use. Close it when done.
type Pool struct {
	order   []string
	byKey   map[string]*entry
	presets map[string]*stubbornv1.ControlSpec
	// maxResult is limits.max_result_bytes.
	maxResult int

	mu     sync.Mutex
	health map[string]healthAnswer
	now    func() time.Time
}

type entry struct {
	cfg    Delegate
	conn   *grpc.ClientConn
	client stubbornv1.DelegateServiceClient
	health healthpb.HealthClient
}

type healthAnswer struct {
	serving bool
	at      time.Time
}

var (
	_ controls.Delegates = (*Pool)(nil)
	_ controls.Presets   = (*Pool)(nil)
)

// NewPool creates a client connection for every delegate in cfg with
// grpc.NewClient (which does not connect until the first call). Connections
// are plaintext unless the delegate sets tls (see TLS), whose files are
// read here.
// gRPC's own policy retries are disabled (Stubborn's controls decide
// retries); its transparent retries of never-processed RPCs stay on. opts
// are appended to every connection's options, so they can add dialers,
// interceptors or stats handlers, or replace the credentials.
func NewPool(cfg *Config, opts ...grpc.DialOption) (*Pool, error) {
	p := &Pool{
		byKey:   make(map[string]*entry, len(cfg.Delegates)),
		presets: make(map[string]*stubbornv1.ControlSpec, len(cfg.Presets)),
		health:  make(map[string]healthAnswer),
		now:     time.Now,
	}
	p.maxResult = cfg.Limits.MaxResultBytes
	if p.maxResult <= 0 {
		p.maxResult = DefaultMaxResultBytes
	}
	for _, pr := range cfg.Presets {
		p.presets[pr.Name] = pr.Spec
	}
	for i, d := range cfg.Delegates {
		if _, dup := p.byKey[d.Name]; dup || d.Name == "" || d.Target == "" {
			p.Close()
			return nil, fmt.Errorf("%w: delegates[%d] (%q): empty or duplicate name, or empty target", ErrInvalidConfig, i, d.Name)
		}
		if d.Timeout <= 0 {
			d.Timeout = Duration(DefaultTimeout)
		}
		creds := insecure.NewCredentials()
		if tc, err := d.TLS.ClientConfig(); err != nil {
			p.Close()
			return nil, fmt.Errorf("delegate %q: %w", d.Name, err)
		} else if tc != nil {
			creds = credentials.NewTLS(tc)
		}
		all := append([]grpc.DialOption{
			grpc.WithTransportCredentials(creds),
			grpc.WithDisableRetry(),
			// Past max_result_bytes an answer fails its attempt (Call);
			// one so large that gRPC will not read it fails the same.
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(p.maxResult + recvSlack)),
		}, opts...)
		conn, err := grpc.NewClient(d.Target, all...)
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("delegate %q: target %q: %w", d.Name, d.Target, err)
		}
		p.order = append(p.order, d.Name)
		p.byKey[d.Name] = &entry{
			cfg:    d,
			conn:   conn,
			client: stubbornv1.NewDelegateServiceClient(conn),
			health: healthpb.NewHealthClient(conn),
		}
	}
	return p, nil
}

// Close closes every connection. Calls after Close fail.
func (p *Pool) Close() error {
	var errs []error
	for _, name := range p.order {
		if err := p.byKey[name].conn.Close(); err != nil {
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

// NotFound returns the error for a delegate name that is not in the registry:
// NOT_FOUND, refused by Stubborn (so never retried).
func NotFound(name string) *controls.CallError {
	return &controls.CallError{
		Code:    codes.NotFound,
		Message: fmt.Sprintf("delegate %q is not in the registry", name),
		Refused: true,
	}
}

// Call sends one Execute attempt to the named delegate. It applies the
// delegate's timeout, or c.AttemptTimeout, to the attempt,
// and sends c's run id, idempotency key and metadata (in the
// request, plus the stubborn-* headers). When ctx itself ends (the run was
// cancelled or hit its deadline) Call returns ctx.Err() (or
// context.DeadlineExceeded when ctx's deadline has passed but its timer has
// not fired yet); every other failure is a *controls.CallError (see Classify).
// So an attempt that timed out while the run goes on is a DEADLINE_EXCEEDED
// CallError with the message "attempt timed out after <timeout>". An unset
// result is returned as an empty one.
func (p *Pool) Call(ctx context.Context, c controls.Call) (*stubbornv1.Result, error) {
	e, ok := p.byKey[c.Delegate]
	if !ok {
		return nil, NotFound(c.Delegate)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	timeout := e.cfg.Timeout.Std()
	if c.AttemptTimeout > 0 {
		timeout = c.AttemptTimeout
	}
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	kv := make([]string, 0, 6)
	if c.Attempt > 0 {
		kv = append(kv, HeaderAttempt, strconv.Itoa(int(c.Attempt)))
	}
	if c.IdempotencyKey != "" {
		kv = append(kv, HeaderIdempotencyKey, c.IdempotencyKey)
	}
	if c.RunID != "" {
		kv = append(kv, HeaderRunID, c.RunID)
	}
	if len(kv) > 0 {
		actx = metadata.AppendToOutgoingContext(actx, kv...)
	}

	req := &stubbornv1.ExecuteRequest{
		Brief:          c.Brief,
		RunId:          c.RunID,
		Attempt:        c.Attempt,
		IdempotencyKey: c.IdempotencyKey,
		Metadata:       maps.Clone(c.Metadata),
	}
	var (
		trailer metadata.MD
		pr      peer.Peer
	)
	resp, err := e.client.Execute(actx, req, grpc.Trailer(&trailer), grpc.Peer(&pr))
	if err != nil {
		if cerr := ended(ctx); cerr != nil {
			return nil, cerr
		}
		ce := Classify(err, trailer)
		if tooLarge(ce) {
			ce = p.resultTooLarge(-1)
		}
		if pr.Addr != nil {
			// A connection to the delegate carried the call: whatever the
			// message says, it may have been received.
			ce.NotSent = false
		}
		if (ce.Code == codes.DeadlineExceeded || ce.Code == codes.Canceled) && ended(actx) != nil {
			// The attempt's deadline ended it, even when the delegate's
			// server (which enforces the same deadline) reset the stream
			// before our own timer fired.
			ce.Code = codes.DeadlineExceeded
			ce.Message = fmt.Sprintf("attempt timed out after %s", timeout)
		}
		return nil, ce
	}
	if r := resp.GetResult(); r != nil {
		if n := proto.Size(r); n > p.maxResult {
			return nil, p.resultTooLarge(n)
		}
		return r, nil
	}
	return &stubbornv1.Result{}, nil
}

// recvSlack is what a delegate's response may hold besides its Result.
const recvSlack = 16 << 10

// resultTooLarge is the error of an answer of n bytes (-1: too large for
// gRPC to read) over max_result_bytes: Stubborn refuses it, and it is not
// retried (the same call would answer the same).
func (p *Pool) resultTooLarge(n int) *controls.CallError {
	size := "larger than gRPC would receive"
	if n >= 0 {
		size = fmt.Sprintf("%d bytes", n)
	}
	return &controls.CallError{
		Code:    codes.ResourceExhausted,
		Message: fmt.Sprintf("the answer is %s, more than limits.max_result_bytes (%d)", size, p.maxResult),
		Refused: true,
	}
}

// tooLarge reports whether ce is gRPC's own refusal of a response over the
// receive limit (not a delegate's RESOURCE_EXHAUSTED, which may pass).
func tooLarge(ce *controls.CallError) bool {
	return ce.Code == codes.ResourceExhausted &&
		(strings.HasPrefix(ce.Message, "grpc: received message larger than max") ||
			strings.HasPrefix(ce.Message, "grpc: received message after decompression larger than max"))
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

// Serving asks the delegate's grpc.health.v1 service about service "" (at
// most HealthTimeout, and never past ctx). It returns false only for an
// answer of NOT_SERVING; any other answer, UNIMPLEMENTED, an error or an
// unknown name gives true, since a delegate that cannot be judged is worth
// trying. Answers are reused for HealthCacheTTL.
func (p *Pool) Serving(ctx context.Context, name string) bool {
	e, ok := p.byKey[name]
	if !ok {
		return true
	}
	p.mu.Lock()
	a, hit := p.health[name]
	p.mu.Unlock()
	if hit && p.now().Sub(a.at) < HealthCacheTTL {
		return a.serving
	}
	hctx, cancel := context.WithTimeout(ctx, HealthTimeout)
	defer cancel()
	resp, err := e.health.Check(hctx, &healthpb.HealthCheckRequest{Service: ""})
	serving := err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING
	if ctx.Err() != nil {
		// The caller gave up; that says nothing about the delegate.
		return true
	}
	p.mu.Lock()
	p.health[name] = healthAnswer{serving: serving, at: p.now()}
	p.mu.Unlock()
	return serving
}
