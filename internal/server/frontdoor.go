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

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/conversation"
)

// The model front doors (README, "Model front doors"): OpenAI's Chat
// Completions (POST /v1/chat/completions, frontdoor_openai.go), OpenAI's
// Responses (POST /v1/responses, frontdoor_responses.go) and Anthropic's
// Messages (POST /v1/messages, frontdoor_anthropic.go), and GET /v1/models,
// on the HTTP listener. Each request is a run of the ControlService,
// called in process (frontdoor_local.go) as the caller its bearer token
// (the SDK's API key) authenticates once: the tenant's limits and
// validation apply, and the stream is revocable, as a gRPC call's; the
// rarer calls (a listing, a cancel) go through an in-process gRPC
// connection to the same server. This file is what the
// doors share: the model lookup, the run, and the answer as it goes (what
// is streamed, what is held); a dialect writes it in its API's shape.

// frontDoor serves the OpenAI-compatible routes.
type frontDoor struct {
	client stubbornv1.ControlServiceClient
	svc    *service
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

// credential is r's caller's credential as gRPC's authorization
// metadata: its Authorization header (OpenAI's SDKs send the API key as
// a bearer token), else its X-Api-Key (Anthropic's SDKs) as a bearer
// token. Empty means none.
func credential(r *http.Request) string {
	if a := r.Header.Values("Authorization"); len(a) > 0 {
		return a[0]
	}
	if k := r.Header.Get("X-Api-Key"); k != "" {
		return "Bearer " + k
	}
	return ""
}

// callContext is r's context for an in-process call on behalf of r's
// caller: its credential, and nothing else of r's, goes along.
func callContext(r *http.Request) context.Context {
	ctx := r.Context()
	if c := credential(r); c != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", c)
	}
	return ctx
}

// failure is an error answer of a door: the HTTP status an SDK maps to
// its own error class, and the headers its retries read; the dialect
// writes its body.
type failure struct {
	status int
	// code is the error's code in OpenAI's terms (invalid_request,
	// model_not_found, run_failed, …); the Anthropic dialect names it by
	// status.
	code string
	msg  string
	// param names the request's field at fault, when one is (OpenAI's
	// error.param).
	param string
	// retried is set for what Stubborn already retried: x-should-retry:
	// false, so an SDK's own retries (408/409/429/5xx by default) do not
	// multiply Stubborn's.
	retried bool
	// retryAfter, when set, is the Retry-After header (whole seconds,
	// rounded up).
	retryAfter time.Duration
}

// badRequest is a 400 of code.
func badRequest(code, msg string) failure {
	return failure{status: http.StatusBadRequest, code: code, msg: msg}
}

// failureOf is err, a status of the ControlService, as the failure an
// SDK expects: 400 invalid, 401, 403, 404 (an unknown model), 409 (an
// Idempotency-Key used for another request, x-should-retry: false), 429
// with Retry-After (a tenant's limit; at least a second), 503 (Retry-After
// at a circuit breaker's cooldown's end, when it says), 504, 500 for the
// rest.
func failureOf(err error) failure {
	st := status.Convert(err)
	var retryAfter time.Duration
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			retryAfter = ri.GetRetryDelay().AsDuration()
		}
	}
	f := failure{msg: st.Message()}
	switch st.Code() {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		f.status, f.code = http.StatusBadRequest, "invalid_request"
		// A field of the conversation is named in the door's terms: the
		// body's field (param), not the run request's.
		for _, d := range st.Details() {
			if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
				if p := doorParam(br.GetFieldViolations()[0].GetField()); p != "" {
					f.param = p
					f.msg = strings.NewReplacer("conversation.options.", "", "conversation.messages", "messages").Replace(f.msg)
				}
			}
		}
	case codes.Unauthenticated:
		f.status, f.code = http.StatusUnauthorized, "invalid_api_key"
	case codes.PermissionDenied:
		f.status, f.code = http.StatusForbidden, "permission_denied"
	case codes.NotFound:
		f.status, f.code = http.StatusNotFound, "model_not_found"
	case codes.ResourceExhausted:
		f.status, f.code, f.retryAfter = http.StatusTooManyRequests, "rate_limit_exceeded", max(retryAfter, time.Second)
		if spendLimited(st) {
			// What OpenAI answers an account out of credit: an SDK
			// tells it from a rate limit by this code.
			f.code = "insufficient_quota"
		}
	case codes.Unavailable:
		f.status, f.code, f.retryAfter = http.StatusServiceUnavailable, "unavailable", retryAfter
	case codes.AlreadyExists:
		// An Idempotency-Key already used for another request: the
		// same request again is the same conflict.
		f.status, f.code, f.retried = http.StatusConflict, "idempotency_key_conflict", true
	case codes.DeadlineExceeded:
		f.status, f.code = http.StatusGatewayTimeout, "timeout"
	default:
		f.status, f.code = http.StatusInternalServerError, "internal_error"
	}
	return f
}

