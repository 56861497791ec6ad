package conversation

import (
	"encoding/json"
	"strings"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Messages is the codec of Anthropic's Messages API.
type Messages struct{}

var _ Codec = Messages{}

// API is AnthropicMessages.
func (Messages) API() stubbornv1.ConversationAPI { return AnthropicMessages }

var (
	messagesRequestFields = set("model", "messages", "system", "max_tokens", "temperature", "top_p", "top_k",
		"stop_sequences", "stream", "metadata", "tools", "tool_choice", "stubborn")
	anthropicToolFields = set("name", "description", "input_schema", "type")
)

// argumentsObject decodes a tool call's arguments for Anthropic's input:
// "" is no arguments ({}); anything but a JSON object is not.
func argumentsObject(args string) (map[string]any, bool) {
	if strings.TrimSpace(args) == "" {
		return map[string]any{}, true
	}
	var m map[string]any
	if !depthOK([]byte(args)) || json.Unmarshal([]byte(args), &m) != nil || m == nil {
		return nil, false
	}
	return m, true
}

// DecodeRequest reads a Messages request body. A user turn's tool_result
// blocks become TOOL messages (in order), its other blocks USER messages.
func (Messages) DecodeRequest(body []byte) (*Request, error) {
	o, err := object(body, "")
	if err != nil {
		if !depthOK(body) {
			return nil, err
		}
		return nil, fieldErr("", "the body must be a JSON object")
	}
	c := &stubbornv1.Conversation{Api: AnthropicMessages}
	req := &Request{Conversation: c}
	if req.Model, err = str(o["model"], "model"); err != nil {
		return nil, err
	}
	if b, err := boolean(o["stream"], "stream"); err != nil {
		return nil, err
	} else if b != nil {
		req.Stream, req.IncludeUsage = *b, *b
	}
	if !isNull(o["stubborn"]) {
		req.Stubborn = o["stubborn"]
	}
	if !isNull(o["system"]) {
		parts, asParts, err := decodeBlocks(o["system"], "system", false)
		if err != nil {
			return nil, err
		}
		c.Messages = append(c.Messages, &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_SYSTEM, Content: parts, ContentAsParts: asParts})
	}
	msgs, err := array(o["messages"], "messages", MaxMessages)
	if err != nil {
		return nil, err
	}
	for i, m := range msgs {
		typed, err := decodeAnthropicMessage(m, at("messages", i))
		if err != nil {
			return nil, err
		}
		c.Messages = append(c.Messages, typed...)
	}
	if len(c.Messages) > MaxMessages {
		return nil, fieldErr("messages", "are %d messages once tool results are split out, more than %d", len(c.Messages), MaxMessages)
	}
	if c.Options, err = decodeMessagesOptions(o); err != nil {
		return nil, err
	}
	return req, nil
}

func decodeAnthropicMessage(r json.RawMessage, field string) ([]*stubbornv1.ChatMessage, error) {
	o, err := object(r, field)
	if err != nil {
		return nil, err
	}
	role, err := str(o["role"], join(field, "role"))
	if err != nil {
		return nil, err
	}
	for k := range o {
		if k != "role" && k != "content" {
			return nil, fieldErr(join(field, k), "is not carried")
		}
	}
	cf := join(field, "content")
	switch role {
	case "assistant":
		return decodeAssistantTurn(o["content"], cf)
	case "user":
	default:
		return nil, fieldErr(join(field, "role"), "%q is not user or assistant", role)
	}
	var s string
	if json.Unmarshal(o["content"], &s) == nil {
		return []*stubbornv1.ChatMessage{{Role: stubbornv1.ChatRole_CHAT_ROLE_USER, Content: []*stubbornv1.ContentPart{textPart(s)}}}, nil
	}
	blocks, err := array(o["content"], cf, MaxParts)
	if err != nil {
		return nil, fieldErr(cf, "must be a string or an array of blocks")
	}
	var out []*stubbornv1.ChatMessage
	var user *stubbornv1.ChatMessage // the user message being filled, after the last tool result
	for j, b := range blocks {
		bf := at(cf, j)
		bo, err := object(b, bf)
		if err != nil {
			return nil, err
		}
		if typ, _ := str(bo["type"], ""); typ == "tool_result" {
			tm, err := decodeToolResult(bo, bf)
			if err != nil {
				return nil, err
			}
			out, user = append(out, tm), nil
			continue
		}
		part, err := decodeBlock(bo, bf, true)
		if err != nil {
			return nil, err
		}
		if user == nil {
			user = &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_USER, ContentAsParts: true}
			out = append(out, user)
		}
		user.Content = append(user.Content, part)
	}
	if len(out) == 0 { // an empty array stays an empty user turn
		out = append(out, &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_USER, ContentAsParts: true})
	}
	return out, nil
}

