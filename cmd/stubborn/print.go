package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/stubbornhq/stubborn/controls"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// printer writes run events, one readable line each, or protojson lines.
type printer struct {
	w    io.Writer
	json bool
	// addr is the server's address when it is not the default: the
	// hints it prints name it.
	addr string
	// runID and lastSeq are those of the last event printed.
	runID   string
	lastSeq int64
}

// jsonLine writes protojson with its standard JSON names (runId,
// taskBrief), as grpcurl, the HTTP API and the clients do.
var jsonLine = protojson.MarshalOptions{}

func (p *printer) event(ev *stubbornv1.RunEvent) {
	p.runID, p.lastSeq = ev.GetRunId(), ev.GetSeq()
	if p.json {
		b, err := jsonLine.Marshal(ev)
		if err != nil {
			fmt.Fprintf(p.w, "{\"error\": %q}\n", err.Error())
			return
		}
		fmt.Fprintf(p.w, "%s\n", b)
		return
	}
	where := ""
	if ev.GetPath() != "" {
		where = "[" + ev.GetPath() + "] "
	}
	line := describe(ev)
	if ev.GetDecisionRequested() != nil {
		line += fmt.Sprintf(" — answer with `stubborn decide%s %s retry|fail`", p.addrFlag(), ev.GetRunId())
	}
	fmt.Fprintf(p.w, "%3d %s %s%s\n", ev.GetSeq(), ev.GetTime().AsTime().Local().Format("15:04:05.000"), where, line)
}

// describe renders an event as one line: attempt n → delegate, outcome,
// wait, reason.
// addrFlag is " -addr ADDR" for a server not at the default address, as
// a command to copy needs it.
func (p printer) addrFlag() string {
	if p.addr == "" || p.addr == defaultAddr {
		return ""
	}
	return " -addr " + p.addr
}

func describe(ev *stubbornv1.RunEvent) string {
	switch k := ev.GetKind().(type) {
	case *stubbornv1.RunEvent_RunStarted:
		st := k.RunStarted.GetState()
		return fmt.Sprintf("run %s started: %s", st.GetRunId(), controlName(st.GetControl()))
	case *stubbornv1.RunEvent_AttemptStarted:
		a := k.AttemptStarted.GetAttempt()
		s := fmt.Sprintf("attempt %d → %s", a.GetNumber(), a.GetDelegate())
		if w := a.GetWaitBefore().AsDuration(); w > 0 {
			s += fmt.Sprintf(" (after waiting %s)", round(w))
		}
		if r := startReasons[a.GetStartReason()]; r != "" {
			s += " (" + r + ")"
		}
		first, rest, _ := strings.Cut(a.GetBrief(), "\n")
		s += ": brief " + quote(first, 60)
		if rest = strings.TrimSpace(rest); rest != "" {
			s += "\n      │ " + strings.ReplaceAll(rest, "\n", "\n      │ ")
		}
		return s
	case *stubbornv1.RunEvent_AttemptFinished:
		a := k.AttemptFinished.GetAttempt()
		s := fmt.Sprintf("attempt %d ← %s: %s", a.GetNumber(), a.GetDelegate(), outcomeName(a.GetOutcome()))
		if e := a.GetError(); e != nil {
			s += fmt.Sprintf(" %s %s", codes.Code(e.GetCode()), quote(e.GetMessage(), errorQuote))
		} else if a.GetResult() != nil {
			s += " " + quote(a.GetResult().GetText(), 80)
		}
		if n := k.AttemptFinished.GetNote(); n != "" {
			s += " (" + n + ")"
		}
		return s + fmt.Sprintf(" in %s", round(a.GetEndTime().AsTime().Sub(a.GetStartTime().AsTime())))
	case *stubbornv1.RunEvent_FailureAnalyzed:
		f := k.FailureAnalyzed.GetFailure()
		s := fmt.Sprintf("failure of attempt %d (%s): %s", f.GetAttempt(), f.GetDelegate(), quote(f.GetReason(), errorQuote))
		if src := f.GetSource(); src != stubbornv1.FailureSource_FAILURE_SOURCE_UNSPECIFIED {
			s += " [" + strings.ToLower(strings.TrimPrefix(src.String(), "FAILURE_SOURCE_")) + "]"
		}
		if a := f.GetAnalysis(); a != "" {
			s += "; analyst: " + quote(a, 80)
		}
		switch {
		case k.FailureAnalyzed.GetWillRetry():
			s += "; next attempt follows"
		case f.GetNotRetriedReason() != "":
			s += "; not retried: " + f.GetNotRetriedReason()
		}
		return s
	case *stubbornv1.RunEvent_BackoffScheduled:
		b := k.BackoffScheduled
		src := fmt.Sprintf("drawn from [0, %s]", round(b.GetBound().AsDuration()))
		if b.GetFromHint() {
			src = "as the delegate asked"
		}
		return fmt.Sprintf("backing off %s before attempt %d (%s), until %s", round(b.GetWait().AsDuration()), b.GetNextAttempt(), src, b.GetUntil().AsTime().Local().Format("15:04:05.000"))
	case *stubbornv1.RunEvent_DecisionRequested:
		return "AWAITING DECISION: " + k.DecisionRequested.GetReason()
	case *stubbornv1.RunEvent_DecisionReceived:
		return "decision received: " + strings.TrimPrefix(k.DecisionReceived.GetDecision().String(), "DECISION_")
	case *stubbornv1.RunEvent_RunResumed:
		return fmt.Sprintf("run resumed by %s: %s", k.RunResumed.GetOwner(), k.RunResumed.GetReason())
	case *stubbornv1.RunEvent_RunFinished:
		st := k.RunFinished.GetState()
		s := fmt.Sprintf("run finished: %s after %d attempt(s)", statusName(st.GetStatus()), st.GetAttempts())
		if st.GetWinner() != "" {
			s += ", winner " + st.GetWinner()
		}
		if st.GetResult() != nil {
			s += ", result " + quote(st.GetResult().GetText(), 80)
		}
		if st.GetStatusReason() != "" {
			s += " (" + st.GetStatusReason() + ")"
		}
		return s
	}
	return "unknown event"
}

