package conversation

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"google.golang.org/protobuf/types/known/structpb"
)

// Responses is the codec of OpenAI's Responses API, as a gateway without
// provider state speaks it: every request carries its whole conversation.
type Responses struct{}

var _ Codec = Responses{}

// API is ResponsesAPI.
func (Responses) API() stubbornv1.ConversationAPI { return ResponsesAPI }

// Bounds of the Responses API's metadata, as the API sets them.
const (
	maxMetadata         = 16
	maxMetadataKeyLen   = 64
	maxMetadataValueLen = 512
)

var (
	// responsesRequestFields are the fields the typed conversation (or
	// the door) reads; stream_options only asks the API to pad deltas
	// (include_obfuscation), which a gateway's stream has no need of.
	responsesRequestFields = set("model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
		"text", "max_output_tokens", "temperature", "top_p", "metadata", "user", "stream", "stream_options", "stubborn",
		"previous_response_id", "store", "conversation", "background", "prompt")
	// An earlier answer's items carry the provider's item id and status:
	// its bookkeeping, not the model's input, read and left out.
	responsesMessageFields = set("type", "role", "content", "id", "status")
	responsesCallFields    = set("type", "call_id", "name", "arguments", "id", "status")
	responsesOutputFields  = set("type", "call_id", "output", "id", "status")
	responsesToolFields    = set("type", "name", "description", "parameters", "strict")
	responsesRoles         = map[string]stubbornv1.ChatRole{
		"system": stubbornv1.ChatRole_CHAT_ROLE_SYSTEM, "developer": stubbornv1.ChatRole_CHAT_ROLE_DEVELOPER,
		"user": stubbornv1.ChatRole_CHAT_ROLE_USER, "assistant": stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT,
	}
)

// DecodeRequest reads a Responses API request body. instructions become a
// system message first; function_call items become the assistant's tool
// calls (joining the assistant message before them), function_call_output
// items tool messages. What needs the provider's state (a stored response
// or conversation, a prompt template, background mode, built-in tools) is
// an error naming the field.
func (Responses) DecodeRequest(body []byte) (*Request, error) {
	o, err := object(body, "")
	if err != nil {
		if !depthOK(body) {
			return nil, err
		}
		return nil, fieldErr("", "the body must be a JSON object")
	}
	if err := refuseProviderState(o); err != nil {
		return nil, err
	}
	c := &stubbornv1.Conversation{Api: ResponsesAPI}
	req := &Request{Conversation: c}
	if req.Model, err = str(o["model"], "model"); err != nil {
		return nil, err
	}
	if b, err := boolean(o["stream"], "stream"); err != nil {
		return nil, err
	} else if b != nil {
		req.Stream, req.IncludeUsage = *b, *b
	}
	if _, err := object(o["stream_options"], "stream_options"); err != nil {
		return nil, err
	}
	if !isNull(o["stubborn"]) {
		req.Stubborn = o["stubborn"]
	}
	instructions, err := str(o["instructions"], "instructions")
	if err != nil {
		return nil, fieldErr("instructions", "must be a string (a prompt template's instructions are provider state)")
	}
	if instructions != "" {
		c.Messages = append(c.Messages, &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_SYSTEM,
			Content: []*stubbornv1.ContentPart{textPart(instructions)}})
	}
	msgs, err := decodeResponsesInput(o["input"])
	if err != nil {
		return nil, err
	}
	c.Messages = append(c.Messages, msgs...)
	if len(c.Messages) > MaxMessages {
		return nil, fieldErr("input", "makes %d messages with the instructions, more than %d", len(c.Messages), MaxMessages)
	}
	if c.Options, err = decodeResponsesOptions(o); err != nil {
		return nil, err
	}
	return req, nil
}

// refuseProviderState refuses what only a provider that keeps responses
// can do.
func refuseProviderState(o raw) error {
	if id, err := str(o["previous_response_id"], "previous_response_id"); err != nil || id != "" {
		return fieldErr("previous_response_id", "is not carried: Stubborn keeps no responses to continue; send the whole conversation in input")
	}
	if b, err := boolean(o["store"], "store"); err != nil {
		return err
	} else if b != nil && *b {
		return fieldErr("store", "true is not carried: Stubborn stores no responses for the provider to retrieve; send false or leave it out")
	}
	if !isNull(o["conversation"]) {
		return fieldErr("conversation", "is not carried: Stubborn keeps no conversations; send the whole conversation in input")
	}
	if b, err := boolean(o["background"], "background"); err != nil {
		return err
	} else if b != nil && *b {
		return fieldErr("background", "true is not carried: a run is durable, but no response is kept to poll; send the request without it")
	}
	if !isNull(o["prompt"]) {
		return fieldErr("prompt", "is not carried: a prompt template is the provider's state; send its text as instructions and input")
	}
	return nil
}

