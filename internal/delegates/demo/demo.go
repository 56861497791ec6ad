// Package demo provides small DelegateService implementations for the README
// demo and for tests, and Serve to run one on a listener with delegatekit
// (gRPC health, reflection, panics recovered).
//
// The demo of "connection refused" needs no code: register a delegate whose
// target has no listener (for example 127.0.0.1:1). Its calls fail with
// UNAVAILABLE before reaching any server, which Stubborn marks NotSent.
package demo

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stubbornhq/stubborn/delegatekit"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// HealthReporter is implemented by a delegate that wants Serve to report a
// health status other than SERVING.
type HealthReporter interface {
	// HealthStatus is the status Serve reports: SERVING, or anything else
	// for NOT_SERVING.
	HealthStatus() healthpb.HealthCheckResponse_ServingStatus
}

// Serve serves svc with delegatekit on lis, in a goroutine, on a new server
// with opts: health SERVING (or what svc's HealthStatus says), reflection.
// Stop the returned server to end it.
func Serve(lis net.Listener, svc stubbornv1.DelegateServiceServer, opts ...grpc.ServerOption) *grpc.Server {
	s := NewServer(svc, delegatekit.WithServerOptions(opts...))
	go func() { _ = s.Serve(context.Background(), lis) }()
	return s.GRPC()
}

// NewServer returns a delegatekit server for svc, its health SERVING or what
// svc's HealthStatus says. Serve it with its Serve method, which shuts down
// gracefully when its context ends.
func NewServer(svc stubbornv1.DelegateServiceServer, opts ...delegatekit.Option) *delegatekit.Server {
	s := delegatekit.NewServer(KitFunc(svc), opts...)
	if r, ok := svc.(HealthReporter); ok {
		s.SetServing(r.HealthStatus() == healthpb.HealthCheckResponse_SERVING)
	}
	return s
}

// KitFunc is svc as a delegatekit.Func: its Execute, the response's result
// unwrapped.
func KitFunc(svc stubbornv1.DelegateServiceServer) delegatekit.Func {
	return func(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.Result, error) {
		resp, err := svc.Execute(ctx, req)
		if err != nil {
			return nil, err
		}
		return resp.GetResult(), nil
	}
}

func text(s string) *stubbornv1.ExecuteResponse {
	return &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{Text: s}}
}

// Echo answers every brief with "echo: " + brief.
type Echo struct {
	stubbornv1.UnimplementedDelegateServiceServer
}

// Execute echoes the brief.
func (Echo) Execute(_ context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
	return text("echo: " + req.GetBrief()), nil
}

// Flaky fails its first FailFirst calls, then echoes like Echo. Calls are
// counted per value, across goroutines; use a *Flaky.
type Flaky struct {
	stubbornv1.UnimplementedDelegateServiceServer
	// FailFirst is how many calls fail.
	FailFirst int
	// Code is the failures' status code; zero (OK) means UNAVAILABLE.
	Code codes.Code

	calls atomic.Int64
}

// Execute fails with "flaky: failing call i of N" for calls 1..N, then
// echoes.
func (f *Flaky) Execute(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
	n := f.calls.Add(1)
	if n <= int64(f.FailFirst) {
		code := f.Code
		if code == codes.OK {
			code = codes.Unavailable
		}
		return nil, status.Errorf(code, "flaky: failing call %d of %d", n, f.FailFirst)
	}
	return Echo{}.Execute(ctx, req)
}

// Calls returns how many calls Execute has received.
func (f *Flaky) Calls() int { return int(f.calls.Load()) }

// Down is a delegate that is down: its health reports NOT_SERVING and
// Execute fails with UNAVAILABLE "down: not serving".
type Down struct {
	stubbornv1.UnimplementedDelegateServiceServer
}

// Execute always fails with UNAVAILABLE.
func (Down) Execute(context.Context, *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
	return nil, delegatekit.Transient("down: not serving")
}

