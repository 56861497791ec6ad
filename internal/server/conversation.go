package server

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/conversation"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/runs"
)

// maxTaskMessages bounds a conversation's messages.
const maxTaskMessages = 1000

// legacyConversation is the typed conversation of a request's legacy
// Structs (task_messages and model_params, read as Chat Completions'
// shapes: conversation.FromLegacy), so that they are checked, carried and
// made a brief as a typed conversation is. nil, and FromLegacy's error,
// when the request has no messages or they do not read; a request with
// model_params and no messages has no conversation (its brief is its
// task).
func legacyConversation(req runRequest) (*stubbornv1.Conversation, error) {
	if len(req.GetTaskMessages()) == 0 {
		return nil, nil
	}
	return conversation.FromLegacy(req.GetTaskMessages(), req.GetModelParams())
}

// legacyField is the legacy request's field of a field named in the typed
// conversation's terms (checkTyped's, or conversationField's): messages
// are task_messages, options model_params. An extra field is the unknown
// field itself, which the path cannot name: the object holding it is
// named.
func legacyField(field string) string {
	field = strings.TrimSuffix(field, ".extra")
	switch {
	case field == "conversation", field == "conversation.options":
		return map[string]string{"conversation": "task_messages", "conversation.options": "model_params"}[field]
	case strings.HasPrefix(field, "conversation.messages"):
		return "task_messages" + strings.TrimPrefix(field, "conversation.messages")
	case strings.HasPrefix(field, "conversation.options."):
		return "model_params." + strings.TrimPrefix(field, "conversation.options.")
	}
	return field
}

// legacyBodyField is the legacy request's field of a path into the Chat
// Completions body the Structs make (a conversation.FieldError's).
func legacyBodyField(path string) string {
	switch {
	case path == "":
		return "task_messages"
	case strings.HasPrefix(path, "messages"):
		return "task_" + path
	}
	return "model_params." + path
}

// addLegacy adds typed's violations to v, each field named as the legacy
// request has it (legacyField).
func addLegacy(v, typed *violations) {
	for _, f := range typed.list {
		v.add(legacyField(f.GetField()), "%s", f.GetDescription())
	}
}

// checkConversation adds what is wrong with a request's messages and model
// parameters, or its typed conversation, to v. The legacy Structs are
// checked as the typed conversation they read as, their fields named as
// the request has them.
func (val *validator) checkConversation(v *violations, req runRequest) {
	if c := req.GetConversation(); c != nil {
		for _, other := range []struct {
			name string
			set  bool
		}{{"task_messages", len(req.GetTaskMessages()) > 0}, {"model_params", req.GetModelParams() != nil}} {
			if other.set {
				v.add("conversation", "is set with %s: a run has its conversation typed (conversation) or as Structs (task_messages, model_params), not both", other.name)
			}
		}
		val.checkTyped(v, c)
		return
	}
	msgs := req.GetTaskMessages()
	if len(msgs) > maxTaskMessages {
		v.add("task_messages", "has %d messages, more than the limit of %d", len(msgs), maxTaskMessages)
		return
	}
	// The Structs are journaled as they are: their size is bounded, not
	// the typed form's.
	if size, limit := conversationSize(msgs, req.GetModelParams(), nil), val.limits.conversationBytes(); size > limit {
		v.add("task_messages", "with model_params is %d bytes, more than the limit of %d (%s)", size, limit, val.limits.conversationBound())
		return
	}
	c, err := legacyConversation(req)
	if err != nil {
		if fe := (*conversation.FieldError)(nil); errors.As(err, &fe) {
			v.add(legacyBodyField(fe.Field), "%s", fe.Msg)
		} else {
			v.add("task_messages", "%v", err)
		}
		return
	}
	if c != nil {
		var typed violations
		val.checkTyped(&typed, c)
		addLegacy(v, &typed)
	}
}

