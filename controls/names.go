package controls

import stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"

// ControlName is the name of a spec's control: "retry",
// "retry_with_learning", "fallback_chain", "race", or "unknown".
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
	}
	return "unknown"
}

// Named returns the delegates and presets spec names, in its order: the
// target (and the analyst), the chain, or the candidates.
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
	}
	return nil
}
