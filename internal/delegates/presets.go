package delegates

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Preset is a named control spec from the config file. A run's target,
// chain entry or race candidate may name a preset as well as a delegate, so
// that controls nest: a fallback chain of [a retry of search-primary,
// search-backup], for example. In YAML a preset is its name and exactly one
// control, written with the fields of its stubborn.v1 message (durations
// as Go durations, on_exhausted as ask or fail, a balance's strategy as
// weighted, least_busy, latency or usage):
//
//	presets:
//	  - name: search-with-retry
//	    retry: {target: search-primary, attempts: 2, base_wait: 100ms, on_exhausted: fail}
//	  - name: gpt
//	    balance: {targets: [{name: gpt-east, weight: 3}, {name: gpt-west}], strategy: weighted}
type Preset struct {
	// Name is how runs refer to the preset; unique among delegates and
	// presets.
	Name string
	// Spec is the control the preset runs.
	Spec *stubbornv1.ControlSpec
	// SpendLimit is the spend limit of the runs whose control names the
	// preset at its top and set none (spend_limit); nil means none.
	SpendLimit *SpendLimit
	// Notify are the webhooks told when a run whose control names the
	// preset at its top waits for a person (docs/notifications.md).
	Notify []NotifyTarget
}

// controlKeys are the YAML keys of the controls, in ControlSpec order,
// and controlMessages their messages.
var (
	controlKeys     = []string{"retry", "retry_with_learning", "fallback_chain", "race", "balance"}
	controlMessages = []proto.Message{&stubbornv1.RetrySpec{}, &stubbornv1.RetryWithLearningSpec{}, &stubbornv1.FallbackChainSpec{}, &stubbornv1.RaceSpec{}, &stubbornv1.BalanceSpec{}}
)

// UnmarshalYAML reads a preset: its name and exactly one control. Its
// errors name the key they are about (presets[2] ("p").retry.max_wait).
func (p *Preset) UnmarshalYAML(n *yaml.Node) error {
	var raw map[string]any
	if err := n.Decode(&raw); err != nil {
		return err
	}
	name, _ := raw["name"].(string)
	p.Name = name
	var found []string
	var unknown []string
	for i := 0; i+1 < len(n.Content); i += 2 {
		switch k := n.Content[i]; {
		case k.Value == "name":
		case k.Value == "notify":
			unknown = append(unknown, unknownNotifyKeys(n.Content[i+1])...)
			if err := n.Content[i+1].Decode(&p.Notify); err != nil {
				return err
			}
		case k.Value == "spend_limit":
			var l SpendLimit
			if err := n.Content[i+1].Decode(&l); err != nil {
				return err
			}
			if bad := l.check(); len(bad) > 0 {
				return nodeError(n, "", k.Line, strings.Join(bad, "; "))
			}
			p.SpendLimit = &l
		case isControlKey(k.Value):
			found = append(found, k.Value)
		default:
			unknown = append(unknown, unknownKey(k, "delegates.Preset"))
		}
	}
	if len(unknown) > 0 {
		return &yaml.TypeError{Errors: unknown}
	}
	if len(found) != 1 {
		return nodeError(n, "", n.Line, fmt.Sprintf("needs exactly one of %s, got %d", strings.Join(controlKeys, ", "), len(found)))
	}
	key := found[0]
	keyNode, body := mappingEntry(n, key)
	fail := func(sub string, line int, format string, args ...any) error {
		if sub != "" {
			sub = "." + sub
		}
		return nodeError(n, key+sub, line, fmt.Sprintf(format, args...))
	}
	fields, ok := raw[key].(map[string]any)
	if !ok || body.Kind != yaml.MappingNode {
		return fail("", keyNode.Line, "must be a mapping")
	}
	msg := controlMessages[slices.Index(controlKeys, key)].ProtoReflect().New().Interface()
	desc := msg.ProtoReflect().Descriptor()
	for i := 0; i+1 < len(body.Content); i += 2 {
		k := body.Content[i]
		if desc.Fields().ByName(protoreflect.Name(k.Value)) == nil && desc.Fields().ByJSONName(k.Value) == nil {
			unknown = append(unknown, unknownKey(k, string(desc.FullName())))
		}
	}
	if len(unknown) > 0 {
		return &yaml.TypeError{Errors: unknown}
	}
	if field, err := normalize(fields); err != nil {
		line := keyNode.Line
		if k, _ := mappingEntry(body, field); k != nil {
			line = k.Line
		}
		return fail(field, line, "%v", err)
	}
	js, err := json.Marshal(fields)
	if err != nil {
		return fail("", keyNode.Line, "%v", err)
	}
	if err := protojson.Unmarshal(js, msg); err != nil {
		return fail("", keyNode.Line, "%v", err)
	}
	spec := &stubbornv1.ControlSpec{}
	switch m := msg.(type) {
	case *stubbornv1.RetrySpec:
		spec.Kind = &stubbornv1.ControlSpec_Retry{Retry: m}
	case *stubbornv1.RetryWithLearningSpec:
		spec.Kind = &stubbornv1.ControlSpec_RetryWithLearning{RetryWithLearning: m}
	case *stubbornv1.FallbackChainSpec:
		spec.Kind = &stubbornv1.ControlSpec_FallbackChain{FallbackChain: m}
	case *stubbornv1.RaceSpec:
		spec.Kind = &stubbornv1.ControlSpec_Race{Race: m}
	case *stubbornv1.BalanceSpec:
		spec.Kind = &stubbornv1.ControlSpec_Balance{Balance: m}
	}
	p.Spec = spec
	return nil
}

