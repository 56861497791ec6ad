package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
)

// printer writes run events, one readable line each, or protojson lines.
// An attempt's streamed output (attempt_output) is the text itself, as it
// comes, in blocks under a label:
//
//	    attempt 1 │ Roses are red,
//	              │ violets are
//	5 15:04:05.000 attempt 1 ← model: ERROR Unavailable "stalled: …" in 5s
//	    attempt 1 output discarded (stalled: …)
//
// A block ends (with a newline) before any other line, and a new one
// starts when the text of another attempt comes (a race's candidates
// interleave); a block that takes up an attempt's line where another left
// it begins with "…".
type printer struct {
	w    io.Writer
	json bool
	// addr is the server's address when it is not the default: the
	// hints it prints name it.
	addr string
	// runID and lastSeq are those of the last event printed.
	runID   string
	lastSeq int64

	// outputs is what was printed of each attempt's text, by outputKey.
	outputs map[string]*attemptText
	// block is the outputKey of the attempt whose text block is open (""
	// for none); cont is the prefix of its next lines, midLine whether its
	// last line has yet to end.
	block, cont string
	midLine     bool
}

// attemptText is what a printer printed of one attempt's text.
type attemptText struct {
	// printed is the bytes of the text printed: the offset the next piece
	// should have.
	printed int64
	// resumed: the next line printed of it takes up a line cut short (by
	// another block, another event, or text never seen), so it begins
	// with "…".
	resumed bool
	// calls is the bytes of each tool call's arguments printed (choice
	// 0's, by call index); a call is in it once its name is printed.
	calls map[int32]int64
}

// outputKey names an attempt of a run's own control or of a nested one.
func outputKey(path string, attempt int32) string {
	return fmt.Sprintf("%s\x00%d", path, attempt)
}

// jsonLine writes protojson with its standard JSON names (runId,
// taskBrief), as grpcurl, the HTTP API and the clients do.
var jsonLine = protojson.MarshalOptions{}

func (p *printer) event(ev *stubbornv1.RunEvent) {
	if ev.GetRunId() != p.runID {
		p.endOutput()
		p.outputs = nil
	}
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
	if o := ev.GetAttemptOutput(); o != nil {
		p.output(ev.GetPath(), o)
		return
	}
	p.endOutput()
	where := ""
	if ev.GetPath() != "" {
		where = "[" + ev.GetPath() + "] "
	}
	var line string
	if f := ev.GetAttemptFinished(); f != nil {
		shown := int64(0)
		if t := p.outputs[outputKey(ev.GetPath(), f.GetAttempt().GetNumber())]; t != nil {
			shown = t.printed
		}
		line = describeFinished(f, shown)
		if f.GetOutputDiscarded() {
			line += "\n      " + where + discardedLine(f)
		}
	} else {
		line = describe(ev)
	}
	if req := ev.GetDecisionRequested(); req != nil {
		if req.GetReasonCode() == stubbornv1.StatusReason_STATUS_REASON_SPEND_LIMIT_REACHED {
			// A RETRY must raise the limit the run reached.
			line += fmt.Sprintf(" — answer with `stubborn decide%s %s retry -max-cost N` (N above the limit) or `… fail`", p.addrFlag(), ev.GetRunId())
		} else {
			line += fmt.Sprintf(" — answer with `stubborn decide%s %s retry|fail`", p.addrFlag(), ev.GetRunId())
		}
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
		if r := startWhy(a); r != "" {
			s += " (" + r + ")"
		}
		first, rest, _ := strings.Cut(a.GetBrief(), "\n")
		s += ": brief " + quote(first, 60)
		if rest = strings.TrimSpace(rest); rest != "" {
			s += "\n      │ " + strings.ReplaceAll(rest, "\n", "\n      │ ")
		}
		return s
	case *stubbornv1.RunEvent_AttemptFinished:
		s := describeFinished(k.AttemptFinished, 0)
		if a := k.AttemptFinished.GetAttempt(); a.GetCost() > 0 {
			s += " (cost " + costText(a.GetCost(), a.GetCostEstimated()) + ")"
		}
		if k.AttemptFinished.GetOutputDiscarded() {
			s += "\n      " + discardedLine(k.AttemptFinished)
		}
		return s
	case *stubbornv1.RunEvent_AttemptOutput:
		o := k.AttemptOutput
		return fmt.Sprintf("attempt %d output at %d: %s", o.GetAttempt(), o.GetOffset(), quote(o.GetText(), 80))
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
			s += ", result " + quote(answerText(st.GetResult()), 80)
		}
		if st.GetStatusReason() != "" {
			s += " (" + st.GetStatusReason() + ")"
		}
		if c := st.GetCost(); c != nil {
			s += ", cost " + costText(c.GetTotal(), c.GetEstimated())
		}
		return s
	}
	return "unknown event"
}

