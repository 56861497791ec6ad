package delegates

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/stubbornhq/stubborn/controls"
	"github.com/stubbornhq/stubborn/controls/controlstest"
)

// Failures keeps the latest MaxRecentFailures failed calls of each
// delegate, newest first, on its clock; an answer, a call Stubborn refused,
// a cancelled call and a call whose run ended are not failures.
func TestFailuresKeepsTheLatest(t *testing.T) {
	clock := controlstest.NewClock()
	fakes := controlstest.NewDelegates(map[string][]controlstest.Reply{
		"down":    {controlstest.Fail(codes.Unavailable, "down")},
		"ok":      {controlstest.OK("fine")},
		"refused": {{Err: &controls.CallError{Code: codes.Unavailable, Message: "bulkhead", Refused: true}}},
		"cancel":  {controlstest.Fail(codes.Canceled, "cancelled")},
		"plain":   {{Err: fmt.Errorf("no status")}},
	})
	f := NewFailures(clock)
	d := f.Record(fakes, tenantOfTest)
	ctx := context.Background()
	for i := range MaxRecentFailures + 3 {
		_, err := d.Call(ctx, controls.Call{Delegate: "down", Attempt: int32(i + 1), RunID: fmt.Sprintf("run_%d", i)})
		require.Error(t, err)
		_ = clock.Sleep(ctx, time.Second)
	}
	for _, name := range []string{"ok", "refused", "cancel"} {
		_, _ = d.Call(ctx, controls.Call{Delegate: name, Attempt: 1})
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	_, _ = d.Call(ended, controls.Call{Delegate: "down", Attempt: 99})
	_, _ = d.Call(ctx, controls.Call{Delegate: "plain"})

	got := f.Recent("down", []string{""})
	require.Len(t, got, MaxRecentFailures)
	for i, r := range got {
		n := MaxRecentFailures + 2 - i // newest first: run_12 … run_3
		assert.Equal(t, fmt.Sprintf("run_%d", n), r.GetRunId(), "failure %d", i)
		assert.EqualValues(t, n+1, r.GetAttempt(), "failure %d", i)
		assert.EqualValues(t, codes.Unavailable, r.GetCode(), "failure %d", i)
		assert.Equal(t, "down", r.GetMessage(), "failure %d", i)
		assert.Equal(t, controlstest.NewClock().Now().Add(time.Duration(n)*time.Second), r.GetTime().AsTime(), "failure %d", i)
	}
	for _, name := range []string{"ok", "refused", "cancel", "nobody"} {
		assert.Empty(t, f.Recent(name, []string{""}), name)
	}
	plain := f.Recent("plain", []string{""})
	require.Len(t, plain, 1)
	assert.EqualValues(t, codes.Unknown, plain[0].GetCode())
	assert.Equal(t, "no status", plain[0].GetMessage())
}

type tenantKeyTest struct{}

func tenantOfTest(ctx context.Context) string {
	t, _ := ctx.Value(tenantKeyTest{}).(string)
	return t
}

// TestATenantSeesItsOwnRunsFailuresOnly: a failure is kept with its run's
// tenant, and Recent shows the tenants asked for only (another tenant's
// run ids and messages are not the caller's business).
func TestATenantSeesItsOwnRunsFailuresOnly(t *testing.T) {
	fakes := controlstest.NewDelegates(map[string][]controlstest.Reply{"gpt": {controlstest.Fail(codes.Unavailable, "secret of a")}})
	f := NewFailures(controlstest.NewClock())
	d := f.Record(fakes, tenantOfTest)
	for _, tenant := range []string{"a", "", "a"} {
		_, err := d.Call(context.WithValue(context.Background(), tenantKeyTest{}, tenant), controls.Call{Delegate: "gpt", RunID: "run_" + tenant})
		require.Error(t, err)
	}
	assert.Len(t, f.Recent("gpt", []string{"a"}), 2)
	assert.Empty(t, f.Recent("gpt", []string{"b"}))
	assert.Len(t, f.Recent("gpt", []string{"b", ""}), 1, "a tenant with the default tenant's runs sees those")
	assert.Len(t, f.Recent("gpt", []string{"a", ""}), 3)
}
