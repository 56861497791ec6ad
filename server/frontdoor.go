package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/stubbornhq/stubborn/controls"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// The OpenAI-compatible front door (README, "An OpenAI-compatible front
// door"): POST /v1/chat/completions and GET /v1/models on the HTTP
// listener. Each request is a run of the ControlService, made through an
// in-process gRPC connection to the same server, so it goes through the
// same interceptors as any other call: the caller's bearer token (the
// SDK's API key) is its tenant's, and the tenant's limits, validation and
// logging apply.

// frontDoor serves the OpenAI-compatible routes.
type frontDoor struct {
	client stubbornv1.ControlServiceClient
	svc    *Service
	now    func() time.Time
}

// frontDoorBufferBytes is the in-process connection's buffer.
const frontDoorBufferBytes = 256 << 10

// newFrontDoor connects to s's gRPC server in memory. close ends the
// connection and the listener.
func newFrontDoor(s *Stubborn) (*frontDoor, func(), error) {
	lis := bufconn.Listen(frontDoorBufferBytes)
	go func() { _ = s.GRPC.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///stubborn-front-door",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		_ = lis.Close()
		return nil, nil, err
	}
	return &frontDoor{client: stubbornv1.NewControlServiceClient(conn), svc: s.svc, now: time.Now},
		func() { _ = conn.Close(); _ = lis.Close() }, nil
}

// callContext is r's context for an in-process call on behalf of r's
// caller: its Authorization header, and nothing else of r's, goes along.
func callContext(r *http.Request) context.Context {
	ctx := r.Context()
	if a := r.Header.Values("Authorization"); len(a) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", a[0])
	}
	return ctx
}

// openAIError writes an error in OpenAI's shape with the HTTP status an
// SDK maps to its own error class. Errors about what Stubborn already
// retried carry x-should-retry: false, so an SDK's own retries do not
// multiply Stubborn's.
func openAIError(w http.ResponseWriter, httpStatus int, kind, code, msg string, retried bool, retryAfter time.Duration) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if retried {
		h.Set("X-Should-Retry", "false")
	}
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int((retryAfter+time.Second-1)/time.Second)))
	}
	w.WriteHeader(httpStatus)
	body, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": kind, "code": code, "param": nil}})
	_, _ = w.Write(body)
}

// grpcError writes err, a status of the ControlService, as the HTTP error
// an OpenAI SDK expects.
func grpcError(w http.ResponseWriter, err error) {
	st := status.Convert(err)
	var retryAfter time.Duration
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			retryAfter = ri.GetRetryDelay().AsDuration()
		}
	}
	msg := st.Message()
	switch st.Code() {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		openAIError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", msg, false, 0)
	case codes.Unauthenticated:
		openAIError(w, http.StatusUnauthorized, "authentication_error", "invalid_api_key", msg, false, 0)
	case codes.PermissionDenied:
		openAIError(w, http.StatusForbidden, "permission_error", "permission_denied", msg, false, 0)
	case codes.NotFound:
		openAIError(w, http.StatusNotFound, "invalid_request_error", "model_not_found", msg, false, 0)
	case codes.ResourceExhausted:
		openAIError(w, http.StatusTooManyRequests, "rate_limit_error", "rate_limit_exceeded", msg, false, max(retryAfter, time.Second))
	case codes.Unavailable:
		openAIError(w, http.StatusServiceUnavailable, "server_error", "unavailable", msg, false, retryAfter)
	default:
		openAIError(w, http.StatusInternalServerError, "server_error", "internal_error", msg, false, 0)
	}
}

