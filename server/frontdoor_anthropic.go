package server

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Anthropic's Messages (POST /v1/messages) on the same machinery as Chat
// Completions: the request becomes the run's conversation in Chat
// Completions' terms (the system prompt a system message first; the
// messages as they came, text blocks being the same shape in both APIs;
// max_tokens, temperature, top_p, stop_sequences as stop and
// metadata.user_id as user), and the answer is a message, or its stream
// of message_start … message_stop events. The API key comes as X-Api-Key
// (or a bearer token). What has no meaning in the run's terms (tools,
// tool_choice, top_k, thinking, …) is refused by name: the run's delegates
// of other kinds would not get it, and an answer without it would be
// wrong.

func (f *frontDoor) messages(w http.ResponseWriter, r *http.Request) {
	f.serve(w, r, anthropicDialect{})
}

// anthropicDialect is the Messages API.
type anthropicDialect struct{}

// messagesFields are the fields of a Messages request the door takes:
// those it acts on, and those it turns into model parameters.
var messagesFields = []string{"model", "messages", "system", "max_tokens", "stream", "temperature", "top_p", "stop_sequences", "metadata", "stubborn"}

// parse reads a Messages request body.
func (anthropicDialect) parse(body []byte) (*doorRequest, error) {
	all, err := jsonObject(body)
	if err != nil {
		return nil, errors.New("the body is not a Messages request: " + err.Error())
	}
	var unknown []string
	for k := range all {
		if !slices.Contains(messagesFields, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("%s: not taken by Stubborn's Messages door (it takes %s); tools go through /v1/chat/completions to openai delegates",
			strings.Join(unknown, ", "), strings.Join(messagesFields, ", "))
	}
	req := &doorRequest{}
	if req.Model, err = stringField(all, "model"); err != nil {
		return nil, err
	}
	if req.Stream, err = boolField(all, "stream"); err != nil {
		return nil, err
	}
	system, err := systemText(all["system"])
	if err != nil {
		return nil, err
	}
	msgs, err := structMessages(all["messages"])
	if err != nil {
		return nil, err
	}
	for i, m := range msgs {
		if role := m.GetFields()["role"].GetStringValue(); role != "user" && role != "assistant" {
			return nil, fmt.Errorf("messages[%d].role: must be user or assistant (the system prompt is the system field)", i)
		}
	}
	if len(msgs) == 0 {
		return nil, errors.New("messages: at least one message is required")
	}
	if system != "" {
		sm, _ := structpb.NewStruct(map[string]any{"role": "system", "content": system})
		msgs = append([]*structpb.Struct{sm}, msgs...)
	}
	req.messages = msgs
	if req.criteria, err = parseCriteria(all); err != nil {
		return nil, err
	}
	params, err := messagesParams(all)
	if err != nil {
		return nil, err
	}
	if len(params) > 0 {
		if req.params, err = structpb.NewStruct(params); err != nil {
			return nil, err
		}
	}
	return req, nil
}

// systemText is a Messages request's system prompt: a string, or text
// blocks joined by blank lines.
func systemText(v any) (string, error) {
	switch s := v.(type) {
	case nil:
		return "", nil
	case string:
		return s, nil
	case []any:
		parts := make([]string, 0, len(s))
		for i, b := range s {
			block, _ := b.(map[string]any)
			text, isText := block["text"].(string)
			if block["type"] != "text" || !isText {
				return "", fmt.Errorf(`system[%d]: must be a text block ({"type": "text", "text": "…"})`, i)
			}
			parts = append(parts, text)
		}
		return strings.Join(parts, "\n\n"), nil
	default:
		return "", errors.New("system: must be a string or an array of text blocks")
	}
}

// messagesParams are a Messages request's model parameters in Chat
// Completions' names.
func messagesParams(all map[string]any) (map[string]any, error) {
	p := map[string]any{}
	for _, k := range []string{"max_tokens", "temperature", "top_p"} {
		if v, set := all[k]; set && v != nil {
			n, isNumber := v.(float64)
			if !isNumber || n < 0 {
				return nil, fmt.Errorf("%s: must be a number, not negative", k)
			}
			p[k] = n
		}
	}
	if v, set := all["stop_sequences"]; set && v != nil {
		list, isList := v.([]any)
		for _, s := range list {
			if _, isText := s.(string); !isText {
				isList = false
			}
		}
		if !isList {
			return nil, errors.New("stop_sequences: must be an array of strings")
		}
		p["stop"] = list
	}
	if v, set := all["metadata"]; set && v != nil {
		m, isObject := v.(map[string]any)
		if !isObject {
			return nil, errors.New("metadata: must be an object")
		}
		if u, set := m["user_id"]; set && u != nil {
			user, isText := u.(string)
			if !isText {
				return nil, errors.New("metadata.user_id: must be a string")
			}
			p["user"] = user
		}
	}
	return p, nil
}

// errorBody is Anthropic's error shape; its type is named by status.
func (anthropicDialect) errorBody(f failure) any {
	kind := "api_error"
	switch {
	case f.status == http.StatusBadRequest, f.status == http.StatusConflict, f.status == http.StatusRequestTimeout, f.status == http.StatusUnprocessableEntity:
		kind = "invalid_request_error"
	case f.status == http.StatusRequestEntityTooLarge:
		kind = "request_too_large" // Anthropic's own type for its 413
	case f.status == http.StatusUnauthorized:
		kind = "authentication_error"
	case f.status == http.StatusForbidden:
		kind = "permission_error"
	case f.status == http.StatusNotFound:
		kind = "not_found_error"
	case f.status == http.StatusGatewayTimeout:
		kind = "timeout_error"
	case f.status == http.StatusTooManyRequests:
		kind = "rate_limit_error"
	case f.code == "unavailable":
		kind = "overloaded_error"
	}
	return map[string]any{"type": "error", "error": map[string]any{"type": kind, "message": f.msg}}
}

// begin is message_start and the text block's content_block_start.
func (anthropicDialect) begin(a *answering) {
	a.sse("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": a.runID, "type": "message", "role": "assistant", "model": a.req.Model, "content": []any{},
		"stop_reason": nil, "stop_sequence": nil, "usage": map[string]int64{"input_tokens": 0, "output_tokens": 0},
	}}, true)
	a.sse("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]any{"type": "text", "text": ""}}, true)
}