func decodeResponsesInput(r json.RawMessage) ([]*stubbornv1.ChatMessage, error) {
	if isNull(r) {
		return nil, nil
	}
	var s string
	if json.Unmarshal(r, &s) == nil {
		return []*stubbornv1.ChatMessage{{Role: stubbornv1.ChatRole_CHAT_ROLE_USER, Content: []*stubbornv1.ContentPart{textPart(s)}}}, nil
	}
	items, err := array(r, "input", MaxMessages)
	if err != nil {
		if isArray(r) {
			return nil, err
		}
		return nil, fieldErr("input", "must be a string or an array of items")
	}
	var out []*stubbornv1.ChatMessage
	for i, item := range items {
		field := at("input", i)
		o, err := object(item, field)
		if err != nil {
			return nil, err
		}
		typ, err := str(o["type"], join(field, "type"))
		if err != nil {
			return nil, err
		}
		switch typ {
		case "message", "":
			m, err := decodeResponsesMessage(o, field)
			if err != nil {
				return nil, err
			}
			out = append(out, m)
		case "function_call":
			call, err := decodeResponsesCall(o, field)
			if err != nil {
				return nil, err
			}
			// An answer's calls follow its message: they are one
			// assistant turn, as Chat Completions and Anthropic have it.
			if n := len(out); n > 0 && out[n-1].GetRole() == stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT {
				if len(out[n-1].ToolCalls) >= MaxToolCalls {
					return nil, fieldErr(field, "is more than %d tool calls in one assistant turn", MaxToolCalls)
				}
				out[n-1].ToolCalls = append(out[n-1].ToolCalls, call)
			} else {
				out = append(out, &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT, ToolCalls: []*stubbornv1.ToolCall{call}})
			}
		case "function_call_output":
			m, err := decodeResponsesCallOutput(o, field)
			if err != nil {
				return nil, err
			}
			out = append(out, m)
		default:
			return nil, fieldErr(join(field, "type"), "%q is not carried (messages, function_call and function_call_output items are; reasoning, item references and built-in tools' items are the provider's state)", typ)
		}
	}
	return out, nil
}

func decodeResponsesMessage(o raw, field string) (*stubbornv1.ChatMessage, error) {
	role, err := str(o["role"], join(field, "role"))
	if err != nil {
		return nil, err
	}
	m := &stubbornv1.ChatMessage{Role: responsesRoles[role]}
	if m.Role == stubbornv1.ChatRole_CHAT_ROLE_UNSPECIFIED {
		return nil, fieldErr(join(field, "role"), "%q is not a role (user, assistant, system, developer)", role)
	}
	if _, err := str(o["id"], join(field, "id")); err != nil {
		return nil, err
	}
	if _, err := str(o["status"], join(field, "status")); err != nil {
		return nil, err
	}
	if err := decodeResponsesContent(m, o["content"], join(field, "content")); err != nil {
		return nil, err
	}
	if m.Extra, err = extraOf(o, responsesMessageFields, field); err != nil {
		return nil, err
	}
	return m, nil
}

