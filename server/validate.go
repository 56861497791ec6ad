package server

import (
	"fmt"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/stubbornhq/stubborn/controls"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Limits bound what a request may ask for. Zero fields take the defaults of
// DefaultLimits.
type Limits struct {
	// MaxBriefBytes bounds task_brief, in bytes.
	MaxBriefBytes int
	// MaxAttempts bounds retry.attempts and retry_with_learning.max_retries.
	MaxAttempts int
	// MaxChain bounds fallback_chain.chain and race.candidates.
	MaxChain int
	// MaxWait bounds retry.max_wait, retry.base_wait and decision_timeout.
	MaxWait time.Duration
	// MaxMetadata bounds the number of options.metadata entries; each key
	// and value is at most 1 KiB.
	MaxMetadata int

	// The limits below are off when zero and have no default (limits.go).

	// MaxConcurrentRuns bounds the runs in progress on this server.
	MaxConcurrentRuns int
	// RunStartsPerSecond bounds the rate of Run and StartRun requests,
	// with bursts of RunStartBurst (0: RunStartsPerSecond rounded up).
	RunStartsPerSecond float64
	RunStartBurst      int
	// MaxWatchersPerRun bounds the Run and WatchRun streams following one
	// run.
	MaxWatchersPerRun int
}

// DefaultLimits are the limits when none are configured.
func DefaultLimits() Limits {
	return Limits{MaxBriefBytes: 64 << 10, MaxAttempts: 100, MaxChain: 32, MaxWait: time.Hour, MaxMetadata: 64}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.MaxBriefBytes <= 0 {
		l.MaxBriefBytes = d.MaxBriefBytes
	}
	if l.MaxAttempts <= 0 {
		l.MaxAttempts = d.MaxAttempts
	}
	if l.MaxChain <= 0 {
		l.MaxChain = d.MaxChain
	}
	if l.MaxWait <= 0 {
		l.MaxWait = d.MaxWait
	}
	if l.MaxMetadata <= 0 {
		l.MaxMetadata = d.MaxMetadata
	}
	return l
}

// runRequest is what RunRequest and StartRunRequest have in common.
type runRequest interface {
	GetTaskBrief() string
	GetRetry() *stubbornv1.RetrySpec
	GetRetryWithLearning() *stubbornv1.RetryWithLearningSpec
	GetFallbackChain() *stubbornv1.FallbackChainSpec
	GetRace() *stubbornv1.RaceSpec
	GetOptions() *stubbornv1.RunOptions
}

// violations collects what is wrong with a request, field by field.
type violations struct {
	list []*errdetails.BadRequest_FieldViolation
}

func (v *violations) add(field, format string, args ...any) {
	v.list = append(v.list, &errdetails.BadRequest_FieldViolation{Field: field, Description: fmt.Sprintf(format, args...)})
}

// err returns INVALID_ARGUMENT naming every violation, with a
// google.rpc.BadRequest detail, or nil.
func (v *violations) err() error {
	if len(v.list) == 0 {
		return nil
	}
	msgs := make([]string, len(v.list))
	for i, f := range v.list {
		msgs[i] = f.GetField() + ": " + f.GetDescription()
	}
	st := status.New(codes.InvalidArgument, strings.Join(msgs, "; "))
	if withDetails, err := st.WithDetails(&errdetails.BadRequest{FieldViolations: v.list}); err == nil {
		st = withDetails
	}
	return st.Err()
}

// validator checks requests against the limits and the delegate registry.
type validator struct {
	limits Limits
	known  func(name string) bool
	// isDelegate reports whether a name is a delegate rather than a preset:
	// judges and analysts are called directly, so they must be. Nil means
	// known.
	isDelegate func(name string) bool
	hasJudge   bool
}

// runSpec checks a run request and returns the control it selects. Unknown
// delegates are NOT_FOUND; everything else wrong is INVALID_ARGUMENT.
func (val *validator) runSpec(req runRequest) (*stubbornv1.ControlSpec, error) {
	var v violations
	brief := req.GetTaskBrief()
	switch {
	case strings.TrimSpace(brief) == "":
		v.add("task_brief", "must not be empty")
	case len(brief) > val.limits.MaxBriefBytes:
		v.add("task_brief", "is %d bytes, more than the limit of %d", len(brief), val.limits.MaxBriefBytes)
	}

	var set []string
	spec := &stubbornv1.ControlSpec{}
	var names []namedRef // delegate names to look up once the shape is valid
	judge := req.GetOptions().GetJudge()
	if judge != "" {
		names = append(names, namedRef{field: "options.judge", name: judge, direct: true})
	}
	judged := judge != "" || val.hasJudge
	if r := req.GetRetry(); r != nil {
		set = append(set, "retry")
		spec.Kind = &stubbornv1.ControlSpec_Retry{Retry: r}
		names = append(names, val.retry(&v, r)...)
	}
	if r := req.GetRetryWithLearning(); r != nil {
		set = append(set, "retry_with_learning")
		spec.Kind = &stubbornv1.ControlSpec_RetryWithLearning{RetryWithLearning: r}
		names = append(names, val.learning(&v, r, judged)...)
	}
	if r := req.GetFallbackChain(); r != nil {
		set = append(set, "fallback_chain")
		spec.Kind = &stubbornv1.ControlSpec_FallbackChain{FallbackChain: r}
		names = append(names, val.list(&v, "fallback_chain.chain", r.GetChain())...)
		val.criteria(&v, "fallback_chain", r.GetFailureCriteria(), r.GetFailureWhen(), "failure_criteria", "failure_when", judged)
	}
	if r := req.GetRace(); r != nil {
		set = append(set, "race")
		spec.Kind = &stubbornv1.ControlSpec_Race{Race: r}
		names = append(names, val.list(&v, "race.candidates", r.GetCandidates())...)
		val.criteria(&v, "race", r.GetAcceptanceCriteria(), r.GetAcceptWhen(), "acceptance_criteria", "accept_when", judged)
	}
	switch len(set) {
	case 0:
		v.add("retry", "exactly one of retry, retry_with_learning, fallback_chain, race must be set; none is")
	case 1:
	default:
		v.add(set[1], "exactly one of retry, retry_with_learning, fallback_chain, race must be set; got %s", strings.Join(set, " and "))
	}
	val.options(&v, req.GetOptions())
	if err := v.err(); err != nil {
		return nil, err
	}
	for _, n := range names {
		if !val.known(n.name) {
			return nil, status.Errorf(codes.NotFound, "%s: delegate %q is not in the registry", n.field, n.name)
		}
		if n.direct && val.isDelegate != nil && !val.isDelegate(n.name) {
			return nil, status.Errorf(codes.NotFound, "%s: %q is a preset, not a delegate in the registry: judges and analysts must be delegates", n.field, n.name)
		}
	}
	return spec, nil
}

// namedRef is a delegate name and the field it came from. direct says the
// name is called directly (a judge, an analyst), so a preset will not do.
type namedRef struct {
	field, name string
	direct      bool
}

func (val *validator) retry(v *violations, r *stubbornv1.RetrySpec) []namedRef {
	refs := val.target(v, "retry.target", r.GetTarget())
	if r.Attempts != nil {
		if n := r.GetAttempts(); n < 0 || int(n) > val.limits.MaxAttempts {
			v.add("retry.attempts", "must be between 0 and %d, got %d", val.limits.MaxAttempts, n)
		}
	}
	val.duration(v, "retry.max_wait", r.GetMaxWait())
	val.duration(v, "retry.base_wait", r.GetBaseWait())
	val.duration(v, "retry.decision_timeout", r.GetDecisionTimeout())
	if _, ok := stubbornv1.OnExhausted_name[int32(r.GetOnExhausted())]; !ok {
		v.add("retry.on_exhausted", "unknown value %d", r.GetOnExhausted())
	}
	return refs
}

func (val *validator) learning(v *violations, r *stubbornv1.RetryWithLearningSpec, judged bool) []namedRef {
	refs := val.target(v, "retry_with_learning.target", r.GetTarget())
	if r.MaxRetries != nil {
		if n := r.GetMaxRetries(); n <= 0 || int(n) > val.limits.MaxAttempts {
			v.add("retry_with_learning.max_retries", "must be between 1 and %d (it is the total number of attempts), got %d", val.limits.MaxAttempts, n)
		}
	}
	val.criteria(v, "retry_with_learning", r.GetFailureCriteria(), r.GetFailureWhen(), "failure_criteria", "failure_when", judged)
	if a := r.GetAnalyst(); a != "" {
		refs = append(refs, namedRef{field: "retry_with_learning.analyst", name: a, direct: true})
	}
	return refs
}

// criteria checks a control's failure criteria before anything runs:
// natural-language criteria need a judge (judged: options.judge or the
// server's default), and a CEL expression must compile, type-check to bool
// and use only the declared variables.
func (val *validator) criteria(v *violations, control, text, expr, textField, exprField string, judged bool) {
	if text != "" {
		field := control + "." + textField
		switch {
		case strings.TrimSpace(text) == "":
			v.add(field, "must not be blank (leave it empty for no criteria)")
		case len(text) > val.limits.MaxBriefBytes:
			v.add(field, "is %d bytes, more than the limit of %d", len(text), val.limits.MaxBriefBytes)
		case !judged:
			v.add(field, "needs a judge delegate, and none is configured: set options.judge, or a default judge in the server config")
		}
	}
	if expr != "" {
		if _, err := controls.CompileExpr(exprField, expr); err != nil {
			v.add(control+"."+exprField, "is not a valid CEL expression: %v", err)
		}
	}
}

func (val *validator) target(v *violations, field, name string) []namedRef {
	if name == "" {
		v.add(field, "must name a delegate")
		return nil
	}
	return []namedRef{{field: field, name: name}}
}

func (val *validator) list(v *violations, field string, names []string) []namedRef {
	switch {
	case len(names) == 0:
		v.add(field, "must name at least one delegate")
	case len(names) > val.limits.MaxChain:
		v.add(field, "names %d delegates, more than the limit of %d", len(names), val.limits.MaxChain)
	}
	var refs []namedRef
	for i, n := range names {
		f := fmt.Sprintf("%s[%d]", field, i)
		if n == "" {
			v.add(f, "must name a delegate")
			continue
		}
		refs = append(refs, namedRef{field: f, name: n})
	}
	return refs
}

func (val *validator) duration(v *violations, field string, d *durationpb.Duration) {
	if d == nil {
		return
	}
	if err := d.CheckValid(); err != nil {
		v.add(field, "is not a valid duration: %v", err)
		return
	}
	switch dd := d.AsDuration(); {
	case dd < 0:
		v.add(field, "must not be negative, got %s", dd)
	case dd > val.limits.MaxWait:
		v.add(field, "must be at most %s, got %s", val.limits.MaxWait, dd)
	}
}

func (val *validator) options(v *violations, o *stubbornv1.RunOptions) {
	if o == nil {
		return
	}
	for _, f := range []struct {
		name string
		d    *durationpb.Duration
	}{{"options.run_timeout", o.GetRunTimeout()}, {"options.attempt_timeout", o.GetAttemptTimeout()}} {
		if f.d == nil {
			continue
		}
		if err := f.d.CheckValid(); err != nil || f.d.AsDuration() < 0 {
			v.add(f.name, "must be a valid, non-negative duration")
		}
	}
	if len(o.GetIdempotencyKey()) > 256 {
		v.add("options.idempotency_key", "is %d bytes, more than the limit of 256", len(o.GetIdempotencyKey()))
	}
	if len(o.GetMetadata()) > val.limits.MaxMetadata {
		v.add("options.metadata", "has %d entries, more than the limit of %d", len(o.GetMetadata()), val.limits.MaxMetadata)
	}
	for k, value := range o.GetMetadata() {
		if k == "" || len(k) > 1024 || len(value) > 1024 {
			v.add("options.metadata", "keys must be non-empty and keys and values at most 1 KiB (key %.40q)", k)
		}
	}
}

// runID checks a run_id field.
func runID(id string) error {
	if id == "" {
		var v violations
		v.add("run_id", "must not be empty")
		return v.err()
	}
	return nil
}
