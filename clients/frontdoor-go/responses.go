package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/responses"
)

// weatherFunction is the get_weather tool as the Responses API declares it.
var weatherFunction = responses.ToolUnionParam{OfFunction: &responses.FunctionToolParam{
	Name:        "get_weather",
	Description: openai.String("The weather in a city."),
	Parameters: map[string]any{
		"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []string{"city"},
	},
}}

// responsesAPI checks the Responses API door (POST /v1/responses) with the
// SDK's Responses.New and Responses.NewStreaming: text over smart (a 503,
// then good), a function_call item over tools-to-anthropic (an openai
// model's 500, then an anthropic model's tool_use), the second turn's
// function_call_output reaching the anthropic model as its tool_result, a
// stream cut mid-answer as the SDK's error naming the run; each part also
// when another failed.
func responsesAPI(ctx context.Context, client openai.Client, toolsURL string) error {
	text := responses.ResponseNewParams{
		Model:        "smart",
		Instructions: openai.String("Be brief."),
		Input:        responses.ResponseNewParamsInputUnion{OfString: openai.String("What is it?")},
	}
	question := responses.ResponseInputItemParamOfMessage("What is the weather in Paris?", responses.EasyInputMessageRoleUser)
	tools := responses.ResponseNewParams{
		Model: "tools-to-anthropic",
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{question}},
		Tools: []responses.ToolUnionParam{weatherFunction},
	}
	return parts(
		part{"responses.new", func() error {
			var resp *http.Response
			r, err := client.Responses.New(ctx, text, option.WithResponseInto(&resp))
			if err != nil {
				return fmt.Errorf("responses.new(smart): %w", describe(err))
			}
			runID := resp.Header.Get("Stubborn-Run-Id")
			switch {
			case r.OutputText() != want:
				return fmt.Errorf("responses.new(smart): output %s, want the text %q", r.RawJSON(), want)
			case runID == "" || r.ID != runID:
				return fmt.Errorf("responses.new(smart): id %q, header Stubborn-Run-Id %q: want the run id in both", r.ID, runID)
			case r.Status != responses.ResponseStatusCompleted || r.Usage.TotalTokens != 7:
				return fmt.Errorf("responses.new(smart): status %q, usage.total_tokens %d: want completed, 7", r.Status, r.Usage.TotalTokens)
			}
			fmt.Printf("ok: responses.new(smart) = %q, id = Stubborn-Run-Id = %s\n", r.OutputText(), r.ID)
			fmt.Println("run responses", r.ID)
			return nil
		}},
		part{"responses.newStreaming", func() error {
			var resp *http.Response
			stream := client.Responses.NewStreaming(ctx, text, option.WithResponseInto(&resp))
			r, deltas, err := accumulate(stream)
			if err != nil {
				return fmt.Errorf("responses.newStreaming(smart): %w", err)
			}
			runID := resp.Header.Get("Stubborn-Run-Id")
			if deltas.String() != want || r.OutputText() != want || r.ID != runID || runID == "" {
				return fmt.Errorf("responses.newStreaming(smart): deltas %q, the completed response %s, Stubborn-Run-Id %q: want %q and the run id", deltas.String(), r.RawJSON(), runID, want)
			}
			fmt.Printf("ok: responses.newStreaming(smart) = %q, the response.completed's id = Stubborn-Run-Id = %s\n", deltas.String(), runID)
			fmt.Println("run responses-streamed", runID)
			return nil
		}},
		part{"a function_call, then the second turn", func() error {
			r, err := client.Responses.New(ctx, tools)
			if err != nil {
				return fmt.Errorf("responses.new(tools-to-anthropic): %w", describe(err))
			}
			call, err := functionCall(*r)
			if err != nil {
				return fmt.Errorf("responses.new(tools-to-anthropic): %w", err)
			}
			fmt.Printf("ok: responses.new(tools-to-anthropic): a function_call item %s(%s), call_id %s\n", call.Name, call.Arguments, call.CallID)
			output := responses.ResponseInputItemParamOfFunctionCallOutput(`{"sky": "clear", "celsius": 21}`)
			output.OfFunctionCallOutput.CallID = openai.String(call.CallID)
			turn := tools
			turn.Input = responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
				question, responses.ResponseInputItemParamOfFunctionCall(call.Arguments, call.CallID, call.Name), output,
			}}
			answer, err := client.Responses.New(ctx, turn)
			if err != nil {
				return fmt.Errorf("responses.new(second turn): %w", describe(err))
			}
			if answer.OutputText() != sunny {
				return fmt.Errorf("responses.new(second turn): %s, want %q", answer.RawJSON(), sunny)
			}
			last, err := lastOf(ctx, toolsURL, "messages")
			if err != nil {
				return err
			}
			if !slices.Equal(last.ToolResultIDs, []string{call.CallID}) || len(last.ToolResults) != 1 || !strings.Contains(last.ToolResults[0], "clear") {
				return fmt.Errorf("responses.new(second turn): the anthropic model got %+v, want a tool_result for %s with the tool's output", last, call.CallID)
			}
			fmt.Printf("ok: responses.new(second turn) = %q: the anthropic model got a tool_result for %s\n", sunny, call.CallID)
			return nil
		}},
		part{"a function_call streamed", func() error {
			r, _, err := accumulate(client.Responses.NewStreaming(ctx, tools))
			if err != nil {
				return fmt.Errorf("responses.newStreaming(tools-to-anthropic): %w", err)
			}
			call, err := functionCall(r)
			if err != nil {
				return fmt.Errorf("responses.newStreaming(tools-to-anthropic): the completed response's %w", err)
			}
			fmt.Printf("ok: responses.newStreaming(tools-to-anthropic): a function_call item %s(%s)\n", call.Name, call.Arguments)
			return nil
		}},
		part{"a stream cut mid-answer", func() error {
			brittle := text
			brittle.Model = "brittle"
			var resp *http.Response
			stream := client.Responses.NewStreaming(ctx, brittle, option.WithResponseInto(&resp))
			_, deltas, err := accumulate(stream)
			runID := resp.Header.Get("Stubborn-Run-Id")
			var se *ssestream.StreamError
			if !errors.As(err, &se) {
				return fmt.Errorf("responses.newStreaming(brittle): after %q: got %v (%T), want the SDK's *ssestream.StreamError", deltas.String(), err, err)
			}
			var ev struct {
				Type  string `json:"type"`
				Error struct {
					Code  string `json:"code"`
					RunID string `json:"run_id"`
				} `json:"error"`
			}
			_ = json.Unmarshal(se.Event.Data, &ev)
			if runID == "" || ev.Type != "error" || ev.Error.RunID != runID || ev.Error.Code != "stream_interrupted" || !strings.Contains(se.Message, runID) {
				return fmt.Errorf("responses.newStreaming(brittle): error event %s, header Stubborn-Run-Id %q: want an error event stream_interrupted naming the run", se.Event.Data, runID)
			}
			if got := deltas.String(); got == "" || got == want || !strings.HasPrefix(want, got) {
				return fmt.Errorf("responses.newStreaming(brittle): before the error: %q, want the start of %q", got, want)
			}
			fmt.Printf("ok: responses.newStreaming(brittle): %q, then *ssestream.StreamError naming the run %s\n", deltas.String(), runID)
			return nil
		}},
	)
}

