package server

import (
	"errors"
	"io"
	"net/http"

	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// OpenAI's Chat Completions (POST /v1/chat/completions): the request's
// messages and its other fields as they came (the model parameters), the
// answer as a chat.completion or a stream of chat.completion.chunk events
// ending with [DONE].

func (f *frontDoor) chatCompletions(w http.ResponseWriter, r *http.Request) {
	f.serve(w, r, openAIDialect{})
}

// openAIDialect is the Chat Completions API.
type openAIDialect struct{}

// parse reads a Chat Completions request body: one decoding, whose fields
// the front door acts on are taken out and checked, the rest kept as the
// model parameters.
func (openAIDialect) parse(body []byte) (*doorRequest, error) {
	all, err := jsonObject(body)
	if err != nil {
		return nil, errors.New("the body is not a Chat Completions request: " + err.Error())
	}
	req := &doorRequest{}
	if req.Model, err = stringField(all, "model"); err != nil {
		return nil, err
	}
	if req.Stream, err = boolField(all, "stream"); err != nil {
		return nil, err
	}
	if v, set := all["stream_options"]; set && v != nil {
		o, isObject := v.(map[string]any)
		if !isObject {
			return nil, errors.New("stream_options: must be an object")
		}
		if req.IncludeUsage, err = boolField(o, "include_usage"); err != nil {
			return nil, errors.New("stream_options." + err.Error())
		}
	}
	if req.messages, err = structMessages(all["messages"]); err != nil {
		return nil, err
	}
	if req.criteria, err = parseCriteria(all); err != nil {
		return nil, err
	}
	for _, k := range []string{"model", "messages", "stream", "stream_options", "stubborn"} {
		delete(all, k)
	}
	if len(all) > 0 {
		if req.params, err = structpb.NewStruct(all); err != nil {
			return nil, err
		}
	}
	return req, nil
}

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
	}
	var param any
	if f.param != "" {
		param = f.param
	}
	return map[string]any{"error": map[string]any{"message": f.msg, "type": kind, "code": f.code, "param": param}}
}

// chatChunk is a chat.completion.chunk of one choice (or, with usage, of
// none).
type chatChunk struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []chunkChoice `json:"choices"`
	Usage   any           `json:"usage,omitempty"`
}

type chunkChoice struct {
	Index        int       `json:"index"`
	Delta        chatDelta `json:"delta"`
	FinishReason *string   `json:"finish_reason"`
}

// chatDelta is a chunk's delta: the role, then content pieces. A role
// chunk's content is "" (as OpenAI sends it); the last chunk's is absent.
type chatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

func chunkOf(a *answering, delta chatDelta, finish *string) chatChunk {
	return chatChunk{ID: a.runID, Object: "chat.completion.chunk", Created: a.f.now().Unix(), Model: a.req.Model,
		Choices: []chunkChoice{{Delta: delta, FinishReason: finish}}}
}

// begin is the chunk with the role, sent with the first piece.
func (openAIDialect) begin(a *answering) {
	a.sse("", chunkOf(a, chatDelta{Role: "assistant", Content: new("")}, nil), true)
}

func (openAIDialect) delta(a *answering, text string) {
	a.sse("", chunkOf(a, chatDelta{Content: &text}, nil), false)
}

// end is the chunk with the finish reason, the usage chunk when asked
// (stream_options.include_usage), and [DONE].
func (openAIDialect) end(a *answering, st *stubbornv1.ControlState) {
	a.sse("", chunkOf(a, chatDelta{}, new(finishReason(st))), true)
	if a.req.IncludeUsage {
		all, _ := usage(st)
		a.sse("", chatChunk{ID: a.runID, Object: "chat.completion.chunk", Created: a.f.now().Unix(), Model: a.req.Model, Choices: []chunkChoice{}, Usage: all}, true)
	}
	_, _ = io.WriteString(a.w, "data: [DONE]\n\n")
}

// whole is a chat.completion: the winner's text, the usage of every
// attempt, and the run (the stubborn field).
func (openAIDialect) whole(a *answering, st *stubbornv1.ControlState) any {
	all, winner := usage(st)
	return map[string]any{
		"id": a.runID, "object": "chat.completion", "created": a.f.now().Unix(), "model": a.req.Model,
		"choices": []any{map[string]any{
			"index": 0, "message": map[string]any{"role": "assistant", "content": st.GetResult().GetText()}, "finish_reason": finishReason(st),
		}},
		"usage":    all,
		"stubborn": a.stubbornPart(st, winner),
	}
}

// streamError is an OpenAI-shaped error event naming the run, which the
// SDKs raise as their own error.
func (openAIDialect) streamError(a *answering, msg string) {
	a.sse("", map[string]any{"error": map[string]any{"message": msg, "type": "server_error", "code": "stream_interrupted", "param": nil, "run_id": a.runID}}, false)
}

// finishReason is the winner's finish reason in Chat Completions' words
// (an Anthropic model's stop_reason translated), else "stop".
func finishReason(st *stubbornv1.ControlState) string {
	switch s := stopReason(st); s {
	case "", "end_turn", "stop_sequence":
		return "stop"
	case "max_tokens":
		return "length"
	case "tool_use":
		return "tool_calls"
	default:
		return s
	}
}
