package conversation

import (
	"encoding/json"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// NewStreamDecoder reads a Messages event stream: message_start,
// content_block_start/delta/stop, message_delta, message_stop (the end),
// ping, error.
func (Messages) NewStreamDecoder() StreamDecoder { return &messagesStreamDecoder{} }

type messagesStreamDecoder struct {
	acc   accumulator
	usage stubbornv1.Usage
	calls map[int]int // content block index → tool call index
}

type messagesEvent struct {
	Type    string `json:"type"`
	Index   int    `json:"index"`
	Message *struct {
		Model string          `json:"model"`
		Usage *anthropicUsage `json:"usage"`
	} `json:"message"`
	ContentBlock *anthropicBlock `json:"content_block"`
	Delta        *struct {
		Type         string `json:"type"`
		Text         string `json:"text"`
		PartialJSON  string `json:"partial_json"`
		StopReason   string `json:"stop_reason"`
		StopSequence string `json:"stop_sequence"`
	} `json:"delta"`
	Usage *anthropicUsage `json:"usage"`
	Error *struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func (d *messagesStreamDecoder) Next(ev Event) ([]*stubbornv1.OutputDelta, bool, error) {
	if !depthOK(ev.Data) {
		return nil, false, fieldErr("", "an event nests more than %d levels deep", MaxDepth)
	}
	var e messagesEvent
	if err := json.Unmarshal(ev.Data, &e); err != nil {
		return nil, false, fieldErr("", "an event is not JSON: %v", err)
	}
	if e.Type == "" {
		e.Type = ev.Name
	}
	p, _ := d.acc.choice(0) // Anthropic answers one choice
	switch e.Type {
	case "error":
		if e.Error == nil {
			return nil, false, &StreamError{Type: "error"}
		}
		return nil, false, &StreamError{Type: e.Error.Type, Message: e.Error.Message}
	case "message_start":
		if e.Message != nil {
			d.acc.model = e.Message.Model
			if e.Message.Usage != nil {
				e.Message.Usage.into(&d.usage)
				d.acc.usage = &d.usage
			}
		}
	case "content_block_start":
		if e.ContentBlock == nil || e.ContentBlock.Type != "tool_use" {
			break // text arrives in deltas; thinking is not carried
		}
		if d.calls == nil {
			d.calls = map[int]int{}
		}
		if _, dup := d.calls[e.Index]; dup {
			return nil, false, fieldErr("index", "content block %d started twice", e.Index)
		}
		k := len(d.calls)
		d.calls[e.Index] = k
		dl, c, err := d.acc.call(0, k, e.ContentBlock.ID, e.ContentBlock.Name, "")
		if err != nil {
			return nil, false, err
		}
		c.input = "{}"
		if !isNull(e.ContentBlock.Input) {
			c.input = compactJSON(e.ContentBlock.Input)
		}
		return []*stubbornv1.OutputDelta{dl}, false, nil
	case "content_block_delta":
		if e.Delta == nil {
			break
		}
		switch e.Delta.Type {
		case "text_delta":
			dl, err := d.acc.text(0, e.Delta.Text)
			if err != nil || dl == nil {
				return nil, false, err
			}
			return []*stubbornv1.OutputDelta{dl}, false, nil
		case "input_json_delta":
			k, ok := d.calls[e.Index]
			if !ok {
				return nil, false, fieldErr("index", "input_json_delta for block %d, which is no tool_use", e.Index)
			}
			dl, _, err := d.acc.call(0, k, "", "", e.Delta.PartialJSON)
			if err != nil {
				return nil, false, err
			}
			return []*stubbornv1.OutputDelta{dl}, false, nil
		}
	case "message_delta":
		if e.Delta != nil && e.Delta.StopReason != "" {
			p.choice.FinishReason, p.choice.NativeFinishReason = anthropicFinish[e.Delta.StopReason], e.Delta.StopReason
			p.choice.StopSequence = e.Delta.StopSequence
		}
		if e.Usage != nil {
			e.Usage.into(&d.usage)
			d.acc.usage = &d.usage
		}
	case "message_stop":
		return nil, true, nil
	}
	return nil, false, nil
}

func (d *messagesStreamDecoder) Result() *stubbornv1.Result { return d.acc.result() }

// NewStreamEncoder writes a Messages event stream of choice 0.
func (Messages) NewStreamEncoder(m Meta) StreamEncoder {
	return &messagesStreamEncoder{meta: m, open: -1}
}

type messagesStreamEncoder struct {
	meta    Meta
	sent    sent
	started bool
	block   int   // the next content block's index
	open    int   // the open block's index, -1 for none
	call    int32 // the tool call the open block carries, -1 for text
}

func event(name string, v map[string]any) (Event, error) {
	v["type"] = name
	b, err := marshal(v)
	return Event{Name: name, Data: b}, err
}

func (e *messagesStreamEncoder) start() ([]Event, error) {
	if e.started {
		return nil, nil
	}
	e.started = true
	ev, err := event("message_start", map[string]any{"message": map[string]any{"id": e.meta.ID, "type": "message",
		"role": "assistant", "model": e.meta.Model, "content": []any{}, "stop_reason": nil, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": 0, "output_tokens": 0}}})
	return []Event{ev}, err
}

func (e *messagesStreamEncoder) closeBlock() ([]Event, error) {
	if e.open < 0 {
		return nil, nil
	}
	ev, err := event("content_block_stop", map[string]any{"index": e.open})
	e.open = -1
	return []Event{ev}, err
}

func (e *messagesStreamEncoder) openBlock(block map[string]any, call int32) ([]Event, error) {
	out, err := e.closeBlock()
	if err != nil {
		return nil, err
	}
	e.open, e.call = e.block, call
	e.block++
	ev, err := event("content_block_start", map[string]any{"index": e.open, "content_block": block})
	return append(out, ev), err
}

func (e *messagesStreamEncoder) Deltas(ds []*stubbornv1.OutputDelta) ([]Event, error) {
	out, err := e.start()
	if err != nil {
		return nil, err
	}
	for _, d := range ds {
		if d.GetChoice() != 0 {
			return nil, fieldErr("choice", "%d: the Messages API answers one choice", d.GetChoice())
		}
		var evs []Event
		if tc := d.GetToolCall(); tc != nil {
			if e.open < 0 || e.call != tc.GetIndex() {
				if evs, err = e.openBlock(map[string]any{"type": "tool_use", "id": tc.GetId(), "name": tc.GetName(),
					"input": map[string]any{}}, tc.GetIndex()); err != nil {
					return nil, err
				}
			}
			if tc.GetArguments() != "" {
				ev, err := event("content_block_delta", map[string]any{"index": e.open,
					"delta": map[string]any{"type": "input_json_delta", "partial_json": tc.GetArguments()}})
				if err != nil {
					return nil, err
				}
				evs = append(evs, ev)
			}
		} else if d.GetText() != "" {
			if e.open < 0 || e.call != -1 {
				if evs, err = e.openBlock(map[string]any{"type": "text", "text": ""}, -1); err != nil {
					return nil, err
				}
			}
			ev, err := event("content_block_delta", map[string]any{"index": e.open,
				"delta": map[string]any{"type": "text_delta", "text": d.GetText()}})
			if err != nil {
				return nil, err
			}
			evs = append(evs, ev)
		}
		e.sent.note(d)
		out = append(out, evs...)
	}
	return out, nil
}

func (e *messagesStreamEncoder) End(r *stubbornv1.Result) ([]Event, error) {
	c := choicesOf(r)[0]
	out, err := e.Deltas(e.sent.rest(c))
	if err != nil {
		return nil, err
	}
	closing, err := e.closeBlock()
	if err != nil {
		return nil, err
	}
	out = append(out, closing...)
	var stopSeq any
	if c.GetStopSequence() != "" {
		stopSeq = c.GetStopSequence()
	}
	md, err := event("message_delta", map[string]any{"delta": map[string]any{"stop_reason": anthropicStopReason(c),
		"stop_sequence": stopSeq}, "usage": anthropicUsageOf(r.GetUsage())})
	if err != nil {
		return nil, err
	}
	stop, err := event("message_stop", map[string]any{})
	return append(out, md, stop), err
}