// accumulate reads a Responses stream to its end: the response of its
// response.completed event, and its output_text deltas joined. The events
// must be numbered in order from 0.
func accumulate(stream *ssestream.Stream[responses.ResponseStreamEventUnion]) (responses.Response, *strings.Builder, error) {
	defer stream.Close()
	var (
		deltas    strings.Builder
		completed *responses.Response
		seq       int64
	)
	for stream.Next() {
		ev := stream.Current()
		if ev.SequenceNumber != seq {
			return responses.Response{}, &deltas, fmt.Errorf("event %s has sequence_number %d, want %d", ev.Type, ev.SequenceNumber, seq)
		}
		seq++
		switch ev.Type {
		case "response.output_text.delta":
			deltas.WriteString(ev.Delta)
		case "response.completed":
			r := ev.Response
			completed = &r
		}
	}
	if err := stream.Err(); err != nil {
		return responses.Response{}, &deltas, err
	}
	if completed == nil {
		return responses.Response{}, &deltas, fmt.Errorf("the stream ended after %d events without response.completed", seq)
	}
	return *completed, &deltas, nil
}

// functionCall is r's one function_call item, a get_weather call whose
// arguments are {"city": "Paris"}.
func functionCall(r responses.Response) (responses.ResponseFunctionToolCall, error) {
	var calls []responses.ResponseFunctionToolCall
	for _, o := range r.Output {
		if o.Type == "function_call" {
			calls = append(calls, o.AsFunctionCall())
		}
	}
	if len(calls) != 1 || calls[0].Name != "get_weather" || calls[0].CallID == "" {
		return responses.ResponseFunctionToolCall{}, fmt.Errorf("output %s, want one get_weather function_call item with a call_id", r.RawJSON())
	}
	var args struct {
		City string `json:"city"`
	}
	if err := json.Unmarshal([]byte(calls[0].Arguments), &args); err != nil || args.City != "Paris" {
		return calls[0], fmt.Errorf("arguments %q (%v), want {\"city\": \"Paris\"}", calls[0].Arguments, err)
	}
	return calls[0], nil
}
