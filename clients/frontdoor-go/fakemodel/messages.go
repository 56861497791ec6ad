package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"
)

// messages serves POST /v1/messages (Anthropic Messages).
func (f *fake) messages(w http.ResponseWriter, r *http.Request) {
	type block struct {
		Type      string          `json:"type"`
		Text      string          `json:"text"`
		ToolUseID string          `json:"tool_use_id"`
		Content   json.RawMessage `json:"content"`
	}
	var req struct {
		Model     string `json:"model"`
		Stream    bool   `json:"stream"`
		MaxTokens int    `json:"max_tokens"`
		Messages  []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Tools []struct {
			Name string `json:"name"`
		} `json:"tools"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		messagesError(w, http.StatusBadRequest, "invalid_request_error", "the body is not JSON: "+err.Error())
		return
	}
	if req.MaxTokens <= 0 || len(req.Messages) == 0 {
		messagesError(w, http.StatusBadRequest, "invalid_request_error", "max_tokens and messages are required")
		return
	}
	last := Last{Messages: len(req.Messages)}
	for _, t := range req.Tools {
		last.Tools = append(last.Tools, t.Name)
	}
	// The tool results the conversation ends with: the tool_result blocks
	// of its last (user) message.
	if m := req.Messages[len(req.Messages)-1]; m.Role == "user" {
		var blocks []block
		_ = json.Unmarshal(m.Content, &blocks)
		for _, b := range blocks {
			if b.Type != "tool_result" {
				continue
			}
			last.ToolResultIDs = append(last.ToolResultIDs, b.ToolUseID)
			var text string
			if json.Unmarshal(b.Content, &text) != nil {
				var parts []block
				_ = json.Unmarshal(b.Content, &parts)
				for _, p := range parts {
					text += p.Text
				}
			}
			last.ToolResults = append(last.ToolResults, text)
		}
	}
	f.serve(w, r, api{name: "messages", fail: messagesError, whole: messagesWhole, stream: messagesStream}, req.Model, req.Stream, 1, last)
}

func messagesError(w http.ResponseWriter, code int, kind, msg string) {
	errorJSON(w, code, map[string]any{"type": "error", "error": map[string]any{"type": kind, "message": msg}})
}

const messageID = "msg_fake"

// block is choice c as a Messages content block, whole.
func (c choice) block() map[string]any {
	if c.call != nil {
		var input any
		_ = json.Unmarshal([]byte(strings.Join(c.call.args, "")), &input)
		return map[string]any{"type": "tool_use", "id": c.call.id, "name": c.call.name, "input": input}
	}
	return map[string]any{"type": "text", "text": c.text()}
}

func (c choice) stopReason() string {
	if c.call != nil {
		return "tool_use"
	}
	return "end_turn"
}

// messagesWhole answers choice 0 (Messages has no n).
func messagesWhole(w http.ResponseWriter, model string, a answer) {
	c := a[0]
	writeJSON(w, map[string]any{
		"id": messageID, "type": "message", "role": "assistant", "model": model,
		"content": []any{c.block()}, "stop_reason": c.stopReason(), "stop_sequence": nil,
		"usage": map[string]int{"input_tokens": 3, "output_tokens": 4},
	})
}

// messagesStream streams choice 0 as Anthropic does: message_start,
// content_block_start, a ping, content_block_delta (text_delta or
// input_json_delta) per piece, content_block_stop, message_delta with the
// stop reason and usage, message_stop.
func messagesStream(w http.ResponseWriter, model string, a answer, cut int, delay time.Duration) {
	s := newSSE(w)
	c := a[0]
	s.event("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": messageID, "type": "message", "role": "assistant", "model": model, "content": []any{},
		"stop_reason": nil, "stop_sequence": nil, "usage": map[string]int{"input_tokens": 3, "output_tokens": 1},
	}})
	start := map[string]any{"type": "text", "text": ""}
	if c.call != nil {
		start = map[string]any{"type": "tool_use", "id": c.call.id, "name": c.call.name, "input": map[string]any{}}
	}
	s.event("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": start})
	s.event("ping", map[string]any{"type": "ping"})
	for j := range c.pieces() {
		if j > 0 {
			time.Sleep(delay)
		}
		if j == cut {
			panic(http.ErrAbortHandler) // the connection drops mid-answer
		}
		delta := map[string]any{"type": "text_delta", "text": ""}
		if c.call != nil {
			delta = map[string]any{"type": "input_json_delta", "partial_json": c.call.args[j]}
		} else {
			delta["text"] = c.words[j]
		}
		s.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": delta})
	}
	s.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	s.event("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": c.stopReason(), "stop_sequence": nil}, "usage": map[string]int{"output_tokens": 4}})
	s.event("message_stop", map[string]any{"type": "message_stop"})
}
