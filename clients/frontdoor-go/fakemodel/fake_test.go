package main

// The fake model under the official OpenAI Go SDK, without Stubborn: what
// the scenarios of clients/check-frontdoor.sh take from it (tool calls,
// choices, errors) must be what the SDK parses from a real model.
// clients/frontdoor-node/fake.mjs does the same with the openai npm package
// and @anthropic-ai/sdk.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

func client(t *testing.T, mode string) (openai.Client, string) {
	t.Helper()
	srv := httptest.NewServer(New(mode, http.StatusInternalServerError, time.Millisecond))
	t.Cleanup(srv.Close)
	return openai.NewClient(option.WithBaseURL(srv.URL+"/v1"), option.WithAPIKey("k"), option.WithMaxRetries(0)), srv.URL
}

var weather = openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{
	Name:       Tool,
	Parameters: openai.FunctionParameters{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}},
})

func ask(msgs ...openai.ChatCompletionMessageParamUnion) openai.ChatCompletionNewParams {
	if len(msgs) == 0 {
		msgs = []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Weather in Paris?")}
	}
	return openai.ChatCompletionNewParams{Model: "m", Messages: msgs, Tools: []openai.ChatCompletionToolUnionParam{weather}}
}

// checkCall checks that m is one get_weather call with {"city": "Paris"}.
func checkCall(t *testing.T, m openai.ChatCompletionMessage) string {
	t.Helper()
	if len(m.ToolCalls) != 1 || m.ToolCalls[0].Function.Name != Tool || m.ToolCalls[0].ID == "" {
		t.Fatalf("tool calls %+v, want one %s with an id", m.ToolCalls, Tool)
	}
	var args struct{ City string }
	if err := json.Unmarshal([]byte(m.ToolCalls[0].Function.Arguments), &args); err != nil || args.City != "Paris" {
		t.Fatalf("arguments %q (%v), want {\"city\": \"Paris\"}", m.ToolCalls[0].Function.Arguments, err)
	}
	return m.ToolCalls[0].ID
}

func TestToolCall(t *testing.T) {
	c, url := client(t, "tools")
	ctx := context.Background()
	got, err := c.Chat.Completions.New(ctx, ask())
	if err != nil {
		t.Fatal(err)
	}
	if got.Choices[0].FinishReason != "tool_calls" {
		t.Errorf("finish_reason %q", got.Choices[0].FinishReason)
	}
	id := checkCall(t, got.Choices[0].Message)

	stream := c.Chat.Completions.NewStreaming(ctx, ask())
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(acc.Choices) != 1 || acc.Choices[0].FinishReason != "tool_calls" {
		t.Fatalf("streamed: %+v", acc.Choices)
	}
	checkCall(t, acc.Choices[0].Message)

	// The second turn: the call and its result back; the model answers
	// text and records the id.
	turn := ask(openai.UserMessage("Weather in Paris?"), got.Choices[0].Message.ToParam(), openai.ToolMessage(`{"sky": "clear"}`, id))
	for _, streamed := range []bool{false, true} {
		var text string
		if streamed {
			s := c.Chat.Completions.NewStreaming(ctx, turn)
			var acc openai.ChatCompletionAccumulator
			for s.Next() {
				acc.AddChunk(s.Current())
			}
			if err := s.Err(); err != nil {
				t.Fatal(err)
			}
			text = acc.Choices[0].Message.Content
		} else {
			got, err := c.Chat.Completions.New(ctx, turn)
			if err != nil {
				t.Fatal(err)
			}
			text = got.Choices[0].Message.Content
		}
		if text != Sunny {
			t.Errorf("streamed %v: the answer to the tool result is %q, want %q", streamed, text, Sunny)
		}
	}
	resp, err := http.Get(url + "/last")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var last map[string]Last
	if err := json.NewDecoder(resp.Body).Decode(&last); err != nil {
		t.Fatal(err)
	}
	if l := last["chat"]; len(l.ToolResultIDs) != 1 || l.ToolResultIDs[0] != id || l.ToolResults[0] != `{"sky": "clear"}` || l.Tools[0] != Tool {
		t.Errorf("/last %+v, want the result of %s", l, id)
	}
}

// A request without the tool is a 400: a tool lost on the way shows.
func TestToolMissing(t *testing.T) {
	c, _ := client(t, "tools")
	p := ask()
	p.Tools = nil
	_, err := c.Chat.Completions.New(context.Background(), p)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest {
		t.Fatalf("got %v, want a 400", err)
	}
}

func TestChoices(t *testing.T) {
	c, _ := client(t, "good")
	p := ask()
	p.N = openai.Int(2)
	got, err := c.Chat.Completions.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Choices) != 2 || got.Choices[0].Message.Content != "The answer is 42." || got.Choices[1].Message.Content != "The answer is 43." {
		t.Fatalf("choices %+v", got.Choices)
	}
	s := c.Chat.Completions.NewStreaming(context.Background(), p)
	var acc openai.ChatCompletionAccumulator
	for s.Next() {
		acc.AddChunk(s.Current())
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if len(acc.Choices) != 2 || acc.Choices[0].Message.Content != "The answer is 42." || acc.Choices[1].Message.Content != "The answer is 43." {
		t.Fatalf("streamed choices %+v", acc.Choices)
	}
}

func TestErrors(t *testing.T) {
	for mode, status := range map[string]int{"bad-request": 400, "busy": 500, "throttle": 429} {
		c, _ := client(t, mode)
		_, err := c.Chat.Completions.New(context.Background(), ask())
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != status {
			t.Fatalf("%s: got %v, want %d", mode, err, status)
		}
		if mode == "bad-request" && (apiErr.Message != BadTemperature || apiErr.Param != "temperature") {
			t.Errorf("bad-request: message %q param %q", apiErr.Message, apiErr.Param)
		}
	}
}