// spendLimited reports whether st refuses a tenant over its spend limit
// (tenantspend.go), not a rate.
func spendLimited(st *status.Status) bool {
	for _, d := range st.Details() {
		if qf, ok := d.(*errdetails.QuotaFailure); ok {
			for _, v := range qf.GetViolations() {
				if strings.Contains(v.GetDescription(), "spend limit") {
					return true
				}
			}
		}
	}
	return false
}

// refuseBodyAs is a door's answer to a body boundBody refuses (over
// maxHTTPBodyBytes, too slow, broken), in d's shape: an SDK reads its
// error as it reads any of the door's.
func refuseBodyAs(d dialect) func(http.ResponseWriter, *http.Request, int, string) {
	return func(w http.ResponseWriter, _ *http.Request, status int, msg string) {
		code := "invalid_body"
		if status == http.StatusRequestEntityTooLarge {
			code = "request_too_large"
		}
		fail(w, d, failure{status: status, code: code, msg: msg})
	}
}

// fail writes f in d's shape, its field named as d's body names it.
func fail(w http.ResponseWriter, d dialect, f failure) {
	if f.param != "" {
		f.param, f.msg = d.field(f.param), d.rename(f.msg)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if f.retried {
		h.Set("X-Should-Retry", "false")
	}
	if f.retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int((f.retryAfter+time.Second-1)/time.Second)))
	}
	w.WriteHeader(f.status)
	body, _ := json.Marshal(d.errorBody(f))
	_, _ = w.Write(body)
}

// A dialect is one door's API: its codec (conversation.Chat,
// conversation.Responses or conversation.Messages) reads the request and
// writes the answer, whole or streamed; the dialect adds its errors and
// what the door tells beside the answer.
type dialect interface {
	// codec is the API's codec.
	codec() conversation.Codec
	// messages is the body's field that holds the conversation's messages
	// ("messages"; the Responses API's "input").
	messages() string
	// field is a field of the body named in Chat Completions' terms (a
	// run's conversation speaks them: "messages[2]", "response_format") as
	// this API names it; rename does the same inside an error's words.
	field(name string) string
	rename(msg string) string
	// errorBody is f's JSON body.
	errorBody(f failure) any
	// usage is a usage in the API's names (the stubborn field's
	// winner_usage).
	usage(u *stubbornv1.Usage) map[string]int64
	// carried is what of ds the API's stream carries (the Messages API:
	// choice 0's).
	carried(ds []*stubbornv1.OutputDelta) []*stubbornv1.OutputDelta
	// streamError ends a stream whose answer began with an error event
	// naming the run (msg does).
	streamError(a *answering, msg string)
}

