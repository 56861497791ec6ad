package server

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/delegates"
)

// limits bound what a request may ask for. Zero fields take the defaults of
// defaultLimits.
type limits struct {
	// MaxBriefBytes bounds task_brief, in bytes.
	MaxBriefBytes int
	// MaxAttempts bounds retry.attempts and retry_with_learning.max_retries.
	MaxAttempts int
	// MaxChain bounds fallback_chain.chain and race.candidates.
	MaxChain int
	// MaxWait bounds retry.max_wait, retry.base_wait, decision_timeout and
	// race.hedge_delay.
	MaxWait time.Duration
	// MaxMetadata bounds the number of options.metadata entries; each key
	// and value is at most 1 KiB, all of them together at most
	// maxMetadataBytes.
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
	// MaxConcurrentReads bounds each tenant's ListRuns and GetRun calls
	// and WatchRun streams in progress at once (the tighter of the
	// server's and the tenant's applies to each tenant).
	MaxConcurrentReads int
}

// defaultLimits are the limits when none are configured.
func defaultLimits() limits {
	return limits{MaxBriefBytes: 64 << 10, MaxAttempts: 100, MaxChain: 32, MaxWait: time.Hour, MaxMetadata: 64}
}

func (l limits) withDefaults() limits {
	d := defaultLimits()
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

// Bounds of every caller string that no configured limit covers, so that
// no value a caller sends reaches a store subject or key, a header or a
// message that a dependency limits (README "Limits of every input"). A
// violation names the field and what is wrong, never the over-long value.
const (
	// maxRunIDBytes bounds run_id. Run ids are "run_" and 29 base32hex
	// characters (runs.newID); their alphabet (isIDChar) keeps them fit for
	// a NATS subject or KV key: no '.', '*', '>' or whitespace.
	maxRunIDBytes = 64
	// maxPageTokenBytes bounds page_token: ListRuns' tokens are base64url
	// of a creation time and a run id, about 90 bytes.
	maxPageTokenBytes = 256
	// maxIdempotencyKeyBytes bounds options.idempotency_key, sent to
	// delegates as the stubborn-idempotency-key header: printable ASCII.
	maxIdempotencyKeyBytes = 256
	// maxMetadataKeyBytes and maxMetadataValueBytes bound each
	// options.metadata entry, maxMetadataBytes all of them (keys and values).
	maxMetadataKeyBytes   = 1 << 10
	maxMetadataValueBytes = 1 << 10
	maxMetadataBytes      = 64 << 10
	// maxCELErrorBytes bounds the CEL error a violation quotes: CEL's own
	// message repeats the source line under each of up to 100 errors.
	maxCELErrorBytes = 512
)

// isIDChar reports whether b may be in a run_id or a page_token: ASCII
// letters, digits, '_' and '-' (the base32hex and base64url alphabets).
func isIDChar(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '_' || b == '-'
}

func isIDString(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isIDChar(s[i]) {
			return false
		}
	}
	return true
}

// validRunID reports whether id is a well-formed run_id.
func validRunID(id string) bool {
	return id != "" && len(id) <= maxRunIDBytes && isIDString(id)
}

// runRequest is what RunRequest and StartRunRequest have in common.
type runRequest interface {
	GetTaskBrief() string
	GetRetry() *stubbornv1.RetrySpec
	GetRetryWithLearning() *stubbornv1.RetryWithLearningSpec
	GetFallbackChain() *stubbornv1.FallbackChainSpec
	GetRace() *stubbornv1.RaceSpec
	GetBalance() *stubbornv1.BalanceSpec
	GetOptions() *stubbornv1.RunOptions
	GetTaskMessages() []*structpb.Struct
	GetModelParams() *structpb.Struct
	GetConversation() *stubbornv1.Conversation
}

// violations collects what is wrong with a request, field by field.
type violations struct {
	list []*errdetails.BadRequest_FieldViolation
}

func (v *violations) add(field, format string, args ...any) {
	v.list = append(v.list, &errdetails.BadRequest_FieldViolation{Field: field, Description: fmt.Sprintf(format, args...)})
}

