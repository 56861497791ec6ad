package conversation

import (
	"mime"
	"sort"
	"strings"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"google.golang.org/protobuf/types/known/structpb"
)

// Unsupported is one field of a conversation that an API cannot carry.
type Unsupported struct {
	// Field is its path: `n`, `top_k`, `tools[0].strict`,
	// `messages[2].content[0]`, or an extra field's name.
	Field string
	// Why says what the API lacks.
	Why string
}

// Problems are the fields an API cannot carry; as an error, it names them
// all.
type Problems []Unsupported

func (p Problems) Error() string {
	parts := make([]string, len(p))
	for i, u := range p {
		parts[i] = u.Field + ": " + u.Why
	}
	return "cannot carry " + strings.Join(parts, "; ")
}

// Drop is what a conversation allows a delegate to leave out.
type Drop struct {
	// All allows leaving out every field the API cannot carry.
	All bool
	// Paths allows each field whose path is one of them, or under one
	// (`tools` allows `tools[3].strict`).
	Paths []string
}

// DropOf is what c allows dropping (Conversation.drop_params,
// drop_all_params).
func DropOf(c *stubbornv1.Conversation) Drop {
	return Drop{All: c.GetDropAllParams(), Paths: c.GetDropParams()}
}

// allows says whether d allows leaving out the field at path.
func (d Drop) allows(path string) bool {
	if d.All {
		return true
	}
	for _, p := range d.Paths {
		if path == p || strings.HasPrefix(path, p+".") || strings.HasPrefix(path, p+"[") {
			return true
		}
	}
	return false
}

// Carry lists the fields of c that api cannot carry and drop does not allow
// leaving out, in a stable order: the caller refuses the request (a 400,
// INVALID_ARGUMENT) naming them before any call. Empty means the encoder of
// api sends c whole, less what drop allowed it to leave out.
func Carry(api stubbornv1.ConversationAPI, c *stubbornv1.Conversation, drop Drop) Problems {
	var all Problems
	add := func(field, why string) {
		if !drop.allows(field) {
			all = append(all, Unsupported{Field: field, Why: why})
		}
	}
	foreign := c.GetApi() != api
	extra := func(prefix string, s *structpb.Struct) {
		if !foreign {
			return
		}
		keys := make([]string, 0, len(s.GetFields()))
		for k := range s.GetFields() {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			add(join(prefix, k), "a field of "+apiName(c.GetApi())+" that "+apiName(api)+" does not have")
		}
	}
	o := optionsOf(c)
	extra("", o.GetExtra())
	for i, t := range o.GetTools() {
		extra(at("tools", i), t.GetExtra())
	}
	for i, m := range c.GetMessages() {
		mf := at("messages", i)
		extra(mf, m.GetExtra())
		for j, p := range m.GetContent() {
			extra(at(join(mf, "content"), j), p.GetExtra())
		}
	}
	switch api {
	case ChatCompletions:
		carryChat(c, add)
	case AnthropicMessages:
		carryMessages(c, add)
	case ResponsesAPI:
		carryResponses(c, add)
	default:
		add("", "no codec speaks "+api.String())
	}
	return all
}

func apiName(api stubbornv1.ConversationAPI) string {
	switch api {
	case ChatCompletions:
		return "Chat Completions"
	case AnthropicMessages:
		return "Anthropic Messages"
	case ResponsesAPI:
		return "the Responses API"
	}
	return "no API"
}

func carryChat(c *stubbornv1.Conversation, add func(field, why string)) {
	if optionsOf(c).TopK != nil {
		add("top_k", "Chat Completions has no top_k")
	}
	for i, m := range c.GetMessages() {
		mf := at("messages", i)
		if m.GetIsError() {
			add(join(mf, "is_error"), "Chat Completions' tool messages have no error flag")
		}
		if m.GetRole() == stubbornv1.ChatRole_CHAT_ROLE_USER {
			continue
		}
		for j, p := range m.GetContent() {
			if p.GetImage() != nil {
				add(at(join(mf, "content"), j), "Chat Completions takes images in user messages only")
			}
		}
	}
}

// anthropicImageTypes are the inline image types the Messages API takes.
var anthropicImageTypes = set("image/jpeg", "image/png", "image/gif", "image/webp")