func decodeToolResult(bo raw, bf string) (*stubbornv1.ChatMessage, error) {
	m := &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_TOOL}
	var err error
	if m.ToolCallId, err = str(bo["tool_use_id"], join(bf, "tool_use_id")); err != nil {
		return nil, err
	}
	if m.ToolCallId == "" {
		return nil, fieldErr(join(bf, "tool_use_id"), "is required")
	}
	if b, err := boolean(bo["is_error"], join(bf, "is_error")); err != nil {
		return nil, err
	} else if b != nil {
		m.IsError = *b
	}
	if !isNull(bo["content"]) {
		if m.Content, m.ContentAsParts, err = decodeBlocks(bo["content"], join(bf, "content"), true); err != nil {
			return nil, err
		}
	}
	if m.Extra, err = extraOf(bo, set("type", "tool_use_id", "is_error", "content"), bf); err != nil {
		return nil, err
	}
	return m, nil
}

func decodeAssistantTurn(r json.RawMessage, cf string) ([]*stubbornv1.ChatMessage, error) {
	m := &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT}
	var s string
	if json.Unmarshal(r, &s) == nil {
		m.Content = []*stubbornv1.ContentPart{textPart(s)}
		return []*stubbornv1.ChatMessage{m}, nil
	}
	blocks, err := array(r, cf, MaxParts)
	if err != nil {
		return nil, fieldErr(cf, "must be a string or an array of blocks")
	}
	m.ContentAsParts = true
	for j, b := range blocks {
		bf := at(cf, j)
		bo, err := object(b, bf)
		if err != nil {
			return nil, err
		}
		if typ, _ := str(bo["type"], ""); typ == "tool_use" {
			if len(m.ToolCalls) >= MaxToolCalls {
				return nil, fieldErr(bf, "is more than %d tool_use blocks", MaxToolCalls)
			}
			for k := range bo {
				if !set("type", "id", "name", "input")[k] {
					return nil, fieldErr(join(bf, k), "is not carried")
				}
			}
			call := &stubbornv1.ToolCall{}
			if call.Id, err = str(bo["id"], join(bf, "id")); err != nil {
				return nil, err
			}
			if call.Name, err = str(bo["name"], join(bf, "name")); err != nil {
				return nil, err
			}
			if _, err := object(bo["input"], join(bf, "input")); err != nil {
				return nil, err
			}
			call.Arguments = compactJSON(bo["input"])
			if isNull(bo["input"]) {
				call.Arguments = "{}"
			}
			m.ToolCalls = append(m.ToolCalls, call)
			continue
		}
		part, err := decodeBlock(bo, bf, false)
		if err != nil {
			return nil, err
		}
		m.Content = append(m.Content, part)
	}
	return []*stubbornv1.ChatMessage{m}, nil
}

// decodeBlocks reads a string or an array of text (and, where images may
// be, image) blocks.
func decodeBlocks(r json.RawMessage, field string, images bool) ([]*stubbornv1.ContentPart, bool, error) {
	var s string
	if json.Unmarshal(r, &s) == nil {
		return []*stubbornv1.ContentPart{textPart(s)}, false, nil
	}
	blocks, err := array(r, field, MaxParts)
	if err != nil {
		return nil, false, fieldErr(field, "must be a string or an array of blocks")
	}
	out := make([]*stubbornv1.ContentPart, 0, len(blocks))
	for j, b := range blocks {
		bo, err := object(b, at(field, j))
		if err != nil {
			return nil, false, err
		}
		p, err := decodeBlock(bo, at(field, j), images)
		if err != nil {
			return nil, false, err
		}
		out = append(out, p)
	}
	return out, true, nil
}

// decodeBlock reads a text or image block; any other type is not carried.
func decodeBlock(bo raw, bf string, images bool) (*stubbornv1.ContentPart, error) {
	typ, err := str(bo["type"], join(bf, "type"))
	if err != nil {
		return nil, err
	}
	p := &stubbornv1.ContentPart{}
	var known map[string]bool
	switch {
	case typ == "text":
		text, err := str(bo["text"], join(bf, "text"))
		if err != nil {
			return nil, err
		}
		p.Kind, known = &stubbornv1.ContentPart_Text{Text: text}, set("type", "text")
	case typ == "image" && images:
		src, err := object(bo["source"], join(bf, "source"))
		if err != nil {
			return nil, err
		}
		st, _ := str(src["type"], "")
		img := &stubbornv1.ImagePart{}
		switch st {
		case "url":
			if img.Url, err = str(src["url"], join(bf, "source.url")); err != nil {
				return nil, err
			}
		case "base64":
			mt, err := str(src["media_type"], join(bf, "source.media_type"))
			if err != nil {
				return nil, err
			}
			data, err := str(src["data"], join(bf, "source.data"))
			if err != nil {
				return nil, err
			}
			img.Url = "data:" + mt + ";base64," + data
		default:
			return nil, fieldErr(join(bf, "source.type"), "%q is not carried (url and base64 are)", st)
		}
		p.Kind, known = &stubbornv1.ContentPart_Image{Image: img}, set("type", "source")
	default:
		return nil, fieldErr(join(bf, "type"), "%q is not carried", typ)
	}
	if p.Extra, err = extraOf(bo, known, bf); err != nil {
		return nil, err
	}
	return p, nil
}

