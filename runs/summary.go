package runs

import (
	"slices"

	"github.com/stubbornhq/stubborn/controls"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
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

// Summary is what a list of runs shows of st.
func Summary(st *stubbornv1.ControlState) *stubbornv1.RunSummary {
	return &stubbornv1.RunSummary{
		RunId:      st.GetRunId(),
		Control:    controls.ControlName(st.GetControl()),
		Delegates:  controls.Named(st.GetControl()),
		Status:     st.GetStatus(),
		Attempts:   st.GetAttempts(),
		CreateTime: st.GetCreateTime(),
		UpdateTime: st.GetUpdateTime(),
		Winner:     st.GetWinner(),
		Brief:      BriefStart(st.GetTaskBrief()),
	}
}

// SummaryBriefChars is how many characters of a run's brief its summary
// keeps (RunSummary.brief).
const SummaryBriefChars = 80

// BriefStart is RunSummary.brief of a run whose task brief is brief: its
// first SummaryBriefChars characters, "…" appended when it is longer.
func BriefStart(brief string) string {
	if start := controls.FirstChars(brief, SummaryBriefChars); len(start) < len(brief) {
		return start + "…"
	}
	return brief
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
