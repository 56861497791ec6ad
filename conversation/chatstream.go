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

func (e *chatStreamEncoder) chunk(choices []any, usage any) (Event, error) {
	c := map[string]any{"id": e.meta.ID, "object": "chat.completion.chunk", "created": e.meta.Created,
		"model": e.meta.Model, "choices": choices}
	if usage != nil {
		c["usage"] = usage
	}
	b, err := marshal(c)
	return Event{Data: b}, err
}

func (e *chatStreamEncoder) Deltas(ds []*stubbornv1.OutputDelta) ([]Event, error) {
	out := make([]Event, 0, len(ds))
	for _, d := range ds {
		delta := map[string]any{}
		if e.opened == nil {
			e.opened = map[int32]bool{}
		}
		if !e.opened[d.GetChoice()] {
			e.opened[d.GetChoice()], delta["role"] = true, "assistant"
		}
		if tc := d.GetToolCall(); tc != nil {
			call := map[string]any{"index": tc.GetIndex()}
			fn := map[string]any{"arguments": tc.GetArguments()}
			if tc.GetId() != "" {
				call["id"], call["type"] = tc.GetId(), "function"
			}
			if tc.GetName() != "" {
				fn["name"] = tc.GetName()
			}
			call["function"] = fn
			delta["tool_calls"] = []any{call}
		} else {
			delta["content"] = d.GetText()
		}
		e.sent.note(d)
		ev, err := e.chunk([]any{map[string]any{"index": d.GetChoice(), "delta": delta, "finish_reason": nil}}, nil)
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
		delta := map[string]any{}
		if !e.opened[c.GetIndex()] {
			delta["role"] = "assistant"
		}
		ev, err := e.chunk([]any{map[string]any{"index": c.GetIndex(), "delta": delta, "finish_reason": chatFinishReason(c)}}, nil)
		if err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	if e.meta.IncludeUsage {
		ev, err := e.chunk([]any{}, chatUsageOf(r.GetUsage()))
		if err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	return append(out, Event{Data: []byte("[DONE]")}), nil
}