// models lists the delegates and presets the caller may name.
func (f *frontDoor) models(w http.ResponseWriter, r *http.Request) {
	resp, err := f.client.ListDelegates(callContext(r), &stubbornv1.ListDelegatesRequest{})
	if err != nil {
		grpcError(w, err)
		return
	}
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	list := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	for _, p := range resp.GetPresets() {
		list.Data = append(list.Data, model{ID: p.GetName(), Object: "model", OwnedBy: "stubborn-preset"})
	}
	for _, d := range resp.GetDelegates() {
		list.Data = append(list.Data, model{ID: d.GetName(), Object: "model", OwnedBy: "stubborn-" + d.GetKind()})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(list)
}

// chatRequest is what the front door reads of a Chat Completions request:
// the fields it acts on, and the messages and the other fields (the model
// parameters: tools, response_format, temperature, …) as they came.
type chatRequest struct {
	Model        string
	Stream       bool
	IncludeUsage bool // stream_options.include_usage

	messages []*structpb.Struct
	params   *structpb.Struct
	// criteria are the request's "stubborn" field: failure_criteria and
	// failure_when (a chain's, retry-with-learning's), acceptance_criteria
	// and accept_when (a race's), set on the run's control.
	criteria map[string]string
}

// criteriaKeys are the keys of a request's "stubborn" field.
var criteriaKeys = []string{"failure_criteria", "failure_when", "acceptance_criteria", "accept_when"}

// parseChat reads a Chat Completions request body: one decoding, whose
// fields the front door acts on are taken out and checked, the rest kept
// as the model parameters.
func parseChat(body []byte) (*chatRequest, error) {
	var all map[string]any
	if err := json.Unmarshal(body, &all); err != nil {
		return nil, err
	}
	if all == nil {
		return nil, errors.New("the body must be a JSON object")
	}
	req := &chatRequest{}
	var ok bool
	if v, set := all["model"]; set {
		if req.Model, ok = v.(string); !ok {
			return nil, errors.New("model: must be a string")
		}
	}
	if v, set := all["stream"]; set && v != nil {
		if req.Stream, ok = v.(bool); !ok {
			return nil, errors.New("stream: must be true or false")
		}
	}
	if v, set := all["stream_options"]; set && v != nil {
		o, isObject := v.(map[string]any)
		if !isObject {
			return nil, errors.New("stream_options: must be an object")
		}
		if u, set := o["include_usage"]; set && u != nil {
			if req.IncludeUsage, ok = u.(bool); !ok {
				return nil, errors.New("stream_options.include_usage: must be true or false")
			}
		}
	}
	list, ok := all["messages"].([]any)
	if !ok && all["messages"] != nil {
		return nil, errors.New("messages: must be an array of messages")
	}
	for i, m := range list {
		obj, ok := m.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("messages[%d]: must be an object", i)
		}
		st, err := structpb.NewStruct(obj)
		if err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		req.messages = append(req.messages, st)
	}
	if ext, ok := all["stubborn"]; ok {
		m, isObject := ext.(map[string]any)
		if !isObject {
			return nil, errors.New(`stubborn: must be an object of failure_criteria, failure_when, acceptance_criteria, accept_when`)
		}
		req.criteria = map[string]string{}
		for k, v := range m {
			text, isText := v.(string)
			if !isText || !slices.Contains(criteriaKeys, k) {
				return nil, fmt.Errorf("stubborn.%s: not one of failure_criteria, failure_when, acceptance_criteria, accept_when (strings)", controls.Cut(k, 64))
			}
			req.criteria[k] = text
		}
	}
	for _, k := range []string{"model", "messages", "stream", "stream_options", "stubborn"} {
		delete(all, k)
	}
	if len(all) > 0 {
		p, err := structpb.NewStruct(all)
		if err != nil {
			return nil, err
		}
		req.params = p
	}
	return req, nil
}

// runRequest is the run a chat request makes: the preset's control, or a
// fallback chain of the one delegate the model names. A retry that would
// ask a person fails instead: no HTTP request waits for one.
func (f *frontDoor) runRequest(r *http.Request, req *chatRequest) (*stubbornv1.RunRequest, error) {
	if req.Model == "" {
		return nil, status.Error(codes.InvalidArgument, "model: required: a preset or a delegate (GET /v1/models lists them)")
	}
	if len(req.messages) == 0 {
		return nil, status.Error(codes.InvalidArgument, "messages: at least one message is required")
	}
	spec, isPreset, err := f.model(r, req.Model)
	if err != nil {
		return nil, err
	}
	// The brief is the messages' text (task_messages): the server makes it.
	run := &stubbornv1.RunRequest{TaskMessages: req.messages, ModelParams: req.params,
		Options: &stubbornv1.RunOptions{IdempotencyKey: r.Header.Get("Idempotency-Key"), NeverAsk: true}}
	if !isPreset {
		run.FallbackChain = &stubbornv1.FallbackChainSpec{Chain: []string{req.Model}}
		return withCriteria(run, req.criteria)
	}
	switch k := proto.CloneOf(spec).GetKind().(type) {
	case *stubbornv1.ControlSpec_Retry:
		k.Retry.OnExhausted = stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL
		run.Retry = k.Retry
	case *stubbornv1.ControlSpec_RetryWithLearning:
		run.RetryWithLearning = k.RetryWithLearning
	case *stubbornv1.ControlSpec_FallbackChain:
		run.FallbackChain = k.FallbackChain
	case *stubbornv1.ControlSpec_Race:
		run.Race = k.Race
	}
	return withCriteria(run, req.criteria)
}