// checkTyped adds what is wrong with a typed conversation to v: its size,
// the conversation package's bounds (what a door's decoder keeps, so that a
// gRPC caller cannot send what no door would take), its roles.
func (val *validator) checkTyped(v *violations, c *stubbornv1.Conversation) {
	if size, limit := conversationSize(nil, nil, c), val.limits.conversationBytes(); size > limit {
		v.add("conversation", "is %d bytes, more than the limit of %d (%s)", size, limit, val.limits.conversationBound())
		return
	}
	msgs := c.GetMessages()
	if len(msgs) == 0 {
		v.add("conversation.messages", "must have at least one message")
	}
	if len(msgs) > conversation.MaxMessages {
		v.add("conversation.messages", "has %d messages, more than the limit of %d", len(msgs), conversation.MaxMessages)
		return
	}
	deep := func(field string, s *structpb.Struct) {
		if s != nil && controls.DataDepth(structpb.NewStructValue(s)) > conversation.MaxDepth {
			v.add(field, "nests more than %d objects and lists deep", conversation.MaxDepth)
		}
	}
	for i, m := range msgs {
		f := fmt.Sprintf("conversation.messages[%d]", i)
		if _, ok := stubbornv1.ChatRole_name[int32(m.GetRole())]; !ok || m.GetRole() == stubbornv1.ChatRole_CHAT_ROLE_UNSPECIFIED {
			v.add(f+".role", "must be one of SYSTEM, DEVELOPER, USER, ASSISTANT, TOOL")
		}
		if n := len(m.GetContent()); n > conversation.MaxParts {
			v.add(f+".content", "has %d parts, more than the limit of %d", n, conversation.MaxParts)
		}
		if n := len(m.GetToolCalls()); n > conversation.MaxToolCalls {
			v.add(f+".tool_calls", "has %d calls, more than the limit of %d", n, conversation.MaxToolCalls)
		} else {
			for j, call := range m.GetToolCalls() {
				checkToolName(v, fmt.Sprintf("%s.tool_calls[%d].name", f, j), call.GetName())
				checkCallID(v, fmt.Sprintf("%s.tool_calls[%d].id", f, j), call.GetId())
			}
		}
		checkCallID(v, f+".tool_call_id", m.GetToolCallId())
		deep(f+".extra", m.GetExtra())
		for j, p := range m.GetContent()[:min(len(m.GetContent()), conversation.MaxParts)] {
			deep(fmt.Sprintf("%s.content[%d].extra", f, j), p.GetExtra())
		}
	}
	o := c.GetOptions()
	if n := len(o.GetTools()); n > conversation.MaxTools {
		v.add("conversation.options.tools", "has %d tools, more than the limit of %d", n, conversation.MaxTools)
	} else {
		for i, t := range o.GetTools() {
			f := fmt.Sprintf("conversation.options.tools[%d]", i)
			checkToolName(v, f+".name", t.GetName())
			deep(f+".parameters", t.GetParameters())
			deep(f+".extra", t.GetExtra())
		}
	}
	if name := o.GetToolChoice().GetName(); name != "" {
		checkToolName(v, "conversation.options.tool_choice.name", name)
	}
	if o != nil && o.N != nil && (o.GetN() < 1 || o.GetN() > conversation.MaxChoices) {
		v.add("conversation.options.n", "must be between 1 and %d, got %d", conversation.MaxChoices, o.GetN())
	}
	if n := len(o.GetStop()); n > conversation.MaxStops {
		v.add("conversation.options.stop", "has %d sequences, more than the limit of %d", n, conversation.MaxStops)
	}
	deep("conversation.options.response_format.schema", o.GetResponseFormat().GetSchema())
	deep("conversation.options.extra", o.GetExtra())
}

// maxToolName is the longest tool name: both model APIs refuse a longer
// one (^[a-zA-Z0-9_-]{1,64}$), so it is refused before any call.
const maxToolName = 64

// checkToolName adds to v what is wrong with a tool's (or a tool call's)
// name: empty, over maxToolName, or a character outside [a-zA-Z0-9_-].
func checkToolName(v *violations, field, name string) {
	switch {
	case name == "":
		v.add(field, "must not be empty")
	case len(name) > maxToolName:
		v.add(field, "is %d bytes, more than the limit of %d", len(name), maxToolName)
	default:
		for i, r := range name {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
				v.add(field, "has %q at byte %d: a tool's name is letters, digits, _ and - (what OpenAI's and Anthropic's APIs take)", r, i)
				return
			}
		}
	}
}

