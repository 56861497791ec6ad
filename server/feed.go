package server

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/stubbornhq/stubborn/controls"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/runs"
	"github.com/stubbornhq/stubborn/runs/store"
)

// feedBuffer is how many summaries a WatchRuns stream may fall behind
// before it is ended (RESOURCE_EXHAUSTED, "fell 1000 behind; reattach"):
// its queue, past what the connection's flow control already holds (the
// client's receive window and gRPC's 64 KiB of writes per stream). A slow
// reader never holds a run back, and one that never reads is ended
// rather than kept open while summaries wait.
const feedBuffer = 1000

// runFeed tells WatchRuns streams about the runs this server drives: a
// summary when a run starts (or is resumed here) and each time its status
// changes. It learns of them as a runs.Observer.
type runFeed struct {
	mu   sync.Mutex
	subs map[*feedSub]struct{}
	// n counts subs: with none, a run's change costs no summary.
	n atomic.Int32
}

type feedSub struct {
	// tenants are the tenants whose runs it follows (runs.Owners).
	tenants []string
	filter  runs.Filter
	c       chan *stubbornv1.WatchRunsResponse
	// overflow is closed when c was full: the stream ends.
	overflow chan struct{}
	once     sync.Once
}

func newRunFeed() *runFeed { return &runFeed{subs: map[*feedSub]struct{}{}} }

func newFeedSub(tenants []string, filter runs.Filter) *feedSub {
	return &feedSub{tenants: tenants, filter: filter, c: make(chan *stubbornv1.WatchRunsResponse, feedBuffer), overflow: make(chan struct{})}
}

// offer queues msg for the stream, or ends the stream when it is too far
// behind. It never blocks.
func (s *feedSub) offer(msg *stubbornv1.WatchRunsResponse) {
	select {
	case s.c <- msg:
	default:
		s.once.Do(func() { close(s.overflow) })
	}
}

// subscribe starts following s's tenant's runs that pass its filter;
// cancel stops.
func (f *runFeed) subscribe(s *feedSub) func() {
	f.mu.Lock()
	f.subs[s] = struct{}{}
	f.n.Add(1)
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		if _, ok := f.subs[s]; ok {
			delete(f.subs, s)
			f.n.Add(-1)
		}
		f.mu.Unlock()
	}
}

// publish sends sum, a run of tenant, to every stream it passes. It never
// blocks.
func (f *runFeed) publish(tenant string, sum *stubbornv1.RunSummary) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.subs {
		if slices.Contains(s.tenants, tenant) && s.filter.MatchesSummary(sum) {
			s.offer(&stubbornv1.WatchRunsResponse{Run: sum})
		}
	}
}

// publishDeleted tells every stream of tenants that run id was deleted,
// whatever its filter (a deleted run has no status to match it). It never
// blocks.
func (f *runFeed) publishDeleted(tenants []string, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.subs {
		if slices.ContainsFunc(tenants, func(t string) bool { return slices.Contains(s.tenants, t) }) {
			s.offer(&stubbornv1.WatchRunsResponse{DeletedRunId: id})
		}
	}
}

// Observer returns a runs.Observer that publishes the runs it sees, then
// passes them on to inner (which may be nil).
func (f *runFeed) Observer(inner runs.Observer) runs.Observer {
	return feedObserver{f: f, inner: inner}
}

type feedObserver struct {
	f     *runFeed
	inner runs.Observer
}

func (o feedObserver) ObserveRun(runCtx, reqCtx context.Context, st *stubbornv1.ControlState, resumed bool) (context.Context, func(*stubbornv1.RunEvent)) {
	ctx, see := runCtx, func(*stubbornv1.RunEvent) {}
	if o.inner != nil {
		ctx, see = o.inner.ObserveRun(runCtx, reqCtx, st, resumed)
	}
	r := &feedRun{
		tenant: st.GetTenant(), id: st.GetRunId(), brief: store.BriefStart(st.GetTaskBrief()), spec: st.GetControl(), created: st.GetCreateTime(),
		status: st.GetStatus(), attempts: st.GetAttempts(), updated: st.GetUpdateTime(), winner: st.GetWinner(),
	}
	o.f.publishRun(r)
	return ctx, func(ev *stubbornv1.RunEvent) {
		if see != nil {
			see(ev)
		}
		if ev != nil && r.advance(ev) {
			o.f.publishRun(r)
		}
	}
}

// publishRun publishes r's summary, made only when a stream follows.
func (f *runFeed) publishRun(r *feedRun) {
	if f.n.Load() == 0 {
		return
	}
	f.publish(r.tenant, r.summary())
}

// feedRun is what the feed keeps of a run between its events.
type feedRun struct {
	tenant, id       string
	brief            string // RunSummary.brief
	spec             *stubbornv1.ControlSpec
	created, updated *timestamppb.Timestamp
	status           stubbornv1.RunStatus
	attempts         int32
	winner           string
}

func (r *feedRun) summary() *stubbornv1.RunSummary {
	return &stubbornv1.RunSummary{
		RunId: r.id, Control: controls.ControlName(r.spec), Delegates: controls.Named(r.spec), Brief: r.brief,
		Status: r.status, Attempts: r.attempts, CreateTime: r.created, UpdateTime: r.updated, Winner: r.winner,
	}
}

// advance updates r with ev and reports whether its status changed.
func (r *feedRun) advance(ev *stubbornv1.RunEvent) bool {
	next := controls.StatusAfter(r.status, ev)
	switch k := ev.GetKind().(type) {
	case *stubbornv1.RunEvent_AttemptStarted:
		if ev.GetPath() == "" {
			r.attempts++
		}
	case *stubbornv1.RunEvent_RunFinished:
		end := k.RunFinished.GetState()
		r.attempts, r.winner = end.GetAttempts(), end.GetWinner()
	}
	if ev.GetTime() != nil {
		r.updated = ev.GetTime()
	}
	if next == r.status {
		return false
	}
	r.status = next
	return true
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
	sub := newFeedSub(runs.Owners(ctx), f)
	// The store's index follows every replica's runs; without one (the
	// memory store) the runs driven here are followed.
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
		defer func() { cancel(); <-followed }()
	case err := <-followed:
		if !errors.Is(err, runs.ErrNoIndex) {
			return status.Errorf(codes.Unavailable, "following the runs: %v", err)
		}
		if s.feed == nil {
			return status.Error(codes.Unimplemented, "this server does not follow its runs")
		}
		stop := s.feed.subscribe(sub)
		defer stop()
		followed = nil
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