// answerText is what a result reads as: its text, and a model's tool
// calls after it as JSON (controls.ResultString), so that an answer of
// tool calls alone is not printed as "".
func answerText(r *stubbornv1.Result) string {
	for _, c := range r.GetChoices() {
		if c.GetIndex() == 0 && len(c.GetMessage().GetToolCalls()) > 0 {
			return controls.ResultString(r)
		}
	}
	return r.GetText()
}

// describeFinished renders attempt_finished. shown is the bytes of the
// attempt's text the printer printed as it streamed: a result whose text
// is above is not quoted again.
func describeFinished(f *stubbornv1.AttemptFinished, shown int64) string {
	a := f.GetAttempt()
	s := fmt.Sprintf("attempt %d ← %s: %s", a.GetNumber(), a.GetDelegate(), outcomeName(a.GetOutcome()))
	switch e := a.GetError(); {
	case e != nil:
		s += fmt.Sprintf(" %s %s", codes.Code(e.GetCode()), quote(e.GetMessage(), errorQuote))
	case a.GetResult() != nil && shown > 0:
		n := f.GetOutputBytes()
		if n == 0 {
			n = shown
		}
		s += fmt.Sprintf(", its output above (%d bytes)", n)
	case a.GetResult() != nil:
		s += " " + quote(answerText(a.GetResult()), 80)
	}
	if n := f.GetNote(); n != "" {
		s += " (" + n + ")"
	}
	return s + fmt.Sprintf(" in %s", round(a.GetEndTime().AsTime().Sub(a.GetStartTime().AsTime())))
}

// discardedLine says that an attempt's streamed output is not the
// answer, and why.
func discardedLine(f *stubbornv1.AttemptFinished) string {
	a := f.GetAttempt()
	why := outcomeName(a.GetOutcome())
	if m := a.GetError().GetMessage(); m != "" {
		why = printable(oneLine(m, errorQuote))
	}
	return fmt.Sprintf("attempt %d output discarded (%s)", a.GetNumber(), why)
}

