package runs

import (
	"slices"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
)

// Filter selects runs for ListWhere and Follow; a zero field selects all.
type Filter struct {
	// Status is the run's status.
	Status stubbornv1.RunStatus
	// Control is controls.ControlName of the run's control.
	Control string
	// Delegate is a name the run's control names (controls.Named).
	Delegate string
}

// matches reports whether st passes f.
func (f Filter) matches(st *stubbornv1.ControlState) bool {
	if f.Status != stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED && st.GetStatus() != f.Status {
		return false
	}
	if f.Control != "" && controls.ControlName(st.GetControl()) != f.Control {
		return false
	}
	return f.Delegate == "" || slices.Contains(controls.Named(st.GetControl()), f.Delegate)
}

// MatchesSummary reports whether a run's summary passes f.
func (f Filter) MatchesSummary(s *stubbornv1.RunSummary) bool {
	if f.Status != stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED && s.GetStatus() != f.Status {
		return false
	}
	if f.Control != "" && s.GetControl() != f.Control {
		return false
	}
	return f.Delegate == "" || slices.Contains(s.GetDelegates(), f.Delegate)
}
