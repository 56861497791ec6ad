package runs

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/runs/jsstore"
)

// BenchmarkListSummaries lists the first page (50) of one tenant's run
// summaries on embedded JetStream holding n finished runs of that tenant
// and n of another, each with a 4 KiB brief: from the listing index, and
// from the runs' states as before it (every run's state read, decoded,
// and the other tenant's dropped).
//
//	go test -run '^$' -bench ListSummaries -benchtime 20x ./runs
func BenchmarkListSummaries(b *testing.B) {
	for _, n := range []int{1000, 10_000} {
		b.Run(fmt.Sprintf("runs=2x%d", n), func(b *testing.B) {
			e, err := jsstore.StartEmbedded(jsstore.EmbeddedConfig{DataDir: b.TempDir()})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			nc, err := nats.Connect("", nats.InProcessServer(e.Server))
			if err != nil {
				b.Fatal(err)
			}
			store, err := jsstore.NewJetStream(b.Context(), nc, jsstore.JetStreamConfig{PurgeEvery: -1})
			if err != nil {
				b.Fatal(err)
			}
			defer store.Close()
			m, err := New(Config{Store: store})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			brief := string(make([]byte, 4<<10))
			created := time.Now()
			for i := range 2 * n {
				tenant := []string{"a", "b"}[i%2]
				st := &stubbornv1.ControlState{
					RunId: fmt.Sprintf("run_%d", i), Tenant: tenant, Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED,
					TaskBrief: brief, CreateTime: timestamppb.New(created.Add(time.Duration(i))),
					Control: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}}},
				}
				data, err := proto.Marshal(st)
				if err != nil {
					b.Fatal(err)
				}
				if err := store.PutState(b.Context(), st.GetRunId(), data); err != nil {
					b.Fatal(err)
				}
			}
			ctx := WithTenant(b.Context(), "a")
			for !indexed(store, n) {
				time.Sleep(10 * time.Millisecond)
			}
			for _, from := range []string{"index", "states"} {
				b.Run("from="+from, func(b *testing.B) {
					for b.Loop() {
						var page []*stubbornv1.RunSummary
						if from == "index" {
							page, _, err = m.ListSummaries(ctx, Filter{}, 50, "")
						} else {
							page, _, err = m.summariesOfStates(ctx, Filter{}, 50, "")
						}
						if err != nil || len(page) != 50 {
							b.Fatalf("%d runs, %v", len(page), err)
						}
					}
				})
			}
		})
	}
}

// indexed reports whether store's index has tenant a's n summaries.
func indexed(store *jsstore.JetStream, n int) bool {
	got := 0
	ok, err := store.Summaries(context.Background(), "a", func(*stubbornv1.RunSummary) bool { got++; return true })
	return ok && err == nil && got == n
}