// decodeResponsesContent reads a message's content: a string, or parts —
// input_text and input_image for every role but the assistant's, whose
// parts are output_text and refusal.
func decodeResponsesContent(m *stubbornv1.ChatMessage, r json.RawMessage, field string) error {
	if isNull(r) {
		return fieldErr(field, "is required")
	}
	var s string
	if json.Unmarshal(r, &s) == nil {
		m.Content = []*stubbornv1.ContentPart{textPart(s)}
		return nil
	}
	parts, err := array(r, field, MaxParts)
	if err != nil {
		if isArray(r) {
			return err
		}
		return fieldErr(field, "must be a string or an array of parts")
	}
	m.ContentAsParts = true
	assistant := m.GetRole() == stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT
	for j, p := range parts {
		pf := at(field, j)
		po, err := object(p, pf)
		if err != nil {
			return err
		}
		typ, err := str(po["type"], join(pf, "type"))
		if err != nil {
			return err
		}
		switch {
		case typ == "refusal" && assistant:
			refusal, err := str(po["refusal"], join(pf, "refusal"))
			if err != nil {
				return err
			}
			m.Refusal += refusal
			continue
		case typ == "output_text" && assistant:
			// annotations and logprobs describe an earlier answer's text:
			// read, and left out as its item id is.
			part, err := decodeResponsesPart(po, pf, set("type", "text", "annotations", "logprobs"))
			if err != nil {
				return err
			}
			m.Content = append(m.Content, part)
			continue
		case assistant && (typ == "input_text" || typ == "input_image"):
			return fieldErr(join(pf, "type"), "%q is not an assistant's part (output_text, refusal)", typ)
		case !assistant && (typ == "output_text" || typ == "refusal"):
			return fieldErr(join(pf, "type"), "%q is an assistant's part (input_text, input_image here)", typ)
		}
		part, err := decodeResponsesInputPart(po, pf, typ)
		if err != nil {
			return err
		}
		m.Content = append(m.Content, part)
	}
	return nil
}

// decodeResponsesInputPart reads an input_text or input_image part.
func decodeResponsesInputPart(o raw, field, typ string) (*stubbornv1.ContentPart, error) {
	switch typ {
	case "input_text":
		return decodeResponsesPart(o, field, set("type", "text"))
	case "input_image":
		if id, err := str(o["file_id"], join(field, "file_id")); err != nil || id != "" {
			return nil, fieldErr(join(field, "file_id"), "is not carried: a file by id is the provider's state; send the image as image_url (an http(s) or data URL)")
		}
		img := &stubbornv1.ImagePart{}
		var err error
		if img.Url, err = str(o["image_url"], join(field, "image_url")); err != nil {
			return nil, err
		}
		if img.Url == "" {
			return nil, fieldErr(join(field, "image_url"), "is required")
		}
		if img.Detail, err = str(o["detail"], join(field, "detail")); err != nil {
			return nil, err
		}
		part := &stubbornv1.ContentPart{Kind: &stubbornv1.ContentPart_Image{Image: img}}
		if part.Extra, err = extraOf(o, set("type", "image_url", "detail", "file_id"), field); err != nil {
			return nil, err
		}
		return part, nil
	}
	return nil, fieldErr(join(field, "type"), "%q is not carried (input_text and input_image are)", typ)
}

func decodeResponsesPart(o raw, field string, known map[string]bool) (*stubbornv1.ContentPart, error) {
	text, err := str(o["text"], join(field, "text"))
	if err != nil {
		return nil, err
	}
	part := textPart(text)
	if part.Extra, err = extraOf(o, known, field); err != nil {
		return nil, err
	}
	return part, nil
}

