package server

import (
	"encoding/json"
	"net/http"
	"strings"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/conversation"
)

// OpenAI's Responses API (POST /v1/responses) on the same machinery as the
// other doors: the request read by conversation.Responses into the run's
// typed conversation (input as a string or items: messages, function_call
// and function_call_output items; instructions; function tools; options),
// the answer written by it as a response object of output items, or as its
// stream of response.* events, each with its sequence_number. What a
// gateway without provider state cannot do (previous_response_id, store,
// conversation, background, built-in tools) the codec refuses by name.

func (f *frontDoor) responses(w http.ResponseWriter, r *http.Request) {
	f.serve(w, r, responsesDialect{})
}

// responsesDialect is the Responses API. Its errors are OpenAI's: the
// openai SDKs read them as they read Chat Completions'.
type responsesDialect struct{}

func (responsesDialect) codec() conversation.Codec { return conversation.Responses{} }

func (responsesDialect) messages() string { return "input" }

// responsesNames are Chat Completions' names of what the Responses API
// names otherwise: a run's conversation names its fields in Chat
// Completions' terms when the server refuses them.
var responsesNames = [][2]string{
	{"messages", "input"},
	{"response_format", "text.format"},
	{"max_completion_tokens", "max_output_tokens"},
	{"max_tokens", "max_output_tokens"},
}

// field is name in the Responses API's terms: `messages[2].content[0]` is
// `input[2].content[0]` (an approximation when function_call items were
// merged into one assistant message: the message's index, not the item's).
func (responsesDialect) field(name string) string {
	for _, n := range responsesNames {
		if rest, ok := strings.CutPrefix(name, n[0]); ok && (rest == "" || strings.ContainsRune("[.:,;)", rune(rest[0]))) {
			return n[1] + rest
		}
	}
	return name
}

// rename names a field the way field does inside an error's words: where a
// name begins the message or follows a space (a path is always so set).
func (d responsesDialect) rename(msg string) string {
	words := strings.SplitAfter(msg, " ")
	for i, w := range words {
		words[i] = d.field(w)
	}
	return strings.Join(words, "")
}

// errorBody is OpenAI's error shape.
func (responsesDialect) errorBody(f failure) any { return openAIDialect{}.errorBody(f) }

// usage is the Responses API's usage names.
func (responsesDialect) usage(u *stubbornv1.Usage) map[string]int64 {
	return map[string]int64{"input_tokens": u.GetInputTokens(), "output_tokens": u.GetOutputTokens(), "total_tokens": u.GetTotalTokens()}
}

// carried is choice 0's deltas: a response is one answer.
func (responsesDialect) carried(ds []*stubbornv1.OutputDelta) []*stubbornv1.OutputDelta {
	return anthropicDialect{}.carried(ds)
}

// streamError ends a stream with the Responses API's error event, numbered
// after the last event sent, and carrying an OpenAI error object as well:
// the openai SDKs (openai-node's Stream, openai-go's ssestream) raise an
// event whose data has an "error" field as their own APIError, and stream
// on past the API's bare error event (type, code, message) and past a
// response.failed, which an app would have to look for.
func (responsesDialect) streamError(a *answering, msg string) {
	var last struct {
		Seq *int64 `json:"sequence_number"`
	}
	seq := int64(0)
	if json.Unmarshal(a.last.Data, &last) == nil && last.Seq != nil {
		seq = *last.Seq + 1
	}
	a.sse("error", map[string]any{
		"type": "error", "code": "stream_interrupted", "message": msg, "param": nil, "sequence_number": seq,
		"error": map[string]any{"message": msg, "type": "server_error", "code": "stream_interrupted", "param": nil, "run_id": a.runID},
	}, false)
}