// model looks a request's model up in the current registry, as the
// caller's tenant sees it (what ListDelegates lists to it): a preset's
// control, or a delegate. It authenticates r's bearer token as the gRPC
// API does, in process (the Run call that follows authenticates it
// again, through the interceptors): the lookup costs no round trip.
func (f *frontDoor) model(r *http.Request, name string) (spec *stubbornv1.ControlSpec, isPreset bool, err error) {
	reg := f.svc.regs.current()
	ctx := r.Context()
	if a := r.Header.Values("Authorization"); len(a) > 0 {
		ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", a[0]))
	}
	if reg.authn != nil {
		if ctx, err = reg.authn.Authenticate(ctx); err != nil {
			return nil, false, err
		}
	}
	if reg.pool != nil && reg.policy(ctx).val.known(name) {
		if spec, ok := reg.pool.Preset(name); ok {
			return spec, true, nil
		}
		if _, ok := reg.pool.Lookup(name); ok {
			return nil, false, nil
		}
	}
	return nil, false, status.Errorf(codes.NotFound, "model: %q is no preset or delegate you may use (GET /v1/models lists them)", controls.Cut(name, 128))
}

// withCriteria sets a request's criteria (its "stubborn" field) on run's
// control; the server judges them as any run's (a judge, CEL).
func withCriteria(run *stubbornv1.RunRequest, c map[string]string) (*stubbornv1.RunRequest, error) {
	if len(c) == 0 {
		return run, nil
	}
	bad := func(kind string) error {
		return status.Errorf(codes.InvalidArgument, "stubborn: the model's control (%s) does not take these criteria: failure_criteria and failure_when go to a fallback chain or retry-with-learning, acceptance_criteria and accept_when to a race", kind)
	}
	switch {
	case run.GetFallbackChain() != nil && c["acceptance_criteria"] == "" && c["accept_when"] == "":
		run.FallbackChain.FailureCriteria, run.FallbackChain.FailureWhen = c["failure_criteria"], c["failure_when"]
	case run.GetRetryWithLearning() != nil && c["acceptance_criteria"] == "" && c["accept_when"] == "":
		run.RetryWithLearning.FailureCriteria, run.RetryWithLearning.FailureWhen = c["failure_criteria"], c["failure_when"]
	case run.GetRace() != nil && c["failure_criteria"] == "" && c["failure_when"] == "":
		run.Race.AcceptanceCriteria, run.Race.AcceptWhen = c["acceptance_criteria"], c["accept_when"]
	default:
		kind := "retry"
		switch {
		case run.GetRetryWithLearning() != nil:
			kind = "retry_with_learning"
		case run.GetRace() != nil:
			kind = "race"
		case run.GetFallbackChain() != nil:
			kind = "fallback_chain"
		}
		return nil, bad(kind)
	}
	return run, nil
}

func (f *frontDoor) chatCompletions(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body) // bounded: boundBody read it already
	if err != nil {
		openAIError(w, http.StatusBadRequest, "invalid_request_error", "invalid_body", "reading the body: "+controls.Cut(err.Error(), 200), false, 0)
		return
	}
	req, err := parseChat(body)
	if err != nil {
		openAIError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", "the body is not a Chat Completions request: "+controls.Cut(err.Error(), 200), false, 0)
		return
	}
	ctx := callContext(r)
	run, err := f.runRequest(r, req)
	if err != nil {
		grpcError(w, err)
		return
	}
	// The run's own context: the request's end (the client hung up, or
	// the answer is out) cancels the run unless it has finished.
	stream, err := f.client.Run(ctx, run)
	if err != nil {
		grpcError(w, err)
		return
	}
	a := &answering{f: f, w: w, req: req, race: run.GetRace() != nil, held: map[int32]*strings.Builder{}}
	end, err := a.follow(stream)
	if err != nil && a.runID == "" {
		grpcError(w, err)
		return
	}
	if ie, ok := errors.AsType[*interrupted](err); ok {
		// The answer the client has began with a failed attempt: its
		// stream ends with an error naming the run, which goes on.
		a.streamError(ie.Error())
		return
	}
	if end == nil && a.runID != "" {
		// The client went away, or the stream broke: the run is let go
		// of only if it goes on.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = f.client.CancelRun(cctx, &stubbornv1.CancelRunRequest{RunId: a.runID})
		if a.started {
			a.streamError(fmt.Sprintf("the run %s stopped before its answer: %v", a.runID, err))
		}
		return
	}
	a.finish(end)
}

