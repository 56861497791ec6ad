// Command frontdoor-go drives Stubborn's OpenAI-compatible front door with
// the official OpenAI Go SDK (github.com/openai/openai-go/v3, pinned in
// go.mod), changed in nothing but its base URL and API key, and fails on
// the first answer that is not what an app would want.
// clients/check-frontdoor.sh starts the servers and runs it with:
//
//	FRONTDOOR_BASE_URL           http://127.0.0.1:PORT/v1 (stubborn serve -http-listen)
//	FRONTDOOR_API_KEY            a tenant's bearer token
//	FRONTDOOR_LIMITED_API_KEY    the token of a tenant with one run start, then 429
//	FRONTDOOR_THROTTLE_HITS_URL  the throttling fake model's /hits
//	FRONTDOOR_TOOLS_URL          the tool-calling fake model (its /last)
//
// It checks Chat Completions (main.go, whole.go) and the Responses API
// (responses.go). It prints one line per check, and "run
// nonstreamed|streamed|responses|responses-streamed ID" for the runs the
// script then reads back with `stubborn get`.
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
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
)

const want = "The answer is 42."

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: openai-go:", err)
		os.Exit(1)
	}
	fmt.Println("openai-go: all checks passed")
}

func env(name string) string {
	v := os.Getenv(name)
	if v == "" {
		fmt.Fprintf(os.Stderr, "FAIL: openai-go: %s is not set\n", name)
		os.Exit(2)
	}
	return v
}

