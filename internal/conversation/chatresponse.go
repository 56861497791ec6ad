package conversation

import (
	"encoding/json"
	"sort"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

var chatFinish = map[string]stubbornv1.FinishReason{
	"stop": stubbornv1.FinishReason_FINISH_REASON_STOP, "length": stubbornv1.FinishReason_FINISH_REASON_LENGTH,
	"tool_calls": stubbornv1.FinishReason_FINISH_REASON_TOOL_CALLS, "function_call": stubbornv1.FinishReason_FINISH_REASON_TOOL_CALLS,
	"content_filter": stubbornv1.FinishReason_FINISH_REASON_CONTENT_FILTER,
}

// chatFinishReason is a choice's finish_reason in Chat Completions' words:
// its native one when that is Chat Completions' and means the same.
func chatFinishReason(c *stubbornv1.Choice) string {
	if n := c.GetNativeFinishReason(); chatFinish[n] == c.GetFinishReason() && n != "" {
		return n
	}
	switch c.GetFinishReason() {
	case stubbornv1.FinishReason_FINISH_REASON_LENGTH, stubbornv1.FinishReason_FINISH_REASON_PAUSE:
		return "length" // a paused turn is an unfinished answer
	case stubbornv1.FinishReason_FINISH_REASON_TOOL_CALLS:
		return "tool_calls"
	case stubbornv1.FinishReason_FINISH_REASON_CONTENT_FILTER:
		return "content_filter"
	}
	return "stop"
}

type chatUsage struct {
	PromptTokens        int64 `json:"prompt_tokens"`
	CompletionTokens    int64 `json:"completion_tokens"`
	TotalTokens         int64 `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details,omitempty"`
	CompletionTokensDetails *struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"completion_tokens_details,omitempty"`
}

func (u *chatUsage) typed() *stubbornv1.Usage {
	if u == nil {
		return nil
	}
	t := &stubbornv1.Usage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
	if u.PromptTokensDetails != nil {
		t.CacheReadTokens = u.PromptTokensDetails.CachedTokens
	}
	if u.CompletionTokensDetails != nil {
		t.ReasoningTokens = u.CompletionTokensDetails.ReasoningTokens
	}
	return t
}

func chatUsageOf(u *stubbornv1.Usage) map[string]any {
	out := map[string]any{"prompt_tokens": u.GetInputTokens(), "completion_tokens": u.GetOutputTokens(),
		"total_tokens": u.GetTotalTokens()}
	if u.GetTotalTokens() == 0 {
		out["total_tokens"] = u.GetInputTokens() + u.GetOutputTokens()
	}
	if u.GetCacheReadTokens() > 0 {
		out["prompt_tokens_details"] = map[string]any{"cached_tokens": u.GetCacheReadTokens()}
	}
	if u.GetReasoningTokens() > 0 {
		out["completion_tokens_details"] = map[string]any{"reasoning_tokens": u.GetReasoningTokens()}
	}
	return out
}

type chatCall struct {
	Index    *int   `json:"index"`
	ID       string `json:"id"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type chatAnswerMessage struct {
	Content   *string    `json:"content"`
	Refusal   string     `json:"refusal"`
	ToolCalls []chatCall `json:"tool_calls"`
}

type chatChoice struct {
	Index        int               `json:"index"`
	Message      chatAnswerMessage `json:"message"`
	Delta        chatAnswerMessage `json:"delta"`
	FinishReason string            `json:"finish_reason"`
}

type chatResponse struct {
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   *chatUsage   `json:"usage"`
	Error   *struct {
		Type    string `json:"type"`
		Code    any    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// DecodeResponse reads a whole Chat Completions answer.
func (Chat) DecodeResponse(body []byte) (*stubbornv1.Result, error) {
	if !depthOK(body) {
		return nil, fieldErr("", "the answer nests more than %d levels deep", MaxDepth)
	}
	var a chatResponse
	if err := json.Unmarshal(body, &a); err != nil {
		return nil, fieldErr("", "the answer is not a Chat Completions response: %v", err)
	}
	if len(a.Choices) > MaxChoices {
		return nil, fieldErr("choices", "has %d choices, more than %d", len(a.Choices), MaxChoices)
	}
	choices := make([]*stubbornv1.Choice, 0, len(a.Choices))
	seen := map[int]bool{}
	for i, c := range a.Choices {
		if c.Index < 0 || c.Index >= MaxChoices || seen[c.Index] {
			return nil, fieldErr(at("choices", i)+".index", "%d is out of range or repeated", c.Index)
		}
		seen[c.Index] = true
		if len(c.Message.ToolCalls) > MaxToolCalls {
			return nil, fieldErr(at("choices", i)+".message.tool_calls", "has more than %d calls", MaxToolCalls)
		}
		m := &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT, Refusal: c.Message.Refusal}
		if c.Message.Content != nil {
			m.Content = []*stubbornv1.ContentPart{textPart(*c.Message.Content)}
		}
		for _, call := range c.Message.ToolCalls {
			m.ToolCalls = append(m.ToolCalls, &stubbornv1.ToolCall{Id: call.ID, Name: call.Function.Name, Arguments: call.Function.Arguments})
		}
		choices = append(choices, &stubbornv1.Choice{Index: int32(c.Index), Message: m,
			FinishReason: chatFinish[c.FinishReason], NativeFinishReason: c.FinishReason})
	}
	sort.Slice(choices, func(i, j int) bool { return choices[i].Index < choices[j].Index })
	return resultOf(choices, a.Usage.typed(), a.Model), nil
}

// EncodeResponse writes a whole Chat Completions answer.
func (Chat) EncodeResponse(r *stubbornv1.Result, m Meta) ([]byte, error) {
	choices := make([]any, 0, len(r.GetChoices()))
	for _, c := range choicesOf(r) {
		msg := map[string]any{"role": "assistant", "content": nil}
		if len(c.GetMessage().GetContent()) > 0 || len(c.GetMessage().GetToolCalls()) == 0 {
			msg["content"] = Text(c.GetMessage())
		}
		if c.GetMessage().GetRefusal() != "" {
			msg["refusal"] = c.GetMessage().GetRefusal()
		}
		if calls := c.GetMessage().GetToolCalls(); len(calls) > 0 {
			out := make([]any, len(calls))
			for j, call := range calls {
				out[j] = map[string]any{"id": call.GetId(), "type": "function",
					"function": map[string]any{"name": call.GetName(), "arguments": call.GetArguments()}}
			}
			msg["tool_calls"] = out
		}
		choices = append(choices, map[string]any{"index": c.GetIndex(), "message": msg,
			"finish_reason": chatFinishReason(c), "logprobs": nil})
	}
	out := map[string]any{"id": m.ID, "object": "chat.completion", "created": m.Created, "model": m.Model, "choices": choices}
	if r.GetUsage() != nil {
		out["usage"] = chatUsageOf(r.GetUsage())
	}
	return marshal(out)
}

// choicesOf is r's choices, or one made of its text for a result without
// (a delegate that is not a model).
func choicesOf(r *stubbornv1.Result) []*stubbornv1.Choice {
	if len(r.GetChoices()) > 0 {
		return r.GetChoices()
	}
	return []*stubbornv1.Choice{{Message: &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT,
		Content: []*stubbornv1.ContentPart{textPart(r.GetText())}}, FinishReason: stubbornv1.FinishReason_FINISH_REASON_STOP}}
}
