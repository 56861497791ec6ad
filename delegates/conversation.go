package delegates

import (
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/stubbornhq/stubborn/controls"
)

// messagesOf returns the messages call c sends (README, "Conversations"):
// none unless c is an attempt at a run's task that is a conversation; then
// the run's messages, with what the control added to the brief (retry-with-
// learning's failure history, after the run's own brief) appended to the
// last user message: to its text, or as a text part of its parts, or as a
// user message of its own when there is none.
func messagesOf(c controls.Call) []*structpb.Struct {
	if !c.Task || len(c.Messages) == 0 {
		return nil
	}
	added, ok := strings.CutPrefix(c.Brief, c.TaskBrief)
	if !ok || added == "" {
		return c.Messages
	}
	out := make([]*structpb.Struct, len(c.Messages))
	copy(out, c.Messages)
	for i := len(out) - 1; i >= 0; i-- {
		if out[i].GetFields()["role"].GetStringValue() != "user" {
			continue
		}
		m := proto.CloneOf(out[i])
		switch content := m.GetFields()["content"].GetKind().(type) {
		case *structpb.Value_StringValue:
			m.Fields["content"] = structpb.NewStringValue(content.StringValue + added)
		case *structpb.Value_ListValue:
			part, _ := structpb.NewStruct(map[string]any{"type": "text", "text": added})
			content.ListValue.Values = append(content.ListValue.Values, structpb.NewStructValue(part))
		default:
			m.Fields["content"] = structpb.NewStringValue(added)
		}
		out[i] = m
		return out
	}
	last, _ := structpb.NewStruct(map[string]any{"role": "user", "content": strings.TrimPrefix(added, "\n\n")})
	return append(out, last)
}

// modelParamsOf returns the model parameters c sends: the run's, for an
// attempt at its task.
func modelParamsOf(c controls.Call) *structpb.Struct {
	if !c.Task {
		return nil
	}
	return c.ModelParams
}