// models lists the delegates and presets the caller may name, in a list
// that both APIs' SDKs read: OpenAI's fields (object, created, owned_by)
// and Anthropic's (type, display_name, created_at; has_more, first_id,
// last_id) side by side. Its errors are in the shape of the SDK that asks
// (an Anthropic SDK sends anthropic-version).
func (f *frontDoor) models(w http.ResponseWriter, r *http.Request) {
	var d dialect = openAIDialect{}
	if r.Header.Get("Anthropic-Version") != "" {
		d = anthropicDialect{}
	}
	resp, err := f.client.ListDelegates(callContext(r), &stubbornv1.ListDelegatesRequest{})
	if err != nil {
		fail(w, d, failureOf(err))
		return
	}
	type model struct {
		ID          string `json:"id"`
		Object      string `json:"object"`
		Created     int64  `json:"created"`
		OwnedBy     string `json:"owned_by"`
		Type        string `json:"type"`
		DisplayName string `json:"display_name"`
		CreatedAt   string `json:"created_at"`
	}
	list := struct {
		Object  string  `json:"object"`
		Data    []model `json:"data"`
		HasMore bool    `json:"has_more"`
		FirstID *string `json:"first_id"`
		LastID  *string `json:"last_id"`
	}{Object: "list", Data: []model{}}
	add := func(name, owner string) {
		list.Data = append(list.Data, model{ID: name, Object: "model", OwnedBy: owner, Type: "model", DisplayName: name, CreatedAt: time.Unix(0, 0).UTC().Format(time.RFC3339)})
	}
	for _, p := range resp.GetPresets() {
		add(p.GetName(), "stubborn-preset")
	}
	for _, d := range resp.GetDelegates() {
		add(d.GetName(), "stubborn-"+d.GetKind())
	}
	if n := len(list.Data); n > 0 {
		list.FirstID, list.LastID = &list.Data[0].ID, &list.Data[n-1].ID
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(list)
}

// doorRequest is a door's request in the run's terms: the model, whether
// to stream, the typed conversation (decoded by the door's codec).
type doorRequest struct {
	Model        string
	Stream       bool
	IncludeUsage bool // OpenAI's stream_options.include_usage

	conv *stubbornv1.Conversation
	// criteria are the request's "stubborn" field's failure_criteria and
	// failure_when (a chain's, retry-with-learning's), acceptance_criteria
	// and accept_when (a race's), set on the run's control.
	criteria map[string]string
}

// criteriaKeys are the criteria a request's "stubborn" field may hold.
var criteriaKeys = []string{"failure_criteria", "failure_when", "acceptance_criteria", "accept_when"}

// stubbornKeys says what a request's "stubborn" field may hold.
const stubbornKeys = "failure_criteria, failure_when, acceptance_criteria, accept_when (strings), drop_params (true, or a list of field paths)"

// parseRequest reads a door's request body with codec: the typed
// conversation, and the "stubborn" extension field: the criteria, and
// drop_params, what the delegates may leave out of the request (true:
// whatever a delegate cannot carry; a list: those fields and what is
// under them).
func parseRequest(codec conversation.Codec, body []byte) (*doorRequest, error) {
	dec, err := codec.DecodeRequest(body)
	if err != nil {
		return nil, err
	}
	req := &doorRequest{Model: dec.Model, Stream: dec.Stream, IncludeUsage: dec.IncludeUsage, conv: dec.Conversation}
	if req.conv == nil {
		req.conv = &stubbornv1.Conversation{}
	}
	if dec.Stubborn == nil {
		return req, nil
	}
	var ext map[string]json.RawMessage
	if err := json.Unmarshal(dec.Stubborn, &ext); err != nil || ext == nil {
		return nil, &conversation.FieldError{Field: "stubborn", Msg: "must be an object of " + stubbornKeys}
	}
	req.criteria = map[string]string{}
	for k, v := range ext {
		field := "stubborn." + controls.Cut(k, 64)
		if k == "drop_params" {
			var all bool
			if json.Unmarshal(v, &all) == nil {
				req.conv.DropAllParams = all
				continue
			}
			var paths []string
			if err := json.Unmarshal(v, &paths); err != nil || len(paths) > conversation.MaxTools+conversation.MaxMessages {
				return nil, &conversation.FieldError{Field: field, Msg: "must be true, or a list of field paths (\"n\", \"response_format\", \"tools[0].strict\")"}
			}
			req.conv.DropParams = paths
			continue
		}
		var text string
		if err := json.Unmarshal(v, &text); err != nil || !slices.Contains(criteriaKeys, k) {
			return nil, &conversation.FieldError{Field: field, Msg: "not one of " + stubbornKeys}
		}
		req.criteria[k] = text
	}
	return req, nil
}

// runRequest is the run a door's request makes: the preset's control, or a
// fallback chain of the one delegate the model names. A retry that would
// ask a person fails instead: no HTTP request waits for one.
func (f *frontDoor) runRequest(r *http.Request, who context.Context, reg *registry, d dialect, req *doorRequest) (*stubbornv1.RunRequest, error) {
	if req.Model == "" {
		return nil, status.Error(codes.InvalidArgument, "model: required: a preset or a delegate (GET /v1/models lists them)")
	}
	if !slices.ContainsFunc(req.conv.GetMessages(), func(m *stubbornv1.ChatMessage) bool {
		// The Messages API's system prompt and the Responses API's
		// instructions are messages of the conversation, not of the
		// request's messages (input).
		switch req.conv.GetApi() {
		case conversation.AnthropicMessages:
			return m.GetRole() != stubbornv1.ChatRole_CHAT_ROLE_SYSTEM
		case conversation.ResponsesAPI:
			return m.GetRole() != stubbornv1.ChatRole_CHAT_ROLE_SYSTEM && m.GetRole() != stubbornv1.ChatRole_CHAT_ROLE_DEVELOPER
		}
		return true
	}) {
		return nil, status.Errorf(codes.InvalidArgument, "%s: at least one message is required", d.messages())
	}
	spec, isPreset, err := model(who, reg, req.Model)
	if err != nil {
		return nil, err
	}
	// The brief is the conversation's text: the server makes it.
	run := &stubbornv1.RunRequest{Conversation: req.conv,
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
	case *stubbornv1.ControlSpec_Balance:
		run.Balance = k.Balance
	}
	return withCriteria(run, req.criteria)
}

// caller authenticates r's credential as the gRPC API does, in process
// (the Run call that follows authenticates it again, through the
// interceptors): ctx on behalf of its tenant, and the registry that
// judged it. The front door does it before it reads a body: a caller
// without credentials costs no decoding.
func (f *frontDoor) caller(r *http.Request) (context.Context, *registry, error) {
	reg := f.svc.regs.current()
	ctx := r.Context()
	if c := credential(r); c != "" {
		ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", c))
	}
	if reg.authn != nil {
		var err error
		if ctx, err = reg.authn.Authenticate(ctx); err != nil {
			return nil, nil, err
		}
	}
	return ctx, reg, nil
}

// model looks a request's model up in reg, as the caller's tenant (ctx,
// from caller) sees it (what ListDelegates lists to it): a preset's
// control, or a delegate. The lookup costs no round trip.
func model(ctx context.Context, reg *registry, name string) (spec *stubbornv1.ControlSpec, isPreset bool, err error) {
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
		return status.Errorf(codes.InvalidArgument, "stubborn: the model's control (%s) does not take these criteria: failure_criteria and failure_when go to a fallback chain, a balance or retry-with-learning, acceptance_criteria and accept_when to a race", kind)
	}
	switch {
	case run.GetFallbackChain() != nil && c["acceptance_criteria"] == "" && c["accept_when"] == "":
		run.FallbackChain.FailureCriteria, run.FallbackChain.FailureWhen = c["failure_criteria"], c["failure_when"]
	case run.GetRetryWithLearning() != nil && c["acceptance_criteria"] == "" && c["accept_when"] == "":
		run.RetryWithLearning.FailureCriteria, run.RetryWithLearning.FailureWhen = c["failure_criteria"], c["failure_when"]
	case run.GetBalance() != nil && c["acceptance_criteria"] == "" && c["accept_when"] == "":
		run.Balance.FailureCriteria, run.Balance.FailureWhen = c["failure_criteria"], c["failure_when"]
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
		case run.GetBalance() != nil:
			kind = "balance"
		}
		return nil, bad(kind)
	}
	return run, nil
}