// summaryName is controlName for a run's summary.
func summaryName(r *stubbornv1.RunSummary) string {
	d := r.GetDelegates()
	switch r.GetControl() {
	case "retry":
		return "retry of " + strings.Join(d, ", ")
	case "retry_with_learning":
		if len(d) > 0 {
			return "retry-with-learning of " + d[0]
		}
	case "fallback_chain":
		return "fallback-chain " + strings.Join(d, " → ")
	case "race":
		return "race of " + strings.Join(d, ", ")
	}
	return r.GetControl()
}

func controlName(c *stubbornv1.ControlSpec) string {
	switch k := c.GetKind().(type) {
	case *stubbornv1.ControlSpec_Retry:
		return "retry of " + k.Retry.GetTarget()
	case *stubbornv1.ControlSpec_RetryWithLearning:
		return "retry-with-learning of " + k.RetryWithLearning.GetTarget()
	case *stubbornv1.ControlSpec_FallbackChain:
		return "fallback-chain " + strings.Join(k.FallbackChain.GetChain(), " → ")
	case *stubbornv1.ControlSpec_Race:
		return "race of " + strings.Join(k.Race.GetCandidates(), ", ")
	}
	return "unknown control"
}

func statusName(s stubbornv1.RunStatus) string {
	return strings.TrimPrefix(s.String(), "RUN_STATUS_")
}

func outcomeName(o stubbornv1.AttemptOutcome) string {
	return strings.TrimPrefix(o.String(), "ATTEMPT_OUTCOME_")
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond)
	}
	return d
}

// quote shows s in quotes on one line, cut to n characters.
// errorQuote is how much of an error message or failure reason a line
// shows: enough for a dial error's address and cause (`get -json` shows
// them whole).
const errorQuote = 240

func quote(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		s = string(r[:n]) + "…"
	}
	return fmt.Sprintf("%q", s)
}

// printState prints a run's state in a few lines (get), or its status in
// one (cancel, decide); -json prints it whole.
func printState(w io.Writer, st *stubbornv1.ControlState, whole bool) {
	line := fmt.Sprintf("run %s: %s", st.GetRunId(), statusName(st.GetStatus()))
	if r := st.GetStatusReason(); r != "" {
		line += " (" + quote(r, errorQuote) + ")"
	}
	fmt.Fprintln(w, line)
	if !whole {
		return
	}
	sum := &stubbornv1.RunSummary{Control: controls.ControlName(st.GetControl()), Delegates: controls.Named(st.GetControl())}
	fmt.Fprintf(w, "  control   %s\n", summaryName(sum))
	fmt.Fprintf(w, "  attempts  %d\n", st.GetAttempts())
	for _, a := range st.GetAttemptLog() {
		line := fmt.Sprintf("    #%d %s%s: %s", a.GetNumber(), pathPrefix(a.GetPath()), a.GetDelegate(), strings.TrimPrefix(a.GetOutcome().String(), "ATTEMPT_OUTCOME_"))
		if e := a.GetError(); e != nil {
			line += fmt.Sprintf(" %s %s", codes.Code(e.GetCode()), quote(e.GetMessage(), errorQuote))
		}
		if a.GetStartTime() != nil && a.GetEndTime() != nil {
			line += " in " + round(a.GetEndTime().AsTime().Sub(a.GetStartTime().AsTime())).String()
		}
		if r := startReasons[a.GetStartReason()]; r != "" {
			line += " (" + r + ")"
		}
		fmt.Fprintln(w, line)
	}
	for _, f := range st.GetFailureHistory() {
		line := fmt.Sprintf("    failure of #%d %s%s: %s", f.GetAttempt(), pathPrefix(f.GetPath()), f.GetDelegate(), quote(f.GetReason(), errorQuote))
		if f.GetNotRetriedReason() != "" {
			line += "; not retried: " + f.GetNotRetriedReason()
		}
		fmt.Fprintln(w, line)
	}
	fmt.Fprintf(w, "  started   %s\n", st.GetCreateTime().AsTime().Local().Format("2006-01-02 15:04:05.000"))
	if st.GetEndTime() != nil {
		fmt.Fprintf(w, "  ended     %s (took %s)\n", st.GetEndTime().AsTime().Local().Format("2006-01-02 15:04:05.000"), round(st.GetEndTime().AsTime().Sub(st.GetCreateTime().AsTime())))
	}
	if st.GetWinner() != "" {
		fmt.Fprintf(w, "  winner    %s\n", st.GetWinner())
	}
	if st.GetResult() != nil {
		fmt.Fprintf(w, "  result    %s\n", quote(st.GetResult().GetText(), errorQuote))
	}
	fmt.Fprintln(w, "  (-json for the whole state: brief, options, each attempt's brief and result)")
}

// startReasons say why a race candidate started when it did
// (Attempt.start_reason); other attempts have none.
var startReasons = map[stubbornv1.AttemptStartReason]string{
	stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_AT_ONCE:        "started with the race",
	stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_HEDGE_DELAY:    "started after the hedge delay",
	stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_EARLIER_FAILED: "started early: the candidates before it failed",
}

// pathPrefix is a nested preset's path before a delegate's name.
func pathPrefix(path string) string {
	if path == "" {
		return ""
	}
	return path + " › "
}
