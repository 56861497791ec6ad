package controls_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// TestNeverAskFailsEveryRetryInsteadOfAsking: with Env.NeverAsk
// (RunOptions.never_ask, the front door's runs) a retry whose retries run
// out fails instead of asking a person: the run's own, and a nested
// preset's, whose chain then moves on.
func TestNeverAskFailsEveryRetryInsteadOfAsking(t *testing.T) {
	t.Parallel()
	asks := &stubbornv1.RetrySpec{Target: "d", Attempts: proto.Int32(0), OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_ASK}
	script := func() map[string][]controlstest.Reply {
		return map[string][]controlstest.Reply{"d": {unavailable("down")}, "good": {ok("fine")}}
	}

	f := newFixture(script())
	f.env.NeverAsk = true
	f.env.Presets = controls.PresetMap(map[string]*stubbornv1.ControlSpec{"asks": {Kind: &stubbornv1.ControlSpec_Retry{Retry: asks}}})
	r := f.run(t, testCtx(t), chain("asks", "good"))
	require.Equal(t, succeeded, r.out.Status, r.out.Reason)
	assert.Equal(t, "fine", r.out.Result.GetText())
	assert.NotContains(t, f.events.Kinds(), "decision_requested")

	own := newFixture(script())
	own.env.NeverAsk = true
	r = own.run(t, testCtx(t), &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: asks}})
	assert.Equal(t, failed, r.out.Status, r.out.Reason)
	assert.NotContains(t, own.events.Kinds(), "decision_requested")
}
