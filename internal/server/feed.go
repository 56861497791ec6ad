package server

import (
	"context"
	"errors"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/runs"
)

// feedBuffer is how many summaries a WatchRuns stream may fall behind
// before it is ended (RESOURCE_EXHAUSTED, "fell 1000 behind; reattach"):
// its queue, past what the connection's flow control already holds (the
// client's receive window and gRPC's 64 KiB of writes per stream). A slow
// reader never holds a run back, and one that never reads is ended
// rather than kept open while summaries wait.
const feedBuffer = 1000

// feedSub is one WatchRuns stream's queue of what it is to be sent.
type feedSub struct {
	c chan *stubbornv1.WatchRunsResponse
	// overflow is closed when c was full: the stream ends.
	overflow chan struct{}
	once     sync.Once
}

func newFeedSub() *feedSub {
	return &feedSub{c: make(chan *stubbornv1.WatchRunsResponse, feedBuffer), overflow: make(chan struct{})}
}

// offer queues msg, or ends the stream when its queue is full.
func (s *feedSub) offer(msg *stubbornv1.WatchRunsResponse) {
	select {
	case s.c <- msg:
	default:
		s.once.Do(func() { close(s.overflow) })
	}
}

// WatchRuns streams the summaries of ctx's tenant's runs as they start and
// change status, and the ids of those deleted.
func (s *service) WatchRuns(req *stubbornv1.WatchRunsRequest, stream grpc.ServerStreamingServer[stubbornv1.WatchRunsResponse]) error {
	var v violations
	f := checkFilter(&v, req.GetStatus(), req.GetControl(), req.GetDelegate())
	if err := v.err(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	sub := newFeedSub()
	// The store follows every replica's runs (JetStream's listing index;
	// the memory store's states, saved by this one server).
	followed := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		followed <- s.runs.FollowSummaries(ctx, func(sum *stubbornv1.RunSummary, deleted string) error {
			switch {
			case deleted != "":
				sub.offer(&stubbornv1.WatchRunsResponse{DeletedRunId: deleted})
			case sum == nil:
				close(started)
			case f.MatchesSummary(sum):
				sub.offer(&stubbornv1.WatchRunsResponse{Run: sum})
			}
			return nil
		})
	}()
	select {
	case <-started:
		s.following.Add(1)
		defer func() { cancel(); <-followed; s.following.Add(-1) }()
	case err := <-followed:
		if errors.Is(err, runs.ErrNoIndex) {
			return status.Error(codes.Unimplemented, "this server's run store does not follow its runs")
		}
		return status.Errorf(codes.Unavailable, "following the runs: %v", err)
	}
	// Following from now on: the caller may list what came before. (A
	// message rather than headers, which an HTTP transcoder may hold back
	// until the first message.)
	if err := stream.Send(&stubbornv1.WatchRunsResponse{}); err != nil {
		return err
	}
	// Sends happen on a goroutine of their own: a Send blocks while the
	// client does not read (flow control), and the stream must still end
	// when its queue overflows. Returning ends the stream, which cancels
	// its context and so a Send that is blocked.
	sent := make(chan error, 1)
	go func() {
		for {
			select {
			case <-ctx.Done():
				sent <- nil
				return
			case msg := <-sub.c:
				if ctx.Err() != nil {
					sent <- nil
					return
				}
				if err := stream.Send(msg); err != nil {
					sent <- err
					return
				}
			}
		}
	}()
	select {
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	case err := <-followed:
		followed <- err // for the deferred wait
		return status.Errorf(codes.Unavailable, "following the runs ended: %v", err)
	case <-sub.overflow:
		return status.Errorf(codes.ResourceExhausted, "this stream fell %d behind; reattach: WatchRuns again, and ListRuns for what was missed", feedBuffer)
	case err := <-sent:
		return err
	}
}
