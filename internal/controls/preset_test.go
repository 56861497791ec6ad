package controls_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// presetMap is a controls.Presets over a map.
type presetMap map[string]*stubbornv1.ControlSpec

func (p presetMap) Preset(name string) (*stubbornv1.ControlSpec, bool) {
	s, ok := p[name]
	return s, ok
}

func retryOf(target string, attempts int32) *stubbornv1.ControlSpec {
	return &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{
		Target: target, Attempts: &attempts, BaseWait: durationpb.New(0),
		OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL,
	}}}
}

func TestPresetNestedInAFallbackChain(t *testing.T) {
	tests := []struct {
		name        string
		primary     []controlstest.Reply
		wantWinner  string
		wantResult  string
		wantCalls   map[string]int
		wantOutcome []stubbornv1.AttemptOutcome // of the chain's own two steps
	}{
		{
			name:        "the nested retry succeeds on its second try: the preset wins",
			primary:     []controlstest.Reply{controlstest.Fail(codes.Unavailable, "blip"), controlstest.OK("primary result")},
			wantWinner:  "search-with-retry",
			wantResult:  "primary result",
			wantCalls:   map[string]int{"search-primary": 2, "search-backup": 0},
			wantOutcome: []stubbornv1.AttemptOutcome{stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED},
		},
		{
			name:       "the nested retry gives up: the chain moves on to the backup",
			primary:    []controlstest.Reply{controlstest.Fail(codes.Unavailable, "down")},
			wantWinner: "search-backup",
			wantResult: "backup result",
			wantCalls:  map[string]int{"search-primary": 3, "search-backup": 1},
			wantOutcome: []stubbornv1.AttemptOutcome{
				stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_ERROR, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SUCCEEDED,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := controlstest.NewDelegates(map[string][]controlstest.Reply{
				"search-primary": tt.primary,
				"search-backup":  {controlstest.OK("backup result")},
			})
			d.SetInfo("search-primary", controls.DelegateInfo{Idempotent: true})
			events := &controlstest.Events{}
			env := controlstest.NewEnv(d, controlstest.NewClock(), events, "find")
			env.Presets = presetMap{"search-with-retry": retryOf("search-primary", 2)}

			out := controls.FallbackChain(context.Background(), env, "find", &stubbornv1.FallbackChainSpec{
				Chain: []string{"search-with-retry", "search-backup"},
			})
			require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, out.Status, out.Reason)
			assert.Equal(t, tt.wantWinner, out.Winner)
			assert.Equal(t, tt.wantResult, out.Result.GetText())
			for name, n := range tt.wantCalls {
				assert.Len(t, d.CallsTo(name), n, name)
			}

			st := env.Tracker.Snapshot()
			var top []stubbornv1.AttemptOutcome
			for _, a := range st.GetAttemptLog() {
				switch a.GetDelegate() {
				case "search-primary":
					assert.Equal(t, "chain[0]", a.GetPath(), "the nested retry's attempts carry their path")
				default:
					assert.Empty(t, a.GetPath())
					top = append(top, a.GetOutcome())
				}
			}
			assert.Equal(t, tt.wantOutcome, top)
			assert.EqualValues(t, len(tt.wantOutcome), st.GetAttempts(), "attempts counts the chain's own steps")
			for _, ev := range events.All() {
				if a := ev.GetAttemptStarted(); a != nil && a.GetAttempt().GetDelegate() == "search-primary" {
					assert.Equal(t, "chain[0]", ev.GetPath(), "events of the nested control carry its path")
				}
			}
			for _, f := range st.GetFailureHistory() {
				if f.GetDelegate() == "search-with-retry" {
					assert.Contains(t, f.GetReason(), `preset "search-with-retry" ended FAILED`)
				}
			}
		})
	}
}

func TestPresetsNestTwoDeep(t *testing.T) {
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {controlstest.OK("deep")}})
	events := &controlstest.Events{}
	env := controlstest.NewEnv(d, controlstest.NewClock(), events, "x")
	env.Presets = presetMap{
		"outer": {Kind: &stubbornv1.ControlSpec_Race{Race: &stubbornv1.RaceSpec{Candidates: []string{"inner"}}}},
		"inner": {Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"a"}}}},
	}
	out := controls.FallbackChain(context.Background(), env, "x", &stubbornv1.FallbackChainSpec{Chain: []string{"outer"}})
	require.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, out.Status)
	assert.Equal(t, "deep", out.Result.GetText())
	var paths []string
	for _, a := range env.Tracker.Snapshot().GetAttemptLog() {
		paths = append(paths, a.GetPath()+"|"+a.GetDelegate())
	}
	assert.Equal(t, []string{"|outer", "chain[0]|inner", "chain[0]/candidates[0]|a"}, paths)
}
