package server

import (
	"net/http"
	"regexp"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/conversation"
)

// OpenAI's Chat Completions (POST /v1/chat/completions): the request read
// by conversation.Chat into the run's typed conversation, the answer
// written by it as a chat.completion (every choice, tool calls included)
// or a stream of chat.completion.chunk events ending with [DONE].

func (f *frontDoor) chatCompletions(w http.ResponseWriter, r *http.Request) {
	f.serve(w, r, openAIDialect{})
}

// openAIDialect is the Chat Completions API.
type openAIDialect struct{}

func (openAIDialect) codec() conversation.Codec { return conversation.Chat{} }

func (openAIDialect) messages() string { return "messages" }

// field is a field of the typed conversation (a check's, such as
// tools[0].name) as Chat Completions' body has it: a tool's and a call's
// name, description, parameters, strict and arguments sit in its
// "function" object.
func (openAIDialect) field(name string) string {
	return chatFunctionField.ReplaceAllString(name, "${1}.function.${2}")
}

// rename names the fields in an error's words as field does.
func (d openAIDialect) rename(msg string) string {
	return chatFunctionField.ReplaceAllString(msg, "${1}.function.${2}")
}

// chatFunctionField matches the paths field rewrites: a tool's, a tool
// call's, tool_choice's.
var chatFunctionField = regexp.MustCompile(`\b(tools\[\d+\]|messages\[\d+\]\.tool_calls\[\d+\]|tool_choice)\.(name|description|parameters|strict|arguments)\b`)

// errorBody is OpenAI's error shape; its type is what the SDKs show.
func (openAIDialect) errorBody(f failure) any {
	kind := "server_error"
	switch f.status {
	case http.StatusBadRequest, http.StatusNotFound, http.StatusConflict, http.StatusRequestTimeout, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
		kind = "invalid_request_error"
	case http.StatusUnauthorized:
		kind = "authentication_error"
	case http.StatusForbidden:
		kind = "permission_error"
	case http.StatusTooManyRequests:
		kind = "rate_limit_error"
		if f.code == "insufficient_quota" {
			kind = f.code // OpenAI's type and code for an account out of credit
		}
	}
	var param any
	if f.param != "" {
		param = f.param
	}
	return map[string]any{"error": map[string]any{"message": f.msg, "type": kind, "code": f.code, "param": param}}
}

func (openAIDialect) usage(u *stubbornv1.Usage) map[string]int64 {
	return map[string]int64{"prompt_tokens": u.GetInputTokens(), "completion_tokens": u.GetOutputTokens(), "total_tokens": u.GetTotalTokens()}
}

// carried is every delta: Chat Completions streams every choice.
func (openAIDialect) carried(ds []*stubbornv1.OutputDelta) []*stubbornv1.OutputDelta { return ds }

// streamError is an OpenAI-shaped error event naming the run, which the
// SDKs raise as their own error.
func (openAIDialect) streamError(a *answering, msg string) {
	a.sse("", map[string]any{"error": map[string]any{"message": msg, "type": "server_error", "code": "stream_interrupted", "param": nil, "run_id": a.runID}}, false)
}
