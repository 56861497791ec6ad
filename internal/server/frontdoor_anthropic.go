package server

import (
	"net/http"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/conversation"
)

// Anthropic's Messages (POST /v1/messages) on the same machinery as Chat
// Completions: the request read by conversation.Messages into the run's
// typed conversation (system prompt, messages with images, tool_use and
// tool_result blocks, tools, tool_choice, options), the answer written by
// it as a message or its stream of message_start … message_stop events.
// The API key comes as X-Api-Key (or a bearer token). What a delegate the
// run can reach cannot carry is refused by name before any call.

func (f *frontDoor) messages(w http.ResponseWriter, r *http.Request) {
	f.serve(w, r, anthropicDialect{})
}

// anthropicDialect is the Messages API.
type anthropicDialect struct{}

func (anthropicDialect) codec() conversation.Codec { return conversation.Messages{} }

func (anthropicDialect) messages() string         { return "messages" }
func (anthropicDialect) field(name string) string { return name }
func (anthropicDialect) rename(msg string) string { return msg }

func (anthropicDialect) usage(u *stubbornv1.Usage) map[string]int64 {
	return map[string]int64{"input_tokens": u.GetInputTokens(), "output_tokens": u.GetOutputTokens()}
}

// carried is choice 0's deltas: the Messages API answers one choice.
func (anthropicDialect) carried(ds []*stubbornv1.OutputDelta) []*stubbornv1.OutputDelta {
	out := ds[:0:0]
	for _, d := range ds {
		if d.GetChoice() == 0 {
			out = append(out, d)
		}
	}
	return out
}

// errorBody is Anthropic's error shape; its type is named by status.
func (anthropicDialect) errorBody(f failure) any {
	kind := "api_error"
	switch {
	case f.status == http.StatusBadRequest, f.status == http.StatusConflict, f.status == http.StatusRequestTimeout, f.status == http.StatusUnprocessableEntity:
		kind = "invalid_request_error"
	case f.status == http.StatusRequestEntityTooLarge:
		kind = "request_too_large" // Anthropic's own type for its 413
	case f.status == http.StatusUnauthorized:
		kind = "authentication_error"
	case f.status == http.StatusForbidden:
		kind = "permission_error"
	case f.status == http.StatusNotFound:
		kind = "not_found_error"
	case f.status == http.StatusGatewayTimeout:
		kind = "timeout_error"
	case f.status == http.StatusTooManyRequests:
		kind = "rate_limit_error"
	case f.code == "unavailable":
		kind = "overloaded_error"
	}
	return map[string]any{"type": "error", "error": map[string]any{"type": kind, "message": f.msg}}
}

// streamError is an error event naming the run, which the SDKs raise.
func (anthropicDialect) streamError(a *answering, msg string) {
	a.sse("error", map[string]any{"type": "error", "error": map[string]any{"type": "api_error", "message": msg, "run_id": a.runID}}, false)
}