func carryMessages(c *stubbornv1.Conversation, add func(field, why string)) {
	o := optionsOf(c)
	if o.GetN() > 1 {
		add("n", "Anthropic answers one choice")
	}
	if o.Seed != nil {
		add("seed", "Anthropic has no seed")
	}
	if o.PresencePenalty != nil {
		add("presence_penalty", "Anthropic has no presence_penalty")
	}
	if o.FrequencyPenalty != nil {
		add("frequency_penalty", "Anthropic has no frequency_penalty")
	}
	if t := o.GetResponseFormat().GetType(); t == stubbornv1.ResponseFormatType_RESPONSE_FORMAT_TYPE_JSON_OBJECT ||
		t == stubbornv1.ResponseFormatType_RESPONSE_FORMAT_TYPE_JSON_SCHEMA {
		add("response_format", "Anthropic has no response_format (Stubborn does not emulate it with a forced tool)")
	}
	for i, t := range o.GetTools() {
		if t.GetStrict() {
			add(join(at("tools", i), "strict"), "Anthropic's tools have no strict flag")
		}
	}
	for i, m := range c.GetMessages() {
		mf := at("messages", i)
		if m.GetName() != "" {
			add(join(mf, "name"), "Anthropic's messages have no name")
		}
		if m.GetRefusal() != "" {
			add(join(mf, "refusal"), "Anthropic's messages have no refusal")
		}
		system := m.GetRole() == stubbornv1.ChatRole_CHAT_ROLE_SYSTEM || m.GetRole() == stubbornv1.ChatRole_CHAT_ROLE_DEVELOPER
		for j, p := range m.GetContent() {
			img := p.GetImage()
			if img == nil {
				continue
			}
			pf := at(join(mf, "content"), j)
			switch {
			case system || m.GetRole() == stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT:
				add(pf, "Anthropic's system prompt and assistant turns take no images")
			case imageSource(img.GetUrl()) == nil:
				add(pf, "Anthropic takes an image by http(s) URL or as a base64 data URL of image/jpeg, png, gif or webp")
			case img.GetDetail() == "low" || img.GetDetail() == "high":
				add(join(pf, "detail"), "Anthropic's images have no detail")
			}
		}
		for j, call := range m.GetToolCalls() {
			if _, ok := argumentsObject(call.GetArguments()); !ok {
				add(join(at(join(mf, "tool_calls"), j), "arguments"), "Anthropic's tool_use input must be a JSON object")
			}
		}
	}
}

// imageSource is an Anthropic image source for url, or nil when Anthropic
// cannot take it.
func imageSource(url string) map[string]any {
	if strings.HasPrefix(url, "http://") || strings.HasPrefix(url, "https://") {
		return map[string]any{"type": "url", "url": url}
	}
	rest, ok := strings.CutPrefix(url, "data:")
	if !ok {
		return nil
	}
	meta, data, ok := strings.Cut(rest, ",")
	if !ok {
		return nil
	}
	mediaType, ok := strings.CutSuffix(meta, ";base64")
	if !ok {
		return nil
	}
	if mt, _, err := mime.ParseMediaType(mediaType); err != nil || !anthropicImageTypes[mt] {
		return nil
	}
	return map[string]any{"type": "base64", "media_type": mediaType, "data": data}
}

// optionsOf is c's options, or none set when it has none: a conversation
// sent without options (a gRPC client may) is read like one with empty
// options, never dereferenced as nil.
func optionsOf(c *stubbornv1.Conversation) *stubbornv1.ModelOptions {
	if o := c.GetOptions(); o != nil {
		return o
	}
	return &stubbornv1.ModelOptions{}
}

func carryResponses(c *stubbornv1.Conversation, add func(field, why string)) {
	o := optionsOf(c)
	if o.GetN() > 1 {
		add("n", "the Responses API answers one choice")
	}
	if len(o.GetStop()) > 0 {
		add("stop", "the Responses API has no stop sequences")
	}
	if o.Seed != nil {
		add("seed", "the Responses API has no seed")
	}
	if o.PresencePenalty != nil {
		add("presence_penalty", "the Responses API has no presence_penalty")
	}
	if o.FrequencyPenalty != nil {
		add("frequency_penalty", "the Responses API has no frequency_penalty")
	}
	if o.TopK != nil {
		add("top_k", "the Responses API has no top_k")
	}
	for i, m := range c.GetMessages() {
		mf := at("messages", i)
		if m.GetName() != "" {
			add(join(mf, "name"), "the Responses API's messages have no name")
		}
		if m.GetIsError() {
			add(join(mf, "is_error"), "the Responses API's function_call_output has no error flag")
		}
		if m.GetRole() != stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT {
			continue
		}
		for j, p := range m.GetContent() {
			if p.GetImage() != nil {
				add(at(join(mf, "content"), j), "the Responses API's assistant messages take no images")
			}
		}
	}
}