// Bounds of the status violations.err returns: gRPC sends its message as
// the grpc-message trailer and the status again (message and details) as
// grpc-status-details-bin, base64, and C-core clients (Python, Ruby, C++,
// …) refuse trailers over 8 KiB in all with RST_STREAM, which they report
// as INTERNAL. A chain of 60 empty names made more than that. The list is
// cut, never the code: the message and the detail name the first
// violations, in order, and end with "…and N more violations".
const (
	// maxListedViolations bounds the violations named one by one.
	maxListedViolations = 10
	// maxViolationFieldBytes and maxViolationDescriptionBytes bound each
	// violation's field and description (cut on a character boundary).
	maxViolationFieldBytes       = 128
	maxViolationDescriptionBytes = 256
	// maxViolationsMessageBytes bounds the message, the final count
	// included. The detail holds the same text, so the status (message
	// and details) is about twice this, plus a few bytes per entry.
	maxViolationsMessageBytes = 1024
)

// err returns INVALID_ARGUMENT naming the violations, with a
// google.rpc.BadRequest detail, or nil. Both are bounded: at most
// maxListedViolations entries, each cut to maxViolationFieldBytes and
// maxViolationDescriptionBytes, within maxViolationsMessageBytes in all,
// then an entry with no field saying how many more violations there are.
func (v *violations) err() error {
	if len(v.list) == 0 {
		return nil
	}
	// Room for the count at the end: "; …and N more violations".
	const countRoom = len("; …and  more violations") + 20
	var (
		msg    strings.Builder
		listed []*errdetails.BadRequest_FieldViolation
	)
	for _, f := range v.list[:min(len(v.list), maxListedViolations)] {
		f = &errdetails.BadRequest_FieldViolation{
			Field:       truncate(f.GetField(), maxViolationFieldBytes),
			Description: truncate(f.GetDescription(), maxViolationDescriptionBytes),
		}
		entry := f.GetField() + ": " + f.GetDescription()
		if len(listed) > 0 {
			entry = "; " + entry
		}
		room := maxViolationsMessageBytes
		if len(listed)+1 < len(v.list) {
			room -= countRoom // more entries follow: keep room to count them
		}
		// The first entry always fits: it is at most 128+2+256 bytes.
		if len(listed) > 0 && msg.Len()+len(entry) > room {
			break
		}
		msg.WriteString(entry)
		listed = append(listed, f)
	}
	if more := len(v.list) - len(listed); more > 0 {
		count := fmt.Sprintf("…and %d more violations", more)
		if more == 1 {
			count = "…and 1 more violation"
		}
		msg.WriteString("; " + count)
		listed = append(listed, &errdetails.BadRequest_FieldViolation{Description: count})
	}
	st := status.New(codes.InvalidArgument, msg.String())
	if withDetails, err := st.WithDetails(&errdetails.BadRequest{FieldViolations: listed}); err == nil {
		st = withDetails
	}
	return st.Err()
}

// validator checks requests against the limits and the delegate registry.
type validator struct {
	limits limits
	known  func(name string) bool
	// isDelegate reports whether a name is a delegate rather than a preset:
	// judges and analysts are called directly, so they must be. Nil means
	// known.
	isDelegate func(name string) bool
	hasJudge   bool
	// kindOf is a delegate's kind (delegates.KindOpenAI, …), "" for a
	// preset or an unknown name; presetOf a preset's control. They say
	// what a run's typed conversation reaches (carry). Nil: not checked.
	kindOf   func(name string) string
	presetOf func(name string) (*stubbornv1.ControlSpec, bool)
	// names lists the registry's names, for "did you mean" (nil: none).
	names func() []string
}

// didYouMean is " (did you mean "x"?)" for the known name closest to
// name, when one is close (delegates.Closest), else "".
func (val *validator) didYouMean(name string) string {
	if val.names == nil {
		return ""
	}
	var known []string
	for _, n := range val.names() {
		if val.known(n) { // another tenant's is not named
			known = append(known, n)
		}
	}
	if best := delegates.Closest(name, known); best != "" {
		return fmt.Sprintf(" (did you mean %q?)", best)
	}
	return ""
}

