package delegates

import (
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/conversation"
)

// conversationOf is the conversation a model delegate's call c sends
// (README, "Conversations"): for an attempt at a run's task, the run's
// conversation (typed, or read from the legacy Structs of a run journaled
// with them) with what the control added to the brief (c.Added); else, or
// for a run of a brief alone, one user message of the brief (which has
// c.Added already). An error is the CallError of legacy Structs that do
// not read.
func conversationOf(c controls.Call, delegate string) (*stubbornv1.Conversation, error) {
	var conv *stubbornv1.Conversation
	switch {
	case c.Task && c.Conversation != nil:
		conv = c.Conversation
	case c.Task && len(c.Messages) > 0:
		var err error
		if conv, err = conversation.FromLegacy(c.Messages, c.ModelParams); err != nil {
			return nil, refusedConversation(delegate, err)
		}
	default:
		return &stubbornv1.Conversation{Messages: []*stubbornv1.ChatMessage{userText(c.Brief)}, Options: &stubbornv1.ModelOptions{}}, nil
	}
	conv = withAdded(conv, c.Added)
	if conv.GetOptions() == nil {
		// The codecs read the options' fields directly: unset is all
		// defaults.
		if conv == c.Conversation {
			conv = proto.CloneOf(conv)
		}
		conv.Options = &stubbornv1.ModelOptions{}
	}
	return conv, nil
}

// withAdded is conv with added (retry-with-learning's failure history,
// starting with a blank line) appended: to the text of its last message
// when that is the user's, byte for byte as it is to the brief; else (the
// conversation ends with tool results or the model's turn) as a user
// message of its own after them, the blank line left out: the feedback is
// the user's next turn. conv is not changed.
func withAdded(conv *stubbornv1.Conversation, added string) *stubbornv1.Conversation {
	if added == "" {
		return conv
	}
	out := proto.CloneOf(conv)
	n := len(out.Messages)
	if n == 0 || out.Messages[n-1].GetRole() != stubbornv1.ChatRole_CHAT_ROLE_USER {
		out.Messages = append(out.Messages, userText(strings.TrimPrefix(added, "\n\n")))
		return out
	}
	last := out.Messages[n-1]
	switch parts := last.GetContent(); {
	case len(parts) == 0:
		last.Content = []*stubbornv1.ContentPart{textPart(added)}
	case len(parts) == 1 && !last.GetContentAsParts() && parts[0].GetImage() == nil:
		parts[0].Kind = &stubbornv1.ContentPart_Text{Text: parts[0].GetText() + added}
	default:
		last.Content = append(last.Content, textPart(added))
	}
	return out
}

func userText(s string) *stubbornv1.ChatMessage {
	return &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_USER, Content: []*stubbornv1.ContentPart{textPart(s)}}
}

func textPart(s string) *stubbornv1.ContentPart {
	return &stubbornv1.ContentPart{Kind: &stubbornv1.ContentPart_Text{Text: s}}
}

// refusedConversation is the error of a conversation delegate cannot be
// sent (its API cannot carry a field, or the run's legacy messages do not
// read): INVALID_ARGUMENT, not sent, and no other try of it can do better.
// The server checks this before a run begins; this is the net under it.
func refusedConversation(delegate string, err error) *controls.CallError {
	return &controls.CallError{Code: codes.InvalidArgument, NotSent: true, Refused: true,
		Message: "delegate " + delegate + ": the conversation: " + err.Error()}
}

// legacyMessagesOf is the legacy messages call c sends a gRPC delegate for
// a run journaled with them: none unless c is an attempt at the run's
// task; else the run's messages, with c.Added where withAdded puts it in
// the typed conversation they read as, rendered back (conversation.ToLegacy).
// The messages before the last are the run's as they are, so a delegate
// gets what it got before the typed conversation. Messages that do not
// read (a run journaled before the server read them) go as they are:
// brief_addition says what was added.
func legacyMessagesOf(c controls.Call) []*structpb.Struct {
	if !c.Task {
		return nil
	}
	if len(c.Messages) == 0 || c.Added == "" {
		return c.Messages
	}
	conv, err := conversation.FromLegacy(c.Messages, c.ModelParams)
	if err != nil {
		return c.Messages
	}
	rendered, _, err := conversation.ToLegacy(withAdded(conv, c.Added))
	n := len(c.Messages)
	if err != nil || len(rendered) < n {
		return c.Messages
	}
	// withAdded changes the last message or appends one: the rest of the
	// rendering is the run's messages, read and written again.
	return append(c.Messages[:n-1:n-1], rendered[n-1:]...)
}
