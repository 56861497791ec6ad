package runs

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/runs/memstore"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// BenchmarkFanOut records events in one run's journal (in memory and in
// the Memory store) while n watchers follow it with Watch, as WatchRun
// streams do (their send does nothing here). ns/op and allocs/op are per
// event recorded, until every watcher has received it.
func BenchmarkFanOut(b *testing.B) {
	for _, n := range []int{0, 1, 10, 100, 1000} {
		b.Run(fmt.Sprintf("watchers=%d", n), func(b *testing.B) {
			m, err := New(Config{Store: memstore.NewMemory(DefaultLease)})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			r, err := m.admit("run_bench", "")
			if err != nil {
				b.Fatal(err)
			}
			defer m.wg.Done() // what drive would do, before Close waits for it
			r.cancel = func(error) {}
			close(r.ready)
			ctx, cancel := context.WithCancel(b.Context())
			defer cancel()

			var received atomic.Int64
			var wg sync.WaitGroup
			for range n {
				wg.Go(func() {
					err := m.Watch(ctx, r.id, 0, func(Event) error {
						received.Add(1)
						return nil
					})
					if err != nil {
						b.Error(err)
					}
				})
			}
			now := timestamppb.Now()
			st := &stubbornv1.ControlState{RunId: r.id, Status: stubbornv1.RunStatus_RUN_STATUS_RUNNING}
			evs := make([]*stubbornv1.RunEvent, b.N)
			for i := range evs {
				evs[i] = &stubbornv1.RunEvent{Time: now, Kind: &stubbornv1.RunEvent_AttemptStarted{
					AttemptStarted: &stubbornv1.AttemptStarted{Attempt: &stubbornv1.Attempt{Number: int32(i + 1), Delegate: "echo"}},
				}}
			}
			done := &stubbornv1.RunEvent{Time: now, Kind: &stubbornv1.RunEvent_RunFinished{RunFinished: &stubbornv1.RunFinished{}}}

			b.ReportAllocs()
			b.ResetTimer()
			for _, ev := range evs {
				r.record(ev, st)
			}
			r.record(done, st)
			wg.Wait()
			b.StopTimer()
			if got, want := received.Load(), int64(n)*int64(b.N+1); got != want {
				b.Fatalf("watchers received %d events, want %d", got, want)
			}
		})
	}
}

// failFirst fails every attempt numbered at most n with UNAVAILABLE and
// answers the others.
type failFirst struct{ n int32 }

func (f failFirst) Call(_ context.Context, c controls.Call) (*stubbornv1.Result, error) {
	if c.Attempt <= f.n {
		return nil, &controls.CallError{Code: codes.Unavailable, Message: "try later"}
	}
	return &stubbornv1.Result{Text: "echo: find it"}, nil
}

func (failFirst) Info(string) controls.DelegateInfo { return controls.DelegateInfo{Idempotent: true} }

func (failFirst) Serving(context.Context, string) bool { return true }

// BenchmarkRunToEnd is a whole run as the Run RPC drives it, without gRPC:
// Start, then Watch to the end, on the wall clock and the Memory store. The
// manager keeps its finished runs (up to 10,000) as it would in production.
func BenchmarkRunToEnd(b *testing.B) {
	for _, c := range runsToEnd() {
		b.Run(c.name, func(b *testing.B) {
			m, err := New(Config{Store: memstore.NewMemory(DefaultLease), Delegates: failFirst{n: c.fail}})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			ctx := b.Context()
			b.ReportAllocs()
			for b.Loop() {
				runToEnd(ctx, b, m, c.spec)
			}
		})
	}
}

// runToEndCase is a whole run of BenchmarkRunToEnd (and of the
// allocation budget's test): its control, and how many of its delegate's
// first calls fail.
type runToEndCase struct {
	name string
	fail int32
	spec *stubbornv1.ControlSpec
}

func runsToEnd() []runToEndCase {
	retries := int32(2)
	return []runToEndCase{
		{"fallback-one-attempt", 0, &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{
			FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}},
		}}},
		{"retry-three-attempts", 2, &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
			Target: "echo", Attempts: &retries, BaseWait: durationpb.New(0),
		}}}},
	}
}

// runToEnd starts a run of spec on m and watches it to its end, which
// must be SUCCEEDED.
func runToEnd(ctx context.Context, tb testing.TB, m *Manager, spec *stubbornv1.ControlSpec) {
	st, _, err := m.Start(ctx, Task{Brief: "find it"}, spec, nil)
	if err != nil {
		tb.Fatal(err)
	}
	var last Event
	if err := m.Watch(ctx, st.GetRunId(), 0, func(ev Event) error {
		last = ev
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
	// The status the event carries (RunEvent.status), read without
	// decoding the rest: a server sends the events as they are encoded,
	// and decoding the final state here would count allocations no run
	// makes (about 30 a run before stop 39).
	if s := eventStatus(last.Data); !last.Finished || s != stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED {
		tb.Fatalf("run ended %s (run_finished: %v)", s, last.Finished)
	}
}

// eventStatus reads the status field of an encoded RunEvent.
func eventStatus(b []byte) stubbornv1.RunStatus { return store.StatusField(b, eventStatusField) }

// eventStatusField is RunEvent.status's field number.
const eventStatusField = 5
