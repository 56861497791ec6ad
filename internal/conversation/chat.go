package conversation

import (
	"encoding/json"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Chat is the codec of OpenAI's Chat Completions API.
type Chat struct{}

var _ Codec = Chat{}

// API is ChatCompletions.
func (Chat) API() stubbornv1.ConversationAPI { return ChatCompletions }

var (
	chatRequestFields = set("model", "stream", "stream_options", "stubborn", "messages", "temperature", "top_p",
		"max_tokens", "max_completion_tokens", "stop", "seed", "user", "n", "tools", "tool_choice",
		"parallel_tool_calls", "response_format", "presence_penalty", "frequency_penalty")
	chatMessageFields = set("role", "content", "name", "tool_calls", "tool_call_id", "refusal")
	chatRoles         = map[string]stubbornv1.ChatRole{
		"system": stubbornv1.ChatRole_CHAT_ROLE_SYSTEM, "developer": stubbornv1.ChatRole_CHAT_ROLE_DEVELOPER,
		"user": stubbornv1.ChatRole_CHAT_ROLE_USER, "assistant": stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT,
		"tool": stubbornv1.ChatRole_CHAT_ROLE_TOOL,
	}
	chatRoleNames = map[stubbornv1.ChatRole]string{}
)

func init() {
	for name, r := range chatRoles {
		chatRoleNames[r] = name
	}
}

// DecodeRequest reads a Chat Completions request body.
func (Chat) DecodeRequest(body []byte) (*Request, error) {
	o, err := object(body, "")
	if err != nil {
		if !depthOK(body) {
			return nil, err
		}
		return nil, fieldErr("", "the body must be a JSON object")
	}
	req := &Request{Conversation: &stubbornv1.Conversation{Api: ChatCompletions}}
	if req.Model, err = str(o["model"], "model"); err != nil {
		return nil, err
	}
	if b, err := boolean(o["stream"], "stream"); err != nil {
		return nil, err
	} else if b != nil {
		req.Stream = *b
	}
	so, err := object(o["stream_options"], "stream_options")
	if err != nil {
		return nil, err
	}
	if b, err := boolean(so["include_usage"], "stream_options.include_usage"); err != nil {
		return nil, err
	} else if b != nil {
		req.IncludeUsage = *b
	}
	if !isNull(o["stubborn"]) {
		req.Stubborn = o["stubborn"]
	}
	msgs, err := array(o["messages"], "messages", MaxMessages)
	if err != nil {
		return nil, err
	}
	for i, m := range msgs {
		msg, err := decodeChatMessage(m, at("messages", i))
		if err != nil {
			return nil, err
		}
		req.Conversation.Messages = append(req.Conversation.Messages, msg)
	}
	if req.Conversation.Options, err = decodeChatOptions(o); err != nil {
		return nil, err
	}
	return req, nil
}

func decodeChatMessage(r json.RawMessage, field string) (*stubbornv1.ChatMessage, error) {
	o, err := object(r, field)
	if err != nil {
		return nil, err
	}
	role, err := str(o["role"], join(field, "role"))
	if err != nil {
		return nil, err
	}
	m := &stubbornv1.ChatMessage{Role: chatRoles[role]}
	if m.Role == stubbornv1.ChatRole_CHAT_ROLE_UNSPECIFIED {
		return nil, fieldErr(join(field, "role"), "%q is not a role (system, developer, user, assistant, tool)", role)
	}
	if m.Name, err = str(o["name"], join(field, "name")); err != nil {
		return nil, err
	}
	if m.ToolCallId, err = str(o["tool_call_id"], join(field, "tool_call_id")); err != nil {
		return nil, err
	}
	if m.Refusal, err = str(o["refusal"], join(field, "refusal")); err != nil {
		return nil, err
	}
	if m.Content, m.ContentAsParts, err = decodeChatContent(o["content"], join(field, "content")); err != nil {
		return nil, err
	}
	calls, err := array(o["tool_calls"], join(field, "tool_calls"), MaxToolCalls)
	if err != nil {
		return nil, err
	}
	for j, c := range calls {
		call, err := decodeChatToolCall(c, at(join(field, "tool_calls"), j))
		if err != nil {
			return nil, err
		}
		m.ToolCalls = append(m.ToolCalls, call)
	}
	if m.Extra, err = extraOf(o, chatMessageFields, field); err != nil {
		return nil, err
	}
	return m, nil
}

func decodeChatContent(r json.RawMessage, field string) ([]*stubbornv1.ContentPart, bool, error) {
	if isNull(r) {
		return nil, false, nil
	}
	var s string
	if json.Unmarshal(r, &s) == nil {
		return []*stubbornv1.ContentPart{textPart(s)}, false, nil
	}
	parts, err := array(r, field, MaxParts)
	if err != nil {
		return nil, false, fieldErr(field, "must be a string or an array of parts")
	}
	out := make([]*stubbornv1.ContentPart, 0, len(parts))
	for j, p := range parts {
		pf := at(field, j)
		o, err := object(p, pf)
		if err != nil {
			return nil, false, err
		}
		typ, err := str(o["type"], join(pf, "type"))
		if err != nil {
			return nil, false, err
		}
		part := &stubbornv1.ContentPart{}
		var known map[string]bool
		switch typ {
		case "text":
			text, err := str(o["text"], join(pf, "text"))
			if err != nil {
				return nil, false, err
			}
			part.Kind, known = &stubbornv1.ContentPart_Text{Text: text}, set("type", "text")
		case "image_url":
			img, err := object(o["image_url"], join(pf, "image_url"))
			if err != nil {
				return nil, false, err
			}
			ip := &stubbornv1.ImagePart{}
			if ip.Url, err = str(img["url"], join(pf, "image_url.url")); err != nil {
				return nil, false, err
			}
			if ip.Detail, err = str(img["detail"], join(pf, "image_url.detail")); err != nil {
				return nil, false, err
			}
			if ip.Url == "" {
				return nil, false, fieldErr(join(pf, "image_url.url"), "is required")
			}
			part.Kind, known = &stubbornv1.ContentPart_Image{Image: ip}, set("type", "image_url")
		default:
			return nil, false, fieldErr(join(pf, "type"), "%q is not carried", typ)
		}
		if part.Extra, err = extraOf(o, known, pf); err != nil {
			return nil, false, err
		}
		out = append(out, part)
	}
	return out, true, nil
}

func decodeChatToolCall(r json.RawMessage, field string) (*stubbornv1.ToolCall, error) {
	o, err := object(r, field)
	if err != nil {
		return nil, err
	}
	if typ, err := str(o["type"], join(field, "type")); err != nil {
		return nil, err
	} else if typ != "" && typ != "function" {
		return nil, fieldErr(join(field, "type"), "%q is not carried", typ)
	}
	f, err := object(o["function"], join(field, "function"))
	if err != nil {
		return nil, err
	}
	c := &stubbornv1.ToolCall{}
	if c.Id, err = str(o["id"], join(field, "id")); err != nil {
		return nil, err
	}
	if c.Name, err = str(f["name"], join(field, "function.name")); err != nil {
		return nil, err
	}
	if c.Arguments, err = str(f["arguments"], join(field, "function.arguments")); err != nil {
		return nil, err
	}
	return c, nil
}

func decodeChatOptions(o raw) (*stubbornv1.ModelOptions, error) {
	opt := &stubbornv1.ModelOptions{}
	var err error
	for name, dst := range map[string]**float64{"temperature": &opt.Temperature, "top_p": &opt.TopP,
		"presence_penalty": &opt.PresencePenalty, "frequency_penalty": &opt.FrequencyPenalty} {
		if *dst, err = number(o[name], name); err != nil {
			return nil, err
		}
	}
	for name, dst := range map[string]**int64{"max_tokens": &opt.MaxTokens,
		"max_completion_tokens": &opt.MaxCompletionTokens, "seed": &opt.Seed} {
		if *dst, err = integer(o[name], name); err != nil {
			return nil, err
		}
	}
	if n, err := integer(o["n"], "n"); err != nil {
		return nil, err
	} else if n != nil {
		if *n < 1 || *n > MaxChoices {
			return nil, fieldErr("n", "must be 1 to %d, not %d", MaxChoices, *n)
		}
		v := int32(*n)
		opt.N = &v
	}
	if opt.User, err = str(o["user"], "user"); err != nil {
		return nil, err
	}
	if opt.Stop, err = decodeStop(o["stop"], "stop"); err != nil {
		return nil, err
	}
	if opt.ParallelToolCalls, err = boolean(o["parallel_tool_calls"], "parallel_tool_calls"); err != nil {
		return nil, err
	}
	tools, err := array(o["tools"], "tools", MaxTools)
	if err != nil {
		return nil, err
	}
	for i, t := range tools {
		tool, err := decodeChatTool(t, at("tools", i))
		if err != nil {
			return nil, err
		}
		opt.Tools = append(opt.Tools, tool)
	}
	if opt.ToolChoice, err = decodeChatToolChoice(o["tool_choice"]); err != nil {
		return nil, err
	}
	if opt.ResponseFormat, err = decodeResponseFormat(o["response_format"]); err != nil {
		return nil, err
	}
	if opt.Extra, err = extraOf(o, chatRequestFields, ""); err != nil {
		return nil, err
	}
	return opt, nil
}

func decodeStop(r json.RawMessage, field string) ([]string, error) {
	if isNull(r) {
		return nil, nil
	}
	var s string
	if json.Unmarshal(r, &s) == nil {
		return []string{s}, nil
	}
	a, err := array(r, field, MaxStops)
	if err != nil {
		return nil, fieldErr(field, "must be a string or an array of strings")
	}
	out := make([]string, len(a))
	for i, x := range a {
		if out[i], err = str(x, at(field, i)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

var chatFunctionFields = set("name", "description", "parameters", "strict")

func decodeChatTool(r json.RawMessage, field string) (*stubbornv1.Tool, error) {
	o, err := object(r, field)
	if err != nil {
		return nil, err
	}
	if typ, err := str(o["type"], join(field, "type")); err != nil {
		return nil, err
	} else if typ != "function" {
		return nil, fieldErr(join(field, "type"), "%q is not carried (only function tools are)", typ)
	}
	f, err := object(o["function"], join(field, "function"))
	if err != nil {
		return nil, err
	}
	for k := range f {
		if !chatFunctionFields[k] {
			return nil, fieldErr(join(field, "function."+k), "is not carried")
		}
	}
	t := &stubbornv1.Tool{}
	if t.Name, err = str(f["name"], join(field, "function.name")); err != nil {
		return nil, err
	}
	if t.Name == "" {
		return nil, fieldErr(join(field, "function.name"), "is required")
	}
	if t.Description, err = str(f["description"], join(field, "function.description")); err != nil {
		return nil, err
	}
	if t.Parameters, err = structOf(f["parameters"], join(field, "function.parameters")); err != nil {
		return nil, err
	}
	if t.Strict, err = boolean(f["strict"], join(field, "function.strict")); err != nil {
		return nil, err
	}
	if t.Extra, err = extraOf(o, set("type", "function"), field); err != nil {
		return nil, err
	}
	return t, nil
}

func decodeChatToolChoice(r json.RawMessage) (*stubbornv1.ToolChoice, error) {
	tc, o, err := decodeToolChoiceMode(r, "")
	if o == nil || err != nil { // null, a mode, or refused
		return tc, err
	}
	f, err := object(o["function"], "tool_choice.function")
	if err != nil {
		return nil, err
	}
	return namedToolChoice(f["name"], "tool_choice.function.name")
}

// decodeToolChoiceMode reads an OpenAI-shaped tool_choice (Chat
// Completions', the Responses API's): null, a mode by its word, or an
// object of type function, returned (o) for its codec to find the name in,
// where its API has it. notCarried adds to the error of another type.
func decodeToolChoiceMode(r json.RawMessage, notCarried string) (tc *stubbornv1.ToolChoice, o raw, err error) {
	if isNull(r) {
		return nil, nil, nil
	}
	var s string
	if json.Unmarshal(r, &s) == nil {
		mode, ok := map[string]stubbornv1.ToolChoiceMode{"auto": stubbornv1.ToolChoiceMode_TOOL_CHOICE_MODE_AUTO,
			"none": stubbornv1.ToolChoiceMode_TOOL_CHOICE_MODE_NONE, "required": stubbornv1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED}[s]
		if !ok {
			return nil, nil, fieldErr("tool_choice", "%q is not auto, none or required", s)
		}
		return &stubbornv1.ToolChoice{Mode: mode}, nil, nil
	}
	if o, err = object(r, "tool_choice"); err != nil {
		return nil, nil, fieldErr("tool_choice", "must be a string or an object")
	}
	if typ, err := str(o["type"], "tool_choice.type"); err != nil {
		return nil, nil, err
	} else if typ != "function" {
		return nil, nil, fieldErr("tool_choice.type", "%q is not carried%s", typ, notCarried)
	}
	return nil, o, nil
}

// namedToolChoice is the choice of the function named by r (field).
func namedToolChoice(r json.RawMessage, field string) (*stubbornv1.ToolChoice, error) {
	name, err := str(r, field)
	if err != nil || name == "" {
		return nil, fieldErr(field, "is required")
	}
	return &stubbornv1.ToolChoice{Mode: stubbornv1.ToolChoiceMode_TOOL_CHOICE_MODE_NAMED, Name: name}, nil
}

func decodeResponseFormat(r json.RawMessage) (*stubbornv1.ResponseFormat, error) {
	if isNull(r) {
		return nil, nil
	}
	o, err := object(r, "response_format")
	if err != nil {
		return nil, err
	}
	typ, err := str(o["type"], "response_format.type")
	if err != nil {
		return nil, err
	}
	rf := &stubbornv1.ResponseFormat{}
	switch typ {
	case "text":
		rf.Type = stubbornv1.ResponseFormatType_RESPONSE_FORMAT_TYPE_TEXT
	case "json_object":
		rf.Type = stubbornv1.ResponseFormatType_RESPONSE_FORMAT_TYPE_JSON_OBJECT
	case "json_schema":
		rf.Type = stubbornv1.ResponseFormatType_RESPONSE_FORMAT_TYPE_JSON_SCHEMA
		js, err := object(o["json_schema"], "response_format.json_schema")
		if err != nil {
			return nil, err
		}
		if rf.Name, err = str(js["name"], "response_format.json_schema.name"); err != nil {
			return nil, err
		}
		if rf.Description, err = str(js["description"], "response_format.json_schema.description"); err != nil {
			return nil, err
		}
		if rf.Schema, err = structOf(js["schema"], "response_format.json_schema.schema"); err != nil {
			return nil, err
		}
		if rf.Strict, err = boolean(js["strict"], "response_format.json_schema.strict"); err != nil {
			return nil, err
		}
	default:
		return nil, fieldErr("response_format.type", "%q is not text, json_object or json_schema", typ)
	}
	return rf, nil
}

// EncodeRequest writes a Chat Completions request body.
func (Chat) EncodeRequest(c *stubbornv1.Conversation, e Entry, stream bool) ([]byte, error) {
	if problems := Carry(ChatCompletions, c, DropOf(c)); len(problems) > 0 {
		return nil, problems
	}
	own := c.GetApi() == ChatCompletions
	out := map[string]any{"model": e.Model}
	messages := make([]any, 0, len(c.GetMessages())+1)
	if e.System != "" {
		messages = append(messages, map[string]any{"role": "system", "content": e.System})
	}
	for _, m := range c.GetMessages() {
		messages = append(messages, encodeChatMessage(m, own))
	}
	out["messages"] = messages
	o := optionsOf(c)
	if own {
		putExtra(out, o.GetExtra())
	}
	if o.Temperature != nil {
		out["temperature"] = o.GetTemperature()
	} else if e.Temperature != nil {
		out["temperature"] = *e.Temperature
	}
	switch {
	case o.MaxTokens != nil:
		out["max_tokens"] = o.GetMaxTokens()
	case o.MaxCompletionTokens == nil && e.MaxTokens > 0:
		out["max_tokens"] = e.MaxTokens
	}
	if o.MaxCompletionTokens != nil {
		out["max_completion_tokens"] = o.GetMaxCompletionTokens()
	}
	for name, v := range map[string]*float64{"top_p": o.TopP, "presence_penalty": o.PresencePenalty, "frequency_penalty": o.FrequencyPenalty} {
		if v != nil {
			out[name] = *v
		}
	}
	if o.Seed != nil {
		out["seed"] = o.GetSeed()
	}
	if o.N != nil && o.GetN() != 1 {
		out["n"] = o.GetN()
	}
	if len(o.GetStop()) > 0 {
		out["stop"] = o.GetStop()
	}
	if o.GetUser() != "" {
		out["user"] = o.GetUser()
	}
	if len(o.GetTools()) > 0 {
		tools := make([]any, len(o.GetTools()))
		for i, t := range o.GetTools() {
			tools[i] = encodeChatTool(t, own)
		}
		out["tools"] = tools
	}
	if tc := encodeChatToolChoice(o.GetToolChoice()); tc != nil {
		out["tool_choice"] = tc
	}
	if o.ParallelToolCalls != nil && len(o.GetTools()) > 0 {
		out["parallel_tool_calls"] = o.GetParallelToolCalls()
	}
	if rf := encodeResponseFormat(o.GetResponseFormat()); rf != nil {
		out["response_format"] = rf
	}
	delete(out, "stream")
	delete(out, "stream_options")
	if stream {
		out["stream"], out["stream_options"] = true, map[string]any{"include_usage": true}
	}
	return marshal(out)
}

func encodeChatMessage(m *stubbornv1.ChatMessage, own bool) map[string]any {
	out := map[string]any{"role": chatRoleNames[m.GetRole()]}
	if own {
		putExtra(out, m.GetExtra())
	}
	out["content"] = encodeChatContent(m, own)
	if m.GetName() != "" {
		out["name"] = m.GetName()
	}
	if m.GetToolCallId() != "" {
		out["tool_call_id"] = m.GetToolCallId()
	}
	if m.GetRefusal() != "" {
		out["refusal"] = m.GetRefusal()
	}
	if len(m.GetToolCalls()) > 0 {
		calls := make([]any, len(m.GetToolCalls()))
		for j, c := range m.GetToolCalls() {
			calls[j] = map[string]any{"id": c.GetId(), "type": "function",
				"function": map[string]any{"name": c.GetName(), "arguments": c.GetArguments()}}
		}
		out["tool_calls"] = calls
	}
	return out
}

// encodeChatContent is a string for a lone text part the request did not
// send as parts (and "" or null for none), else the parts.
func encodeChatContent(m *stubbornv1.ChatMessage, own bool) any {
	parts := m.GetContent()
	if len(parts) == 0 {
		if m.GetRole() == stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT {
			return nil // tool calls only
		}
		return ""
	}
	if len(parts) == 1 && !m.GetContentAsParts() && parts[0].GetImage() == nil && (!own || parts[0].GetExtra() == nil) {
		return parts[0].GetText()
	}
	out := make([]any, 0, len(parts))
	for _, p := range parts {
		var q map[string]any
		if img := p.GetImage(); img != nil {
			u := map[string]any{"url": img.GetUrl()}
			if img.GetDetail() != "" {
				u["detail"] = img.GetDetail()
			}
			q = map[string]any{"type": "image_url", "image_url": u}
		} else {
			q = map[string]any{"type": "text", "text": p.GetText()}
		}
		if own {
			putExtra(q, p.GetExtra())
		}
		out = append(out, q)
	}
	return out
}

func encodeChatTool(t *stubbornv1.Tool, own bool) map[string]any {
	f := map[string]any{"name": t.GetName()}
	if t.GetDescription() != "" {
		f["description"] = t.GetDescription()
	}
	if t.GetParameters() != nil {
		f["parameters"] = t.GetParameters().AsMap()
	}
	if t.Strict != nil {
		f["strict"] = t.GetStrict()
	}
	out := map[string]any{"type": "function", "function": f}
	if own {
		putExtra(out, t.GetExtra())
	}
	return out
}

func encodeChatToolChoice(tc *stubbornv1.ToolChoice) any {
	switch tc.GetMode() {
	case stubbornv1.ToolChoiceMode_TOOL_CHOICE_MODE_AUTO:
		return "auto"
	case stubbornv1.ToolChoiceMode_TOOL_CHOICE_MODE_NONE:
		return "none"
	case stubbornv1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED:
		return "required"
	case stubbornv1.ToolChoiceMode_TOOL_CHOICE_MODE_NAMED:
		return map[string]any{"type": "function", "function": map[string]any{"name": tc.GetName()}}
	}
	return nil
}

func encodeResponseFormat(rf *stubbornv1.ResponseFormat) any {
	switch rf.GetType() {
	case stubbornv1.ResponseFormatType_RESPONSE_FORMAT_TYPE_TEXT:
		return map[string]any{"type": "text"}
	case stubbornv1.ResponseFormatType_RESPONSE_FORMAT_TYPE_JSON_OBJECT:
		return map[string]any{"type": "json_object"}
	case stubbornv1.ResponseFormatType_RESPONSE_FORMAT_TYPE_JSON_SCHEMA:
		js := map[string]any{"name": rf.GetName()}
		if rf.GetDescription() != "" {
			js["description"] = rf.GetDescription()
		}
		if rf.GetSchema() != nil {
			js["schema"] = rf.GetSchema().AsMap()
		}
		if rf.Strict != nil {
			js["strict"] = rf.GetStrict()
		}
		return map[string]any{"type": "json_schema", "json_schema": js}
	}
	return nil
}
