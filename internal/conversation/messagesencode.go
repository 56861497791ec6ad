package conversation

import (
	"strings"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// EncodeRequest writes a Messages request body: system and developer texts
// in the top-level system (after the entry's), consecutive TOOL messages and
// a USER message right after them merged into one user turn (tool_result
// blocks first), tool calls as tool_use blocks.
func (Messages) EncodeRequest(c *stubbornv1.Conversation, e Entry, stream bool) ([]byte, error) {
	if problems := Carry(AnthropicMessages, c, DropOf(c)); len(problems) > 0 {
		return nil, problems
	}
	own := c.GetApi() == AnthropicMessages
	o := optionsOf(c)
	out := map[string]any{}
	if own {
		putExtra(out, o.GetExtra())
	}
	out["model"] = e.Model
	system, systemBlocks := []string{}, []any{}
	if e.System != "" {
		system = append(system, e.System)
		systemBlocks = append(systemBlocks, map[string]any{"type": "text", "text": e.System})
	}
	blocksWanted := false // a system block carries extra fields or came as blocks
	messages := []any{}
	var turn map[string]any // the user turn tool results and a following user message merge into
	for _, m := range c.GetMessages() {
		switch m.GetRole() {
		case stubbornv1.ChatRole_CHAT_ROLE_SYSTEM, stubbornv1.ChatRole_CHAT_ROLE_DEVELOPER:
			blocksWanted = blocksWanted || (own && m.GetContentAsParts())
			for _, p := range m.GetContent() {
				if p.GetImage() != nil {
					continue // Carry refused it unless dropped
				}
				system = append(system, p.GetText())
				b := map[string]any{"type": "text", "text": p.GetText()}
				if own && p.GetExtra() != nil {
					putExtra(b, p.GetExtra())
					blocksWanted = true
				}
				systemBlocks = append(systemBlocks, b)
			}
			turn = nil
		case stubbornv1.ChatRole_CHAT_ROLE_TOOL:
			block := map[string]any{"type": "tool_result", "tool_use_id": m.GetToolCallId()}
			if own {
				putExtra(block, m.GetExtra())
			}
			if m.GetIsError() {
				block["is_error"] = true
			}
			if len(m.GetContent()) > 0 {
				block["content"] = anthropicContent(m, own, false)
			}
			if turn == nil {
				turn = map[string]any{"role": "user", "content": []any{}}
				messages = append(messages, turn)
			}
			turn["content"] = append(turn["content"].([]any), block)
		case stubbornv1.ChatRole_CHAT_ROLE_USER:
			if turn != nil {
				turn["content"] = append(turn["content"].([]any), anthropicContent(m, own, true).([]any)...)
				turn = nil
				continue
			}
			messages = append(messages, map[string]any{"role": "user", "content": anthropicContent(m, own, false)})
		case stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT:
			turn = nil
			messages = append(messages, map[string]any{"role": "assistant", "content": anthropicAssistant(m, own)})
		}
	}
	out["messages"] = messages
	switch {
	case blocksWanted && len(systemBlocks) > 0:
		out["system"] = systemBlocks
	case len(system) > 0:
		out["system"] = strings.Join(system, "\n\n")
	}
	maxTokens := e.MaxTokens
	if o.MaxTokens != nil {
		maxTokens = o.GetMaxTokens()
	}
	if o.MaxCompletionTokens != nil {
		maxTokens = o.GetMaxCompletionTokens()
	}
	if maxTokens <= 0 {
		maxTokens = defaultAnthropicMaxTokens
	}
	out["max_tokens"] = maxTokens
	if o.Temperature != nil {
		out["temperature"] = o.GetTemperature()
	} else if e.Temperature != nil {
		out["temperature"] = *e.Temperature
	}
	if o.TopP != nil {
		out["top_p"] = o.GetTopP()
	}
	if o.TopK != nil {
		out["top_k"] = o.GetTopK()
	}
	if len(o.GetStop()) > 0 {
		out["stop_sequences"] = o.GetStop()
	}
	if o.GetUser() != "" {
		out["metadata"] = map[string]any{"user_id": o.GetUser()}
	}
	if len(o.GetTools()) > 0 {
		tools := make([]any, len(o.GetTools()))
		for i, t := range o.GetTools() {
			tool := map[string]any{}
			if own {
				putExtra(tool, t.GetExtra())
			}
			tool["name"] = t.GetName()
			if t.GetDescription() != "" {
				tool["description"] = t.GetDescription()
			}
			tool["input_schema"] = map[string]any{"type": "object"}
			if t.GetParameters() != nil {
				tool["input_schema"] = t.GetParameters().AsMap()
			}
			tools[i] = tool
		}
		out["tools"] = tools
	}
	if tc := anthropicToolChoice(o); tc != nil {
		out["tool_choice"] = tc
	}
	delete(out, "stream")
	if stream {
		out["stream"] = true
	}
	return marshal(out)
}

// anthropicToolChoice is tool_choice with parallel_tool_calls: false as
// disable_parallel_tool_use (meaningless, so left out, with none).
func anthropicToolChoice(o *stubbornv1.ModelOptions) map[string]any {
	tc := map[string]any{}
	switch o.GetToolChoice().GetMode() {
	case stubbornv1.ToolChoiceMode_TOOL_CHOICE_MODE_AUTO:
		tc["type"] = "auto"
	case stubbornv1.ToolChoiceMode_TOOL_CHOICE_MODE_NONE:
		return map[string]any{"type": "none"}
	case stubbornv1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED:
		tc["type"] = "any"
	case stubbornv1.ToolChoiceMode_TOOL_CHOICE_MODE_NAMED:
		tc["type"], tc["name"] = "tool", o.GetToolChoice().GetName()
	}
	if o.ParallelToolCalls != nil && !o.GetParallelToolCalls() && len(o.GetTools()) > 0 {
		if tc["type"] == nil {
			tc["type"] = "auto"
		}
		tc["disable_parallel_tool_use"] = true
	}
	if tc["type"] == nil {
		return nil
	}
	return tc
}

// anthropicContent is a message's content as a string (a lone text part
// not sent as parts) or blocks; blocks when asked for.
func anthropicContent(m *stubbornv1.ChatMessage, own, blocks bool) any {
	parts := m.GetContent()
	if !blocks && len(parts) == 1 && !m.GetContentAsParts() && parts[0].GetImage() == nil && (!own || parts[0].GetExtra() == nil) {
		return parts[0].GetText()
	}
	out := make([]any, 0, len(parts))
	for _, p := range parts {
		var b map[string]any
		if img := p.GetImage(); img != nil {
			src := imageSource(img.GetUrl())
			if src == nil {
				continue // Carry refused it unless dropped
			}
			b = map[string]any{"type": "image", "source": src}
		} else {
			b = map[string]any{"type": "text", "text": p.GetText()}
		}
		if own {
			putExtra(b, p.GetExtra())
		}
		out = append(out, b)
	}
	return out
}

func anthropicAssistant(m *stubbornv1.ChatMessage, own bool) any {
	if len(m.GetToolCalls()) == 0 {
		return anthropicContent(m, own, false)
	}
	out := []any{}
	for _, p := range m.GetContent() {
		if p.GetImage() == nil && p.GetText() != "" { // Anthropic refuses empty text blocks
			b := map[string]any{"type": "text", "text": p.GetText()}
			if own {
				putExtra(b, p.GetExtra())
			}
			out = append(out, b)
		}
	}
	for _, c := range m.GetToolCalls() {
		input, ok := argumentsObject(c.GetArguments())
		if !ok {
			continue // Carry refused it unless dropped
		}
		out = append(out, map[string]any{"type": "tool_use", "id": c.GetId(), "name": c.GetName(), "input": input})
	}
	return out
}