// mappingEntry returns the key and value nodes of key in mapping n, or
// nils.
func mappingEntry(n *yaml.Node, key string) (k, v *yaml.Node) {
	for i := 0; n.Kind == yaml.MappingNode && i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i], n.Content[i+1]
		}
	}
	return nil, nil
}

// MarshalYAML writes the preset back in the form UnmarshalYAML reads
// (protojson field names, durations in seconds).
func (p Preset) MarshalYAML() (any, error) {
	js, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(p.Spec)
	if err != nil {
		return nil, err
	}
	var body map[string]any
	if err := json.Unmarshal(js, &body); err != nil {
		return nil, err
	}
	body["name"] = p.Name
	if p.SpendLimit != nil {
		body["spend_limit"] = p.SpendLimit
	}
	if len(p.Notify) > 0 {
		body["notify"] = p.Notify
	}
	return body, nil
}

func isControlKey(k string) bool { return slices.Contains(controlKeys, k) }

// normalize rewrites the YAML conveniences into protojson: Go durations
// ("100ms") for the *_wait, *_timeout and *_delay fields, and on_exhausted
// ask/fail. An error names the field it is about.
func normalize(body map[string]any) (field string, err error) {
	for k, v := range body {
		switch {
		case strings.HasSuffix(k, "_wait") || strings.HasSuffix(k, "_timeout") || strings.HasSuffix(k, "_delay"):
			s, ok := v.(string)
			if !ok {
				return k, fmt.Errorf("a duration must be a string such as \"500ms\"")
			}
			d, err := time.ParseDuration(s)
			if err != nil {
				return k, fmt.Errorf("invalid duration %q", s)
			}
			body[k] = strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
		case k == "on_exhausted":
			// ask, fail, or the .proto's ON_EXHAUSTED_FAIL, in any case.
			s, _ := v.(string)
			u := strings.ToUpper(s)
			if !strings.HasPrefix(u, "ON_EXHAUSTED_") {
				u = "ON_EXHAUSTED_" + u
			}
			if _, ok := stubbornv1.OnExhausted_value[u]; !ok || u == "ON_EXHAUSTED_UNSPECIFIED" {
				return k, fmt.Errorf("must be ask or fail (or ON_EXHAUSTED_ASK, ON_EXHAUSTED_FAIL), got %v", v)
			}
			body[k] = u
		case k == "strategy":
			// weighted, least_busy, latency, usage, or the .proto's
			// BALANCE_STRATEGY_LATENCY, in any case.
			s, _ := v.(string)
			u := strings.ToUpper(s)
			if !strings.HasPrefix(u, "BALANCE_STRATEGY_") {
				u = "BALANCE_STRATEGY_" + u
			}
			if _, ok := stubbornv1.BalanceStrategy_value[u]; !ok || u == "BALANCE_STRATEGY_UNSPECIFIED" {
				return k, fmt.Errorf("must be weighted, least_busy, latency or usage, got %v", v)
			}
			body[k] = u
		}
	}
	return "", nil
}

