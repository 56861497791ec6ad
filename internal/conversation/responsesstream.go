package conversation

import (
	"encoding/json"
	"strings"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// NewStreamEncoder writes a Responses API event stream of choice 0, as the
// API orders it: response.created, response.in_progress; per output item
// (by first appearance) response.output_item.added, then for a message
// response.content_part.added and response.output_text.delta…, for a
// function call response.function_call_arguments.delta…; an item is done
// (…text.done, content_part.done or …arguments.done, then
// response.output_item.done) when the next one is added or the answer
// ends; last response.completed, or response.incomplete, with the whole
// response. Every event names its type and carries a sequence_number from
// 0. The encoder it returns also has Fail(code, message string), which ends
// the stream with an error.
func (Responses) NewStreamEncoder(m Meta) StreamEncoder { return &responsesStreamEncoder{meta: m} }

// responsesStreamEncoder writes a Responses API event stream; Fail ends one
// with an error.
type responsesStreamEncoder struct {
	meta     Meta
	seq      int64
	started  bool
	ended    bool
	items    []*streamItem
	open     *streamItem
	calls    map[int32]*streamItem
	messages int // message items so far, for their ids
	sent     sent
}

// streamItem is one output item as the stream has written it.
type streamItem struct {
	index   int
	id      string
	message bool
	text    strings.Builder
	call    int32
	callID  string
	name    string
	args    strings.Builder
}

// The events written for every streamed piece, typed (a map per piece costs
// several times the allocations).
type (
	textDeltaEvent struct {
		Type           string `json:"type"`
		SequenceNumber int64  `json:"sequence_number"`
		ItemID         string `json:"item_id"`
		OutputIndex    int    `json:"output_index"`
		ContentIndex   int    `json:"content_index"`
		Delta          string `json:"delta"`
		Logprobs       []any  `json:"logprobs"`
	}
	argsDeltaEvent struct {
		Type           string `json:"type"`
		SequenceNumber int64  `json:"sequence_number"`
		ItemID         string `json:"item_id"`
		OutputIndex    int    `json:"output_index"`
		Delta          string `json:"delta"`
	}
)

// emit is an event of v, whose type and sequence_number fields are set here
// (v is a map, or a pointer to an event struct with those fields).
func (e *responsesStreamEncoder) emit(typ string, v any) (Event, error) {
	seq := e.seq
	e.seq++
	switch x := v.(type) {
	case map[string]any:
		x["type"], x["sequence_number"] = typ, seq
	case *textDeltaEvent:
		x.Type, x.SequenceNumber = typ, seq
	case *argsDeltaEvent:
		x.Type, x.SequenceNumber = typ, seq
	}
	b, err := marshal(v)
	return Event{Name: typ, Data: b}, err
}

func (e *responsesStreamEncoder) start() ([]Event, error) {
	if e.started {
		return nil, nil
	}
	e.started = true
	b := responseOf(e.meta, "in_progress", nil)
	created, err := e.emit("response.created", map[string]any{"response": b})
	if err != nil {
		return nil, err
	}
	progress, err := e.emit("response.in_progress", map[string]any{"response": b})
	return []Event{created, progress}, err
}

// item is it as output_item.done and the final response carry it.
func (it *streamItem) item(status string) any {
	if it.message {
		return messageItem{ID: it.id, Type: "message", Status: status, Role: "assistant", Content: []any{newOutputText(it.text.String())}}
	}
	return callItem{ID: it.id, Type: "function_call", Status: status, CallID: it.callID, Name: it.name, Arguments: it.args.String()}
}

// add opens a new output item, closing the open one.
func (e *responsesStreamEncoder) add(it *streamItem) ([]Event, error) {
	out, err := e.closeOpen("completed")
	if err != nil {
		return nil, err
	}
	it.index = len(e.items)
	e.items = append(e.items, it)
	e.open = it
	var added map[string]any
	if it.message {
		added = map[string]any{"output_index": it.index, "item": messageItem{ID: it.id, Type: "message", Status: "in_progress", Role: "assistant", Content: []any{}}}
	} else {
		added = map[string]any{"output_index": it.index, "item": callItem{ID: it.id, Type: "function_call", Status: "in_progress", CallID: it.callID, Name: it.name}}
	}
	ev, err := e.emit("response.output_item.added", added)
	if err != nil {
		return nil, err
	}
	out = append(out, ev)
	if it.message {
		ev, err := e.emit("response.content_part.added", map[string]any{"item_id": it.id, "output_index": it.index,
			"content_index": 0, "part": newOutputText("")})
		if err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	return out, nil
}

// closeOpen writes the open item's done events, with its status.
func (e *responsesStreamEncoder) closeOpen(status string) ([]Event, error) {
	it := e.open
	if it == nil {
		return nil, nil
	}
	e.open = nil
	var names []string
	var bodies []map[string]any
	if it.message {
		text := it.text.String()
		names = []string{"response.output_text.done", "response.content_part.done"}
		bodies = []map[string]any{
			{"item_id": it.id, "output_index": it.index, "content_index": 0, "text": text, "logprobs": []any{}},
			{"item_id": it.id, "output_index": it.index, "content_index": 0, "part": newOutputText(text)},
		}
	} else {
		names = []string{"response.function_call_arguments.done"}
		bodies = []map[string]any{{"item_id": it.id, "output_index": it.index, "name": it.name, "arguments": it.args.String()}}
	}
	names = append(names, "response.output_item.done")
	bodies = append(bodies, map[string]any{"output_index": it.index, "item": it.item(status)})
	out := make([]Event, 0, len(names))
	for i, name := range names {
		ev, err := e.emit(name, bodies[i])
		if err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	return out, nil
}

// Deltas writes ds (choice 0's: the Responses API has no n). Text after a
// function call is a new message item; a call's arguments that continue
// after another item began are written to the call's own output_index.
func (e *responsesStreamEncoder) Deltas(ds []*stubbornv1.OutputDelta) ([]Event, error) {
	out, err := e.start()
	if err != nil {
		return nil, err
	}
	for _, d := range ds {
		if d.GetChoice() != 0 {
			return nil, fieldErr("choice", "%d: the Responses API answers one choice", d.GetChoice())
		}
		evs, err := e.delta(d)
		if err != nil {
			return nil, err
		}
		e.sent.note(d)
		out = append(out, evs...)
	}
	return out, nil
}

func (e *responsesStreamEncoder) delta(d *stubbornv1.OutputDelta) ([]Event, error) {
	var out []Event
	if tc := d.GetToolCall(); tc != nil {
		it := e.calls[tc.GetIndex()]
		if it == nil {
			if e.calls == nil {
				e.calls = map[int32]*streamItem{}
			}
			it = &streamItem{id: callItemID(e.meta.ID, tc.GetIndex()), call: tc.GetIndex(), callID: tc.GetId(), name: tc.GetName()}
			e.calls[tc.GetIndex()] = it
			evs, err := e.add(it)
			if err != nil {
				return nil, err
			}
			out = evs
		}
		if tc.GetArguments() == "" {
			return out, nil
		}
		it.args.WriteString(tc.GetArguments())
		ev, err := e.emit("response.function_call_arguments.delta", &argsDeltaEvent{ItemID: it.id, OutputIndex: it.index, Delta: tc.GetArguments()})
		return append(out, ev), err
	}
	if d.GetText() == "" {
		return nil, nil
	}
	if e.open == nil || !e.open.message {
		it := &streamItem{id: messageID(e.meta.ID, e.messages), message: true}
		e.messages++
		evs, err := e.add(it)
		if err != nil {
			return nil, err
		}
		out = evs
	}
	e.open.text.WriteString(d.GetText())
	ev, err := e.emit("response.output_text.delta", &textDeltaEvent{ItemID: e.open.id, OutputIndex: e.open.index, Delta: d.GetText(), Logprobs: []any{}})
	return append(out, ev), err
}

// End writes what of r's choice 0 the deltas did not carry, closes the open
// item, and ends with response.completed (or response.incomplete, with
// incomplete_details) carrying the whole response: the items as streamed,
// a refusal as a message item of its own.
func (e *responsesStreamEncoder) End(r *stubbornv1.Result) ([]Event, error) {
	c := answerOf(r)
	status, incomplete := responseStatus(c)
	out, err := e.Deltas(e.sent.rest(c))
	if err != nil {
		return nil, err
	}
	if len(e.items) == 0 && c.GetMessage().GetRefusal() == "" {
		// An empty answer is an empty message, as EncodeResponse has it.
		if out, err = e.emptyMessage(out); err != nil {
			return nil, err
		}
	}
	closing, err := e.closeOpen(itemStatus(status))
	if err != nil {
		return nil, err
	}
	out = append(out, closing...)
	b := responseOf(e.meta, status, r.GetUsage())
	b.IncompleteDetails = incomplete
	b.Output = e.output(itemStatus(status))
	if refusal := c.GetMessage().GetRefusal(); refusal != "" {
		evs, err := e.refusal(refusal, itemStatus(status))
		if err != nil {
			return nil, err
		}
		out = append(out, evs...)
		b.Output = append(b.Output, messageItem{ID: messageID(e.meta.ID, e.messages-1), Type: "message", Status: itemStatus(status),
			Role: "assistant", Content: []any{refusalPart{Type: "refusal", Refusal: refusal}}})
	}
	name := "response.completed"
	if status == "incomplete" {
		name = "response.incomplete"
	}
	e.ended = true
	ev, err := e.emit(name, map[string]any{"response": b})
	return append(out, ev), err
}

func (e *responsesStreamEncoder) emptyMessage(out []Event) ([]Event, error) {
	it := &streamItem{id: messageID(e.meta.ID, e.messages), message: true}
	e.messages++
	evs, err := e.add(it)
	return append(out, evs...), err
}

// refusal writes a refusal as a message item of its own.
func (e *responsesStreamEncoder) refusal(refusal, status string) ([]Event, error) {
	id, index := messageID(e.meta.ID, e.messages), len(e.items)
	e.messages++
	part := refusalPart{Type: "refusal", Refusal: refusal}
	steps := []struct {
		name string
		body map[string]any
	}{
		{"response.output_item.added", map[string]any{"output_index": index, "item": messageItem{ID: id, Type: "message", Status: "in_progress", Role: "assistant", Content: []any{}}}},
		{"response.content_part.added", map[string]any{"item_id": id, "output_index": index, "content_index": 0, "part": refusalPart{Type: "refusal"}}},
		{"response.refusal.delta", map[string]any{"item_id": id, "output_index": index, "content_index": 0, "delta": refusal}},
		{"response.refusal.done", map[string]any{"item_id": id, "output_index": index, "content_index": 0, "refusal": refusal}},
		{"response.content_part.done", map[string]any{"item_id": id, "output_index": index, "content_index": 0, "part": part}},
		{"response.output_item.done", map[string]any{"output_index": index, "item": messageItem{ID: id, Type: "message", Status: status, Role: "assistant", Content: []any{part}}}},
	}
	out := make([]Event, 0, len(steps))
	for _, s := range steps {
		ev, err := e.emit(s.name, s.body)
		if err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	return out, nil
}

// output is the items as the stream wrote them. Items closed before the end
// are completed; the last one has the response's status.
func (e *responsesStreamEncoder) output(last string) []any {
	out := make([]any, 0, len(e.items)+1)
	for i, it := range e.items {
		status := "completed"
		if i == len(e.items)-1 {
			status = last
		}
		out = append(out, it.item(status))
	}
	return out
}

// Fail ends a stream whose answer cannot finish: an `error` event, which
// both official SDKs raise as an error (the openai npm SDK and openai-go
// raise any event whose data has a top-level "error" field, so it carries
// one beside the event's own code and message), then response.failed with
// the response so far and its error, for a reader of the raw events. code
// is a short machine word (such as "stream_interrupted"); message says
// what happened. It writes nothing after the stream ended.
func (e *responsesStreamEncoder) Fail(code, message string) ([]Event, error) {
	if e.ended {
		return nil, nil
	}
	out, err := e.start()
	if err != nil {
		return nil, err
	}
	e.ended = true
	e.open = nil
	ev, err := e.emit("error", map[string]any{"code": code, "message": message, "param": nil,
		"error": map[string]any{"type": "server_error", "code": code, "message": message, "param": nil}})
	if err != nil {
		return nil, err
	}
	out = append(out, ev)
	b := responseOf(e.meta, "failed", nil)
	b.Error = &responseError{Code: code, Message: message}
	b.Output = e.output("incomplete")
	ev, err = e.emit("response.failed", map[string]any{"response": b})
	return append(out, ev), err
}

// NewStreamDecoder reads a Responses API event stream: text and function
// call arguments from their delta events (routed by output_index), each
// call's id and name from its output_item.added, the finish and usage from
// response.completed or response.incomplete (the end). An `error` event
// and response.failed are a *StreamError.
func (Responses) NewStreamDecoder() StreamDecoder { return &responsesStreamDecoder{} }

type responsesStreamDecoder struct {
	acc   accumulator
	calls map[int]int // output_index → tool call index
}

type responsesEventIn struct {
	Type        string        `json:"type"`
	OutputIndex int           `json:"output_index"`
	Delta       string        `json:"delta"`
	Arguments   *string       `json:"arguments"`
	Item        *outputItemIn `json:"item"`
	Response    *responseIn   `json:"response"`
	Code        string        `json:"code"`
	Message     string        `json:"message"`
	Error       *struct {
		Code    string `json:"code"`
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func (d *responsesStreamDecoder) Next(ev Event) ([]*stubbornv1.OutputDelta, bool, error) {
	if !depthOK(ev.Data) {
		return nil, false, fieldErr("", "an event nests more than %d levels deep", MaxDepth)
	}
	var e responsesEventIn
	if err := json.Unmarshal(ev.Data, &e); err != nil {
		return nil, false, fieldErr("", "an event is not JSON: %v", err)
	}
	if e.Type == "" {
		e.Type = ev.Name
	}
	p, _ := d.acc.choice(0)
	switch e.Type {
	case "error":
		se := &StreamError{Type: e.Code, Message: e.Message}
		if e.Error != nil {
			se.Type, se.Message = firstOf(e.Error.Code, e.Error.Type, se.Type), firstOf(e.Error.Message, se.Message)
		}
		if se.Type == "" {
			se.Type = "error"
		}
		return nil, false, se
	case "response.failed":
		se := &StreamError{Type: "failed"}
		if e.Response != nil && e.Response.Error != nil {
			se.Type, se.Message = e.Response.Error.Code, e.Response.Error.Message
		}
		return nil, false, se
	case "response.created", "response.in_progress":
		if e.Response != nil {
			d.acc.model = e.Response.Model
		}
	case "response.output_item.added":
		if e.Item == nil || e.Item.Type != "function_call" {
			break
		}
		if d.calls == nil {
			d.calls = map[int]int{}
		}
		if _, dup := d.calls[e.OutputIndex]; dup {
			return nil, false, fieldErr("output_index", "item %d added twice", e.OutputIndex)
		}
		k := len(d.calls)
		d.calls[e.OutputIndex] = k
		dl, _, err := d.acc.call(0, k, e.Item.CallID, e.Item.Name, e.Item.Arguments)
		if err != nil {
			return nil, false, err
		}
		return []*stubbornv1.OutputDelta{dl}, false, nil
	case "response.output_text.delta":
		dl, err := d.acc.text(0, e.Delta)
		if err != nil || dl == nil {
			return nil, false, err
		}
		return []*stubbornv1.OutputDelta{dl}, false, nil
	case "response.refusal.delta":
		p.refusal.WriteString(e.Delta)
	case "response.function_call_arguments.delta", "response.function_call_arguments.done":
		k, ok := d.calls[e.OutputIndex]
		if !ok {
			return nil, false, fieldErr("output_index", "%s for item %d, which is no function_call", e.Type, e.OutputIndex)
		}
		args := e.Delta
		if e.Type == "response.function_call_arguments.done" {
			// done carries the whole arguments: only what no delta did.
			if e.Arguments == nil || p.calls[k].args.Len() >= len(*e.Arguments) || !strings.HasPrefix(*e.Arguments, p.calls[k].args.String()) {
				break
			}
			args = (*e.Arguments)[p.calls[k].args.Len():]
		}
		dl, _, err := d.acc.call(0, k, "", "", args)
		if err != nil {
			return nil, false, err
		}
		return []*stubbornv1.OutputDelta{dl}, false, nil
	case "response.completed", "response.incomplete":
		if e.Response != nil {
			if e.Response.Model != "" {
				d.acc.model = e.Response.Model
			}
			d.acc.usage = e.Response.Usage.typed()
			if p.text.Len() == 0 && len(p.calls) == 0 && len(e.Response.Output) > 0 {
				// A server that streams no deltas still ends with the
				// whole response: its output is the answer.
				r, err := resultOfOutput(*e.Response, e.Response.Output)
				if err != nil {
					return nil, false, err
				}
				m := r.GetChoices()[0].GetMessage()
				if _, err := d.acc.text(0, Text(m)); err != nil {
					return nil, false, err
				}
				for k, c := range m.GetToolCalls() {
					if _, _, err := d.acc.call(0, k, c.GetId(), c.GetName(), c.GetArguments()); err != nil {
						return nil, false, err
					}
				}
				p.refusal.WriteString(m.GetRefusal())
			}
			p.choice.FinishReason, p.choice.NativeFinishReason = finishOf(e.Response.Status, e.Response.IncompleteDetails, len(p.calls) > 0)
		}
		return nil, true, nil
	}
	return nil, false, nil
}

func (d *responsesStreamDecoder) Result() *stubbornv1.Result { return d.acc.result() }

func firstOf(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}
