package controls

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Sizes. Every text a run keeps comes from outside (a delegate's answer or
// error, a judge's reason, an analyst's advice) and is bounded here, so
// that a run's events fit the store's messages and its state gRPC's.
const (
	// MaxReasonBytes bounds a failure's reason, an attempt's error message
	// and a verdict's note: longer ones are cut (Cut). Each joins every
	// later brief of a retry-with-learning, so their sum over a run's
	// attempts stays below a store message.
	MaxReasonBytes = 4 << 10
	// MaxStateBytes bounds a run's state as it is sent (GetRun, ListRuns,
	// run_started, run_finished, the snapshots saved), besides its accepted
	// result (bounded by the server's max_result_bytes, at most 2 MiB): so
	// the whole stays below gRPC's default 4 MiB message limit
	// (BoundState).
	MaxStateBytes = 768 << 10
	// MaxDataDepth bounds how deeply a result's structured data nests: at
	// most this many objects and lists inside one another (BoundResult).
	// Each level of a google.protobuf.Value costs decoders up to three
	// nested messages (Value, Struct, the map's entry), and a result
	// reaches a client inside up to six more (WatchRunResponse, RunEvent,
	// RunFinished, ControlState, Attempt, Result): 6 + 1 + 3·24 = 79,
	// under the recursion limit of 100 of the C++, Java and Python (upb)
	// protobuf runtimes, so clients in every language can read every run,
	// and far under protobuf-go's 10,000, which a 3,400-deep answer
	// exceeded (issue 30: every listing failed). Real answers nest a few
	// levels: model usage, REST resources.
	MaxDataDepth = 24
)

// Cut returns s if it is at most max bytes long; else its longest prefix
// of at most max bytes that ends on a character boundary, followed by a
// mark that says how many bytes were cut. The result may be longer than
// max by the mark's length.
func Cut(s string, max int) string {
	if len(s) <= max {
		return s
	}
	i := max
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + fmt.Sprintf(" …[%d bytes cut]", len(s)-i)
}

// stateCuts are the lengths the texts of a state's attempt log and failure
// history are cut to, in turn, until the state fits (BoundState).
var stateCuts = []int{16 << 10, 4 << 10, 1 << 10, 256, 0}

// BoundState returns st if its encoding, its accepted result aside, is at
// most limit bytes. Otherwise
// it returns a copy whose attempt log and failure history have their texts
// (briefs, results, error messages, reasons, advice) cut, to shorter and
// shorter lengths until the copy fits, and whose results' data are dropped
// once a result is cut: the run's events keep every text whole. The run's
// own brief, control, options and accepted result are never cut. st is
// not changed.
func BoundState(st *stubbornv1.ControlState, limit int) *stubbornv1.ControlState {
	result := proto.Size(st.GetResult())
	if st == nil || proto.Size(st)-result <= limit {
		return st
	}
	var out *stubbornv1.ControlState
	for _, n := range stateCuts {
		out = proto.CloneOf(st)
		for _, a := range out.GetAttemptLog() {
			cutAttempt(a, n)
		}
		for _, f := range out.GetFailureHistory() {
			cutFailure(f, n)
		}
		if proto.Size(out)-result <= limit {
			return out
		}
	}
	return out
}

// BoundEvent returns ev if its encoding is at most limit bytes. Otherwise
// it returns a copy whose texts are cut, to shorter and shorter lengths,
// until it fits: the state it carries (BoundState), an attempt's brief,
// result and error message, a failure's texts and the next brief. A store
// whose messages are smaller than a run's largest event keeps the event
// cut rather than refuse it, and the run goes on. ev is not changed.
func BoundEvent(ev *stubbornv1.RunEvent, limit int) *stubbornv1.RunEvent {
	if proto.Size(ev) <= limit {
		return ev
	}
	var out *stubbornv1.RunEvent
	for _, n := range stateCuts {
		out = proto.CloneOf(ev)
		switch k := out.GetKind().(type) {
		case *stubbornv1.RunEvent_RunStarted:
			k.RunStarted.State = cutState(k.RunStarted.GetState(), n)
		case *stubbornv1.RunEvent_RunFinished:
			k.RunFinished.State = cutState(k.RunFinished.GetState(), n)
		case *stubbornv1.RunEvent_AttemptStarted:
			cutAttempt(k.AttemptStarted.GetAttempt(), n)
		case *stubbornv1.RunEvent_AttemptFinished:
			cutAttempt(k.AttemptFinished.GetAttempt(), n)
			k.AttemptFinished.Note = Cut(k.AttemptFinished.GetNote(), n)
		case *stubbornv1.RunEvent_FailureAnalyzed:
			cutFailure(k.FailureAnalyzed.GetFailure(), n)
			k.FailureAnalyzed.NextBrief = Cut(k.FailureAnalyzed.GetNextBrief(), n)
		case *stubbornv1.RunEvent_DecisionRequested:
			k.DecisionRequested.Reason = Cut(k.DecisionRequested.GetReason(), n)
			for _, f := range k.DecisionRequested.GetFailureHistory() {
				cutFailure(f, n)
			}
		}
		if proto.Size(out) <= limit {
			return out
		}
	}
	return out
}

// cutState returns st with the texts of its attempt log and failure
// history cut to n bytes; past the first cut, its accepted result too,
// and past the third its brief (an event that carries them must fit a
// store message).
func cutState(st *stubbornv1.ControlState, n int) *stubbornv1.ControlState {
	if st == nil {
		return nil
	}
	for _, a := range st.GetAttemptLog() {
		cutAttempt(a, n)
	}
	for _, f := range st.GetFailureHistory() {
		cutFailure(f, n)
	}
	if n < stateCuts[0] {
		cutResult(st.GetResult(), n)
	}
	if n < stateCuts[2] {
		st.TaskBrief = Cut(st.GetTaskBrief(), n)
	}
	return st
}

func cutAttempt(a *stubbornv1.Attempt, n int) {
	if a == nil {
		return
	}
	a.Brief = Cut(a.GetBrief(), n)
	cutResult(a.GetResult(), n)
	if e := a.GetError(); e != nil {
		e.Message = Cut(e.GetMessage(), n)
	}
}

// cutResult cuts r's texts to n bytes (its text, its choices' texts,
// refusals and tool calls' arguments) and drops its data and its
// choices' extra fields when any of them is longer.
func cutResult(r *stubbornv1.Result, n int) {
	if r == nil {
		return
	}
	over := len(r.GetText()) > n || r.GetData() != nil && proto.Size(r.GetData()) > n
	for _, c := range r.GetChoices() {
		over = over || choiceOver(c.GetMessage(), n)
	}
	if !over {
		return
	}
	r.Text = Cut(r.GetText(), n)
	r.Data = nil
	for _, c := range r.GetChoices() {
		m := c.GetMessage()
		if m == nil {
			continue
		}
		m.Extra, m.Refusal = nil, Cut(m.GetRefusal(), n)
		for _, p := range m.GetContent() {
			p.Extra = nil
			switch k := p.GetKind().(type) {
			case *stubbornv1.ContentPart_Text:
				k.Text = Cut(k.Text, n)
			case *stubbornv1.ContentPart_Image:
				k.Image.Url = Cut(k.Image.GetUrl(), n)
			}
		}
		for _, tc := range m.GetToolCalls() {
			tc.Arguments = Cut(tc.GetArguments(), n)
		}
	}
}

// choiceOver reports whether a text of m, or its extra fields, are over n
// bytes.
func choiceOver(m *stubbornv1.ChatMessage, n int) bool {
	if len(m.GetRefusal()) > n || m.GetExtra() != nil && proto.Size(m.GetExtra()) > n {
		return true
	}
	for _, p := range m.GetContent() {
		if len(p.GetText()) > n || len(p.GetImage().GetUrl()) > n || p.GetExtra() != nil && proto.Size(p.GetExtra()) > n {
			return true
		}
	}
	for _, tc := range m.GetToolCalls() {
		if len(tc.GetArguments()) > n {
			return true
		}
	}
	return false
}

func cutFailure(f *stubbornv1.FailureRecord, n int) {
	if f == nil {
		return
	}
	f.Reason = Cut(f.GetReason(), n)
	f.Analysis = Cut(f.GetAnalysis(), n)
	f.AnalysisError = Cut(f.GetAnalysisError(), n)
	f.NotRetriedReason = Cut(f.GetNotRetriedReason(), n)
}

// BoundResult returns r if its data, and its choices' extra fields, nest
// at most MaxDataDepth objects and lists deep (DataDepth). Otherwise it
// returns a copy whose data keeps each object or list found at that depth
// as a string: its JSON text (object keys sorted). Nothing of the answer
// is lost, and its shallow fields (a model's finish_reason, say) stay
// where they were; a delegate's answer is data, and refusing it for its
// shape would throw away an answer that may have cost a model call (and
// be retried at that cost again). r is not changed.
func BoundResult(r *stubbornv1.Result) *stubbornv1.Result {
	deep := r.GetData() != nil && DataDepth(r.GetData()) > MaxDataDepth
	for _, c := range r.GetChoices() {
		eachExtra(c.GetMessage(), func(s *structpb.Struct) {
			deep = deep || DataDepth(structpb.NewStructValue(s)) > MaxDataDepth
		})
	}
	if !deep {
		return r
	}
	out := proto.CloneOf(r)
	if out.GetData() != nil {
		out.Data = boundValue(out.GetData(), MaxDataDepth)
	}
	for _, c := range out.GetChoices() {
		eachExtra(c.GetMessage(), func(s *structpb.Struct) {
			// Changed in place: the object itself is one level.
			for k, f := range s.GetFields() {
				s.Fields[k] = boundValue(f, MaxDataDepth-1)
			}
		})
	}
	return out
}

// eachExtra calls f with each extra field (a Struct) of m and its parts
// that is set.
func eachExtra(m *stubbornv1.ChatMessage, f func(*structpb.Struct)) {
	if m.GetExtra() != nil {
		f(m.GetExtra())
	}
	for _, p := range m.GetContent() {
		if p.GetExtra() != nil {
			f(p.GetExtra())
		}
	}
}

// DataDepth is how many objects and lists v nests inside one another: 0
// for a scalar, 1 for an object of scalars.
func DataDepth(v *structpb.Value) int {
	d := 0
	switch k := v.GetKind().(type) {
	case *structpb.Value_StructValue:
		for _, f := range k.StructValue.GetFields() {
			d = max(d, DataDepth(f))
		}
		return d + 1
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			d = max(d, DataDepth(e))
		}
		return d + 1
	}
	return 0
}

// boundValue changes v in place so that it nests at most depth objects and
// lists: each one below that is replaced by its JSON text. It returns v.
func boundValue(v *structpb.Value, depth int) *structpb.Value {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StructValue:
		if depth <= 0 {
			return jsonText(v)
		}
		for key, f := range k.StructValue.GetFields() {
			k.StructValue.Fields[key] = boundValue(f, depth-1)
		}
	case *structpb.Value_ListValue:
		if depth <= 0 {
			return jsonText(v)
		}
		for i, e := range k.ListValue.GetValues() {
			k.ListValue.Values[i] = boundValue(e, depth-1)
		}
	}
	return v
}

// jsonText is v as a string value of its JSON.
func jsonText(v *structpb.Value) *structpb.Value {
	b, err := json.Marshal(v.AsInterface())
	if err != nil {
		return structpb.NewStringValue(fmt.Sprintf("[a value of %d bytes that could not be encoded as JSON: %v]", proto.Size(v), err))
	}
	return structpb.NewStringValue(string(b))
}