// References returns the delegate or preset names a control spec calls.
func References(spec *stubbornv1.ControlSpec) []string {
	switch k := spec.GetKind().(type) {
	case *stubbornv1.ControlSpec_Retry:
		return []string{k.Retry.GetTarget()}
	case *stubbornv1.ControlSpec_RetryWithLearning:
		return []string{k.RetryWithLearning.GetTarget()}
	case *stubbornv1.ControlSpec_FallbackChain:
		return k.FallbackChain.GetChain()
	case *stubbornv1.ControlSpec_Race:
		return k.Race.GetCandidates()
	case *stubbornv1.ControlSpec_Balance:
		names := make([]string, len(k.Balance.GetTargets()))
		for i, t := range k.Balance.GetTargets() {
			names[i] = t.GetName()
		}
		return names
	}
	return nil
}

// errCycle reports presets that reach themselves.
var errCycle = errors.New("presets form a cycle")

// validatePresets checks names, references and cycles. delegates holds the
// delegate names.
func (c *Config) validatePresets(delegates map[string]int) []error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s", errInvalidConfig, fmt.Sprintf(format, args...)))
	}
	presets := make(map[string]*stubbornv1.ControlSpec, len(c.Presets))
	for i, p := range c.Presets {
		where := fmt.Sprintf("presets[%d] (%q)", i, p.Name)
		nameErr := CheckName(p.Name)
		switch _, isDelegate := delegates[p.Name]; {
		case p.Name == "":
			bad("presets[%d]: name is empty", i)
		case nameErr != nil:
			bad("%s: name: %v", where, nameErr)
		case isDelegate:
			bad("%s: name: a delegate has the same name", where)
		case presets[p.Name] != nil:
			bad("%s: name: duplicate preset", where)
		default:
			presets[p.Name] = p.Spec
		}
		if hasCriteria(p.Spec) {
			bad("%s: failure criteria are not supported in presets", where)
		}
		if on := p.Spec.GetRetry().GetRetryOn(); on != nil {
			for _, msg := range CheckRetryOn("retry.retry_on", on) {
				bad("%s: %s", where, msg)
			}
		}
		if p.Spec.GetRace().GetHedgeDelay().AsDuration() < 0 {
			bad("%s: race.hedge_delay must not be negative", where)
		}
		if b := p.Spec.GetBalance(); b != nil {
			for _, msg := range CheckBalance("balance", b, c.Limits.MaxChain, c.Limits.MaxAttempts) {
				bad("%s: %s", where, msg)
			}
		}
	}
	for i, p := range c.Presets {
		refs := References(p.Spec)
		if len(refs) == 0 || (len(refs) == 1 && refs[0] == "") {
			bad("presets[%d] (%q): names no delegate", i, p.Name)
		}
		for _, r := range refs {
			if _, ok := delegates[r]; !ok && presets[r] == nil {
				bad("presets[%d] (%q): %q is neither a delegate nor a preset", i, p.Name, r)
			}
		}
	}
	// Depth-first search for a preset that reaches itself.
	const (
		unseen = iota
		active
		done
	)
	state := map[string]int{}
	var visit func(name string, path []string) bool
	visit = func(name string, path []string) bool {
		switch state[name] {
		case active:
			bad("%v: %s", errCycle, strings.Join(append(path, name), " → "))
			return false
		case done:
			return true
		}
		state[name] = active
		for _, r := range References(presets[name]) {
			if presets[r] != nil && !visit(r, append(path, name)) {
				return false
			}
		}
		state[name] = done
		return true
	}
	for _, p := range c.Presets {
		if presets[p.Name] != nil && state[p.Name] == unseen {
			visit(p.Name, nil)
		}
	}
	return errs
}

