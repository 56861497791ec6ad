package conversation_test

import (
	"testing"

	"github.com/stubbornhq/stubborn/internal/conversation"
)

// fuzzRequest: a request decoder never panics, and what it takes its own
// API's encoder writes and it reads again.
func fuzzRequest(f *testing.F, codec conversation.Codec, seeds map[string]string) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := codec.DecodeRequest(body)
		if err != nil {
			return
		}
		if n := len(req.Conversation.GetMessages()); n > conversation.MaxMessages {
			t.Fatalf("%d messages taken", n)
		}
		req.Conversation.DropAllParams = true
		out, err := codec.EncodeRequest(req.Conversation, conversation.Entry{Model: "m"}, req.Stream)
		if err != nil {
			t.Fatalf("a request it took does not encode: %v", err)
		}
		if _, err := codec.DecodeRequest(out); err != nil {
			t.Fatalf("its own encoding does not decode: %v\n%s", err, out)
		}
		// The other API: never a panic, whatever it makes of it.
		for _, other := range []conversation.Codec{conversation.Chat{}, conversation.Messages{}, conversation.Responses{}} {
			_, _ = other.EncodeRequest(req.Conversation, conversation.Entry{Model: "m"}, true)
		}
	})
}

func FuzzChatRequest(f *testing.F) { fuzzRequest(f, conversation.Chat{}, chatRequests) }

func FuzzMessagesRequest(f *testing.F) { fuzzRequest(f, conversation.Messages{}, messagesRequests) }

func FuzzResponsesRequest(f *testing.F) { fuzzRequest(f, conversation.Responses{}, responsesRequests) }
