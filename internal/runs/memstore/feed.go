package memstore

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// followBuffer is how many changes a follower (FollowSummaries) may fall
// behind before its follow ends with errFellBehind: a slow follower never
// holds a run's write back.
const followBuffer = 1024

// errFellBehind ends a follow whose follower did not keep up.
var errFellBehind = errors.New("memory store: the follower fell behind; follow again")

// feed tells the store's followers (FollowSummaries) of each run's state
// saved (a claim with its state, PutState) as a summary, and of each run
// deleted: the one feed WatchRuns follows, as it follows JetStream's
// listing index.
type feed struct {
	mu   sync.Mutex
	subs map[*follower]struct{}
	// n counts subs: with none, a saved state is not decoded.
	n atomic.Int32
}

// follower is one FollowSummaries call.
type follower struct {
	tenants []string
	c       chan change
	// behind is closed once c was full.
	behind chan struct{}
	once   sync.Once
}

// change is a run's summary, or the id of a run deleted.
type change struct {
	sum     *stubbornv1.RunSummary
	deleted string
}

// FollowSummaries calls fn with nil and "" once it follows, then with the
// summary of each of tenants' runs each time its state is saved (its start,
// each change of status, its end), and with the id of each of their runs
// deleted, until ctx ends or fn fails (or errFellBehind).
func (s *Memory) FollowSummaries(ctx context.Context, tenants []string, fn func(sum *stubbornv1.RunSummary, deleted string) error) error {
	f := &follower{tenants: tenants, c: make(chan change, followBuffer), behind: make(chan struct{})}
	s.feed.mu.Lock()
	if s.feed.subs == nil {
		s.feed.subs = map[*follower]struct{}{}
	}
	s.feed.subs[f] = struct{}{}
	s.feed.n.Add(1)
	s.feed.mu.Unlock()
	defer func() {
		s.feed.mu.Lock()
		delete(s.feed.subs, f)
		s.feed.n.Add(-1)
		s.feed.mu.Unlock()
	}()
	if err := fn(nil, ""); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-f.behind:
			return errFellBehind
		case c := <-f.c:
			if err := fn(c.sum, c.deleted); err != nil {
				return err
			}
		}
	}
}

// saved tells the followers of a run's state saved (encoded), if any
// follows its tenant.
func (f *feed) saved(state []byte) {
	if f.n.Load() == 0 {
		return
	}
	st, err := store.DecodeState(state)
	if err != nil {
		return // an unreadable state has no summary (ListRuns leaves it out too)
	}
	f.send(st.GetTenant(), change{sum: store.Summary(st)})
}

// deleted tells the followers of run id's deletion; state is its last
// saved state (encoded), which names its tenant (nil: nobody is told).
func (f *feed) deleted(id string, state []byte) {
	if f.n.Load() == 0 || state == nil {
		return
	}
	st, err := store.DecodeState(state)
	if err != nil {
		return
	}
	f.send(st.GetTenant(), change{deleted: id})
}

// send offers c to the followers of tenant; one whose queue is full is
// told it fell behind.
func (f *feed) send(tenant string, c change) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for sub := range f.subs {
		if !slices.Contains(sub.tenants, tenant) {
			continue
		}
		select {
		case sub.c <- c:
		default:
			sub.once.Do(func() { close(sub.behind) })
		}
	}
}