func decodeMessagesOptions(o raw) (*stubbornv1.ModelOptions, error) {
	opt := &stubbornv1.ModelOptions{}
	var err error
	if opt.Temperature, err = number(o["temperature"], "temperature"); err != nil {
		return nil, err
	}
	if opt.TopP, err = number(o["top_p"], "top_p"); err != nil {
		return nil, err
	}
	if opt.MaxTokens, err = integer(o["max_tokens"], "max_tokens"); err != nil {
		return nil, err
	}
	if opt.TopK, err = integer(o["top_k"], "top_k"); err != nil {
		return nil, err
	}
	if opt.Stop, err = decodeStop(o["stop_sequences"], "stop_sequences"); err != nil {
		return nil, err
	}
	md, err := object(o["metadata"], "metadata")
	if err != nil {
		return nil, err
	}
	for k := range md {
		if k != "user_id" {
			return nil, fieldErr("metadata."+k, "is not carried")
		}
	}
	if opt.User, err = str(md["user_id"], "metadata.user_id"); err != nil {
		return nil, err
	}
	tools, err := array(o["tools"], "tools", MaxTools)
	if err != nil {
		return nil, err
	}
	for i, t := range tools {
		tf := at("tools", i)
		to, err := object(t, tf)
		if err != nil {
			return nil, err
		}
		if typ, err := str(to["type"], join(tf, "type")); err != nil {
			return nil, err
		} else if typ != "" && typ != "custom" {
			return nil, fieldErr(join(tf, "type"), "%q is not carried (a server tool)", typ)
		}
		tool := &stubbornv1.Tool{}
		if tool.Name, err = str(to["name"], join(tf, "name")); err != nil {
			return nil, err
		}
		if tool.Name == "" {
			return nil, fieldErr(join(tf, "name"), "is required")
		}
		if tool.Description, err = str(to["description"], join(tf, "description")); err != nil {
			return nil, err
		}
		if tool.Parameters, err = structOf(to["input_schema"], join(tf, "input_schema")); err != nil {
			return nil, err
		}
		if tool.Extra, err = extraOf(to, anthropicToolFields, tf); err != nil {
			return nil, err
		}
		opt.Tools = append(opt.Tools, tool)
	}
	if !isNull(o["tool_choice"]) {
		tc, err := object(o["tool_choice"], "tool_choice")
		if err != nil {
			return nil, err
		}
		typ, err := str(tc["type"], "tool_choice.type")
		if err != nil {
			return nil, err
		}
		mode, ok := map[string]stubbornv1.ToolChoiceMode{"auto": stubbornv1.ToolChoiceMode_TOOL_CHOICE_MODE_AUTO,
			"none": stubbornv1.ToolChoiceMode_TOOL_CHOICE_MODE_NONE, "any": stubbornv1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED,
			"tool": stubbornv1.ToolChoiceMode_TOOL_CHOICE_MODE_NAMED}[typ]
		if !ok {
			return nil, fieldErr("tool_choice.type", "%q is not auto, none, any or tool", typ)
		}
		opt.ToolChoice = &stubbornv1.ToolChoice{Mode: mode}
		if mode == stubbornv1.ToolChoiceMode_TOOL_CHOICE_MODE_NAMED {
			if opt.ToolChoice.Name, err = str(tc["name"], "tool_choice.name"); err != nil || opt.ToolChoice.Name == "" {
				return nil, fieldErr("tool_choice.name", "is required for type tool")
			}
		}
		if b, err := boolean(tc["disable_parallel_tool_use"], "tool_choice.disable_parallel_tool_use"); err != nil {
			return nil, err
		} else if b != nil {
			parallel := !*b
			opt.ParallelToolCalls = &parallel
		}
		for k := range tc {
			if !set("type", "name", "disable_parallel_tool_use")[k] {
				return nil, fieldErr("tool_choice."+k, "is not carried")
			}
		}
	}
	if opt.Extra, err = extraOf(o, messagesRequestFields, ""); err != nil {
		return nil, err
	}
	return opt, nil
}
