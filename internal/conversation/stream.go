package conversation

import (
	"sort"
	"strings"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// accumulator builds a streamed answer's choices from pieces routed by
// their indexes. Texts grow in builders, not by string concatenation, so a
// long answer of small pieces costs linear time.
type accumulator struct {
	choices map[int32]*partial
	usage   *stubbornv1.Usage
	model   string
}

type partial struct {
	text    strings.Builder
	refusal strings.Builder
	calls   []*partialCall // by call index
	choice  stubbornv1.Choice
}

type partialCall struct {
	id, name string
	args     strings.Builder
	// input is Anthropic's content_block_start input, the arguments when
	// no input_json_delta came.
	input string
}

func (a *accumulator) choice(i int) (*partial, error) {
	if i < 0 || i >= MaxChoices {
		return nil, fieldErr("choices.index", "%d is out of range (0 to %d)", i, MaxChoices-1)
	}
	if a.choices == nil {
		a.choices = map[int32]*partial{}
	}
	p := a.choices[int32(i)]
	if p == nil {
		p = &partial{}
		a.choices[int32(i)] = p
	}
	return p, nil
}

func (a *accumulator) text(i int, s string) (*stubbornv1.OutputDelta, error) {
	p, err := a.choice(i)
	if err != nil || s == "" {
		return nil, err
	}
	d := &stubbornv1.OutputDelta{Choice: int32(i), Kind: &stubbornv1.OutputDelta_Text{Text: s}, Offset: int64(p.text.Len())}
	p.text.WriteString(s)
	return d, nil
}

func (a *accumulator) call(i, k int, id, name, args string) (*stubbornv1.OutputDelta, *partialCall, error) {
	p, err := a.choice(i)
	if err != nil {
		return nil, nil, err
	}
	if k < 0 || k >= MaxToolCalls {
		return nil, nil, fieldErr("tool_calls.index", "%d is out of range (0 to %d)", k, MaxToolCalls-1)
	}
	for len(p.calls) <= k {
		p.calls = append(p.calls, nil)
	}
	c := p.calls[k]
	if c == nil {
		c = &partialCall{}
		p.calls[k] = c
	}
	if id != "" {
		c.id = id
	}
	if name != "" {
		c.name = name
	}
	d := &stubbornv1.OutputDelta{Choice: int32(i), Offset: int64(c.args.Len()),
		Kind: &stubbornv1.OutputDelta_ToolCall{ToolCall: &stubbornv1.ToolCallDelta{Index: int32(k), Id: id, Name: name, Arguments: args}}}
	c.args.WriteString(args)
	return d, c, nil
}

// result is the answer so far, choices by index.
func (a *accumulator) result() *stubbornv1.Result {
	idx := make([]int32, 0, len(a.choices))
	for i := range a.choices {
		idx = append(idx, i)
	}
	sort.Slice(idx, func(x, y int) bool { return idx[x] < idx[y] })
	choices := make([]*stubbornv1.Choice, 0, len(idx))
	for _, i := range idx {
		p := a.choices[i]
		m := &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT, Refusal: p.refusal.String()}
		if p.text.Len() > 0 || len(p.calls) == 0 {
			m.Content = []*stubbornv1.ContentPart{textPart(p.text.String())}
		}
		for _, c := range p.calls {
			if c == nil {
				continue // an index the stream skipped
			}
			args := c.args.String()
			if args == "" {
				args = c.input
			}
			m.ToolCalls = append(m.ToolCalls, &stubbornv1.ToolCall{Id: c.id, Name: c.name, Arguments: args})
		}
		choices = append(choices, &stubbornv1.Choice{Index: i, Message: m, FinishReason: p.choice.FinishReason,
			NativeFinishReason: p.choice.NativeFinishReason, StopSequence: p.choice.StopSequence})
	}
	return resultOf(choices, a.usage, a.model)
}

// sent is what a stream encoder has written of each choice, so End writes
// only the rest of the result.
type sent struct {
	text  map[int32]int
	calls map[[2]int32]int // (choice, call) → argument bytes; present once started
}

func (s *sent) note(d *stubbornv1.OutputDelta) {
	if s.text == nil {
		s.text, s.calls = map[int32]int{}, map[[2]int32]int{}
	}
	if tc := d.GetToolCall(); tc != nil {
		s.calls[[2]int32{d.GetChoice(), tc.GetIndex()}] += len(tc.GetArguments())
	} else {
		s.text[d.GetChoice()] += len(d.GetText())
	}
}

// rest is the deltas that carry what of c the stream has not: the rest of
// its text and of each call.
func (s *sent) rest(c *stubbornv1.Choice) []*stubbornv1.OutputDelta {
	var out []*stubbornv1.OutputDelta
	i := c.GetIndex()
	if text := Text(c.GetMessage()); len(text) > s.text[i] {
		out = append(out, &stubbornv1.OutputDelta{Choice: i, Kind: &stubbornv1.OutputDelta_Text{Text: text[s.text[i]:]}})
	}
	for k, call := range c.GetMessage().GetToolCalls() {
		n, started := s.calls[[2]int32{i, int32(k)}]
		d := &stubbornv1.ToolCallDelta{Index: int32(k)}
		switch {
		case !started:
			d.Id, d.Name, d.Arguments = call.GetId(), call.GetName(), call.GetArguments()
		case len(call.GetArguments()) > n:
			d.Arguments = call.GetArguments()[n:]
		default:
			continue
		}
		out = append(out, &stubbornv1.OutputDelta{Choice: i, Kind: &stubbornv1.OutputDelta_ToolCall{ToolCall: d}})
	}
	return out
}
