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
	size := proto.Size(req.GetModelParams())
	for i, m := range msgs {
		size += proto.Size(m)
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
	if limit := 4 * val.limits.MaxBriefBytes; size > limit {
		v.add("task_messages", "with model_params is %d bytes, more than the limit of %d (4 times the brief's)", size, limit)
	}
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