// serve answers a door's request in d's terms: the request read, the
// model looked up, the run made, its answer streamed or whole.
func (f *frontDoor) serve(w http.ResponseWriter, r *http.Request, d dialect) {
	who, reg, err := f.caller(r)
	if err != nil {
		fail(w, d, failureOf(err))
		return
	}
	body, err := io.ReadAll(r.Body) // bounded: boundBody read it already
	if err != nil {
		fail(w, d, badRequest("invalid_body", "reading the body: "+controls.Cut(err.Error(), 200)))
		return
	}
	req, err := parseRequest(d.codec(), body)
	if err != nil {
		fl := badRequest("invalid_json", controls.Cut(err.Error(), 300))
		if fe, ok := errors.AsType[*conversation.FieldError](err); ok && fe.Field != "" {
			fl.code, fl.param = "invalid_request", controls.Cut(fe.Field, 128)
		}
		fail(w, d, fl)
		return
	}
	// A conversation the run cannot take is said in the door's terms
	// (messages, not the run's conversation) before any call.
	if lim, size := reg.policy(who).limits, conversationSize(nil, nil, req.conv); size > lim.conversationBytes() {
		fail(w, d, failure{status: http.StatusBadRequest, code: "conversation_too_large", param: "messages",
			msg: fmt.Sprintf("%s: the conversation with its parameters is %d bytes, more than the limit of %d (%s)",
				d.messages(), size, lim.conversationBytes(), lim.conversationBound())})
		return
	}
	ctx := callContext(r)
	run, err := f.runRequest(r, who, reg, d, req)
	if err != nil {
		fail(w, d, failureOf(err))
		return
	}
	// The run's own context: the request's end (the client hung up, or
	// the answer is out) cancels the run unless it has finished.
	stream := f.run(who, run)
	defer stream.close()
	a := &answering{f: f, d: d, w: w, req: req, race: run.GetRace() != nil, key: run.GetOptions().GetIdempotencyKey(), held: map[int32][]*stubbornv1.OutputDelta{}}
	end, err := a.follow(stream)
	if err != nil && a.runID == "" {
		fail(w, d, failureOf(err))
		return
	}
	if ie, ok := errors.AsType[*interrupted](err); ok {
		// The answer the client has began with a failed attempt: its
		// stream ends with an error naming the run and what it did next.
		d.streamError(a, ie.Error())
		return
	}
	if end == nil && a.runID != "" {
		if r.Context().Err() != nil {
			// The client hung up: its run is cancelled.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_, _ = f.client.CancelRun(cctx, &stubbornv1.CancelRunRequest{RunId: a.runID})
			return
		}
		// The run's stream broke (a reload took the credentials away,
		// the server stops): the run goes on, and the answer says so,
		// naming it.
		msg := fmt.Sprintf("the run %s goes on, but its answer stopped coming here: %s (stubborn watch %s)", a.runID, status.Convert(err).Message(), a.runID)
		if a.started {
			d.streamError(a, msg)
			return
		}
		fl := failureOf(err)
		fl.msg = msg
		w.Header().Set("Stubborn-Run-Id", a.runID)
		fail(w, d, fl)
		return
	}
	a.finish(end)
}

// interrupted is why a stream whose answer began ends early: its attempt
// failed.
type interrupted struct {
	attempt int32
	msg     string
}

