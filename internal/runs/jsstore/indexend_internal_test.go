package jsstore

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
)

// TestAnEndWrittenByAFailedWriteIsListed: a run's last write lands but its
// answer is lost, so its server loses the run, and no owners entry keeps
// it for a takeover (it was claimed in its journal): the server that looks
// at it again finds it finished, and the listing index learns its end
// (before, it listed the run RUNNING for good: make chaos, link-latency).
func TestAnEndWrittenByAFailedWriteIsListed(t *testing.T) {
	s, pubs, _ := openFaulty(t, -1) // no second try: the run is lost here
	pubs.plan = []fault{pass, unanswered}
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"d": {controlstest.OK("fine")}})
	m, err := runs.New(runs.Config{Store: s, Delegates: d, Owner: "me", Lease: 300 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(m.Close)
	attempts := int32(1)
	spec := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{Target: "d", Attempts: &attempts}}}
	st, err := runstest.Start(m, context.Background(), "brief", spec, nil)
	require.NoError(t, err)
	id := st.GetRunId()
	listed := func() stubbornv1.RunStatus {
		status := stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED
		_, err := s.Summaries(context.Background(), "", func(sum *stubbornv1.RunSummary) bool {
			if sum.GetRunId() == id {
				status = sum.GetStatus()
			}
			return true
		})
		require.NoError(t, err)
		return status
	}
	require.Eventually(t, func() bool { return pubs.count() >= 2 }, 10*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return listed() == stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED }, 10*time.Second, 10*time.Millisecond,
		"the index lists the end the journal has")
}
