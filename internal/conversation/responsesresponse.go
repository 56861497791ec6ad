package conversation

import (
	"encoding/json"
	"strconv"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// The response object's wire shape. Its echo of the request (tools,
// tool_choice, temperature, …) is what the API returns and the SDKs' types
// have; instructions are not echoed apart (they are the conversation's
// first system message), nor are provider-state fields (always off here).
type (
	responseBody struct {
		ID                 string             `json:"id"`
		Object             string             `json:"object"`
		CreatedAt          int64              `json:"created_at"`
		Status             string             `json:"status"`
		Background         bool               `json:"background"`
		Error              *responseError     `json:"error"`
		IncompleteDetails  *incompleteDetails `json:"incomplete_details"`
		Instructions       *string            `json:"instructions"`
		MaxOutputTokens    *int64             `json:"max_output_tokens"`
		Metadata           map[string]string  `json:"metadata"`
		Model              string             `json:"model"`
		Output             []any              `json:"output"`
		ParallelToolCalls  bool               `json:"parallel_tool_calls"`
		PreviousResponseID *string            `json:"previous_response_id"`
		Reasoning          responseReasoning  `json:"reasoning"`
		Store              bool               `json:"store"`
		Temperature        float64            `json:"temperature"`
		Text               responseText       `json:"text"`
		ToolChoice         any                `json:"tool_choice"`
		Tools              []any              `json:"tools"`
		TopP               float64            `json:"top_p"`
		Truncation         string             `json:"truncation"`
		Usage              *responsesUsage    `json:"usage"`
		User               *string            `json:"user"`
	}
	responseError struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	incompleteDetails struct {
		Reason string `json:"reason"`
	}
	responseReasoning struct {
		Effort  *string `json:"effort"`
		Summary *string `json:"summary"`
	}
	responseText struct {
		Format map[string]any `json:"format"`
	}
	responsesUsage struct {
		InputTokens        int64 `json:"input_tokens"`
		InputTokensDetails struct {
			CachedTokens int64 `json:"cached_tokens"`
		} `json:"input_tokens_details"`
		OutputTokens        int64 `json:"output_tokens"`
		OutputTokensDetails struct {
			ReasoningTokens int64 `json:"reasoning_tokens"`
		} `json:"output_tokens_details"`
		TotalTokens int64 `json:"total_tokens"`
	}
	// messageItem is an output message: its text, then its refusal.
	messageItem struct {
		ID      string `json:"id"`
		Type    string `json:"type"`
		Status  string `json:"status"`
		Role    string `json:"role"`
		Content []any  `json:"content"`
	}
	outputText struct {
		Type        string `json:"type"`
		Text        string `json:"text"`
		Annotations []any  `json:"annotations"`
		Logprobs    []any  `json:"logprobs"`
	}
	refusalPart struct {
		Type    string `json:"type"`
		Refusal string `json:"refusal"`
	}
	callItem struct {
		ID        string `json:"id"`
		Type      string `json:"type"`
		Status    string `json:"status"`
		CallID    string `json:"call_id"`
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	}
)

func newOutputText(text string) outputText {
	return outputText{Type: "output_text", Text: text, Annotations: []any{}, Logprobs: []any{}}
}

// The output items' ids: made of the response's, so a stream's items and
// its final response's are the same.
func messageID(id string, n int) string {
	if n == 0 {
		return "msg_" + id
	}
	return "msg_" + id + "_" + strconv.Itoa(n)
}

func callItemID(id string, k int32) string { return "fc_" + id + "_" + strconv.Itoa(int(k)) }

// responseStatus is the response's status for a choice's finish reason, and
// why it is incomplete.
func responseStatus(c *stubbornv1.Choice) (string, *incompleteDetails) {
	switch c.GetFinishReason() {
	case stubbornv1.FinishReason_FINISH_REASON_LENGTH, stubbornv1.FinishReason_FINISH_REASON_PAUSE:
		return "incomplete", &incompleteDetails{Reason: "max_output_tokens"}
	case stubbornv1.FinishReason_FINISH_REASON_CONTENT_FILTER:
		return "incomplete", &incompleteDetails{Reason: "content_filter"}
	}
	return "completed", nil
}

// itemStatus is an output item's status in a response of status.
func itemStatus(status string) string {
	if status == "completed" {
		return "completed"
	}
	return "incomplete"
}

// responseOf is the response object, output aside: the echo of m's
// conversation, the usage, the status.
func responseOf(m Meta, status string, usage *stubbornv1.Usage) responseBody {
	o := optionsOf(m.Conversation)
	b := responseBody{ID: m.ID, Object: "response", CreatedAt: m.Created, Status: status, Model: m.Model,
		Output: []any{}, Metadata: o.GetMetadata(), ParallelToolCalls: true, Temperature: 1, TopP: 1,
		Text: responseText{Format: map[string]any{"type": "text"}}, ToolChoice: "auto", Tools: []any{}, Truncation: "disabled"}
	if b.Metadata == nil {
		b.Metadata = map[string]string{}
	}
	if o.Temperature != nil {
		b.Temperature = o.GetTemperature()
	}
	if o.TopP != nil {
		b.TopP = o.GetTopP()
	}
	if o.MaxCompletionTokens != nil {
		b.MaxOutputTokens = o.MaxCompletionTokens
	} else if o.MaxTokens != nil {
		b.MaxOutputTokens = o.MaxTokens
	}
	if o.ParallelToolCalls != nil {
		b.ParallelToolCalls = o.GetParallelToolCalls()
	}
	if u := o.GetUser(); u != "" {
		b.User = &u
	}
	if rf := responsesFormat(o.GetResponseFormat()); rf != nil {
		b.Text.Format = rf
	}
	if tc := encodeResponsesToolChoice(o.GetToolChoice()); tc != nil {
		b.ToolChoice = tc
	}
	for _, t := range o.GetTools() {
		tool := encodeResponsesTool(t, false)
		if t.Strict == nil {
			tool["strict"] = nil
		}
		if tool["parameters"] == nil {
			tool["parameters"] = nil
		}
		b.Tools = append(b.Tools, tool)
	}
	if usage != nil {
		u := &responsesUsage{InputTokens: usage.GetInputTokens(), OutputTokens: usage.GetOutputTokens(), TotalTokens: usage.GetTotalTokens()}
		if u.TotalTokens == 0 {
			u.TotalTokens = u.InputTokens + u.OutputTokens
		}
		u.InputTokensDetails.CachedTokens = usage.GetCacheReadTokens()
		u.OutputTokensDetails.ReasoningTokens = usage.GetReasoningTokens()
		b.Usage = u
	}
	return b
}

// answerOf is r's choice 0: the Responses API has no n.
func answerOf(r *stubbornv1.Result) *stubbornv1.Choice {
	choices := choicesOf(r)
	for _, c := range choices {
		if c.GetIndex() == 0 {
			return c
		}
	}
	return choices[0]
}

// EncodeResponse writes a whole answer as a response object: a message item
// (its text and refusal; none for an answer of tool calls only), then a
// function_call item per tool call. The answer is choice 0's.
func (Responses) EncodeResponse(r *stubbornv1.Result, m Meta) ([]byte, error) {
	c := answerOf(r)
	status, incomplete := responseStatus(c)
	b := responseOf(m, status, r.GetUsage())
	b.IncompleteDetails = incomplete
	msg := c.GetMessage()
	if len(msg.GetContent()) > 0 || msg.GetRefusal() != "" || len(msg.GetToolCalls()) == 0 {
		item := messageItem{ID: messageID(m.ID, 0), Type: "message", Status: itemStatus(status), Role: "assistant", Content: []any{}}
		if len(msg.GetContent()) > 0 || msg.GetRefusal() == "" {
			item.Content = append(item.Content, newOutputText(Text(msg)))
		}
		if msg.GetRefusal() != "" {
			item.Content = append(item.Content, refusalPart{Type: "refusal", Refusal: msg.GetRefusal()})
		}
		b.Output = append(b.Output, item)
	}
	for k, call := range msg.GetToolCalls() {
		b.Output = append(b.Output, callItem{ID: callItemID(m.ID, int32(k)), Type: "function_call", Status: itemStatus(status),
			CallID: call.GetId(), Name: call.GetName(), Arguments: call.GetArguments()})
	}
	return marshal(b)
}

// The response object as a delegate side reads it.
type (
	responseIn struct {
		Status            string             `json:"status"`
		Model             string             `json:"model"`
		Output            []outputItemIn     `json:"output"`
		Usage             *responsesUsage    `json:"usage"`
		Error             *responseError     `json:"error"`
		IncompleteDetails *incompleteDetails `json:"incomplete_details"`
	}
	outputItemIn struct {
		Type      string `json:"type"`
		ID        string `json:"id"`
		CallID    string `json:"call_id"`
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
		Content   []struct {
			Type    string `json:"type"`
			Text    string `json:"text"`
			Refusal string `json:"refusal"`
		} `json:"content"`
	}
)

func (u *responsesUsage) typed() *stubbornv1.Usage {
	if u == nil {
		return nil
	}
	return &stubbornv1.Usage{InputTokens: u.InputTokens, OutputTokens: u.OutputTokens, TotalTokens: u.TotalTokens,
		CacheReadTokens: u.InputTokensDetails.CachedTokens, ReasoningTokens: u.OutputTokensDetails.ReasoningTokens}
}

// finishOf is the finish reason of a response of status, and its native
// words (the incomplete reason, else the status).
func finishOf(status string, incomplete *incompleteDetails, calls bool) (stubbornv1.FinishReason, string) {
	if status == "incomplete" && incomplete != nil {
		switch incomplete.Reason {
		case "max_output_tokens":
			return stubbornv1.FinishReason_FINISH_REASON_LENGTH, incomplete.Reason
		case "content_filter":
			return stubbornv1.FinishReason_FINISH_REASON_CONTENT_FILTER, incomplete.Reason
		}
		return stubbornv1.FinishReason_FINISH_REASON_UNSPECIFIED, incomplete.Reason
	}
	if status != "completed" {
		return stubbornv1.FinishReason_FINISH_REASON_UNSPECIFIED, status
	}
	if calls {
		return stubbornv1.FinishReason_FINISH_REASON_TOOL_CALLS, status
	}
	return stubbornv1.FinishReason_FINISH_REASON_STOP, status
}

// DecodeResponse reads a whole response object: its message items' text
// and refusals, its function_call items as tool calls, in order (reasoning
// items are the model's own and not carried). A failed response is a
// *StreamError with its error.
func (Responses) DecodeResponse(body []byte) (*stubbornv1.Result, error) {
	if !depthOK(body) {
		return nil, fieldErr("", "the answer nests more than %d levels deep", MaxDepth)
	}
	var a responseIn
	if err := json.Unmarshal(body, &a); err != nil {
		return nil, fieldErr("", "the answer is not a Responses API response: %v", err)
	}
	if a.Status == "failed" || a.Error != nil {
		e := &StreamError{Type: "failed"}
		if a.Error != nil {
			e.Type, e.Message = a.Error.Code, a.Error.Message
		}
		return nil, e
	}
	return resultOfOutput(a, a.Output)
}

// resultOfOutput is the answer of a response's output items.
func resultOfOutput(a responseIn, items []outputItemIn) (*stubbornv1.Result, error) {
	m := &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT}
	var text []byte
	texts := false
	for i, item := range items {
		switch item.Type {
		case "message":
			if len(item.Content) > MaxParts {
				return nil, fieldErr(at("output", i)+".content", "has more than %d parts", MaxParts)
			}
			for _, p := range item.Content {
				switch p.Type {
				case "output_text":
					text, texts = append(text, p.Text...), true
				case "refusal":
					m.Refusal += p.Refusal
				}
			}
		case "function_call":
			if len(m.ToolCalls) >= MaxToolCalls {
				return nil, fieldErr(at("output", i), "is more than %d tool calls", MaxToolCalls)
			}
			m.ToolCalls = append(m.ToolCalls, &stubbornv1.ToolCall{Id: item.CallID, Name: item.Name, Arguments: item.Arguments})
		}
	}
	if texts || len(m.ToolCalls) == 0 && m.Refusal == "" {
		m.Content = []*stubbornv1.ContentPart{textPart(string(text))}
	}
	c := &stubbornv1.Choice{Message: m}
	c.FinishReason, c.NativeFinishReason = finishOf(a.Status, a.IncompleteDetails, len(m.ToolCalls) > 0)
	return resultOf([]*stubbornv1.Choice{c}, a.Usage.typed(), a.Model), nil
}
