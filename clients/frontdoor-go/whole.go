package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"

	"github.com/openai/openai-go/v3"
)

// What the tool-calling and bad-request fake models answer
// (clients/frontdoor-go/fakemodel).
const (
	sunny          = "It is sunny in Paris."
	badTemperature = "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 5 instead."
)

var weather = openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{
	Name:        "get_weather",
	Description: openai.String("The weather in a city."),
	Parameters: openai.FunctionParameters{
		"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []string{"city"},
	},
})

// whole checks the model's whole answer: a tool call across providers,
// plain and streamed, its result back, choices, the model's own 400; each
// part also when another failed.
func whole(ctx context.Context, client openai.Client, toolsURL string) error {
	question := openai.UserMessage("What is the weather in Paris?")
	req := openai.ChatCompletionNewParams{
		Model:    "tools-to-anthropic",
		Messages: []openai.ChatCompletionMessageParamUnion{question},
		Tools:    []openai.ChatCompletionToolUnionParam{weather},
	}

	return parts(
		part{"tool calls, then the second turn", func() error {
			// tools-to-anthropic = fallback_chain [an openai model answering 500,
			// an anthropic model answering tool_use]: the app gets tool_calls.
			c, err := client.Chat.Completions.New(ctx, req)
			if err != nil {
				return fmt.Errorf("chat.completions.new(tools-to-anthropic): %w", describe(err))
			}
			if len(c.Choices) != 1 || c.Choices[0].FinishReason != "tool_calls" {
				return fmt.Errorf("chat.completions.new(tools-to-anthropic): %s, want one choice with finish_reason tool_calls", c.RawJSON())
			}
			call, err := weatherCall(c.Choices[0].Message)
			if err != nil {
				return fmt.Errorf("chat.completions.new(tools-to-anthropic): %w", err)
			}
			fmt.Printf("ok: chat.completions.new(tools-to-anthropic): tool_calls[0] = %s(%s), id %s\n", call.Function.Name, call.Function.Arguments, call.ID)

			// The second turn: the call and the tool's result back; the anthropic
			// model gets a tool_result with the call's id, the app its text.
			turn := req
			turn.Messages = []openai.ChatCompletionMessageParamUnion{question, c.Choices[0].Message.ToParam(), openai.ToolMessage(`{"sky": "clear", "celsius": 21}`, call.ID)}
			answer, err := client.Chat.Completions.New(ctx, turn)
			if err != nil {
				return fmt.Errorf("chat.completions.new(second turn): %w", describe(err))
			}
			if len(answer.Choices) != 1 || answer.Choices[0].Message.Content != sunny {
				return fmt.Errorf("chat.completions.new(second turn): %s, want %q", answer.RawJSON(), sunny)
			}
			last, err := lastOf(ctx, toolsURL, "messages")
			if err != nil {
				return err
			}
			if !slices.Equal(last.ToolResultIDs, []string{call.ID}) || len(last.ToolResults) != 1 || !strings.Contains(last.ToolResults[0], "clear") {
				return fmt.Errorf("chat.completions.new(second turn): the anthropic model got %+v, want a tool_result for %s with the tool's content", last, call.ID)
			}
			fmt.Printf("ok: chat.completions.new(second turn) = %q: the anthropic model got a tool_result for %s\n", sunny, call.ID)
			return nil
		}},
		part{"tool calls streamed", func() error {
			// Streamed, through the SDK's accumulator.
			stream := client.Chat.Completions.NewStreaming(ctx, req)
			var acc openai.ChatCompletionAccumulator
			deltas := 0
			for stream.Next() {
				ch := stream.Current()
				acc.AddChunk(ch)
				if len(ch.Choices) > 0 && len(ch.Choices[0].Delta.ToolCalls) > 0 {
					deltas++
				}
			}
			if err := stream.Err(); err != nil {
				return fmt.Errorf("chat.completions.newStreaming(tools-to-anthropic): %w", describe(err))
			}
			if len(acc.Choices) != 1 || acc.Choices[0].FinishReason != "tool_calls" || deltas == 0 {
				return fmt.Errorf("chat.completions.newStreaming(tools-to-anthropic): the accumulator has %+v after %d tool_calls deltas, want one choice with finish_reason tool_calls", acc.Choices, deltas)
			}
			got, err := weatherCall(acc.Choices[0].Message)
			if err != nil {
				return fmt.Errorf("chat.completions.newStreaming(tools-to-anthropic): the accumulator's %w", err)
			}
			fmt.Printf("ok: chat.completions.newStreaming(tools-to-anthropic): the ChatCompletionAccumulator has %s(%s) from %d deltas\n", got.Function.Name, got.Function.Arguments, deltas)
			return nil
		}},
		part{"n: 2", func() error {
			// n: 2 over choices = fallback_chain [a model answering 500, good].
			two := openai.ChatCompletionNewParams{Model: "choices", Messages: []openai.ChatCompletionMessageParamUnion{question}, N: openai.Int(2)}
			wantTexts := []string{"The answer is 42.", "The answer is 43."}
			cs, err := client.Chat.Completions.New(ctx, two)
			if err != nil {
				return fmt.Errorf("chat.completions.new(choices, n 2): %w", describe(err))
			}
			if texts := choiceTexts(cs.Choices); !slices.Equal(texts, wantTexts) {
				return fmt.Errorf("chat.completions.new(choices, n 2): %q, want %q", texts, wantTexts)
			}
			s := client.Chat.Completions.NewStreaming(ctx, two)
			var acc2 openai.ChatCompletionAccumulator
			for s.Next() {
				acc2.AddChunk(s.Current())
			}
			if err := s.Err(); err != nil {
				return fmt.Errorf("chat.completions.newStreaming(choices, n 2): %w", describe(err))
			}
			if texts := choiceTexts(acc2.Choices); !slices.Equal(texts, wantTexts) {
				return fmt.Errorf("chat.completions.newStreaming(choices, n 2): the accumulator has %q, want %q", texts, wantTexts)
			}
			fmt.Printf("ok: chat.completions.new(choices, n 2) = %q, the same streamed\n", wantTexts)
			return nil
		}},
		part{"the model's 400", func() error {
			// The model's own 400 (an anthropic model's): the SDK's *openai.Error
			// 400 with the model's message.
			_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "rejects-anthropic", Messages: []openai.ChatCompletionMessageParamUnion{question}})
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || !strings.Contains(apiErr.Message, badTemperature) {
				return fmt.Errorf("chat.completions.new(rejects-anthropic): got %v, want *openai.Error 400 with the model's message %q", describe(err), badTemperature)
			}
			fmt.Printf("ok: the model's 400 is *openai.Error 400: %s\n", apiErr.Message)
			return nil
		}},
	)
}