// maxCallID bounds a tool call's id (and a tool message's tool_call_id):
// providers' ids are tens of bytes; a longer one is no model's.
const maxCallID = 256

func checkCallID(v *violations, field, id string) {
	if len(id) > maxCallID {
		v.add(field, "is %d bytes, more than the limit of %d", len(id), maxCallID)
	}
}

// carry adds to v, for every delegate the control spec can reach (its
// targets, chain members and candidates, through presets; not judges or
// analysts, which are given the brief), each field of c that the
// delegate's kind cannot carry and c does not allow dropping: openai takes
// Chat Completions, anthropic the Messages API, grpc the conversation
// whole, http the brief only (never refused).
func (val *validator) carry(v *violations, req runRequest, spec *stubbornv1.ControlSpec, briefCut int) {
	if val.kindOf == nil {
		return
	}
	field := conversationField
	c := req.GetConversation()
	if c == nil {
		// A legacy request's conversation is carried as the typed one
		// it reads as (what a model delegate sends), its fields named
		// as the request has them. One that does not read is refused
		// already.
		c, _ = legacyConversation(req)
		field = func(path string) string { return legacyField(conversationField(path)) }
	}
	if c == nil {
		return
	}
	drop := conversation.DropOf(c)
	seen := map[string]bool{}
	var visit func(spec *stubbornv1.ControlSpec, depth int)
	visit = func(spec *stubbornv1.ControlSpec, depth int) {
		for _, name := range delegates.References(spec) { // the names called with the run's task: not judges or analysts
			if seen[name] {
				continue
			}
			seen[name] = true
			if val.presetOf != nil {
				if p, ok := val.presetOf(name); ok {
					if depth < maxPresetDepth {
						visit(p, depth+1)
					}
					continue
				}
			}
			kind := val.kindOf(name)
			var api stubbornv1.ConversationAPI
			switch kind {
			case delegates.KindOpenAI:
				api = conversation.ChatCompletions
			case delegates.KindAnthropic:
				api = conversation.AnthropicMessages
			case delegates.KindHTTP:
				if briefCut > 0 {
					v.add(field(""), "is %d bytes as text, more than limits.max_brief_bytes (%d): delegate %.128q (http) gets the conversation as its brief, which would be cut; give it a task_brief, or a shorter conversation",
						briefCut, val.limits.MaxBriefBytes, name)
				}
				continue
			default:
				continue
			}
			for _, u := range conversation.Carry(api, c, drop) {
				v.add(field(u.Field), "delegate %.128q (%s) cannot carry %s: %s", name, kind, u.Field, u.Why)
			}
		}
	}
	visit(spec, 0)
}

// maxPresetDepth bounds how deeply carry follows presets naming presets
// (the config refuses cycles; this is a guard, not a rule).
const maxPresetDepth = 16

// conversationField is the request's field of a Carry path (a path into a
// model API's body: "n", "tools[0].strict", "messages[2].content[0]").
func conversationField(path string) string {
	if path == "" {
		return "conversation"
	}
	if strings.HasPrefix(path, "messages") {
		return "conversation." + path
	}
	return "conversation.options." + path
}

// doorParam is the body's field of a request's field that
// conversationField made, or of one checkTyped named; "" for another.
func doorParam(field string) string {
	for _, p := range []string{"conversation.options.", "conversation."} {
		if rest, ok := strings.CutPrefix(field, p); ok {
			return rest
		}
	}
	if field == "conversation" {
		return "messages"
	}
	return ""
}

// maxConversationEventBytes bounds a conversation whatever max_brief_bytes
// says: the run's first event (run_started) holds it and the brief made of
// its text, no larger, within runs.MaxEventBytes; 64 KiB is left for the
// rest (the control's spec, options).
const maxConversationEventBytes = runs.MaxEventBytes/2 - 64<<10

