package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// events reads a run's events one at a time from a Run or WatchRun stream.
type events func() (*stubbornv1.RunEvent, error)

// streamEventsOf reads a Run or WatchRun stream's events.
func streamEventsOf[T any, PT interface {
	*T
	GetEvent() *stubbornv1.RunEvent
}](stream grpc.ServerStreamingClient[T]) events {
	return func() (*stubbornv1.RunEvent, error) {
		msg, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		return PT(msg).GetEvent(), nil
	}
}

// follow prints a run's events until it ends, and returns its final state
// (nil when the stream ended with no run_finished, as a watch from past the
// end does). id is the run's id, "" until its first event names it (run).
//
// Following survives the server: when the stream breaks because the
// server went away (a stop, a restart, another server taking the run
// over) after an event named the run, follow waits for a server to
// answer again, up to reattachWait, and follows the run on from the last
// event seen (WatchRun after_seq), as often as that happens. When none
// answers, its error says how to follow the run again. It says on stderr
// that it waits, and that it follows the run again (at the first event).
func (c *client) follow(ctx context.Context, id string, next events, p *printer) (*stubbornv1.ControlState, error) {
	// A stream that ends in the middle of an attempt's text ends its line.
	defer p.endOutput()
	var final *stubbornv1.ControlState
	var lost time.Time // when the stream broke; zero while it goes
	tries := 0         // streams opened since, none of which gave an event
	seen := false      // whether any event came
	for {
		ev, err := next()
		if err == nil {
			seen = true
			if !lost.IsZero() {
				fmt.Fprintf(stderr, "stubborn: following run %s again, after seq %d\n", id, p.lastSeq)
			}
			lost, tries = time.Time{}, 0
			p.event(ev)
			if f := ev.GetRunFinished(); f != nil {
				final = f.GetState()
			}
			continue
		}
		if id == "" {
			id = p.runID
		}
		if errors.Is(err, io.EOF) {
			if final != nil || id == "" || !seen {
				return final, nil
			}
			// No run_finished: the run ended before -after, or the server
			// ended the stream as it stopped. Its state says which.
			st, gerr := c.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
			if gerr == nil && finished(st.GetState()) {
				return st.GetState(), nil
			}
			err = status.Error(codes.Unavailable, "the stream ended before the run did")
		}
		if ctx.Err() != nil || id == "" || status.Code(err) != codes.Unavailable {
			return final, err
		}
		if lost.IsZero() {
			lost = time.Now()
		}
		left := max(reattachWait-time.Since(lost), 0)
		say := fmt.Sprintf("the server went away while following run %s: waiting up to %s for one to answer again (Ctrl-C stops)", id, left.Round(time.Second))
		if left == 0 || !c.waitReady(ctx, left, say) {
			if ctx.Err() != nil {
				return final, ctx.Err()
			}
			return final, fmt.Errorf("%w; follow the run again with `stubborn watch%s %s -after %d` once a server is back", err, p.addrFlag(), id, p.lastSeq)
		}
		if tries++; tries > 1 {
			// The server answered, and the stream broke again at once (a
			// server stopping, its store not back yet): not at once again.
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
				return final, ctx.Err()
			}
		}
		stream, werr := c.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: id, AfterSeq: p.lastSeq})
		if werr != nil {
			next = func() (*stubbornv1.RunEvent, error) { return nil, werr }
			continue
		}
		next = streamEventsOf(stream)
	}
}

// finished says whether a run's state is final.
func finished(st *stubbornv1.ControlState) bool {
	switch st.GetStatus() {
	case stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED,
		stubbornv1.RunStatus_RUN_STATUS_FAILED, stubbornv1.RunStatus_RUN_STATUS_CANCELLED:
		return true
	}
	return false
}

// followAgain is the hint that says how to follow a run again from the
// last event seen.
func (p *printer) followAgain() string {
	return fmt.Sprintf("follow it again with `stubborn watch%s %s -after %d`", p.addrFlag(), p.runID, p.lastSeq)
}
