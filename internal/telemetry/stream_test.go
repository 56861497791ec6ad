package telemetry_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
	"github.com/stubbornhq/stubborn/internal/telemetry"
)

// TestAStreamedAttemptRecordsItsTimeToFirstOutput: the attempt span of a
// delegate that streams says its time to first output and its chunks,
// and stubborn.attempt.first_output counts it by delegate.
func TestAStreamedAttemptRecordsItsTimeToFirstOutput(t *testing.T) {
	p := newProviders()
	reg := &delegates.Config{Delegates: []delegates.Delegate{
		{Name: "storyteller", Target: serveDelegate(t, &demo.Storyteller{Story: "one two three four", Pace: time.Millisecond}), Idempotent: true},
		{Name: "echo", Target: serveDelegate(t, demo.Echo{}), Idempotent: true},
	}}
	s := startStubborn(t, reg, p.config(slog.New(slog.DiscardHandler)))
	evs := runToEnd(t, testCtx(t), s.client, &stubbornv1.RunRequest{
		TaskBrief:     "tell",
		FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"storyteller"}},
	})
	require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, evs[len(evs)-1].GetRunFinished().GetState().GetStatus())
	runToEnd(t, testCtx(t), s.client, &stubbornv1.RunRequest{
		TaskBrief:     "echo",
		FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}},
	})
	s.stop()

	attempts := spansNamed(p.spans.Ended(), "stubborn.attempt storyteller")
	require.Len(t, attempts, 1)
	chunks, ok := attr(attempts[0], "stubborn.attempt.output_chunks")
	require.True(t, ok, "the attempt span counts its chunks")
	assert.EqualValues(t, 4, chunks.AsInt64())
	first, ok := attr(attempts[0], "stubborn.attempt.first_output_s")
	require.True(t, ok)
	assert.Positive(t, first.AsFloat64())
	echo := spansNamed(p.spans.Ended(), "stubborn.attempt echo")
	require.Len(t, echo, 1)
	_, ok = attr(echo[0], "stubborn.attempt.output_chunks")
	assert.False(t, ok, "an answer that did not stream has no chunks")

	ms := p.metrics(t)
	assert.EqualValues(t, 1, count(t, ms, "stubborn.attempt.first_output", telemetry.DelegateKey.String("storyteller")))
	assert.EqualValues(t, 0, count(t, ms, "stubborn.attempt.first_output", telemetry.DelegateKey.String("echo")))
}