func hasCriteria(spec *stubbornv1.ControlSpec) bool {
	switch k := spec.GetKind().(type) {
	case *stubbornv1.ControlSpec_RetryWithLearning:
		return k.RetryWithLearning.GetFailureCriteria() != "" || k.RetryWithLearning.GetFailureWhen() != "" || k.RetryWithLearning.GetAnalyst() != ""
	case *stubbornv1.ControlSpec_FallbackChain:
		return k.FallbackChain.GetFailureCriteria() != "" || k.FallbackChain.GetFailureWhen() != ""
	case *stubbornv1.ControlSpec_Race:
		return k.Race.GetAcceptanceCriteria() != "" || k.Race.GetAcceptWhen() != ""
	case *stubbornv1.ControlSpec_Balance:
		return k.Balance.GetFailureCriteria() != "" || k.Balance.GetFailureWhen() != ""
	}
	return false
}

// MaxBalanceWeight is the largest weight of a balance's target.
const MaxBalanceWeight = 1000

// CheckBalance returns what is wrong with a balance spec's shape, each
// message naming its field under field (targets empty, over maxChain or
// with a name twice, a weight outside 1..MaxBalanceWeight, an unknown
// strategy, max_attempts outside 1..maxAttempts); none when it is
// well-formed. A limit of 0 or less is not checked. Whether the names
// are known is the caller's to check.
func CheckBalance(field string, b *stubbornv1.BalanceSpec, maxChain, maxAttempts int) []string {
	var msgs []string
	targets := b.GetTargets()
	switch {
	case len(targets) == 0:
		msgs = append(msgs, field+".targets: at least one target is required")
	case maxChain > 0 && len(targets) > maxChain:
		msgs = append(msgs, fmt.Sprintf("%s.targets: %d targets, more than the limit of %d (limits.max_chain)", field, len(targets), maxChain))
	}
	seen := make(map[string]int, len(targets))
	for i, t := range targets {
		at := fmt.Sprintf("%s.targets[%d]", field, i)
		if j, dup := seen[t.GetName()]; dup && t.GetName() != "" {
			msgs = append(msgs, fmt.Sprintf("%s.name: %q is targets[%d] already", at, t.GetName(), j))
		}
		seen[t.GetName()] = i
		if t.Weight != nil && (t.GetWeight() < 1 || t.GetWeight() > MaxBalanceWeight) {
			msgs = append(msgs, fmt.Sprintf("%s.weight: must be 1 to %d, got %d", at, MaxBalanceWeight, t.GetWeight()))
		}
	}
	if _, known := stubbornv1.BalanceStrategy_name[int32(b.GetStrategy())]; !known {
		msgs = append(msgs, fmt.Sprintf("%s.strategy: unknown strategy %d", field, b.GetStrategy()))
	}
	if b.MaxAttempts != nil {
		switch n := b.GetMaxAttempts(); {
		case maxAttempts > 0 && (n < 1 || int(n) > maxAttempts):
			msgs = append(msgs, fmt.Sprintf("%s.max_attempts: must be 1 to %d (limits.max_attempts), got %d", field, maxAttempts, n))
		case n < 1:
			msgs = append(msgs, fmt.Sprintf("%s.max_attempts: must be at least 1, got %d", field, n))
		}
	}
	return msgs
}