// HealthStatus reports NOT_SERVING.
func (Down) HealthStatus() healthpb.HealthCheckResponse_ServingStatus {
	return healthpb.HealthCheckResponse_NOT_SERVING
}

// Slow answers "slow: " + brief after Delay, unless the call's context ends
// first; it counts such cancellations, so tests can see that a caller's
// cancellation reached the server. Use a *Slow.
type Slow struct {
	stubbornv1.UnimplementedDelegateServiceServer
	// Delay is how long each call takes.
	Delay time.Duration

	started   atomic.Int64
	cancelled atomic.Int64
}

// Execute waits Delay or until ctx ends, whichever is first.
func (s *Slow) Execute(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
	s.started.Add(1)
	t := time.NewTimer(s.Delay)
	defer t.Stop()
	select {
	case <-t.C:
		return text("slow: " + req.GetBrief()), nil
	case <-ctx.Done():
		s.cancelled.Add(1)
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// Started returns how many calls Execute has received.
func (s *Slow) Started() int { return int(s.started.Load()) }

// Cancelled returns how many calls saw their context end before Delay.
func (s *Slow) Cancelled() int { return int(s.cancelled.Load()) }

// Func is a delegate written as a function. Wrap it with NewScripted to
// serve it.
type Func func(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error)

// Received is one request a Scripted delegate got.
type Received struct {
	// Request is the request as received.
	Request *stubbornv1.ExecuteRequest
	// Header is the request's incoming gRPC metadata.
	Header metadata.MD
}

// Scripted serves a Func and records every request it receives.
type Scripted struct {
	stubbornv1.UnimplementedDelegateServiceServer
	fn Func

	mu       sync.Mutex
	received []Received
}

// NewScripted returns a delegate that answers with fn; a nil fn echoes like
// Echo.
func NewScripted(fn Func) *Scripted {
	if fn == nil {
		fn = Echo{}.Execute
	}
	return &Scripted{fn: fn}
}

// Execute records the request and calls the Func.
func (s *Scripted) Execute(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	s.received = append(s.received, Received{Request: req, Header: md.Copy()})
	s.mu.Unlock()
	return s.fn(ctx, req)
}

// Received returns the requests received so far, in order.
func (s *Scripted) Received() []Received {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Received(nil), s.received...)
}

// Storyteller is a model that streams its answer word by word
// (delegatekit.Send), a word every Pace. Its first StallFirst calls stall
// after StallAfter words: they send nothing more until the call ends, as
// a model that hangs mid-answer does. Calls are counted per value; use a
// *Storyteller.
type Storyteller struct {
	stubbornv1.UnimplementedDelegateServiceServer
	// Story is the answer; empty means a short one.
	Story string
	// Pace is the wait before each word.
	Pace time.Duration
	// StallFirst calls stall, after StallAfter words each.
	StallFirst, StallAfter int

	calls atomic.Int64
}

// defaultStory is a Storyteller's answer when Story is empty.
const defaultStory = "Once upon a time a retry layer kept every word a model said, " +
	"noticed when the model fell silent, and asked another, which finished the story."

// Execute streams the story; a stalling call hangs after StallAfter words.
func (s *Storyteller) Execute(ctx context.Context, _ *stubbornv1.ExecuteRequest) (*stubbornv1.ExecuteResponse, error) {
	n := s.calls.Add(1)
	story := s.Story
	if story == "" {
		story = defaultStory
	}
	words := strings.SplitAfter(story, " ")
	for i, w := range words {
		if int(n) <= s.StallFirst && i == s.StallAfter {
			<-ctx.Done() // stalled: silent until the caller gives up
			return nil, ctx.Err()
		}
		select {
		case <-time.After(s.Pace):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if err := delegatekit.Send(ctx, w); err != nil {
			return nil, err
		}
	}
	return &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{}}, nil
}

// Calls returns how many calls Execute has received.
func (s *Storyteller) Calls() int { return int(s.calls.Load()) }
