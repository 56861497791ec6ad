package server

import (
	"context"
	"io"
	"log/slog"
	"runtime/debug"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// A door's run is the ControlService's Run called in process: the caller
// was authenticated once (frontDoor.caller), and the run's events come
// through a channel, not a connection — no second authentication, no
// encoding and decoding of each event, no 4 MiB message limit. What the
// gRPC chain does for a Run that matters here is done here too: the
// stream is revocable (a reload that takes the caller's credentials away
// ends it, as revocable ends a gRPC stream), a panic is recovered into
// INTERNAL, and the handler's headers (the replay header) reach the door.

// runStream is a run's answer as the door reads it.
type runStream interface {
	// Recv returns the next event, or why there is none: io.EOF after the
	// run's stream ended cleanly, else its status error.
	Recv() (*stubbornv1.RunResponse, error)
	// Header is the metadata the handler set (the replay header).
	Header() (metadata.MD, error)
	// Context is the run's stream's context (the caller's).
	Context() context.Context
}

// localRunBuffer is how many events the run may send ahead of the door's
// reading before its Send waits, as gRPC's flow control makes it wait.
const localRunBuffer = 64

// runMethod is Run's full method name, for what reads it from the stream.
var runMethod = stubbornv1.ControlService_Run_FullMethodName

// run starts req's run in process as the caller who (the context
// frontDoor.caller returned). The stream ends when the run's does, or when
// who is cancelled (the client hung up, the door answered).
func (f *frontDoor) run(who context.Context, req *stubbornv1.RunRequest) *localRun {
	ctx, cancel := context.WithCancel(who)
	s := &localRun{cancel: cancel, events: make(chan *stubbornv1.RunResponse, localRunBuffer), done: make(chan struct{})}
	s.ctx = grpc.NewContextWithServerTransportStream(ctx, localHeaders{s})
	go func() {
		var err error
		defer func() {
			if p := recover(); p != nil {
				slog.Default().ErrorContext(ctx, "panic in handler", "panic", p, "stack", string(debug.Stack()))
				err = status.Error(codes.Internal, "internal error")
			}
			s.err = err
			close(s.done)
		}()
		err = f.svc.revocable(nil, s, &grpc.StreamServerInfo{FullMethod: runMethod, IsServerStream: true},
			func(_ any, ss grpc.ServerStream) error {
				return f.svc.Run(req, &grpc.GenericServerStream[stubbornv1.RunRequest, stubbornv1.RunResponse]{ServerStream: ss})
			})
	}()
	return s
}

// localRun is both ends of an in-process Run: the handler's
// grpc.ServerStream and the door's runStream.
type localRun struct {
	ctx    context.Context
	cancel context.CancelFunc
	events chan *stubbornv1.RunResponse
	done   chan struct{} // closed when the handler returned; err is then set
	err    error

	mu     sync.Mutex
	header metadata.MD
}

var (
	_ grpc.ServerStream          = (*localRun)(nil)
	_ runStream                  = (*localRun)(nil)
	_ grpc.ServerTransportStream = localHeaders{}
)

func (s *localRun) Context() context.Context { return s.ctx }

// SendMsg hands the door the event: decoded from the journal's encoding
// the service sends it in (eventResponse, which gRPC's codec passes
// through), or a copy of a RunResponse (the run's events are shared with
// its other watchers, and the door keeps what it reads).
func (s *localRun) SendMsg(m any) error {
	var ev *stubbornv1.RunResponse
	switch m := m.(type) {
	case eventResponse:
		e := &stubbornv1.RunEvent{}
		if err := proto.Unmarshal(m, e); err != nil {
			return status.Errorf(codes.Internal, "a run's event does not decode: %v", err)
		}
		ev = &stubbornv1.RunResponse{Event: e}
	case *stubbornv1.RunResponse:
		ev = proto.CloneOf(m)
	default:
		return status.Errorf(codes.Internal, "a Run stream sends RunResponse, not %T", m)
	}
	select {
	case s.events <- ev:
		return nil
	case <-s.ctx.Done():
		return status.FromContextError(s.ctx.Err()).Err()
	}
}

// RecvMsg is never called: Run's one request is given to the handler.
func (s *localRun) RecvMsg(any) error { return io.EOF }

func (s *localRun) SetHeader(md metadata.MD) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.header = metadata.Join(s.header, md)
	return nil
}

func (s *localRun) SendHeader(md metadata.MD) error { return s.SetHeader(md) }

func (s *localRun) SetTrailer(metadata.MD) {}

// localHeaders is the run's grpc.ServerTransportStream, which
// grpc.SetHeader(ctx, …) finds in the handler's context.
type localHeaders struct{ s *localRun }

func (h localHeaders) Method() string                  { return runMethod }
func (h localHeaders) SetHeader(md metadata.MD) error  { return h.s.SetHeader(md) }
func (h localHeaders) SendHeader(md metadata.MD) error { return h.s.SetHeader(md) }
func (h localHeaders) SetTrailer(md metadata.MD) error { return nil }

// Header returns the headers set so far: the handler sets them before its
// first event, which the door has read when it asks.
func (s *localRun) Header() (metadata.MD, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.header.Copy(), nil
}

func (s *localRun) Recv() (*stubbornv1.RunResponse, error) {
	select {
	case ev := <-s.events:
		return ev, nil
	case <-s.done:
		select { // what the handler sent before it returned comes first
		case ev := <-s.events:
			return ev, nil
		default:
		}
		if s.err != nil {
			return nil, s.err
		}
		return nil, io.EOF
	}
}

// close ends the stream from the door's side: the handler's next Send
// fails and it returns.
func (s *localRun) close() { s.cancel() }
