package delegates

import (
	"context"
	"errors"
	"io"
	"maps"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/conversation"
)

// transport is how the Pool reaches one delegate, by kind.
type transport interface {
	// call sends one attempt. ctx carries the attempt's deadline. An error
	// is a *controls.CallError, or one that Classify turns into one. A
	// transport whose answer streams calls s.begin once the request is
	// sent and s.piece with each piece of text, and stops reading when
	// piece fails; ctx is s's, which a stall ends.
	call(ctx context.Context, c controls.Call, s *stream) (*stubbornv1.Result, error)
	// mayStream reports whether a call made now may stream: s is nil for
	// one that may not (it costs nothing then).
	mayStream() bool
	// serving answers a health check: false only for a clear "not
	// serving".
	// serving asks the delegate whether it serves (health.go).
	serving(ctx context.Context) health
	close() error
}

// newTransport builds d's transport by its kind.
func (p *Pool) newTransport(d Delegate, opts []grpc.DialOption) (transport, error) {
	tc, err := d.TLS.clientConfig()
	if err != nil {
		return nil, err
	}
	switch {
	case d.HTTP != nil:
		return &httpTransport{httpClient: p.newHTTPClient(tc, d.HTTP.HealthURL), cfg: d.HTTP, stream: d.Stream != streamOff && d.HTTP.StreamFormat != ""}, nil
	case d.OpenAI != nil:
		return newOpenAITransport(d.OpenAI, d.Stream, p.newHTTPClient(tc, d.OpenAI.HealthURL)), nil
	case d.Anthropic != nil:
		return newAnthropicTransport(d.Anthropic, d.Stream, p.newHTTPClient(tc, d.Anthropic.HealthURL)), nil
	}
	creds := insecure.NewCredentials()
	if tc != nil {
		creds = credentials.NewTLS(tc)
	}
	all := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDisableRetry(),
		// Past max_result_bytes an answer fails its attempt (Call);
		// one so large that gRPC will not read it fails the same.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(p.maxResult + recvSlack)),
	}, opts...)
	conn, err := grpc.NewClient(d.Target, all...)
	if err != nil {
		return nil, err
	}
	return &grpcTransport{
		conn:   conn,
		client: stubbornv1.NewDelegateServiceClient(conn),
		health: healthpb.NewHealthClient(conn),
		p:      p,
		mode:   d.Stream,
	}, nil
}

// grpcTransport reaches a delegate that serves stubborn.v1.DelegateService
// over one shared, lazily connecting client connection.
type grpcTransport struct {
	conn   *grpc.ClientConn
	client stubbornv1.DelegateServiceClient
	health healthpb.HealthClient
	p      *Pool
	// mode is the registry's stream setting; unary says an ExecuteStream
	// answered UNIMPLEMENTED (streamAuto): Execute from then on.
	mode  string
	unary atomic.Bool
}

func (g *grpcTransport) mayStream() bool { return g.mode != streamOff && !g.unary.Load() }

func (g *grpcTransport) call(ctx context.Context, c controls.Call, s *stream) (*stubbornv1.Result, error) {
	kv := make([]string, 0, 6)
	if c.Attempt > 0 {
		kv = append(kv, headerAttempt, strconv.Itoa(int(c.Attempt)))
	}
	if c.IdempotencyKey != "" {
		kv = append(kv, headerIdempotencyKey, c.IdempotencyKey)
	}
	if c.RunID != "" {
		kv = append(kv, headerRunID, c.RunID)
	}
	if len(kv) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, kv...)
	}
	req := &stubbornv1.ExecuteRequest{
		Brief:          c.Brief,
		RunId:          c.RunID,
		Attempt:        c.Attempt,
		IdempotencyKey: c.IdempotencyKey,
		Metadata:       maps.Clone(c.Metadata),
	}
	setTask(req, c)
	if s != nil && g.mayStream() {
		res, err, unimplemented := g.stream(ctx, req, s)
		if !unimplemented || g.mode == streamOn {
			return res, err
		}
		g.unary.Store(true) // it does not stream: never asked again
		s.disarm()          // its answer is not timed as a stream
	}
	var (
		trailer metadata.MD
		pr      peer.Peer
	)
	resp, err := g.client.Execute(ctx, req, grpc.Trailer(&trailer), grpc.Peer(&pr))
	if err != nil {
		return nil, g.callError(err, trailer, pr)
	}
	return resp.GetResult(), nil
}

// setTask sets the run's task on req for an attempt at it (c.Task): the
// conversation, typed, with c.Added applied (withAdded), and what the
// control added as brief_addition; and the legacy messages and
// model_params, for delegates that read only them: a typed run's rendered
// in their shape (conversation.ToLegacy), a run journaled with them as
// they are (legacyMessagesOf). A gRPC delegate gets the conversation
// whatever its fields: it is never refused here (its brief is its task).
func setTask(req *stubbornv1.ExecuteRequest, c controls.Call) {
	if !c.Task {
		return
	}
	req.BriefAddition = c.Added
	switch {
	case c.Conversation != nil:
		req.Conversation = withAdded(c.Conversation, c.Added)
		// The rendering leaves out what Chat Completions cannot carry;
		// it fails on no conversation a run can have.
		req.Messages, req.ModelParams, _ = conversation.ToLegacy(req.Conversation)
	case len(c.Messages) > 0:
		req.Messages, req.ModelParams = legacyMessagesOf(c), c.ModelParams
		if conv, err := conversation.FromLegacy(c.Messages, c.ModelParams); err == nil {
			req.Conversation = withAdded(conv, c.Added)
		}
	default:
		req.ModelParams = c.ModelParams
	}
}

