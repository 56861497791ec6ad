package runs_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
)

// Watching a finished run with after at or past its last event ends at
// once, with no event and no error, on both stores: from the store
// (Follow), from a server that follows the store (the run is not its
// own), and from the server that ran it (issue 30 item 7: Follow waited
// for a message after run_finished, which never comes).
func TestWatchPastTheEndOfAFinishedRunEndsAtOnce(t *testing.T) {
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			open := newStore(t, time.Second)
			store := open()
			d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {controlstest.Fail(codes.Internal, "no")}, "b": {controlstest.OK("yes")}})
			ran := runstest.NewManager(t, d, runs.Config{Store: store, Lease: time.Second, Owner: "ran"})
			st, err := runstest.Start(ran, context.Background(), "brief", runstest.Chain("a", "b"), nil)
			require.NoError(t, err)
			id := st.GetRunId()
			last := int64(len(runstest.WatchAll(t, ran, id, 0)))
			require.Greater(t, last, int64(2))
			other := runstest.NewManager(t, d, runs.Config{Store: open(), Lease: time.Second, Owner: "other"})

			for _, after := range []int64{last - 1, last, last + 1, last + 13} {
				want := max(0, last-after)
				for via, watch := range map[string]func(context.Context, func(runs.Event) error) error{
					"store.Follow":     func(ctx context.Context, fn func(runs.Event) error) error { return store.Follow(ctx, id, after, fn) },
					"following server": func(ctx context.Context, fn func(runs.Event) error) error { return other.Watch(ctx, id, after, fn) },
					"running server":   func(ctx context.Context, fn func(runs.Event) error) error { return ran.Watch(ctx, id, after, fn) },
				} {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					var got []*stubbornv1.RunEvent
					began := time.Now()
					err := watch(ctx, runstest.Decoding(func(ev *stubbornv1.RunEvent) error {
						got = append(got, ev)
						return nil
					}))
					took := time.Since(began)
					cancel()
					require.NoError(t, err, "%s, after %d of %d", via, after, last)
					assert.Less(t, took, 2*time.Second, "%s, after %d: at once", via, after)
					require.Len(t, got, int(want), "%s, after %d", via, after)
					if want > 0 {
						assert.NotNil(t, got[0].GetRunFinished(), "%s, after %d: the last event", via, after)
					}
				}
			}
		})
	}
}