// interrupted is why a stream whose answer began ends early: its attempt
// failed.
type interrupted struct{ msg string }

func (e *interrupted) Error() string { return e.msg }

// answering is one chat request's answer as its run goes: what reached
// the client, and what is held.
type answering struct {
	f     *frontDoor
	w     http.ResponseWriter
	req   *chatRequest
	race  bool
	runID string

	started bool  // the response's head is out
	sentBy  int32 // the attempt whose text the client has, 0 none
	sent    strings.Builder
	held    map[int32]*strings.Builder // held output of attempts, by number
}

// follow reads the run's events to its end, streaming output as it may.
// It returns the final state, or nil and why the stream ended before.
func (a *answering) follow(stream grpc.ServerStreamingClient[stubbornv1.RunResponse]) (*stubbornv1.ControlState, error) {
	for {
		resp, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("the run's stream ended without its end")
			}
			return nil, err
		}
		ev := resp.GetEvent()
		if a.runID == "" {
			a.runID = ev.GetRunId()
		}
		switch k := ev.GetKind().(type) {
		case *stubbornv1.RunEvent_AttemptOutput:
			a.output(k.AttemptOutput)
		case *stubbornv1.RunEvent_AttemptFinished:
			if err := a.finished(k.AttemptFinished); err != nil {
				return nil, err
			}
		case *stubbornv1.RunEvent_RunFinished:
			return k.RunFinished.GetState(), nil
		}
	}
}

// output takes a piece of an attempt's text: to the client at once when it
// may be the answer (the first attempt to stream, not provisional, not a
// race's), else held until the attempt is accepted.
func (a *answering) output(o *stubbornv1.AttemptOutput) {
	n := o.GetAttempt()
	if !a.req.Stream || o.GetProvisional() || a.race || (a.sentBy != 0 && a.sentBy != n) {
		h := a.held[n]
		if h == nil {
			h = &strings.Builder{}
			a.held[n] = h
		}
		h.WriteString(o.GetText())
		return
	}
	a.sentBy = n
	a.chunk(o.GetText())
}

// finished sees an attempt's end: an accepted one's held text goes out; a
// failed one's is dropped — unless the client has part of it, which ends
// the answer with an error naming the run.
func (a *answering) finished(f *stubbornv1.AttemptFinished) error {
	n := f.GetAttempt().GetNumber()
	held := a.held[n]
	delete(a.held, n)
	ok := f.GetAttempt().GetOutcome() == stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED
	switch {
	case !ok && a.sentBy == n:
		return &interrupted{fmt.Sprintf("attempt %d failed after its answer began (%s); the run goes on without this stream: stubborn watch %s",
			n, controls.Cut(f.GetAttempt().GetError().GetMessage(), 300), a.runID)}
	case ok && held != nil && a.req.Stream && a.sentBy == 0 && f.GetAttempt().GetPath() == "":
		a.sentBy = n
		a.chunk(held.String())
	}
	return nil
}

// head writes the response's head, once.
func (a *answering) head(contentType string, code int) {
	if a.started {
		return
	}
	a.started = true
	h := a.w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Stubborn-Run-Id", a.runID)
	if contentType == "text/event-stream" {
		h.Set("Cache-Control", "no-cache")
	}
	a.w.WriteHeader(code)
}

// event writes one server-sent event of v, and sends it unless more
// follow at once.
func (a *answering) event(v any, more bool) {
	b, _ := json.Marshal(v)
	_, _ = a.w.Write(append(append(append(make([]byte, 0, len(b)+8), "data: "...), b...), "\n\n"...))
	if fl, ok := a.w.(http.Flusher); ok && !more {
		fl.Flush()
	}
}

// chunk streams text as a chat.completion.chunk, the head and a first
// chunk with the role before the first.
func (a *answering) chunk(text string) {
	if !a.started {
		a.head("text/event-stream", http.StatusOK)
		a.event(a.chunkOf(chatDelta{Role: "assistant"}, nil), text != "")
	}
	if text == "" {
		return
	}
	a.sent.WriteString(text)
	a.event(a.chunkOf(chatDelta{Content: &text}, nil), false)
}