// conversationBytes is the largest conversation (messages and model
// parameters, encoded) a run takes: 4 times the brief's bound, within what
// an event holds.
func (l limits) conversationBytes() int {
	return min(4*l.MaxBriefBytes, maxConversationEventBytes)
}

// conversationBound says which bound conversationBytes is.
func (l limits) conversationBound() string {
	if 4*l.MaxBriefBytes <= maxConversationEventBytes {
		return "4 times limits.max_brief_bytes"
	}
	return "what the run's first event holds: half of an event's 3 MiB, less 64 KiB"
}

// conversationSize is the encoded size of a conversation and its model
// parameters (or of a typed conversation), as conversationBytes bounds it.
func conversationSize(msgs []*structpb.Struct, params *structpb.Struct, c *stubbornv1.Conversation) int {
	size := proto.Size(params) + proto.Size(c)
	for _, m := range msgs {
		size += proto.Size(m)
	}
	return size
}

// typedBrief is the brief of a run asked as a conversation
// (RunRequest.conversation, or the one its task_messages read as), for what reads a brief (a judge, an http
// delegate, the run's listing): a lone user message's text, else each
// message as "role: text", a blank line between them, with the tool calls
// an assistant made ("→ get_weather#call_1({…})") and whose call a tool
// message answers ("tool#call_1: …").
func typedBrief(c *stubbornv1.Conversation) string {
	msgs := c.GetMessages()
	if len(msgs) == 1 && msgs[0].GetRole() == stubbornv1.ChatRole_CHAT_ROLE_USER && len(msgs[0].GetToolCalls()) == 0 {
		return conversation.Text(msgs[0])
	}
	var b strings.Builder
	for i, m := range msgs {
		if i > 0 {
			b.WriteString("\n\n")
		}
		b.WriteString(strings.ToLower(strings.TrimPrefix(m.GetRole().String(), "CHAT_ROLE_")))
		if id := m.GetToolCallId(); id != "" {
			b.WriteString("#" + id)
		}
		if m.GetIsError() {
			b.WriteString(" (error)")
		}
		b.WriteString(": " + conversation.Text(m))
		for _, call := range m.GetToolCalls() {
			fmt.Fprintf(&b, "\n→ %s#%s(%s)", call.GetName(), call.GetId(), call.GetArguments())
		}
	}
	return b.String()
}

// taskOf is the task a valid request asks: its brief (when it has none,
// its conversation's, typed or read from its messages), messages and model
// parameters, or its typed conversation.
func taskOf(req runRequest, maxBrief int) runs.Task {
	t := runs.Task{Brief: req.GetTaskBrief(), Messages: req.GetTaskMessages(), ModelParams: req.GetModelParams()}
	if c := req.GetConversation(); c != nil {
		t.Conversation = c
		if strings.TrimSpace(t.Brief) == "" {
			t.Brief, _ = cutBrief(typedBrief(c), maxBrief)
		}
		return t
	}
	if strings.TrimSpace(t.Brief) == "" {
		// Messages that do not read make no brief: the request is
		// refused (checkConversation).
		if c, err := legacyConversation(req); err == nil && c != nil {
			t.Brief, _ = cutBrief(typedBrief(c), maxBrief)
		}
	}
	return t
}

// cutBrief keeps a conversation's brief within max bytes (the conversation
// itself may be up to 4 times that): a longer one keeps its end — the
// latest turns, what a judge weighs — after a line saying how much of the
// beginning is left out, cut between characters. cut says whether it was.
// The model delegates get the conversation whole; a delegate that would get
// only the cut brief (http) is refused (carry).
func cutBrief(brief string, max int) (_ string, cut bool) {
	if len(brief) <= max {
		return brief, false
	}
	const note = "[the conversation's first %d bytes are left out of this brief]\n\n"
	keep := max - len(fmt.Sprintf(note, len(brief)))
	if keep <= 0 {
		return brief[:0], true
	}
	from := len(brief) - keep
	for from < len(brief) && !utf8.RuneStart(brief[from]) {
		from++
	}
	return fmt.Sprintf(note, from) + brief[from:], true
}