// output prints the next piece of an attempt's text: the part of it not
// printed yet (a piece seen before, as a watch that reattaches may see
// one, is not printed twice).
func (p *printer) output(path string, o *stubbornv1.AttemptOutput) {
	key := outputKey(path, o.GetAttempt())
	t := p.outputs[key]
	if t == nil {
		if p.outputs == nil {
			p.outputs = map[string]*attemptText{}
		}
		t = &attemptText{}
		p.outputs[key] = t
	}
	text, off := o.GetText(), o.GetOffset()
	if end := off + int64(len(text)); end > t.printed {
		switch {
		case off < t.printed:
			text = text[t.printed-off:]
		case off > t.printed:
			// Text before this piece was never seen here (a watch from
			// -after in the middle of an answer).
			if p.block == key {
				p.endOutput()
			}
			t.resumed = true
		}
		t.printed = end
		p.write(key, path, o, t, text)
	}
	// The tool calls the first choice makes, as they stream: a line
	// "→ name " per call, then its arguments as they come (the other
	// choices are in the run's answer: stubborn get).
	for _, d := range o.GetDeltas() {
		tc := d.GetToolCall()
		if tc == nil || d.GetChoice() != 0 {
			continue
		}
		if t.calls == nil {
			t.calls = map[int32]int64{}
		}
		printed, started := t.calls[tc.GetIndex()]
		var piece string
		if !started {
			if tc.GetName() == "" {
				continue // its name comes first; a watch that joined late sees it in the answer
			}
			piece = "\n→ " + tc.GetName() + " "
		}
		args, off := tc.GetArguments(), d.GetOffset()
		end := off + int64(len(args))
		switch {
		case end <= printed:
			args = ""
		case off < printed:
			args = args[printed-off:]
		case off > printed:
			args = "…" + args
		}
		t.calls[tc.GetIndex()] = max(printed, end)
		p.write(key, path, o, t, piece+args)
	}
}

// write prints text in the attempt's block, line by line.
func (p *printer) write(key, path string, o *stubbornv1.AttemptOutput, t *attemptText, text string) {
	if text == "" {
		return
	}
	if p.block != key {
		p.endOutput()
	}
	for text != "" {
		line, rest, nl := strings.Cut(text, "\n")
		text = rest
		if !p.midLine {
			p.startLine(key, path, o, t, line == "" && nl)
		}
		fmt.Fprint(p.w, printable(line))
		p.midLine = !nl
		if nl {
			fmt.Fprintln(p.w)
		}
	}
}

// startLine begins a line of an attempt's text block: the label on the
// block's first line, a blank as wide on the others; on an empty line,
// with no space after the bar.
func (p *printer) startLine(key, path string, o *stubbornv1.AttemptOutput, t *attemptText, empty bool) {
	write := func(prefix string) {
		if empty && !t.resumed {
			prefix = strings.TrimSuffix(prefix, " ")
		}
		fmt.Fprint(p.w, prefix)
	}
	if p.block != key {
		label := fmt.Sprintf("attempt %d", o.GetAttempt())
		if path != "" {
			label = "[" + path + "] " + label
		}
		if o.GetProvisional() {
			label += " (provisional)"
		}
		label = "      " + label + " │ "
		p.block = key
		p.cont = strings.Repeat(" ", utf8.RuneCountInString(label)-2) + "│ "
		write(label)
	} else {
		write(p.cont)
	}
	if t.resumed {
		fmt.Fprint(p.w, "…")
		t.resumed = false
	}
}

// endOutput ends the open text block, if any, before another line.
func (p *printer) endOutput() {
	if p.midLine {
		fmt.Fprintln(p.w)
		if t := p.outputs[p.block]; t != nil {
			t.resumed = true
		}
	}
	p.block, p.midLine = "", false
}

// printable is a line of a delegate's text as a terminal may show it:
// carriage returns dropped (a CRLF line ends as any other), other control
// characters (an escape sequence) written as Go escapes, tabs kept.
func printable(s string) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return r != '\t' && unicode.IsControl(r) }) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if r == '\t' || !unicode.IsControl(r) {
			b.WriteRune(r)
			continue
		}
		if r == '\r' {
			continue
		}
		q := strconv.QuoteRune(r)
		b.WriteString(q[1 : len(q)-1])
	}
	return b.String()
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
	case "balance":
		return "balance of " + strings.Join(d, ", ")
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
	case *stubbornv1.ControlSpec_Balance:
		b := k.Balance
		var ts []string
		for _, t := range b.GetTargets() {
			if t.Weight != nil {
				ts = append(ts, fmt.Sprintf("%s:%d", t.GetName(), t.GetWeight()))
			} else {
				ts = append(ts, t.GetName())
			}
		}
		strategy := strings.ToLower(strings.TrimPrefix(b.GetStrategy().String(), "BALANCE_STRATEGY_"))
		if b.GetStrategy() == stubbornv1.BalanceStrategy_BALANCE_STRATEGY_UNSPECIFIED {
			strategy = "weighted"
		}
		return "balance (" + strategy + ") of " + strings.Join(ts, ", ")
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
	return fmt.Sprintf("%q", oneLine(s, n))
}