func decodeResponsesCall(o raw, field string) (*stubbornv1.ToolCall, error) {
	for k := range o {
		if !responsesCallFields[k] {
			return nil, fieldErr(join(field, k), "is not carried")
		}
	}
	c := &stubbornv1.ToolCall{}
	var err error
	if c.Id, err = str(o["call_id"], join(field, "call_id")); err != nil {
		return nil, err
	}
	if c.Id == "" {
		return nil, fieldErr(join(field, "call_id"), "is required")
	}
	if c.Name, err = str(o["name"], join(field, "name")); err != nil {
		return nil, err
	}
	if c.Name == "" {
		return nil, fieldErr(join(field, "name"), "is required")
	}
	if c.Arguments, err = str(o["arguments"], join(field, "arguments")); err != nil {
		return nil, err
	}
	for _, k := range []string{"id", "status"} {
		if _, err := str(o[k], join(field, k)); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func decodeResponsesCallOutput(o raw, field string) (*stubbornv1.ChatMessage, error) {
	for k := range o {
		if !responsesOutputFields[k] {
			return nil, fieldErr(join(field, k), "is not carried")
		}
	}
	m := &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_TOOL}
	var err error
	if m.ToolCallId, err = str(o["call_id"], join(field, "call_id")); err != nil {
		return nil, err
	}
	if m.ToolCallId == "" {
		return nil, fieldErr(join(field, "call_id"), "is required")
	}
	for _, k := range []string{"id", "status"} {
		if _, err := str(o[k], join(field, k)); err != nil {
			return nil, err
		}
	}
	if err := decodeResponsesContent(m, o["output"], join(field, "output")); err != nil {
		return nil, err
	}
	return m, nil
}

func decodeResponsesOptions(o raw) (*stubbornv1.ModelOptions, error) {
	opt := &stubbornv1.ModelOptions{}
	var err error
	if opt.Temperature, err = number(o["temperature"], "temperature"); err != nil {
		return nil, err
	}
	if opt.TopP, err = number(o["top_p"], "top_p"); err != nil {
		return nil, err
	}
	if opt.MaxTokens, err = integer(o["max_output_tokens"], "max_output_tokens"); err != nil {
		return nil, err
	}
	if opt.User, err = str(o["user"], "user"); err != nil {
		return nil, err
	}
	if opt.ParallelToolCalls, err = boolean(o["parallel_tool_calls"], "parallel_tool_calls"); err != nil {
		return nil, err
	}
	if opt.Metadata, err = decodeMetadata(o["metadata"]); err != nil {
		return nil, err
	}
	tools, err := array(o["tools"], "tools", MaxTools)
	if err != nil {
		return nil, err
	}
	for i, t := range tools {
		tool, err := decodeResponsesTool(t, at("tools", i))
		if err != nil {
			return nil, err
		}
		opt.Tools = append(opt.Tools, tool)
	}
	if opt.ToolChoice, err = decodeResponsesToolChoice(o["tool_choice"]); err != nil {
		return nil, err
	}
	text, err := object(o["text"], "text")
	if err != nil {
		return nil, err
	}
	if opt.ResponseFormat, err = decodeResponsesFormat(text["format"]); err != nil {
		return nil, err
	}
	if opt.Extra, err = extraOf(o, responsesRequestFields, ""); err != nil {
		return nil, err
	}
	// text's other fields (verbosity) are extra fields named by their
	// path, so Carry names them as the caller wrote them.
	textExtra, err := extraOf(text, set("format"), "text")
	if err != nil {
		return nil, err
	}
	if len(textExtra.GetFields()) > 0 && opt.Extra == nil {
		opt.Extra = &structpb.Struct{Fields: map[string]*structpb.Value{}}
	}
	for k, v := range textExtra.GetFields() {
		opt.Extra.Fields["text."+k] = v
	}
	return opt, nil
}

func decodeMetadata(r json.RawMessage) (map[string]string, error) {
	o, err := object(r, "metadata")
	if err != nil {
		return nil, err
	}
	if len(o) > maxMetadata {
		return nil, fieldErr("metadata", "has %d keys, more than %d", len(o), maxMetadata)
	}
	if len(o) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(o))
	for k, v := range o {
		if utf8.RuneCountInString(k) > maxMetadataKeyLen {
			return nil, fieldErr("metadata", "key %.64q… is longer than %d characters", k, maxMetadataKeyLen)
		}
		s, err := str(v, join("metadata", k))
		if err != nil {
			return nil, err
		}
		if utf8.RuneCountInString(s) > maxMetadataValueLen {
			return nil, fieldErr(join("metadata", k), "is longer than %d characters", maxMetadataValueLen)
		}
		out[k] = s
	}
	return out, nil
}

func decodeResponsesTool(r json.RawMessage, field string) (*stubbornv1.Tool, error) {
	o, err := object(r, field)
	if err != nil {
		return nil, err
	}
	typ, err := str(o["type"], join(field, "type"))
	if err != nil {
		return nil, err
	}
	if typ != "function" {
		return nil, fieldErr(join(field, "type"), "%q is not carried: built-in tools run at the provider; function tools are carried", typ)
	}
	t := &stubbornv1.Tool{}
	if t.Name, err = str(o["name"], join(field, "name")); err != nil {
		return nil, err
	}
	if t.Name == "" {
		return nil, fieldErr(join(field, "name"), "is required")
	}
	if t.Description, err = str(o["description"], join(field, "description")); err != nil {
		return nil, err
	}
	if t.Parameters, err = structOf(o["parameters"], join(field, "parameters")); err != nil {
		return nil, err
	}
	if t.Strict, err = boolean(o["strict"], join(field, "strict")); err != nil {
		return nil, err
	}
	if t.Extra, err = extraOf(o, responsesToolFields, field); err != nil {
		return nil, err
	}
	return t, nil
}

func decodeResponsesToolChoice(r json.RawMessage) (*stubbornv1.ToolChoice, error) {
	tc, o, err := decodeToolChoiceMode(r, " (a function by name is)")
	if o == nil || err != nil { // null, a mode, or refused
		return tc, err
	}
	return namedToolChoice(o["name"], "tool_choice.name")
}

