package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"
)

// chatUsage is what the good model reports using per choice.
func chatUsage(n int) map[string]int {
	return map[string]int{"prompt_tokens": 3, "completion_tokens": 4 * n, "total_tokens": 3 + 4*n}
}

// chat serves POST /v1/chat/completions.
func (f *fake) chat(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model    string `json:"model"`
		Stream   bool   `json:"stream"`
		N        int    `json:"n"`
		Messages []struct {
			Role       string          `json:"role"`
			Content    json.RawMessage `json:"content"`
			ToolCallID string          `json:"tool_call_id"`
		} `json:"messages"`
		Tools []struct {
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		} `json:"tools"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		chatError(w, http.StatusBadRequest, "invalid_request_error", "the body is not JSON: "+err.Error())
		return
	}
	last := Last{Messages: len(req.Messages)}
	for _, t := range req.Tools {
		last.Tools = append(last.Tools, t.Function.Name)
	}
	// The tool results the conversation ends with: its trailing role
	// "tool" messages.
	for i := len(req.Messages) - 1; i >= 0 && req.Messages[i].Role == "tool"; i-- {
		m := req.Messages[i]
		last.ToolResultIDs = append([]string{m.ToolCallID}, last.ToolResultIDs...)
		last.ToolResults = append([]string{chatText(m.Content)}, last.ToolResults...)
	}
	f.serve(w, r, api{name: "chat", fail: chatError, whole: chatWhole, stream: chatStream}, req.Model, req.Stream, req.N, last)
}

// chatText is a message's content as text: a string, or its text parts.
func chatText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type, Text string
	}
	_ = json.Unmarshal(raw, &parts)
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String()
}

func chatError(w http.ResponseWriter, code int, kind, msg string) {
	e := map[string]any{"message": msg, "type": kind, "code": nil, "param": nil}
	if code == http.StatusBadRequest && strings.HasPrefix(msg, "Invalid 'temperature'") {
		e["param"], e["code"] = "temperature", "decimal_above_max_value"
	}
	errorJSON(w, code, map[string]any{"error": e})
}

const chatID = "chatcmpl-fake"

func chatWhole(w http.ResponseWriter, model string, a answer) {
	choices := make([]any, len(a))
	for i, c := range a {
		msg := map[string]any{"role": "assistant", "content": c.text(), "refusal": nil}
		finish := "stop"
		if c.call != nil {
			msg["content"] = nil
			msg["tool_calls"] = []any{map[string]any{"id": c.call.id, "type": "function",
				"function": map[string]any{"name": c.call.name, "arguments": strings.Join(c.call.args, "")}}}
			finish = "tool_calls"
		}
		choices[i] = map[string]any{"index": i, "message": msg, "finish_reason": finish, "logprobs": nil}
	}
	writeJSON(w, map[string]any{
		"id": chatID, "object": "chat.completion", "created": time.Now().Unix(), "model": model,
		"choices": choices, "usage": chatUsage(len(a)),
	})
}

// chatStream streams a as OpenAI does: a first chunk per choice with its
// role (and a tool call's id and name), then the pieces, the choices
// interleaved, each chunk naming its choice's index; a finish chunk per
// choice, the usage chunk, [DONE].
func chatStream(w http.ResponseWriter, model string, a answer, cut int, delay time.Duration) {
	s := newSSE(w)
	created := time.Now().Unix()
	chunk := func(i int, delta map[string]any, finish any) {
		s.event("", map[string]any{"id": chatID, "object": "chat.completion.chunk", "created": created, "model": model,
			"choices": []any{map[string]any{"index": i, "delta": delta, "finish_reason": finish}}})
	}
	toolDelta := func(c *call, first bool, args string) map[string]any {
		tc := map[string]any{"index": 0, "function": map[string]any{"arguments": args}}
		if first {
			tc["id"], tc["type"], tc["function"] = c.id, "function", map[string]any{"name": c.name, "arguments": args}
		}
		return map[string]any{"tool_calls": []any{tc}}
	}
	pieces := 0
	for i, c := range a {
		pieces = max(pieces, c.pieces())
		if c.call != nil {
			d := toolDelta(c.call, true, "")
			d["role"], d["content"] = "assistant", nil
			chunk(i, d, nil)
		} else {
			chunk(i, map[string]any{"role": "assistant", "content": ""}, nil)
		}
	}
	for j := range pieces {
		if j > 0 {
			time.Sleep(delay)
		}
		if j == cut {
			panic(http.ErrAbortHandler) // the connection drops mid-answer
		}
		for i, c := range a {
			switch {
			case c.call != nil && j < len(c.call.args):
				chunk(i, toolDelta(c.call, false, c.call.args[j]), nil)
			case c.call == nil && j < len(c.words):
				chunk(i, map[string]any{"content": c.words[j]}, nil)
			}
		}
	}
	for i, c := range a {
		finish := "stop"
		if c.call != nil {
			finish = "tool_calls"
		}
		chunk(i, map[string]any{}, finish)
	}
	s.event("", map[string]any{"id": chatID, "object": "chat.completion.chunk", "created": created, "model": model,
		"choices": []any{}, "usage": chatUsage(len(a))})
	s.raw("data: [DONE]\n\n")
}