// runSpec checks a run request and returns the control it selects. Unknown
// delegates are NOT_FOUND; everything else wrong is INVALID_ARGUMENT.
func (val *validator) runSpec(req runRequest) (*stubbornv1.ControlSpec, error) {
	var v violations
	val.checkConversation(&v, req)
	brief, field := req.GetTaskBrief(), "task_brief"
	briefCut := 0 // the length of a conversation's brief that is cut to the bound
	switch {
	case strings.TrimSpace(brief) != "":
	case req.GetConversation() != nil || len(req.GetTaskMessages()) > 0:
		// The brief is the conversation's text (typed, or what
		// task_messages read as), cut to the bound as taskOf cuts it.
		field = "conversation"
		c := req.GetConversation()
		if c == nil {
			field = "task_messages"
			var err error
			if c, err = legacyConversation(req); err != nil {
				field = "" // messages that do not read have no brief: checkConversation said why
			}
		}
		if field != "" {
			brief = typedBrief(c)
			if len(brief) > val.limits.MaxBriefBytes {
				briefCut = len(brief)
			}
		}
	}
	switch {
	case field == "":
	case strings.TrimSpace(brief) == "" && field != "task_brief":
		v.add(field, "have no text")
	case strings.TrimSpace(brief) == "":
		v.add(field, "must not be empty (or give task_messages)")
	case field == "task_brief" && len(brief) > val.limits.MaxBriefBytes:
		v.add(field, "is %d bytes, more than the limit of %d", len(brief), val.limits.MaxBriefBytes)
	}

	var set []string
	spec := &stubbornv1.ControlSpec{}
	var names []namedRef // delegate names to look up once the shape is valid
	judge := req.GetOptions().GetJudge()
	if judge != "" {
		names = append(names, val.name(&v, "options.judge", judge, true)...)
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
		val.duration(&v, "race.hedge_delay", r.GetHedgeDelay())
	}
	if r := req.GetBalance(); r != nil {
		set = append(set, "balance")
		spec.Kind = &stubbornv1.ControlSpec_Balance{Balance: r}
		names = append(names, val.balance(&v, r)...)
		val.criteria(&v, "balance", r.GetFailureCriteria(), r.GetFailureWhen(), "failure_criteria", "failure_when", judged)
	}
	switch len(set) {
	case 0:
		v.add("retry", "exactly one of retry, retry_with_learning, fallback_chain, race, balance must be set; none is")
	case 1:
	default:
		v.add(set[1], "exactly one of retry, retry_with_learning, fallback_chain, race, balance must be set; got %s", strings.Join(set, " and "))
	}
	val.options(&v, req.GetOptions())
	if err := v.err(); err != nil {
		return nil, err
	}
	// Every name is well formed by now (delegates.CheckName): short enough
	// to quote.
	for _, n := range names {
		if !val.known(n.name) {
			return nil, status.Errorf(codes.NotFound, "%s: delegate %.128q is not in the registry%s", n.field, n.name, val.didYouMean(n.name))
		}
		if n.direct && val.isDelegate != nil && !val.isDelegate(n.name) {
			return nil, status.Errorf(codes.NotFound, "%s: %.128q is a preset, not a delegate in the registry: judges and analysts must be delegates", n.field, n.name)
		}
	}
	// What the delegates cannot carry of the conversation, named before
	// any call: none would get it, and an answer without it is wrong.
	val.carry(&v, req, spec, briefCut)
	if err := v.err(); err != nil {
		return nil, err
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
	if r.GetRetryOn() != nil {
		for _, msg := range delegates.CheckRetryOn("retry.retry_on", r.GetRetryOn()) {
			field, what, _ := strings.Cut(msg, ": ")
			v.add(field, "%s", what)
		}
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
		refs = append(refs, val.name(v, "retry_with_learning.analyst", a, true)...)
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
		field := control + "." + exprField
		if n := utf8.RuneCountInString(expr); n > controls.CELMaxLength {
			v.add(field, "is %d characters, more than the limit of %d", n, controls.CELMaxLength)
		} else if _, err := controls.CompileExpr(exprField, expr); err != nil {
			v.add(field, "is not a valid CEL expression: %s", celError(err))
		}
	}
}

// celError is CEL's error cut to its first line (where, and what: CEL
// follows it with the source line and a caret, then the next error) and to
// maxCELErrorBytes, saying how many more errors there were.
func celError(err error) string {
	msg := err.Error()
	more := strings.Count(msg, "\nERROR: ")
	// CEL reports 100 errors at most, then "N more errors were truncated".
	if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
		var n int
		if _, err := fmt.Sscanf(msg[i+1:], "%d more errors were truncated", &n); err == nil {
			more += n
		}
	}
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i]
	}
	msg = truncate(msg, maxCELErrorBytes)
	if more > 0 {
		msg += fmt.Sprintf(" (and %d more errors)", more)
	}
	return msg
}

