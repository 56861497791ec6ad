package jsstore

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// TestTheIndexEndsWithTheRunsEnd (issue 29, finding 5): a server that
// lost a run writes a summary it had queued (RUNNING) after the server
// that took the run over wrote its end (SUCCEEDED); the index keeps the
// end. Of two non-final summaries the later update stays. Before, the
// last write won, and the listing said RUNNING for good.
func TestTheIndexEndsWithTheRunsEnd(t *testing.T) {
	e, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := NewJetStream(ctx, e.Conn, JetStreamConfig{Memory: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	now := time.Now()
	sum := func(status stubbornv1.RunStatus, at time.Time) *stubbornv1.RunSummary {
		return &stubbornv1.RunSummary{RunId: "run_x", Status: status, UpdateTime: timestamppb.New(at)}
	}
	indexed := func() stubbornv1.RunStatus {
		e, err := s.index.kv.Get(ctx, indexKey("", "run_x"))
		require.NoError(t, err)
		got, ok := parseIndexEntry(e.Value(), "")
		require.True(t, ok)
		return got.GetStatus()
	}
	write := func(sum *stubbornv1.RunSummary) {
		_, err := s.index.write(ctx, "", sum)
		require.NoError(t, err)
	}
	write(sum(stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF, now))
	write(sum(stubbornv1.RunStatus_RUN_STATUS_RUNNING, now.Add(-time.Second)))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF, indexed(), "an older update does not replace a newer one")
	write(sum(stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, now.Add(time.Second)))
	write(sum(stubbornv1.RunStatus_RUN_STATUS_RUNNING, now.Add(time.Hour)))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, indexed(), "nothing replaces the run's end")
}