var responsesFormatFields = set("type", "name", "description", "schema", "strict")

// decodeResponsesFormat reads text.format, whose json_schema fields sit
// beside its type (Chat Completions nests them in json_schema).
func decodeResponsesFormat(r json.RawMessage) (*stubbornv1.ResponseFormat, error) {
	if isNull(r) {
		return nil, nil
	}
	o, err := object(r, "text.format")
	if err != nil {
		return nil, err
	}
	typ, err := str(o["type"], "text.format.type")
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
		for k := range o {
			if !responsesFormatFields[k] {
				return nil, fieldErr(join("text.format", k), "is not carried")
			}
		}
		if rf.Name, err = str(o["name"], "text.format.name"); err != nil {
			return nil, err
		}
		if rf.Description, err = str(o["description"], "text.format.description"); err != nil {
			return nil, err
		}
		if rf.Schema, err = structOf(o["schema"], "text.format.schema"); err != nil {
			return nil, err
		}
		if rf.Strict, err = boolean(o["strict"], "text.format.strict"); err != nil {
			return nil, err
		}
		return rf, nil
	default:
		return nil, fieldErr("text.format.type", "%q is not text, json_object or json_schema", typ)
	}
	for k := range o {
		if k != "type" {
			return nil, fieldErr(join("text.format", k), "is not carried")
		}
	}
	return rf, nil
}

// EncodeRequest writes a Responses API request body: stateless (store
// false), the entry's system prompt as instructions.
func (Responses) EncodeRequest(c *stubbornv1.Conversation, e Entry, stream bool) ([]byte, error) {
	if problems := Carry(ResponsesAPI, c, DropOf(c)); len(problems) > 0 {
		return nil, problems
	}
	own := c.GetApi() == ResponsesAPI
	out := map[string]any{"model": e.Model}
	o := optionsOf(c)
	text := map[string]any{}
	if own {
		for k, v := range o.GetExtra().GetFields() {
			if sub, ok := strings.CutPrefix(k, "text."); ok {
				text[sub] = v.AsInterface()
			} else {
				out[k] = v.AsInterface()
			}
		}
	}
	if e.System != "" {
		out["instructions"] = e.System
	}
	items := make([]any, 0, len(c.GetMessages()))
	for _, m := range c.GetMessages() {
		items = append(items, encodeResponsesItems(m, own)...)
	}
	out["input"] = items
	out["store"] = false
	if o.Temperature != nil {
		out["temperature"] = o.GetTemperature()
	} else if e.Temperature != nil {
		out["temperature"] = *e.Temperature
	}
	if o.TopP != nil {
		out["top_p"] = o.GetTopP()
	}
	switch {
	case o.MaxCompletionTokens != nil:
		out["max_output_tokens"] = o.GetMaxCompletionTokens()
	case o.MaxTokens != nil:
		out["max_output_tokens"] = o.GetMaxTokens()
	case e.MaxTokens > 0:
		out["max_output_tokens"] = e.MaxTokens
	}
	if o.GetUser() != "" {
		out["user"] = o.GetUser()
	}
	if len(o.GetMetadata()) > 0 {
		out["metadata"] = o.GetMetadata()
	}
	if len(o.GetTools()) > 0 {
		tools := make([]any, len(o.GetTools()))
		for i, t := range o.GetTools() {
			tools[i] = encodeResponsesTool(t, own)
		}
		out["tools"] = tools
	}
	if tc := encodeResponsesToolChoice(o.GetToolChoice()); tc != nil {
		out["tool_choice"] = tc
	}
	if o.ParallelToolCalls != nil {
		out["parallel_tool_calls"] = o.GetParallelToolCalls()
	}
	if rf := responsesFormat(o.GetResponseFormat()); rf != nil {
		text["format"] = rf
	}
	if len(text) > 0 {
		out["text"] = text
	}
	delete(out, "stream")
	if stream {
		out["stream"] = true
	}
	return marshal(out)
}