// truncate cuts s to at most n bytes on a character boundary, marking the
// cut with "…".
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func (val *validator) target(v *violations, field, name string) []namedRef {
	if name == "" {
		v.add(field, "must name a delegate")
		return nil
	}
	return val.name(v, field, name, false)
}

// name checks a delegate name's shape (delegates.CheckName) and returns it
// to be looked up, or adds a violation.
func (val *validator) name(v *violations, field, name string, direct bool) []namedRef {
	if err := delegates.CheckName(name); err != nil {
		v.add(field, "%v", err)
		return nil
	}
	return []namedRef{{field: field, name: name, direct: direct}}
}

func (val *validator) list(v *violations, field string, names []string) []namedRef {
	switch {
	case len(names) == 0:
		v.add(field, "must name at least one delegate")
	case len(names) > val.limits.MaxChain:
		v.add(field, "names %d delegates, more than the limit of %d", len(names), val.limits.MaxChain)
	}
	var refs []namedRef
	// A list over the limit is refused as a whole; the names in it past
	// the limit are not looked at one by one.
	for i, n := range names[:min(len(names), val.limits.MaxChain)] {
		f := fmt.Sprintf("%s[%d]", field, i)
		if n == "" {
			v.add(f, "must name a delegate")
			continue
		}
		refs = append(refs, val.name(v, f, n, false)...)
	}
	return refs
}

// balance checks a balance's shape (delegates.CheckBalance, within the
// limits on a chain's length and on attempts) and returns its targets'
// names to look up.
func (val *validator) balance(v *violations, r *stubbornv1.BalanceSpec) []namedRef {
	for _, msg := range delegates.CheckBalance("balance", r, val.limits.MaxChain, val.limits.MaxAttempts) {
		field, what, _ := strings.Cut(msg, ": ")
		v.add(field, "%s", what)
	}
	var refs []namedRef
	// A list over the limit is refused as a whole, as the chain's.
	targets := r.GetTargets()
	for i, t := range targets[:min(len(targets), val.limits.MaxChain)] {
		f := fmt.Sprintf("balance.targets[%d].name", i)
		if t.GetName() == "" {
			v.add(f, "must name a delegate or a preset")
			continue
		}
		refs = append(refs, val.name(v, f, t.GetName(), false)...)
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
		max  time.Duration // 0: none
	}{
		{"options.run_timeout", o.GetRunTimeout(), 0},
		{"options.attempt_timeout", o.GetAttemptTimeout(), 0},
		{"options.first_output_timeout", o.GetFirstOutputTimeout(), delegates.MaxStallTimeout},
		{"options.idle_timeout", o.GetIdleTimeout(), delegates.MaxStallTimeout},
	} {
		if f.d == nil {
			continue
		}
		err := f.d.CheckValid()
		switch d := f.d.AsDuration(); {
		case f.max > 0 && (err != nil || d < 0 || d > f.max):
			v.add(f.name, "must be a duration between 0 and %s", f.max)
		case err != nil || d < 0:
			v.add(f.name, "must be a valid, non-negative duration")
		}
	}
	switch key := o.GetIdempotencyKey(); {
	case len(key) > maxIdempotencyKeyBytes:
		v.add("options.idempotency_key", "is %d bytes, more than the limit of %d", len(key), maxIdempotencyKeyBytes)
	case !printableASCII(key):
		v.add("options.idempotency_key", "must be printable ASCII (space to '~'): it is sent to delegates as a gRPC header")
	}
	val.metadata(v, o.GetMetadata())
	checkSpendLimit(v, "options.spend_limit", o.GetSpendLimit())
}

// Bounds of a spend limit: far past any run's spend, and exact in a
// float64 and in every client's number type.
const (
	maxSpendCost   = 1e12
	maxSpendTokens = 1e15
)