// oneLine is s on one line, cut to n characters.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		s = string(r[:n]) + "…"
	}
	return s
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
		outcome := outcomeName(a.GetOutcome())
		if a.GetOutcome() == stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_UNSPECIFIED && a.GetEndTime() == nil {
			outcome = "running" // in flight: it has no outcome yet
		}
		line := fmt.Sprintf("    #%d %s%s: %s", a.GetNumber(), pathPrefix(a.GetPath()), a.GetDelegate(), outcome)
		if e := a.GetError(); e != nil {
			line += fmt.Sprintf(" %s %s", codes.Code(e.GetCode()), quote(e.GetMessage(), errorQuote))
		}
		if a.GetStartTime() != nil && a.GetEndTime() != nil {
			line += " in " + round(a.GetEndTime().AsTime().Sub(a.GetStartTime().AsTime())).String()
		}
		if r := startWhy(a); r != "" {
			line += " (" + r + ")"
		}
		if a.GetCost() > 0 {
			line += ", cost " + costText(a.GetCost(), a.GetCostEstimated())
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
	if c := st.GetCost(); c != nil {
		fmt.Fprintf(w, "  cost      %s, %d tokens%s\n", costText(c.GetTotal(), c.GetEstimated()), c.GetTotalTokens(), costByDelegate(c))
	}
	if l := st.GetOptions().GetSpendLimit(); l != nil {
		fmt.Fprintf(w, "  limit     %s\n", limitText(l))
	}
	if st.GetResult() != nil {
		fmt.Fprintf(w, "  result    %s\n", quote(answerText(st.GetResult()), errorQuote))
	}
	fmt.Fprintln(w, "  (-json for the whole state: brief, options, each attempt's brief and result)")
}

// costText is a cost as the CLI prints it: six significant digits, "~"
// before an estimate.
func costText(c float64, estimated bool) string {
	s := strconv.FormatFloat(c, 'g', 6, 64)
	if estimated {
		s = "~" + s
	}
	return s
}

// costByDelegate is a run's cost by delegate, in name order, when it has
// more than one: " (a 0.01, judge 0.002)".
func costByDelegate(c *stubbornv1.RunCost) string {
	if len(c.GetByDelegate()) < 2 {
		return ""
	}
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(c.GetByDelegate())) {
		parts = append(parts, name+" "+costText(c.GetByDelegate()[name], false))
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// limitText is a spend limit in words.
func limitText(l *stubbornv1.SpendLimit) string {
	var parts []string
	if l.GetMaxCost() > 0 {
		parts = append(parts, "max_cost "+strconv.FormatFloat(l.GetMaxCost(), 'g', -1, 64))
	}
	if l.GetMaxTotalTokens() > 0 {
		parts = append(parts, fmt.Sprintf("max_total_tokens %d", l.GetMaxTotalTokens()))
	}
	then := "then ask"
	if l.GetOnExhausted() == stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL {
		then = "then fail"
	}
	return strings.Join(parts, ", ") + ", " + then
}

// startWhy says why an attempt started: a balance's pick with its
// figures (Attempt.start_detail), else its start reason's words; "" for
// none.
func startWhy(a *stubbornv1.Attempt) string {
	if d := a.GetStartDetail(); d != "" {
		return d
	}
	return startReasons[a.GetStartReason()]
}

// startReasons say why a race candidate started when it did, or that a
// balance picked it (Attempt.start_reason); other attempts have none.
var startReasons = map[stubbornv1.AttemptStartReason]string{
	stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_BALANCE_PICK:   "picked by the balance",
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
