package delegates

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Preset is a named control spec from the config file. A run's target,
// chain entry or race candidate may name a preset as well as a delegate, so
// that controls nest: a fallback chain of [a retry of search-primary,
// search-backup], for example. In YAML a preset is its name and exactly one
// control, written with the fields of its stubborn.v1 message (durations
// as Go durations, on_exhausted as ask or fail):
//
//	presets:
//	  - name: search-with-retry
//	    retry: {target: search-primary, attempts: 2, base_wait: 100ms, on_exhausted: fail}
type Preset struct {
	// Name is how runs refer to the preset; unique among delegates and
	// presets.
	Name string
	// Spec is the control the preset runs.
	Spec *stubbornv1.ControlSpec
}

// controlKeys are the YAML keys of the four controls, in ControlSpec order.
var controlKeys = []string{"retry", "retry_with_learning", "fallback_chain", "race"}

// UnmarshalYAML reads a preset: its name and exactly one control.
func (p *Preset) UnmarshalYAML(n *yaml.Node) error {
	var raw map[string]any
	if err := n.Decode(&raw); err != nil {
		return err
	}
	// An error is reported at the line of the control's key when there is
	// one, so that it names presets[i].retry, say, rather than the name.
	line := n.Line
	fail := func(format string, args ...any) error {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: preset %q: %s", line, p.Name, fmt.Sprintf(format, args...))}}
	}
	name, _ := raw["name"].(string)
	p.Name = name
	var found []string
	for k := range raw {
		switch {
		case k == "name":
		case isControlKey(k):
			found = append(found, k)
		default:
			return fail("unknown field %q (want name and one of %s)", k, strings.Join(controlKeys, ", "))
		}
	}
	if len(found) != 1 {
		return fail("needs exactly one of %s, got %d", strings.Join(controlKeys, ", "), len(found))
	}
	key := found[0]
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			line = n.Content[i].Line
		}
	}
	body, ok := raw[key].(map[string]any)
	if !ok {
		return fail("%s: must be a mapping", key)
	}
	if err := normalize(body); err != nil {
		return fail("%s.%v", key, err)
	}
	js, err := json.Marshal(body)
	if err != nil {
		return fail("%s: %v", key, err)
	}
	spec := &stubbornv1.ControlSpec{}
	var msg proto.Message
	switch key {
	case "retry":
		m := &stubbornv1.RetrySpec{}
		spec.Kind, msg = &stubbornv1.ControlSpec_Retry{Retry: m}, m
	case "retry_with_learning":
		m := &stubbornv1.RetryWithLearningSpec{}
		spec.Kind, msg = &stubbornv1.ControlSpec_RetryWithLearning{RetryWithLearning: m}, m
	case "fallback_chain":
		m := &stubbornv1.FallbackChainSpec{}
		spec.Kind, msg = &stubbornv1.ControlSpec_FallbackChain{FallbackChain: m}, m
	case "race":
		m := &stubbornv1.RaceSpec{}
		spec.Kind, msg = &stubbornv1.ControlSpec_Race{Race: m}, m
	}
	if err := protojson.Unmarshal(js, msg); err != nil {
		return fail("%s: %v", key, err)
	}
	p.Spec = spec
	return nil
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
	return body, nil
}

func isControlKey(k string) bool {
	for _, c := range controlKeys {
		if k == c {
			return true
		}
	}
	return false
}

// normalize rewrites the YAML conveniences into protojson: Go durations
// ("100ms") for the *_wait, *_timeout and *_delay fields, and on_exhausted
// ask/fail.
func normalize(body map[string]any) error {
	for k, v := range body {
		switch {
		case strings.HasSuffix(k, "_wait") || strings.HasSuffix(k, "_timeout") || strings.HasSuffix(k, "_delay"):
			s, ok := v.(string)
			if !ok {
				return fmt.Errorf("%s: a duration must be a string such as \"500ms\"", k)
			}
			d, err := time.ParseDuration(s)
			if err != nil {
				return fmt.Errorf("%s: invalid duration %q", k, s)
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
				return fmt.Errorf("%s: must be ask or fail (or ON_EXHAUSTED_ASK, ON_EXHAUSTED_FAIL), got %v", k, v)
			}
			body[k] = u
		}
	}
	return nil
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
		errs = append(errs, fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...)))
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
	}
	return false
}