func (e *interrupted) Error() string { return e.msg }

// then is e completed with what the run did next.
func (e *interrupted) then(next string) *interrupted {
	return &interrupted{e.attempt, e.msg + "; " + next}
}

// answering is one door request's answer as its run goes: what reached
// the client, and what is held.
type answering struct {
	f     *frontDoor
	d     dialect
	w     http.ResponseWriter
	req   *doorRequest
	race  bool
	key   string // the request's Idempotency-Key, "" none
	runID string

	started bool  // the response's head is out
	sentBy  int32 // the attempt whose output the client has, 0 none
	// enc writes the stream (made with its head); it knows what of each
	// choice the client has.
	enc  conversation.StreamEncoder
	last conversation.Event                  // the last event written (a stream's error event follows its numbering)
	held map[int32][]*stubbornv1.OutputDelta // held output of attempts, by number

	lastStarted int32          // the highest attempt number started
	past        map[int32]bool // on a replay, the attempts that had ended before it
	pastAll     bool           // on a replay whose past is unknown: every attempt's
}

// follow reads the run's events to its end, streaming output as it may.
// It returns the final state, or nil and why the stream ended before.
func (a *answering) follow(stream runStream) (*stubbornv1.ControlState, error) {
	for first := true; ; first = false {
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
		if first {
			a.replay(stream)
		}
		switch k := ev.GetKind().(type) {
		case *stubbornv1.RunEvent_AttemptStarted:
			a.lastStarted = max(a.lastStarted, k.AttemptStarted.GetAttempt().GetNumber())
		case *stubbornv1.RunEvent_AttemptOutput:
			a.output(k.AttemptOutput)
		case *stubbornv1.RunEvent_AttemptFinished:
			if cut := a.finished(k.AttemptFinished); cut != nil {
				return nil, a.afterCut(stream, cut)
			}
		case *stubbornv1.RunEvent_RunFinished:
			return k.RunFinished.GetState(), nil
		}
	}
}

// cutWait is how long a stream whose attempt failed after its answer began
// waits for its run to end, so that its error can say how it ended.
const cutWait = 2 * time.Second