func run() error {
	base, key, limitedKey, hitsURL := env("FRONTDOOR_BASE_URL"), env("FRONTDOOR_API_KEY"), env("FRONTDOOR_LIMITED_API_KEY"), env("FRONTDOOR_THROTTLE_HITS_URL")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// The change an app makes: the base URL and the API key.
	client := openai.NewClient(
		option.WithBaseURL(base),
		option.WithAPIKey(key),
		option.WithRequestTimeout(30*time.Second),
	)
	ask := func(model string) openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{
			Model:    model,
			Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage("What is it?")},
		}
	}

	// GET /v1/models lists the presets and the delegates.
	var ids []string
	pager := client.Models.ListAutoPaging(ctx)
	for pager.Next() {
		ids = append(ids, pager.Current().ID)
	}
	if err := pager.Err(); err != nil {
		return fmt.Errorf("models.list: %w", err)
	}
	for _, m := range []string{"smart", "patient", "brittle", "throttled", "good"} {
		if !slices.Contains(ids, m) {
			return fmt.Errorf("models.list: %q missing from %v", m, ids)
		}
	}
	fmt.Printf("ok: models.list lists %v\n", ids)

	// Not streamed: the chain's first model answers 503, the second answers.
	var resp *http.Response
	c, err := client.Chat.Completions.New(ctx, ask("smart"), option.WithResponseInto(&resp))
	if err != nil {
		return fmt.Errorf("chat.completions.new(smart): %w", describe(err))
	}
	runID := resp.Header.Get("Stubborn-Run-Id")
	switch {
	case len(c.Choices) != 1 || c.Choices[0].Message.Content != want:
		return fmt.Errorf("chat.completions.new(smart): choices %s, want one with %q", c.RawJSON(), want)
	case runID == "" || c.ID != runID:
		return fmt.Errorf("chat.completions.new(smart): id %q, header Stubborn-Run-Id %q: want the run id in both", c.ID, runID)
	case c.Object != "chat.completion" || c.Model != "smart" || c.Choices[0].FinishReason != "stop" || c.Choices[0].Message.Role != "assistant":
		return fmt.Errorf("chat.completions.new(smart): object %q model %q finish_reason %q role %q", c.Object, c.Model, c.Choices[0].FinishReason, c.Choices[0].Message.Role)
	case c.Usage.TotalTokens != 7:
		return fmt.Errorf("chat.completions.new(smart): usage.total_tokens %d, want 7 (the good model's; the 503 spent none)", c.Usage.TotalTokens)
	}
	fmt.Printf("ok: chat.completions.new(smart) = %q, id = Stubborn-Run-Id = %s\n", c.Choices[0].Message.Content, c.ID)
	fmt.Println("run nonstreamed", c.ID)

	// Streamed, over a 503 and over a stall (neither spent tokens).
	for _, model := range []string{"smart", "patient"} {
		id, err := streamed(ctx, client, ask(model), 7)
		if err != nil {
			return fmt.Errorf("chat.completions.newStreaming(%s): %w", model, err)
		}
		if model == "smart" {
			fmt.Println("run streamed", id)
		}
	}

	// The chain's first model drops its connection mid-answer. Not
	// streamed, the client gets the second model's answer; streamed, it
	// had part of the first's, so the stream ends with an error event
	// naming the run, which the SDK raises.
	if c, err := client.Chat.Completions.New(ctx, ask("brittle")); err != nil {
		return fmt.Errorf("chat.completions.new(brittle): %w", describe(err))
	} else if len(c.Choices) != 1 || c.Choices[0].Message.Content != want {
		return fmt.Errorf("chat.completions.new(brittle): %s, want %q", c.RawJSON(), want)
	}
	fmt.Printf("ok: chat.completions.new(brittle) = %q: nothing of the broken attempt\n", want)
	if err := interrupted(ctx, client, ask("brittle")); err != nil {
		return fmt.Errorf("chat.completions.newStreaming(brittle): %w", err)
	}

	// A wrong API key: 401.
	bad := openai.NewClient(option.WithBaseURL(base), option.WithAPIKey("sk-not-a-stubborn-token"), option.WithMaxRetries(0))
	if err := wantStatus(bad.Chat.Completions.New(ctx, ask("smart")))(http.StatusUnauthorized, "invalid_api_key"); err != nil {
		return fmt.Errorf("wrong API key: %w", err)
	}
	fmt.Println("ok: a wrong API key is *openai.Error 401")

	// An unknown model: 404.
	if err := wantStatus(client.Chat.Completions.New(ctx, ask("no-such-model")))(http.StatusNotFound, "model_not_found"); err != nil {
		return fmt.Errorf("unknown model: %w", err)
	}
	fmt.Println("ok: an unknown model is *openai.Error 404")

	// A run whose retries ran out (the model only answers 429): 503 with
	// x-should-retry: false, so the SDK (2 retries by default) sends it
	// once, and the model saw Stubborn's two attempts only.
	before, err := hits(ctx, hitsURL)
	if err != nil {
		return err
	}
	_, err = client.Chat.Completions.New(ctx, ask("throttled"))
	if err := wantStatus(nil, err)(http.StatusServiceUnavailable, "run_failed"); err != nil {
		return fmt.Errorf("throttled: %w", err)
	}
	var apiErr *openai.Error
	errors.As(err, &apiErr)
	if h := apiErr.Response.Header; h.Get("X-Should-Retry") != "false" || h.Get("Stubborn-Run-Id") == "" {
		return fmt.Errorf("throttled: headers X-Should-Retry %q Stubborn-Run-Id %q, want false and the run", h.Get("X-Should-Retry"), h.Get("Stubborn-Run-Id"))
	}
	after, err := hits(ctx, hitsURL)
	if err != nil {
		return err
	}
	if after-before != 2 {
		return fmt.Errorf("throttled: the 429 model got %d requests, want 2 (Stubborn's try and retry, the SDK's request once)", after-before)
	}
	fmt.Printf("ok: retries exhausted is *openai.Error 503, X-Should-Retry false, sent once (the model saw %d attempts)\n", after-before)

	// The tenant's run_starts_per_second: its one start, then 429.
	limited := openai.NewClient(option.WithBaseURL(base), option.WithAPIKey(limitedKey), option.WithMaxRetries(0))
	first, err := limited.Chat.Completions.New(ctx, ask("good"))
	if err != nil {
		return fmt.Errorf("limited tenant, first run: %w", describe(err))
	}
	if len(first.Choices) != 1 || first.Choices[0].Message.Content != want {
		return fmt.Errorf("limited tenant, first run: %s, want %q", first.RawJSON(), want)
	}
	_, err = limited.Chat.Completions.New(ctx, ask("good"))
	if err := wantStatus(nil, err)(http.StatusTooManyRequests, "rate_limit_exceeded"); err != nil {
		return fmt.Errorf("limited tenant, second run: %w", err)
	}
	errors.As(err, &apiErr)
	if apiErr.Response.Header.Get("Retry-After") == "" {
		return errors.New("limited tenant: a 429 without Retry-After")
	}
	fmt.Printf("ok: over the tenant's rate is *openai.Error 429, Retry-After %s\n", apiErr.Response.Header.Get("Retry-After"))
	toolsURL := env("FRONTDOOR_TOOLS_URL")
	return errors.Join(whole(ctx, client, toolsURL), responsesAPI(ctx, client, toolsURL))
}

