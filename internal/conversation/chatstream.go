package conversation

import (
	"encoding/json"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// NewStreamDecoder reads Chat Completions chunks: `data: {...}` events,
// then `data: [DONE]`.
func (Chat) NewStreamDecoder() StreamDecoder { return &chatStreamDecoder{} }

type chatStreamDecoder struct{ acc accumulator }

func (d *chatStreamDecoder) Next(ev Event) ([]*stubbornv1.OutputDelta, bool, error) {
	if string(ev.Data) == "[DONE]" {
		return nil, true, nil
	}
	if !depthOK(ev.Data) {
		return nil, false, fieldErr("", "a chunk nests more than %d levels deep", MaxDepth)
	}
	var ch chatResponse
	if err := json.Unmarshal(ev.Data, &ch); err != nil {
		return nil, false, fieldErr("", "a chunk is not JSON: %v", err)
	}
	if ch.Error != nil {
		return nil, false, &StreamError{Type: ch.Error.Type, Message: ch.Error.Message}
	}
	if ch.Model != "" {
		d.acc.model = ch.Model
	}
	if ch.Usage != nil {
		d.acc.usage = ch.Usage.typed()
	}
	var out []*stubbornv1.OutputDelta
	for _, c := range ch.Choices { // routed by index: n > 1 interleaves
		p, err := d.acc.choice(c.Index)
		if err != nil {
			return nil, false, err
		}
		if c.Delta.Content != nil {
			if dl, err := d.acc.text(c.Index, *c.Delta.Content); err != nil {
				return nil, false, err
			} else if dl != nil {
				out = append(out, dl)
			}
		}
		p.refusal.WriteString(c.Delta.Refusal)
		for _, tc := range c.Delta.ToolCalls {
			k := 0
			if tc.Index != nil {
				k = *tc.Index
			}
			dl, _, err := d.acc.call(c.Index, k, tc.ID, tc.Function.Name, tc.Function.Arguments)
			if err != nil {
				return nil, false, err
			}
			out = append(out, dl)
		}
		if c.FinishReason != "" {
			p.choice.FinishReason, p.choice.NativeFinishReason = chatFinish[c.FinishReason], c.FinishReason
		}
	}
	return out, false, nil
}

func (d *chatStreamDecoder) Result() *stubbornv1.Result { return d.acc.result() }

// NewStreamEncoder writes Chat Completions chunks.
func (Chat) NewStreamEncoder(m Meta) StreamEncoder { return &chatStreamEncoder{meta: m} }

type chatStreamEncoder struct {
	meta   Meta
	sent   sent
	opened map[int32]bool // choices whose first chunk (with the role) is out
}

// The chunk's wire shape, typed: a chunk is written for every streamed
// piece, and structs encode at a fraction of maps' allocations.
type (
	chatChunk struct {
		ID      string        `json:"id"`
		Object  string        `json:"object"`
		Created int64         `json:"created"`
		Model   string        `json:"model"`
		Choices []chunkChoice `json:"choices"`
		Usage   any           `json:"usage,omitempty"`
	}
	chunkChoice struct {
		Index int32      `json:"index"`
		Delta chunkDelta `json:"delta"`
		// FinishReason is null until the choice's last chunk.
		FinishReason *string `json:"finish_reason"`
	}
	chunkDelta struct {
		Role      string          `json:"role,omitempty"`
		Content   *string         `json:"content,omitempty"`
		ToolCalls []chunkToolCall `json:"tool_calls,omitempty"`
	}
	chunkToolCall struct {
		Index    int32         `json:"index"`
		ID       string        `json:"id,omitempty"`
		Type     string        `json:"type,omitempty"`
		Function chunkFunction `json:"function"`
	}
	chunkFunction struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	}
)

func (e *chatStreamEncoder) chunk(choices []chunkChoice, usage any) (Event, error) {
	b, err := marshal(chatChunk{ID: e.meta.ID, Object: "chat.completion.chunk", Created: e.meta.Created,
		Model: e.meta.Model, Choices: choices, Usage: usage})
	return Event{Data: b}, err
}

// role is the role a choice's first chunk carries, then none.
func (e *chatStreamEncoder) role(choice int32) string {
	if e.opened == nil {
		e.opened = map[int32]bool{}
	}
	if e.opened[choice] {
		return ""
	}
	e.opened[choice] = true
	return "assistant"
}

func (e *chatStreamEncoder) Deltas(ds []*stubbornv1.OutputDelta) ([]Event, error) {
	out := make([]Event, 0, len(ds))
	for _, d := range ds {
		delta := chunkDelta{Role: e.role(d.GetChoice())}
		if tc := d.GetToolCall(); tc != nil {
			call := chunkToolCall{Index: tc.GetIndex(), Function: chunkFunction{Name: tc.GetName(), Arguments: tc.GetArguments()}}
			if tc.GetId() != "" {
				call.ID, call.Type = tc.GetId(), "function"
			}
			delta.ToolCalls = []chunkToolCall{call}
		} else {
			text := d.GetText()
			delta.Content = &text
		}
		e.sent.note(d)
		ev, err := e.chunk([]chunkChoice{{Index: d.GetChoice(), Delta: delta}}, nil)
		if err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	return out, nil
}

func (e *chatStreamEncoder) End(r *stubbornv1.Result) ([]Event, error) {
	var out []Event
	for _, c := range choicesOf(r) {
		evs, err := e.Deltas(e.sent.rest(c))
		if err != nil {
			return nil, err
		}
		out = append(out, evs...)
		finish := chatFinishReason(c)
		ev, err := e.chunk([]chunkChoice{{Index: c.GetIndex(), Delta: chunkDelta{Role: e.role(c.GetIndex())}, FinishReason: &finish}}, nil)
		if err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	if e.meta.IncludeUsage {
		ev, err := e.chunk([]chunkChoice{}, chatUsageOf(r.GetUsage()))
		if err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	return append(out, Event{Data: []byte("[DONE]")}), nil
}
