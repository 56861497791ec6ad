package conversation

import (
	"encoding/json"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

var anthropicFinish = map[string]stubbornv1.FinishReason{
	"end_turn": stubbornv1.FinishReason_FINISH_REASON_STOP, "stop_sequence": stubbornv1.FinishReason_FINISH_REASON_STOP_SEQUENCE,
	"max_tokens": stubbornv1.FinishReason_FINISH_REASON_LENGTH, "model_context_window_exceeded": stubbornv1.FinishReason_FINISH_REASON_LENGTH,
	"tool_use": stubbornv1.FinishReason_FINISH_REASON_TOOL_CALLS, "refusal": stubbornv1.FinishReason_FINISH_REASON_CONTENT_FILTER,
	"pause_turn": stubbornv1.FinishReason_FINISH_REASON_PAUSE,
}

// anthropicStopReason is a choice's stop_reason in Anthropic's words: its
// native one when that is Anthropic's and means the same.
func anthropicStopReason(c *stubbornv1.Choice) string {
	if n := c.GetNativeFinishReason(); n != "" && anthropicFinish[n] == c.GetFinishReason() {
		return n
	}
	switch c.GetFinishReason() {
	case stubbornv1.FinishReason_FINISH_REASON_STOP_SEQUENCE:
		if c.GetStopSequence() != "" {
			return "stop_sequence"
		}
	case stubbornv1.FinishReason_FINISH_REASON_LENGTH:
		return "max_tokens"
	case stubbornv1.FinishReason_FINISH_REASON_TOOL_CALLS:
		return "tool_use"
	case stubbornv1.FinishReason_FINISH_REASON_CONTENT_FILTER:
		return "refusal"
	case stubbornv1.FinishReason_FINISH_REASON_PAUSE:
		return "pause_turn"
	}
	return "end_turn"
}

type anthropicUsage struct {
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
}

// into adds what u reports to t (a stream reports some in message_start,
// the rest in message_delta).
func (u *anthropicUsage) into(t *stubbornv1.Usage) {
	if u.InputTokens != nil || u.CacheCreationInputTokens != nil || u.CacheReadInputTokens != nil {
		in, cw, cr := deref(u.InputTokens), deref(u.CacheCreationInputTokens), deref(u.CacheReadInputTokens)
		t.InputTokens, t.CacheWriteTokens, t.CacheReadTokens = in+cw+cr, cw, cr
	}
	if u.OutputTokens != nil {
		t.OutputTokens = *u.OutputTokens
	}
	t.TotalTokens = t.InputTokens + t.OutputTokens
}

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

func anthropicUsageOf(u *stubbornv1.Usage) map[string]any {
	out := map[string]any{"input_tokens": max(0, u.GetInputTokens()-u.GetCacheReadTokens()-u.GetCacheWriteTokens()),
		"output_tokens": u.GetOutputTokens()}
	if u.GetCacheWriteTokens() > 0 {
		out["cache_creation_input_tokens"] = u.GetCacheWriteTokens()
	}
	if u.GetCacheReadTokens() > 0 {
		out["cache_read_input_tokens"] = u.GetCacheReadTokens()
	}
	return out
}

type anthropicBlock struct {
	Type  string          `json:"type"`
	Text  string          `json:"text"`
	ID    string          `json:"id"`
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
}

type anthropicMessage struct {
	Model        string           `json:"model"`
	Content      []anthropicBlock `json:"content"`
	StopReason   string           `json:"stop_reason"`
	StopSequence string           `json:"stop_sequence"`
	Usage        *anthropicUsage  `json:"usage"`
}

// DecodeResponse reads a whole Messages answer: text and tool_use blocks
// (thinking and server-tool blocks are the model's workings, not its
// answer, and are not carried).
func (Messages) DecodeResponse(body []byte) (*stubbornv1.Result, error) {
	if !depthOK(body) {
		return nil, fieldErr("", "the answer nests more than %d levels deep", MaxDepth)
	}
	var a anthropicMessage
	if err := json.Unmarshal(body, &a); err != nil {
		return nil, fieldErr("", "the answer is not a Messages response: %v", err)
	}
	if len(a.Content) > MaxParts {
		return nil, fieldErr("content", "has more than %d blocks", MaxParts)
	}
	m := &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT}
	text := ""
	for _, b := range a.Content {
		switch b.Type {
		case "text":
			text += b.Text
		case "tool_use":
			if len(m.ToolCalls) >= MaxToolCalls {
				return nil, fieldErr("content", "has more than %d tool_use blocks", MaxToolCalls)
			}
			args := "{}"
			if !isNull(b.Input) {
				args = compactJSON(b.Input)
			}
			m.ToolCalls = append(m.ToolCalls, &stubbornv1.ToolCall{Id: b.ID, Name: b.Name, Arguments: args})
		}
	}
	if text != "" || len(m.ToolCalls) == 0 {
		m.Content = []*stubbornv1.ContentPart{textPart(text)}
	}
	var usage *stubbornv1.Usage
	if a.Usage != nil {
		usage = &stubbornv1.Usage{}
		a.Usage.into(usage)
	}
	c := &stubbornv1.Choice{Message: m, FinishReason: anthropicFinish[a.StopReason], NativeFinishReason: a.StopReason,
		StopSequence: a.StopSequence}
	return resultOf([]*stubbornv1.Choice{c}, usage, a.Model), nil
}

// EncodeResponse writes a whole Messages answer of r's choice 0 (the
// Messages API has one; its door never asks for more).
func (Messages) EncodeResponse(r *stubbornv1.Result, m Meta) ([]byte, error) {
	c := choicesOf(r)[0]
	content := []any{}
	if text := Text(c.GetMessage()); text != "" || len(c.GetMessage().GetToolCalls()) == 0 {
		content = append(content, map[string]any{"type": "text", "text": text})
	}
	for j, call := range c.GetMessage().GetToolCalls() {
		input, ok := argumentsObject(call.GetArguments())
		if !ok {
			return nil, fieldErr(at("choices[0].message.tool_calls", j)+".arguments", "is not a JSON object, which Anthropic's tool_use input must be")
		}
		content = append(content, map[string]any{"type": "tool_use", "id": call.GetId(), "name": call.GetName(), "input": input})
	}
	var stopSeq any
	if c.GetStopSequence() != "" {
		stopSeq = c.GetStopSequence()
	}
	return marshal(map[string]any{"id": m.ID, "type": "message", "role": "assistant", "model": m.Model,
		"content": content, "stop_reason": anthropicStopReason(c), "stop_sequence": stopSeq,
		"usage": anthropicUsageOf(r.GetUsage())})
}