// textDelta is a content_block_delta of text.
type textDelta struct {
	Type  string `json:"type"`
	Index int    `json:"index"`
	Delta struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"delta"`
}

func (anthropicDialect) delta(a *answering, text string) {
	d := textDelta{Type: "content_block_delta"}
	d.Delta.Type, d.Delta.Text = "text_delta", text
	a.sse("content_block_delta", d, false)
}

// end is content_block_stop, message_delta with the stop reason and the
// usage of every attempt, and message_stop.
func (anthropicDialect) end(a *answering, st *stubbornv1.ControlState) {
	all, _ := usage(st)
	a.sse("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0}, true)
	a.sse("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": anthropicStopReason(st), "stop_sequence": nil},
		"usage": map[string]int64{"input_tokens": all["prompt_tokens"], "output_tokens": all["completion_tokens"]}}, true)
	a.sse("message_stop", map[string]any{"type": "message_stop"}, false)
}

// whole is a message: the winner's text, the usage of every attempt, and
// the run (the stubborn field).
func (anthropicDialect) whole(a *answering, st *stubbornv1.ControlState) any {
	all, winner := usage(st)
	return map[string]any{
		"id": a.runID, "type": "message", "role": "assistant", "model": a.req.Model,
		"content":     []any{map[string]any{"type": "text", "text": st.GetResult().GetText()}},
		"stop_reason": anthropicStopReason(st), "stop_sequence": nil,
		"usage":    map[string]int64{"input_tokens": all["prompt_tokens"], "output_tokens": all["completion_tokens"]},
		"stubborn": a.stubbornPart(st, winner),
	}
}

// streamError is an error event naming the run, which the SDKs raise.
func (anthropicDialect) streamError(a *answering, msg string) {
	a.sse("error", map[string]any{"type": "error", "error": map[string]any{"type": "api_error", "message": msg, "run_id": a.runID}}, false)
}

// anthropicStopReason is the winner's reason to stop in the Messages API's
// words (an OpenAI model's finish_reason translated), else end_turn.
func anthropicStopReason(st *stubbornv1.ControlState) string {
	switch s := stopReason(st); s {
	case "", "stop":
		return "end_turn"
	case "length":
		return "max_tokens"
	case "tool_calls", "function_call":
		return "tool_use"
	case "content_filter":
		return "refusal"
	default:
		return s
	}
}