// callError is the CallError of a failed Execute or ExecuteStream.
func (g *grpcTransport) callError(err error, trailer metadata.MD, pr peer.Peer) *controls.CallError {
	ce := Classify(err, trailer)
	if tooLarge(ce) {
		ce = g.p.resultTooLarge(-1)
	}
	if pr.Addr != nil {
		// A connection to the delegate carried the call: whatever the
		// message says, it may have been received.
		ce.NotSent = false
	}
	return ce
}

// stream makes the call with ExecuteStream. unimplemented says the
// delegate answered UNIMPLEMENTED before any message: it serves Execute
// only, and nothing was done.
func (g *grpcTransport) stream(ctx context.Context, req *stubbornv1.ExecuteRequest, s *stream) (res *stubbornv1.Result, err error, unimplemented bool) {
	var (
		trailer metadata.MD
		pr      peer.Peer
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // a stream left unread is ended
	sreq := &stubbornv1.ExecuteStreamRequest{
		Brief: req.GetBrief(), RunId: req.GetRunId(), Attempt: req.GetAttempt(),
		IdempotencyKey: req.GetIdempotencyKey(), Metadata: req.GetMetadata(),
		Messages: req.GetMessages(), ModelParams: req.GetModelParams(),
		Conversation: req.GetConversation(), BriefAddition: req.GetBriefAddition(),
	}
	st, err := g.client.ExecuteStream(ctx, sreq, grpc.Trailer(&trailer), grpc.Peer(&pr))
	if err != nil {
		return nil, g.callError(err, trailer, pr), false
	}
	s.begin()
	messages := 0
	for {
		msg, err := st.Recv()
		if errors.Is(err, io.EOF) {
			// Ended without a result: the deltas are the answer.
			return &stubbornv1.Result{Text: s.joined()}, nil, false
		}
		if err != nil {
			ce := g.callError(err, st.Trailer(), pr)
			return nil, ce, messages == 0 && doesNotStream(ce)
		}
		messages++
		switch k := msg.GetKind().(type) {
		case *stubbornv1.ExecuteStreamResponse_TextDelta:
			if err := s.piece(k.TextDelta); err != nil {
				return nil, err, false
			}
		case *stubbornv1.ExecuteStreamResponse_Delta:
			if err := route(s, []*stubbornv1.OutputDelta{k.Delta}); err != nil {
				return nil, err, false
			}
		case *stubbornv1.ExecuteStreamResponse_Result:
			res := k.Result
			if res == nil {
				res = &stubbornv1.Result{}
			}
			if res.GetText() == "" {
				res.Text = s.joined()
			}
			// The stream ends after its result: read that end, so the
			// call ends OK (its span too) rather than cancelled; a
			// delegate that does not end it is cut after drainWait.
			t := time.AfterFunc(drainWait, cancel)
			_, _ = st.Recv()
			t.Stop()
			return res, nil, false
		}
	}
}

// serving asks grpc.health.v1 about service "": NOT_SERVING is not
// serving; a delegate without the health service (UNIMPLEMENTED) or with
// another answer serves; a call that did not reach it (connection
// refused, no answer in time) is unreachable.
func (g *grpcTransport) serving(ctx context.Context) health {
	resp, err := g.health.Check(ctx, &healthpb.HealthCheckRequest{Service: ""})
	switch {
	case err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING:
		return healthNotServing
	case err == nil:
		return healthServing
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return healthUnreachable
	}
	return healthServing // it answered, without a health service of its own
}

func (g *grpcTransport) close() error { return g.conn.Close() }

// drainWait bounds the wait for a stream's end after its result.
const drainWait = 250 * time.Millisecond

// doesNotStream reports whether ce is a server's answer that it has no
// ExecuteStream: UNIMPLEMENTED in the words gRPC servers use for a method
// they do not serve (grpc-go's "unknown method ExecuteStream …" and
// "method ExecuteStream not implemented", grpc-python's "Method not
// implemented!" and "Method not found!", the Python kit's "this delegate
// does not stream"), with no detail of a delegate's own. A delegate's own
// UNIMPLEMENTED (delegatekit.Upstream(501, …), after it did its work) is
// a failure like any other: never a reason to call it again with Execute.
func doesNotStream(ce *controls.CallError) bool {
	if ce.Code != codes.Unimplemented || ce.HTTPStatus != 0 || ce.HasHint {
		return false
	}
	msg := strings.ToLower(ce.Message)
	for _, words := range []string{"executestream", "method not implemented", "method not found", "unknown service", "does not stream"} {
		if strings.Contains(msg, words) {
			return true
		}
	}
	return false
}

// tooLarge reports whether ce is gRPC's own refusal of a response over the
// receive limit (not a delegate's RESOURCE_EXHAUSTED, which may pass).
func tooLarge(ce *controls.CallError) bool {
	return ce.Code == codes.ResourceExhausted &&
		(strings.HasPrefix(ce.Message, "grpc: received message larger than max") ||
			strings.HasPrefix(ce.Message, "grpc: received message after decompression larger than max"))
}
