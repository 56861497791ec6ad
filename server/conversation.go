package server

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/stubbornhq/stubborn/runs"
)

// maxTaskMessages bounds a conversation's messages.
const maxTaskMessages = 1000

// chatRoles are the roles a message may have.
var chatRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

// messageText is a message's text: its content, or its text parts joined.
func messageText(m *structpb.Struct) string {
	switch c := m.GetFields()["content"].GetKind().(type) {
	case *structpb.Value_StringValue:
		return c.StringValue
	case *structpb.Value_ListValue:
		var b strings.Builder
		for _, p := range c.ListValue.GetValues() {
			f := p.GetStructValue().GetFields()
			if f["type"].GetStringValue() == "text" {
				b.WriteString(f["text"].GetStringValue())
			}
		}
		return b.String()
	}
	return ""
}

// conversationBrief is the brief of a run asked as messages
// (RunRequest.task_messages): a lone user message's text, else each
// message as "role: text", a blank line between them.
func conversationBrief(msgs []*structpb.Struct) string {
	if len(msgs) == 1 && msgs[0].GetFields()["role"].GetStringValue() == "user" {
		return messageText(msgs[0])
	}
	var b strings.Builder
	for i, m := range msgs {
		if i > 0 {
			b.WriteString("\n\n")
		}
		b.WriteString(m.GetFields()["role"].GetStringValue() + ": " + messageText(m))
	}
	return b.String()
}

// checkConversation adds what is wrong with a request's messages and model
// parameters to v.
func (val *validator) checkConversation(v *violations, req runRequest) {
	msgs := req.GetTaskMessages()
	if len(msgs) > maxTaskMessages {
		v.add("task_messages", "has %d messages, more than the limit of %d", len(msgs), maxTaskMessages)
		return
	}
	for i, m := range msgs {
		f := m.GetFields()
		if role := f["role"].GetStringValue(); !chatRoles[role] {
			v.add(fmt.Sprintf("task_messages[%d]", i)+".role", "must be one of system, developer, user, assistant, tool")
		}
		switch f["content"].GetKind().(type) {
		case nil, *structpb.Value_StringValue, *structpb.Value_ListValue, *structpb.Value_NullValue:
		default:
			v.add(fmt.Sprintf("task_messages[%d]", i)+".content", "must be a string, an array of parts, or null")
		}
	}
	if size, limit := conversationSize(msgs, req.GetModelParams()), val.limits.conversationBytes(); size > limit {
		v.add("task_messages", "with model_params is %d bytes, more than the limit of %d (%s)", size, limit, val.limits.conversationBound())
	}
}

// maxConversationEventBytes bounds a conversation whatever max_brief_bytes
// says: the run's first event (run_started) holds it and the brief made of
// its text, no larger, within runs.MaxEventBytes; 64 KiB is left for the
// rest (the control's spec, options).
const maxConversationEventBytes = runs.MaxEventBytes/2 - 64<<10

// conversationBytes is the largest conversation (messages and model
// parameters, encoded) a run takes: 4 times the brief's bound, within what
// an event holds.
func (l Limits) conversationBytes() int {
	return min(4*l.MaxBriefBytes, maxConversationEventBytes)
}

// conversationBound says which bound conversationBytes is.
func (l Limits) conversationBound() string {
	if 4*l.MaxBriefBytes <= maxConversationEventBytes {
		return "4 times limits.max_brief_bytes"
	}
	return "what the run's first event holds: half of an event's 3 MiB, less 64 KiB"
}

// conversationSize is the encoded size of a conversation and its model
// parameters, as conversationBytes bounds it.
func conversationSize(msgs []*structpb.Struct, params *structpb.Struct) int {
	size := proto.Size(params)
	for _, m := range msgs {
		size += proto.Size(m)
	}
	return size
}

// taskOf is the task a valid request asks: its brief (the messages' when
// it has none), messages and model parameters.
func taskOf(req runRequest) runs.Task {
	t := runs.Task{Brief: req.GetTaskBrief(), Messages: req.GetTaskMessages(), ModelParams: req.GetModelParams()}
	if strings.TrimSpace(t.Brief) == "" && len(t.Messages) > 0 {
		t.Brief = conversationBrief(t.Messages)
	}
	return t
}
