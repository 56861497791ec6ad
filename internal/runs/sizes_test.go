package runs_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
)

// TestLargeRunsEndOnEveryStore: runs whose events or state are larger than
// a JetStream message (1 MiB on a NATS server's defaults) end, with their
// whole journal and a state a client can read. Before, a journal write
// failed with "maximum payload exceeded", and the run stayed RUNNING for
// good, its watchers waiting: a 1.5 MB answer; a retry of 20 attempts over
// a 64 KiB brief (each attempt's brief in the final state); a judge's
// 300 KB reason in every failure.
func TestLargeRunsEndOnEveryStore(t *testing.T) {
	brief := strings.Repeat("b", 64<<10)
	cases := []struct {
		name    string
		replies []controlstest.Reply
		spec    *stubbornv1.ControlSpec
		want    stubbornv1.RunStatus
	}{
		{"a 1.5 MB answer", []controlstest.Reply{controlstest.OK(strings.Repeat("r", 1500<<10))}, runstest.RetrySpec(0), stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED},
		{"20 attempts over a 64 KiB brief", []controlstest.Reply{controlstest.Fail(codes.Unavailable, "busy")}, runstest.RetrySpec(19), stubbornv1.RunStatus_RUN_STATUS_FAILED},
		{"300 KB error messages", []controlstest.Reply{controlstest.Fail(codes.Unavailable, strings.Repeat("e", 300<<10))}, runstest.RetrySpec(4), stubbornv1.RunStatus_RUN_STATUS_FAILED},
	}
	for name, open := range stores {
		for _, c := range cases {
			t.Run(name+"/"+c.name, func(t *testing.T) {
				store := open(t, time.Second)()
				d := controlstest.NewDelegates(map[string][]controlstest.Reply{"d": c.replies})
				m := runstest.NewManager(t, d, runs.Config{Store: store, Lease: time.Second})
				st, err := runstest.Start(m, runstest.Ctx(t), brief, c.spec, nil)
				require.NoError(t, err)
				evs := runstest.WatchAll(t, m, st.GetRunId(), 0)
				fin := runstest.Final(t, evs)
				assert.Equal(t, c.want, fin.GetStatus(), fin.GetStatusReason())
				for i, ev := range evs {
					assert.EqualValues(t, i+1, ev.GetSeq(), "dense")
					assert.LessOrEqual(t, proto.Size(ev), runs.MaxEventBytes, "event %d", i+1)
				}
				got, err := m.Get(runstest.Ctx(t), st.GetRunId())
				require.NoError(t, err)
				assert.Equal(t, c.want, got.GetStatus())
				assert.LessOrEqual(t, proto.Size(got)-proto.Size(got.GetResult()), controls.MaxStateBytes, "GetRun fits a client's 4 MiB")
				assert.Less(t, proto.Size(got), 4<<20, "GetRun fits a client's 4 MiB")
				assert.True(t, got.GetTaskBrief() == brief, "the run's own brief is not cut")
				stored, err := store.State(runstest.Ctx(t), st.GetRunId())
				require.NoError(t, err)
				assert.Equal(t, c.want, stored.GetStatus(), "the store has the end")
				recorded, err := store.Events(runstest.Ctx(t), st.GetRunId(), 0)
				require.NoError(t, err)
				assert.Len(t, recorded, len(evs), "the whole journal is in the store")
			})
		}
	}
}

// TestAListPageFitsAClient: ListRuns of runs with 64 KiB briefs ends its
// page before gRPC's default 4 MiB, with a token for the rest; every run
// is listed once over the pages. Before, a page of 100 such runs was
// 6.5 MB, and clients with default limits failed RESOURCE_EXHAUSTED.
func TestAListPageFitsAClient(t *testing.T) {
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"d": {controlstest.OK("fine")}})
	m := runstest.NewManager(t, d, runs.Config{})
	brief := strings.Repeat("b", 64<<10)
	for range 100 {
		st, err := runstest.Start(m, runstest.Ctx(t), brief, runstest.RetrySpec(0), nil)
		require.NoError(t, err)
		runstest.Final(t, runstest.WatchAll(t, m, st.GetRunId(), 0))
	}
	seen := map[string]bool{}
	token, pages := "", 0
	for {
		page, next, err := m.List(runstest.Ctx(t), stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED, 1000, token)
		require.NoError(t, err)
		pages++
		resp := &stubbornv1.ListRunsResponse{Runs: page, NextPageToken: next}
		assert.Less(t, proto.Size(resp), 4<<20, "page %d", pages)
		for _, st := range page {
			assert.False(t, seen[st.GetRunId()], "listed once")
			seen[st.GetRunId()] = true
		}
		if next == "" {
			break
		}
		token = next
	}
	assert.Len(t, seen, 100)
	assert.Greater(t, pages, 1)
}
