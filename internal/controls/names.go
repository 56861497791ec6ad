package controls

import stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"

// ControlName is the name of a spec's control: "retry",
// "retry_with_learning", "fallback_chain", "race", "balance", or "unknown".
func ControlName(spec *stubbornv1.ControlSpec) string {
	switch spec.GetKind().(type) {
	case *stubbornv1.ControlSpec_Retry:
		return "retry"
	case *stubbornv1.ControlSpec_RetryWithLearning:
		return "retry_with_learning"
	case *stubbornv1.ControlSpec_FallbackChain:
		return "fallback_chain"
	case *stubbornv1.ControlSpec_Race:
		return "race"
	case *stubbornv1.ControlSpec_Balance:
		return "balance"
	}
	return "unknown"
}

// Named returns the delegates and presets spec names, in its order: the
// target (and the analyst), the chain, the candidates, or the targets.
func Named(spec *stubbornv1.ControlSpec) []string {
	switch k := spec.GetKind().(type) {
	case *stubbornv1.ControlSpec_Retry:
		return []string{k.Retry.GetTarget()}
	case *stubbornv1.ControlSpec_RetryWithLearning:
		if a := k.RetryWithLearning.GetAnalyst(); a != "" {
			return []string{k.RetryWithLearning.GetTarget(), a}
		}
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

// ExpandPresets returns the presets spec names, directly or through other
// presets, as presets resolves them: the tree a run's control reaches.
// Nil when it names none.
func ExpandPresets(spec *stubbornv1.ControlSpec, presets Presets) map[string]*stubbornv1.ControlSpec {
	if presets == nil {
		return nil
	}
	var out map[string]*stubbornv1.ControlSpec
	var walk func(*stubbornv1.ControlSpec)
	walk = func(s *stubbornv1.ControlSpec) {
		for _, name := range Named(s) {
			if _, seen := out[name]; seen {
				continue // a preset named twice, or (refused by the config) one that reaches itself
			}
			if p, ok := presets.Preset(name); ok {
				if out == nil {
					out = map[string]*stubbornv1.ControlSpec{}
				}
				out[name] = p
				walk(p)
			}
		}
	}
	walk(spec)
	return out
}

// PresetMap is Presets from a map of name to spec: a run's recorded
// presets (ControlState.presets).
type PresetMap map[string]*stubbornv1.ControlSpec

// Preset implements Presets.
func (p PresetMap) Preset(name string) (*stubbornv1.ControlSpec, bool) {
	s, ok := p[name]
	return s, ok
}