// part is a part of whole, named.
type part struct {
	name string
	fn   func() error
}

// parts runs each of ps, also after one failed, so that a run says every
// part that failed.
func parts(ps ...part) error {
	var failed []string
	for _, p := range ps {
		if err := p.fn(); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: openai-go: %s: %v\n", p.name, err)
			failed = append(failed, p.name)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d parts failed: %s", len(failed), len(ps), strings.Join(failed, "; "))
	}
	return nil
}

// weatherCall is m's one get_weather call, whose arguments are
// {"city": "Paris"}.
func weatherCall(m openai.ChatCompletionMessage) (openai.ChatCompletionMessageToolCallUnion, error) {
	if len(m.ToolCalls) != 1 || m.ToolCalls[0].Function.Name != "get_weather" || m.ToolCalls[0].ID == "" {
		return openai.ChatCompletionMessageToolCallUnion{}, fmt.Errorf("tool_calls %+v, want one get_weather call with an id", m.ToolCalls)
	}
	call := m.ToolCalls[0]
	var args struct {
		City string `json:"city"`
	}
	if err := json.Unmarshal([]byte(call.Function.Arguments), &args); err != nil || args.City != "Paris" {
		return call, fmt.Errorf("arguments %q (%v), want {\"city\": \"Paris\"}", call.Function.Arguments, err)
	}
	return call, nil
}

// choiceTexts is each choice's text, "index N?" where a choice is not at
// its own index.
func choiceTexts(cs []openai.ChatCompletionChoice) []string {
	texts := make([]string, len(cs))
	for i, c := range cs {
		texts[i] = c.Message.Content
		if c.Index != int64(i) {
			texts[i] = fmt.Sprintf("index %d?", c.Index)
		}
	}
	return texts
}

// lastRequest is what the fake model recorded of an API's last request.
type lastRequest struct {
	Tools         []string `json:"tools"`
	ToolResultIDs []string `json:"tool_result_ids"`
	ToolResults   []string `json:"tool_results"`
}

func lastOf(ctx context.Context, url, api string) (lastRequest, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/last", nil)
	if err != nil {
		return lastRequest{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return lastRequest{}, fmt.Errorf("the fake model's /last: %w", err)
	}
	defer resp.Body.Close()
	var last map[string]lastRequest
	if err := json.NewDecoder(resp.Body).Decode(&last); err != nil {
		return lastRequest{}, fmt.Errorf("the fake model's /last: %w", err)
	}
	return last[api], nil
}
