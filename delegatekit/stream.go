package delegatekit

import (
	"context"
	"strings"
	"sync"

	"google.golang.org/grpc"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Send streams text, the next piece of the answer, to Stubborn while the
// Func that ctx was given to runs: a run's watchers see it at once, and
// the run's first_output_timeout and idle_timeout time the gaps between
// pieces. A Func that sends pieces may return a Result with no text: the
// pieces joined are the answer's text. Called with a ctx of no call (or
// after the Func returned) it does nothing. An error means the piece could
// not be sent (the caller went away): stop and return it.
//
// When Stubborn calls Execute (a server older than streaming, or a
// delegate registered with `stream: off`), the pieces are kept and joined
// into the answer, so one Func serves both ways.
func Send(ctx context.Context, text string) error {
	out, ok := ctx.Value(outputKey{}).(*output)
	if !ok || text == "" {
		return nil
	}
	return out.send(text)
}

type outputKey struct{}

// output is where a call's pieces go: the stream of an ExecuteStream, or a
// buffer for Execute.
type output struct {
	mu     sync.Mutex
	stream grpc.ServerStreamingServer[stubbornv1.ExecuteStreamResponse] // nil: Execute
	text   strings.Builder
	sent   bool
	closed bool
}

func (o *output) send(text string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil
	}
	o.text.WriteString(text)
	o.sent = true
	if o.stream == nil {
		return nil
	}
	return o.stream.Send(&stubbornv1.ExecuteStreamResponse{Kind: &stubbornv1.ExecuteStreamResponse_TextDelta{TextDelta: text}})
}

// close ends the output: a Func's goroutine left behind cannot send after
// its call returned.
func (o *output) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
}

// answer is res with the pieces joined as its text when it has none.
func (o *output) answer(res *stubbornv1.Result) *stubbornv1.Result {
	o.mu.Lock()
	defer o.mu.Unlock()
	if res.GetText() == "" && o.sent {
		// A Result of the Func's own is not changed: it may share it.
		return &stubbornv1.Result{Text: o.text.String(), Data: res.GetData()}
	}
	return res
}

var executeStreamInfo = &grpc.UnaryServerInfo{FullMethod: stubbornv1.DelegateService_ExecuteStream_FullMethodName}

// ExecuteStream calls fn as Execute does, streaming what it Sends, then
// its Result.
func (s *service) ExecuteStream(req *stubbornv1.ExecuteStreamRequest, stream grpc.ServerStreamingServer[stubbornv1.ExecuteStreamResponse]) error {
	ereq := &stubbornv1.ExecuteRequest{
		Brief: req.GetBrief(), RunId: req.GetRunId(), Attempt: req.GetAttempt(),
		IdempotencyKey: req.GetIdempotencyKey(), Metadata: req.GetMetadata(),
	}
	out := &output{stream: stream}
	ctx := context.WithValue(stream.Context(), outputKey{}, out)
	resp, err := s.recover(ctx, ereq, executeStreamInfo, s.call)
	out.close()
	if err != nil {
		return statusError(err)
	}
	res := resp.(*stubbornv1.ExecuteResponse).GetResult()
	if out.sent && res.GetText() == out.text.String() {
		// The deltas are the text: not sent twice (res is the kit's copy
		// when the Func's had no text, else the Func's: copied).
		res = &stubbornv1.Result{Data: res.GetData()}
	}
	return stream.Send(&stubbornv1.ExecuteStreamResponse{Kind: &stubbornv1.ExecuteStreamResponse_Result{Result: res}})
}