// chatChunk is a chat.completion.chunk of one choice (or, with usage,
// of none).
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

func (a *answering) chunkOf(delta chatDelta, finish *string) chatChunk {
	if delta.Role != "" && delta.Content == nil {
		delta.Content = new("")
	}
	return chatChunk{ID: a.runID, Object: "chat.completion.chunk", Created: a.f.now().Unix(), Model: a.req.Model,
		Choices: []chunkChoice{{Delta: delta, FinishReason: finish}}}
}

// streamError ends a stream whose answer began with an OpenAI-shaped
// error event naming the run.
func (a *answering) streamError(msg string) {
	a.event(map[string]any{"error": map[string]any{"message": msg, "type": "server_error", "code": "stream_interrupted", "param": nil, "run_id": a.runID}}, false)
}

// usage sums what every attempt of st reported using, as Chat
// Completions usage, and returns the winner's own too.
func usage(st *stubbornv1.ControlState) (all, winner map[string]int64) {
	all = map[string]int64{"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
	for _, at := range st.GetAttemptLog() {
		u := at.GetResult().GetData().GetStructValue().GetFields()["usage"].GetStructValue().GetFields()
		if u == nil {
			continue
		}
		prompt := int64(u["prompt_tokens"].GetNumberValue() + u["input_tokens"].GetNumberValue())
		completion := int64(u["completion_tokens"].GetNumberValue() + u["output_tokens"].GetNumberValue())
		total := int64(u["total_tokens"].GetNumberValue())
		if total == 0 {
			total = prompt + completion
		}
		all["prompt_tokens"] += prompt
		all["completion_tokens"] += completion
		all["total_tokens"] += total
		if at.GetOutcome() == stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED && at.GetDelegate() == st.GetWinner() {
			winner = map[string]int64{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}
		}
	}
	return all, winner
}

// finishReason is the winner's finish reason (a model's), else "stop".
func finishReason(st *stubbornv1.ControlState) string {
	f := st.GetResult().GetData().GetStructValue().GetFields()
	for _, k := range []string{"finish_reason", "stop_reason"} {
		if s := f[k].GetStringValue(); s != "" {
			if s == "end_turn" || s == "stop_sequence" {
				return "stop"
			}
			if s == "max_tokens" {
				return "length"
			}
			return s
		}
	}
	return "stop"
}

// finish answers with the run's end: the completion (or the stream's
// last chunks), or the error of a run that did not succeed.
func (a *answering) finish(st *stubbornv1.ControlState) {
	if st.GetStatus() != stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED {
		msg := fmt.Sprintf("run %s ended %s: %s", a.runID, strings.TrimPrefix(st.GetStatus().String(), "RUN_STATUS_"), st.GetStatusReason())
		if a.started {
			a.streamError(msg)
			return
		}
		a.w.Header().Set("Stubborn-Run-Id", a.runID)
		openAIError(a.w, http.StatusServiceUnavailable, "server_error", "run_failed", msg, true, 0)
		return
	}
	all, winner := usage(st)
	text := st.GetResult().GetText()
	if !a.req.Stream {
		a.head("application/json", http.StatusOK)
		_ = json.NewEncoder(a.w).Encode(map[string]any{
			"id": a.runID, "object": "chat.completion", "created": a.f.now().Unix(), "model": a.req.Model,
			"choices": []any{map[string]any{
				"index": 0, "message": map[string]any{"role": "assistant", "content": text}, "finish_reason": finishReason(st),
			}},
			"usage":    all,
			"stubborn": map[string]any{"run_id": a.runID, "winner": st.GetWinner(), "attempts": st.GetAttempts(), "winner_usage": winner},
		})
		return
	}
	// What the client has not had of the answer: all of it, or the rest
	// of what the answering attempt streamed.
	a.chunk(strings.TrimPrefix(text, a.sent.String()))
	a.event(a.chunkOf(chatDelta{}, new(finishReason(st))), true)
	if a.req.IncludeUsage {
		a.event(chatChunk{ID: a.runID, Object: "chat.completion.chunk", Created: a.f.now().Unix(), Model: a.req.Model, Choices: []chunkChoice{}, Usage: all}, true)
	}
	_, _ = io.WriteString(a.w, "data: [DONE]\n\n")
}