// encodeResponsesItems is m as input items: a message, and an assistant's
// tool calls as function_call items after it.
func encodeResponsesItems(m *stubbornv1.ChatMessage, own bool) []any {
	switch m.GetRole() {
	case stubbornv1.ChatRole_CHAT_ROLE_TOOL:
		return []any{map[string]any{"type": "function_call_output", "call_id": m.GetToolCallId(), "output": encodeResponsesContent(m, own)}}
	case stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT:
		var out []any
		if len(m.GetContent()) > 0 || m.GetRefusal() != "" || len(m.GetToolCalls()) == 0 {
			msg := map[string]any{"type": "message", "role": "assistant"}
			if own {
				putExtra(msg, m.GetExtra())
			}
			msg["content"] = encodeResponsesContent(m, own)
			out = append(out, msg)
		}
		for _, c := range m.GetToolCalls() {
			out = append(out, map[string]any{"type": "function_call", "call_id": c.GetId(), "name": c.GetName(), "arguments": c.GetArguments()})
		}
		return out
	}
	msg := map[string]any{"type": "message", "role": chatRoleNames[m.GetRole()]}
	if own {
		putExtra(msg, m.GetExtra())
	}
	msg["content"] = encodeResponsesContent(m, own)
	return []any{msg}
}

// encodeResponsesContent is a string for a lone text part the request did
// not send as parts, else the parts: an assistant's as output_text and
// refusal, the others' as input_text and input_image.
func encodeResponsesContent(m *stubbornv1.ChatMessage, own bool) any {
	parts := m.GetContent()
	assistant := m.GetRole() == stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT
	if m.GetRefusal() == "" && !m.GetContentAsParts() && len(parts) <= 1 &&
		(len(parts) == 0 || parts[0].GetImage() == nil && (!own || parts[0].GetExtra() == nil)) {
		if len(parts) == 0 {
			return ""
		}
		return parts[0].GetText()
	}
	out := make([]any, 0, len(parts)+1)
	for _, p := range parts {
		var q map[string]any
		switch img := p.GetImage(); {
		case img != nil:
			q = map[string]any{"type": "input_image", "image_url": img.GetUrl()}
			if img.GetDetail() != "" {
				q["detail"] = img.GetDetail()
			}
		case assistant:
			q = map[string]any{"type": "output_text", "text": p.GetText(), "annotations": []any{}}
		default:
			q = map[string]any{"type": "input_text", "text": p.GetText()}
		}
		if own {
			putExtra(q, p.GetExtra())
		}
		out = append(out, q)
	}
	if m.GetRefusal() != "" {
		out = append(out, map[string]any{"type": "refusal", "refusal": m.GetRefusal()})
	}
	return out
}

func encodeResponsesTool(t *stubbornv1.Tool, own bool) map[string]any {
	out := map[string]any{"type": "function", "name": t.GetName()}
	if own {
		putExtra(out, t.GetExtra())
	}
	if t.GetDescription() != "" {
		out["description"] = t.GetDescription()
	}
	if t.GetParameters() != nil {
		out["parameters"] = t.GetParameters().AsMap()
	}
	if t.Strict != nil {
		out["strict"] = t.GetStrict()
	}
	return out
}

func encodeResponsesToolChoice(tc *stubbornv1.ToolChoice) any {
	if tc.GetMode() == stubbornv1.ToolChoiceMode_TOOL_CHOICE_MODE_NAMED {
		return map[string]any{"type": "function", "name": tc.GetName()}
	}
	return encodeChatToolChoice(tc) // auto, none, required: the same words
}

// responsesFormat is text.format: json_schema's fields flat beside type.
func responsesFormat(rf *stubbornv1.ResponseFormat) map[string]any {
	switch rf.GetType() {
	case stubbornv1.ResponseFormatType_RESPONSE_FORMAT_TYPE_TEXT:
		return map[string]any{"type": "text"}
	case stubbornv1.ResponseFormatType_RESPONSE_FORMAT_TYPE_JSON_OBJECT:
		return map[string]any{"type": "json_object"}
	case stubbornv1.ResponseFormatType_RESPONSE_FORMAT_TYPE_JSON_SCHEMA:
		out := map[string]any{"type": "json_schema", "name": rf.GetName()}
		if rf.GetDescription() != "" {
			out["description"] = rf.GetDescription()
		}
		if rf.GetSchema() != nil {
			out["schema"] = rf.GetSchema().AsMap()
		}
		if rf.Strict != nil {
			out["strict"] = rf.GetStrict()
		}
		return out
	}
	return nil
}

// isArray says whether r is a JSON array: its error is its bound's.
func isArray(r json.RawMessage) bool {
	r = bytes.TrimSpace(r)
	return len(r) > 0 && r[0] == '['
}