// streamed streams p, checks the chunks and returns the run's id.
func streamed(ctx context.Context, client openai.Client, p openai.ChatCompletionNewParams, tokens int64) (string, error) {
	p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	var resp *http.Response
	stream := client.Chat.Completions.NewStreaming(ctx, p, option.WithResponseInto(&resp))
	defer stream.Close()
	var acc openai.ChatCompletionAccumulator
	var text strings.Builder
	pieces, finish, total := 0, "", int64(0)
	for stream.Next() {
		ch := stream.Current()
		acc.AddChunk(ch)
		if runID := resp.Header.Get("Stubborn-Run-Id"); runID == "" || ch.ID != runID {
			return "", fmt.Errorf("a chunk's id %q, header Stubborn-Run-Id %q: want the run id in both", ch.ID, runID)
		}
		if ch.Object != "chat.completion.chunk" {
			return "", fmt.Errorf("a chunk's object is %q", ch.Object)
		}
		for _, choice := range ch.Choices {
			if choice.Delta.Content != "" {
				pieces++
				text.WriteString(choice.Delta.Content)
			}
			if choice.FinishReason != "" {
				finish = choice.FinishReason
			}
		}
		if ch.JSON.Usage.Valid() {
			total = ch.Usage.TotalTokens
		}
	}
	if err := stream.Err(); err != nil {
		return "", describe(err)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		return "", fmt.Errorf("Content-Type %q", ct)
	}
	if text.String() != want || pieces < 2 || finish != "stop" || total != tokens {
		return "", fmt.Errorf("%d pieces %q, finish_reason %q, usage.total_tokens %d: want %q in 2 pieces or more, stop, %d", pieces, text.String(), finish, total, want, tokens)
	}
	if len(acc.Choices) != 1 || acc.Choices[0].Message.Content != want {
		return "", fmt.Errorf("the SDK's ChatCompletionAccumulator has %+v", acc.Choices)
	}
	runID := resp.Header.Get("Stubborn-Run-Id")
	fmt.Printf("ok: chat.completions.newStreaming(%s) = %q in %d pieces, usage %d tokens, every chunk's id = Stubborn-Run-Id = %s\n", p.Model, text.String(), pieces, total, runID)
	return runID, nil
}

// interrupted streams p, whose answering attempt fails after its first
// chunks: the SDK must return them, then its *ssestream.StreamError with the
// front door's error event naming the run.
func interrupted(ctx context.Context, client openai.Client, p openai.ChatCompletionNewParams) error {
	var resp *http.Response
	stream := client.Chat.Completions.NewStreaming(ctx, p, option.WithResponseInto(&resp))
	defer stream.Close()
	var text strings.Builder
	for stream.Next() {
		for _, choice := range stream.Current().Choices {
			text.WriteString(choice.Delta.Content)
		}
	}
	runID := resp.Header.Get("Stubborn-Run-Id")
	var se *ssestream.StreamError
	if !errors.As(stream.Err(), &se) {
		return fmt.Errorf("after %q: got %v (%T), want the SDK's *ssestream.StreamError", text.String(), stream.Err(), stream.Err())
	}
	var ev struct {
		Error struct {
			Code  string `json:"code"`
			RunID string `json:"run_id"`
		} `json:"error"`
	}
	_ = json.Unmarshal(se.Event.Data, &ev)
	if runID == "" || ev.Error.RunID != runID || ev.Error.Code != "stream_interrupted" || !strings.Contains(se.Message, runID) {
		return fmt.Errorf("error event %s, header Stubborn-Run-Id %q: want code stream_interrupted and the run", se.Event.Data, runID)
	}
	if got := text.String(); got == "" || got == want || !strings.HasPrefix(want, got) {
		return fmt.Errorf("before the error: %q, want the start of %q", got, want)
	}
	fmt.Printf("ok: chat.completions.newStreaming(brittle): %q, then *ssestream.StreamError naming the run %s\n", text.String(), runID)
	return nil
}

// wantStatus checks that a call failed with the SDK's *openai.Error of the
// status and the error code.
func wantStatus(_ any, err error) func(status int, code string) error {
	return func(status int, code string) error {
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) {
			return fmt.Errorf("got %v (%T), want *openai.Error %d", err, err, status)
		}
		if apiErr.StatusCode != status || apiErr.Code != code || apiErr.Message == "" {
			return fmt.Errorf("got *openai.Error %d code %q message %q, want %d %q", apiErr.StatusCode, apiErr.Code, apiErr.Message, status, code)
		}
		return nil
	}
}

// describe adds an *openai.Error's body, which its Error() leaves out.
func describe(err error) error {
	var apiErr *openai.Error
	if errors.As(err, &apiErr) {
		return fmt.Errorf("%w: %s", err, apiErr.RawJSON())
	}
	return err
}

func hits(ctx context.Context, url string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("the fake model's hits: %w", err)
	}
	defer resp.Body.Close()
	var h struct{ Hits int64 }
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		return 0, fmt.Errorf("the fake model's hits: %w", err)
	}
	return h.Hits, nil
}