// afterCut completes cut, the error of a stream whose attempt failed after
// its answer began, with what the run does next: how it ended, if it ends
// within cutWait (a chain's last delegate failing at once, say), else that
// it goes on and with which attempt. The client cannot take another
// attempt's answer after part of this one's; a resend with the same
// Idempotency-Key gets the run's answer.
func (a *answering) afterCut(stream runStream, cut *interrupted) *interrupted {
	type next struct {
		ev  *stubbornv1.RunEvent
		err error
	}
	evs := make(chan next)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		// Recv has no deadline of its own: the request's end (the door
		// answers) cancels the stream, and this reader with it.
		for {
			resp, err := stream.Recv()
			select {
			case evs <- next{resp.GetEvent(), err}:
			case <-stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	wait := time.NewTimer(cutWait)
	defer wait.Stop()
	goesOn := func() *interrupted {
		if a.lastStarted > cut.attempt {
			return cut.then(fmt.Sprintf("run %s goes on: attempt %d is answering (stubborn watch %s)", a.runID, a.lastStarted, a.runID))
		}
		return cut.then(fmt.Sprintf("run %s goes on: attempt %d follows (stubborn watch %s)", a.runID, a.lastStarted+1, a.runID))
	}
	for {
		select {
		case <-wait.C:
			return goesOn()
		case n := <-evs:
			if n.err != nil {
				return goesOn()
			}
			switch k := n.ev.GetKind().(type) {
			case *stubbornv1.RunEvent_AttemptStarted:
				a.lastStarted = max(a.lastStarted, k.AttemptStarted.GetAttempt().GetNumber())
			case *stubbornv1.RunEvent_DecisionRequested:
				return cut.then("run " + a.runID + " waits for a decision: stubborn watch " + a.runID)
			case *stubbornv1.RunEvent_RunFinished:
				st := k.RunFinished.GetState()
				if st.GetStatus() != stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED {
					return cut.then("run " + a.runID + " " + ending(st))
				}
				get := "stubborn get " + a.runID + " has it"
				if a.key != "" {
					get = "the same request with its Idempotency-Key gets it"
				}
				return cut.then(fmt.Sprintf("run %s succeeded with delegate %q's answer, which this stream cannot carry after another attempt's: %s", a.runID, st.GetWinner(), get))
			}
		}
	}
}

// replay sees whether the run is one that an Idempotency-Key named again
// (the server's replay header): its stream then begins with the run's
// history, replayed from its first event. The attempts that had ended by
// now are that history: their output is held like any output that may not
// be the answer, and the accepted one's goes out when its end is replayed.
// Attempts still in flight stream from their start, as on the first call.
func (a *answering) replay(stream runStream) {
	md, err := stream.Header()
	if err != nil || len(md.Get(ReplayHeader)) == 0 {
		return
	}
	a.past = map[int32]bool{}
	got, err := a.f.svc.GetRun(stream.Context(), &stubbornv1.GetRunRequest{RunId: a.runID})
	if err != nil {
		a.pastAll = true // no state to tell live from past: hold every attempt's output
		return
	}
	for _, at := range got.GetState().GetAttemptLog() {
		if at.GetOutcome() != stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_UNSPECIFIED {
			a.past[at.GetNumber()] = true
		}
	}
}

// output takes a piece of an attempt's output (its first choice's text,
// and its deltas: other choices' text, tool-call fragments): to the client
// at once when it may be the answer (the first attempt to stream, not
// provisional, not a race's, not replayed history), else held until the
// attempt is accepted.
func (a *answering) output(o *stubbornv1.AttemptOutput) {
	n := o.GetAttempt()
	ds := deltasOf(o)
	if !a.req.Stream || o.GetProvisional() || a.race || a.pastAll || a.past[n] || (a.sentBy != 0 && a.sentBy != n) {
		if a.req.Stream {
			a.held[n] = append(a.held[n], ds...)
		}
		return
	}
	a.sentBy = n
	a.send(ds)
}

// deltasOf is an AttemptOutput as deltas: its text (choice 0's), then the
// rest.
func deltasOf(o *stubbornv1.AttemptOutput) []*stubbornv1.OutputDelta {
	ds := make([]*stubbornv1.OutputDelta, 0, 1+len(o.GetDeltas()))
	if o.GetText() != "" {
		ds = append(ds, &stubbornv1.OutputDelta{Kind: &stubbornv1.OutputDelta_Text{Text: o.GetText()}, Offset: o.GetOffset()})
	}
	return append(ds, o.GetDeltas()...)
}

// finished sees an attempt's end: an accepted one's held output goes out;
// a failed one's is dropped — unless the client has part of it, which ends
// the answer with an error naming the run (returned).
func (a *answering) finished(f *stubbornv1.AttemptFinished) *interrupted {
	n := f.GetAttempt().GetNumber()
	held, wasHeld := a.held[n]
	delete(a.held, n)
	ok := f.GetAttempt().GetOutcome() == stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED
	switch {
	case !ok && a.sentBy == n:
		why := f.GetAttempt().GetError().GetMessage()
		if why == "" {
			why = strings.ToLower(strings.TrimPrefix(f.GetAttempt().GetOutcome().String(), "ATTEMPT_OUTCOME_"))
		}
		return &interrupted{n, fmt.Sprintf("attempt %d failed after its answer began (%s)", n, controls.Cut(why, 300))}
	case ok && wasHeld && a.req.Stream && a.sentBy == 0 && f.GetAttempt().GetPath() == "":
		a.sentBy = n
		a.send(held)
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

// sse writes one server-sent event of v (named, when name is set), and
// sends it unless more follow at once.
func (a *answering) sse(name string, v any, more bool) {
	b, _ := json.Marshal(v)
	a.events([]conversation.Event{{Name: name, Data: b}}, more)
}

// events writes evs, and sends them unless more follow at once.
func (a *answering) events(evs []conversation.Event, more bool) {
	var out []byte
	for _, ev := range evs {
		out = ev.AppendSSE(out)
	}
	if len(evs) > 0 {
		a.last = evs[len(evs)-1]
	}
	_, _ = a.w.Write(out)
	if fl, ok := a.w.(http.Flusher); ok && !more {
		fl.Flush()
	}
}

// meta is what the answer says about itself: the run's id, the model asked.
func (a *answering) meta() conversation.Meta {
	return conversation.Meta{ID: a.runID, Model: a.req.Model, Created: a.f.now().Unix(), IncludeUsage: a.req.IncludeUsage}
}

// send streams pieces of the answer: the head and the stream's opening
// before the first.
func (a *answering) send(ds []*stubbornv1.OutputDelta) {
	if !a.started {
		a.head("text/event-stream", http.StatusOK)
		a.enc = a.d.codec().NewStreamEncoder(a.meta())
	}
	evs, err := a.enc.Deltas(a.d.carried(ds))
	if err != nil {
		return // a delta the API has no place for (a choice past 0 on the Messages API): never sent
	}
	a.events(evs, false)
}

// finish answers with the run's end: the answer (or the stream's last
// events), or the error of a run that did not succeed.
func (a *answering) finish(st *stubbornv1.ControlState) {
	if st.GetStatus() != stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED {
		fl := runFailure(a.runID, st)
		if a.started {
			a.d.streamError(a, fl.msg)
			return
		}
		a.w.Header().Set("Stubborn-Run-Id", a.runID)
		fail(a.w, a.d, fl)
		return
	}
	r, winner := answerOf(st)
	if !a.req.Stream {
		body, err := a.whole(r, st, winner)
		if err != nil {
			a.w.Header().Set("Stubborn-Run-Id", a.runID)
			fail(a.w, a.d, failure{status: http.StatusBadGateway, code: "bad_answer", retried: true,
				msg: fmt.Sprintf("run %s's answer cannot be written as this API's: %s", a.runID, controls.Cut(err.Error(), 300))})
			return
		}
		a.head("application/json", http.StatusOK)
		_, _ = a.w.Write(append(body, '\n'))
		return
	}
	// What the client has not had of the answer (all of it, or the rest of
	// what the answering attempt streamed), each choice's end, the usage.
	a.send(nil)
	evs, err := a.enc.End(r)
	if err != nil {
		a.d.streamError(a, fmt.Sprintf("run %s's answer cannot be written as this API's: %s", a.runID, controls.Cut(err.Error(), 300)))
		return
	}
	a.events(evs, false)
}

// whole is the answer of a request that does not stream: the codec's, with
// the run's id as its id, the usage of every attempt, and the stubborn
// field (the run, its winner, attempts and the winner's own usage).
func (a *answering) whole(r *stubbornv1.Result, st *stubbornv1.ControlState, winner *stubbornv1.Usage) ([]byte, error) {
	b, err := a.d.codec().EncodeResponse(r, a.meta())
	if err != nil {
		return nil, err
	}
	var body map[string]json.RawMessage
	if err := json.Unmarshal(b, &body); err != nil {
		return nil, err
	}
	var wu map[string]int64
	if winner != nil {
		wu = a.d.usage(winner)
	}
	ext := map[string]any{"run_id": a.runID, "winner": st.GetWinner(), "attempts": st.GetAttempts(), "winner_usage": wu}
	if c := st.GetCost(); c != nil {
		// The whole run's: every attempt, judge and analyst, priced.
		ext["cost"] = map[string]any{"total": c.GetTotal(), "total_tokens": c.GetTotalTokens(), "estimated": c.GetEstimated()}
	}
	body["stubborn"], _ = json.Marshal(ext)
	return json.Marshal(body)
}

// runFailure is the door's answer to a run that ended without an answer
// (st), by what ended it. The last failed attempt's upstream HTTP status
// decides: a model's 400 or 422 is about the request, so the app gets that
// status and the model's message (its SDK raises its own BadRequestError);
// a delegate's 401, 403 or 404 is the operator's (a key, a configured
// model), a 502 naming the delegate, which no retry fixes and which must
// not look like the door's own 404 (an unknown model). Anything else is a
// 503 that says why the run ended; Stubborn retried already.
func runFailure(runID string, st *stubbornv1.ControlState) failure {
	at := lastFailed(st)
	e := at.GetError()
	ended := st.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED || st.GetStatus() == stubbornv1.RunStatus_RUN_STATUS_FAILED
	if ended && e != nil && !e.GetRefused() {
		switch hs := int(e.GetHttpStatus()); hs {
		case http.StatusBadRequest, http.StatusUnprocessableEntity:
			return failure{status: hs, code: "invalid_request",
				msg: fmt.Sprintf("%s (delegate %q; run %s ended %s)", upstreamMessage(e.GetMessage()), at.GetDelegate(), runID, statusWord(st))}
		case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound:
			return failure{status: http.StatusBadGateway, code: "delegate_misconfigured", retried: true,
				msg: fmt.Sprintf("delegate %q answered %d (%s): check its key and its configured model; run %s ended %s",
					at.GetDelegate(), hs, controls.Cut(upstreamMessage(e.GetMessage()), 300), runID, statusWord(st))}
		}
	}
	return failure{status: http.StatusServiceUnavailable, code: "run_failed", msg: "run " + runID + " " + ending(st), retried: true}
}

// ending says how a run ended and why, in words: its status, its reason,
// and the last failure (what an attempt's error or a criterion said), so
// that "all N delegates failed" is never all an app learns.
func ending(st *stubbornv1.ControlState) string {
	msg := "ended " + statusWord(st)
	if r := st.GetStatusReason(); r != "" {
		msg += ": " + r
	}
	if h := st.GetFailureHistory(); len(h) > 0 {
		f := h[len(h)-1]
		why := f.GetReason()
		if why == "" {
			why = f.GetSummary()
		}
		msg += fmt.Sprintf("; the last failure: attempt %d (delegate %q): %s", f.GetAttempt(), f.GetDelegate(), controls.Cut(why, 300))
		if nr := f.GetNotRetriedReason(); nr != "" && !strings.Contains(msg, nr) {
			msg += "; not retried: " + nr
		}
	}
	return msg
}

// statusWord is st's status without its enum's prefix (EXHAUSTED, …).
func statusWord(st *stubbornv1.ControlState) string {
	return strings.TrimPrefix(st.GetStatus().String(), "RUN_STATUS_")
}

// lastFailed is st's last attempt (by number) that ended without success,
// nil when none did.
func lastFailed(st *stubbornv1.ControlState) *stubbornv1.Attempt {
	var last *stubbornv1.Attempt
	for _, at := range st.GetAttemptLog() {
		switch at.GetOutcome() {
		case stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_UNSPECIFIED, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED:
			continue
		}
		if last == nil || at.GetNumber() > last.GetNumber() {
			last = at
		}
	}
	return last
}

// upstreamMessage is an HTTP delegate's error message without the status
// line that the delegate put before the model's own words ("HTTP 400 Bad
// Request: …", delegates/http.go).
func upstreamMessage(msg string) string {
	if rest, ok := strings.CutPrefix(msg, "HTTP "); ok {
		if _, m, ok := strings.Cut(rest, ": "); ok {
			return m
		}
	}
	return msg
}

// answerOf is the run's answer as the doors write it: the winner's
// result (its choices, or its text as choice 0 with the reason to stop it
// gave in its data), with the usage of every attempt summed; and the
// winner's own usage (nil when it reported none).
func answerOf(st *stubbornv1.ControlState) (r *stubbornv1.Result, winner *stubbornv1.Usage) {
	r = proto.CloneOf(st.GetResult())
	if r == nil {
		r = &stubbornv1.Result{}
	}
	if len(r.GetChoices()) == 0 {
		r.Choices = []*stubbornv1.Choice{{
			Message: &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT,
				Content: []*stubbornv1.ContentPart{{Kind: &stubbornv1.ContentPart_Text{Text: r.GetText()}}}},
			FinishReason: finishOf(stopReason(st)), NativeFinishReason: stopReason(st),
		}}
	}
	all := &stubbornv1.Usage{}
	for _, at := range st.GetAttemptLog() {
		u := usageOf(at.GetResult())
		if u == nil {
			continue
		}
		all.InputTokens += u.GetInputTokens()
		all.OutputTokens += u.GetOutputTokens()
		all.TotalTokens += u.GetTotalTokens()
		all.CacheReadTokens += u.GetCacheReadTokens()
		all.CacheWriteTokens += u.GetCacheWriteTokens()
		all.ReasoningTokens += u.GetReasoningTokens()
		if at.GetOutcome() == stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED && at.GetDelegate() == st.GetWinner() {
			winner = u
		}
	}
	r.Usage = all
	return r, winner
}

// usageOf is what an attempt's result reports using: its typed usage, else
// the usage in its data (either API's names), total tokens made up when
// absent; nil when it reports none.
func usageOf(r *stubbornv1.Result) *stubbornv1.Usage {
	if u := r.GetUsage(); u != nil {
		u = proto.CloneOf(u)
		if u.TotalTokens == 0 {
			u.TotalTokens = u.InputTokens + u.OutputTokens
		}
		return u
	}
	f := r.GetData().GetStructValue().GetFields()["usage"].GetStructValue().GetFields()
	if f == nil {
		return nil
	}
	u := &stubbornv1.Usage{
		InputTokens:  int64(f["prompt_tokens"].GetNumberValue() + f["input_tokens"].GetNumberValue()),
		OutputTokens: int64(f["completion_tokens"].GetNumberValue() + f["output_tokens"].GetNumberValue()),
		TotalTokens:  int64(f["total_tokens"].GetNumberValue()),
	}
	if u.TotalTokens == 0 {
		u.TotalTokens = u.InputTokens + u.OutputTokens
	}
	return u
}

// stopReason is the winner's own reason to stop in its data (a model's
// finish_reason or stop_reason), for a result without choices; empty when
// it gave none.
func stopReason(st *stubbornv1.ControlState) string {
	f := st.GetResult().GetData().GetStructValue().GetFields()
	for _, k := range []string{"finish_reason", "stop_reason"} {
		if s := f[k].GetStringValue(); s != "" {
			return s
		}
	}
	return ""
}

// finishOf is a reason to stop in either API's words as a FinishReason.
func finishOf(s string) stubbornv1.FinishReason {
	switch s {
	case "length", "max_tokens":
		return stubbornv1.FinishReason_FINISH_REASON_LENGTH
	case "tool_calls", "function_call", "tool_use":
		return stubbornv1.FinishReason_FINISH_REASON_TOOL_CALLS
	case "content_filter", "refusal":
		return stubbornv1.FinishReason_FINISH_REASON_CONTENT_FILTER
	case "stop_sequence":
		return stubbornv1.FinishReason_FINISH_REASON_STOP_SEQUENCE
	case "pause_turn":
		return stubbornv1.FinishReason_FINISH_REASON_PAUSE
	}
	return stubbornv1.FinishReason_FINISH_REASON_STOP
}