// checkSpendLimit checks spend limit l (at field) against its bounds.
func checkSpendLimit(v *violations, field string, l *stubbornv1.SpendLimit) {
	if l == nil {
		return
	}
	if c := l.GetMaxCost(); math.IsNaN(c) || c < 0 || c > maxSpendCost {
		v.add(field+".max_cost", "must be between 0 and %g (0: no cost limit), got %g", float64(maxSpendCost), c)
	}
	if n := l.GetMaxTotalTokens(); n < 0 || n > maxSpendTokens {
		v.add(field+".max_total_tokens", "must be between 0 and %d (0: no token limit), got %d", int64(maxSpendTokens), n)
	}
	if _, ok := stubbornv1.OnExhausted_name[int32(l.GetOnExhausted())]; !ok {
		v.add(field+".on_exhausted", "must be ON_EXHAUSTED_ASK or ON_EXHAUSTED_FAIL, got %d", l.GetOnExhausted())
	}
}

// printableASCII reports whether s is all printable ASCII, space included:
// what a gRPC header value may hold.
func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// metadata checks options.metadata: the number of entries, then each entry
// (in key order; the first wrong one is named, by at most 40 characters of
// its key, with how many more are wrong the same way), then their total
// size.
func (val *validator) metadata(v *violations, md map[string]string) {
	const field = "options.metadata"
	if len(md) > val.limits.MaxMetadata {
		v.add(field, "has %d entries, more than the limit of %d", len(md), val.limits.MaxMetadata)
		return // its entries are not looked at one by one
	}
	type problem struct {
		first string // what is wrong with the first entry
		n     int    // entries wrong this way
	}
	var keys, values problem
	note := func(p *problem, format string, args ...any) {
		if p.n == 0 {
			p.first = fmt.Sprintf(format, args...)
		}
		p.n++
	}
	total := 0
	for _, k := range slices.Sorted(maps.Keys(md)) {
		value := md[k]
		total += len(k) + len(value)
		switch {
		case k == "":
			note(&keys, "a key is empty")
		case len(k) > maxMetadataKeyBytes:
			note(&keys, "key %.40q… is %d bytes, more than the limit of %d", k, len(k), maxMetadataKeyBytes)
		case !controlFree(k):
			note(&keys, "key %.40q has a control character or is not valid UTF-8", k)
		}
		if len(value) > maxMetadataValueBytes {
			note(&values, "the value of key %.40q is %d bytes, more than the limit of %d", k, len(value), maxMetadataValueBytes)
		}
	}
	for _, p := range []problem{keys, values} {
		switch {
		case p.n == 1:
			v.add(field, "%s", p.first)
		case p.n > 1:
			v.add(field, "%s (and %d more entries like it)", p.first, p.n-1)
		}
	}
	if total > maxMetadataBytes {
		v.add(field, "is %d bytes (keys and values), more than the limit of %d", total, maxMetadataBytes)
	}
}

// controlFree reports whether s is valid UTF-8 without a control
// character.
func controlFree(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// checkRunID adds what is wrong with a run_id field to v: it must be
// 1 to maxRunIDBytes ASCII letters, digits, '_' or '-'.
func checkRunID(v *violations, field, id string) {
	switch {
	case id == "":
		v.add(field, "must not be empty")
	case len(id) > maxRunIDBytes:
		v.add(field, "is %d bytes, more than the limit of %d", len(id), maxRunIDBytes)
	case !isIDString(id):
		v.add(field, "may hold only ASCII letters, digits, '_' and '-', as the run ids StartRun returns")
	}
}

// runID checks a request's run_id field.
func runID(id string) error {
	var v violations
	checkRunID(&v, "run_id", id)
	return v.err()
}

// checkPageToken adds what is wrong with ListRuns' page_token to v. (A
// token of the right shape that this server did not issue is refused by
// the runs layer.)
func checkPageToken(v *violations, tok string) {
	switch {
	case len(tok) > maxPageTokenBytes:
		v.add("page_token", "is %d bytes, more than the limit of %d", len(tok), maxPageTokenBytes)
	case !isIDString(tok):
		v.add("page_token", "is not valid: pass a next_page_token as ListRuns returned it")
	}
}
