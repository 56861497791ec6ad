package delegates

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// Failures keeps the latest maxRecentFailures failed calls of each
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
	for i := range maxRecentFailures + 3 {
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
	require.Len(t, got, maxRecentFailures)
	for i, r := range got {
		n := maxRecentFailures + 2 - i // newest first: run_12 … run_3
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

// Last says what a delegate's latest call did: none yet; failing since the
// first failure after its latest success (with the latest failure's time
// and code); ok once a call succeeds. A refused or cancelled call, or one
// whose run ended, changes nothing. Over two tenants, the latest call of
// either counts, and a success of one ends the other's failing streak.
func TestLastCallSaysSinceWhenItFails(t *testing.T) {
	clock := controlstest.NewClock()
	t0 := clock.Now()
	fakes := controlstest.NewDelegates(map[string][]controlstest.Reply{
		"gpt": {
			controlstest.Fail(codes.Unavailable, "down"), controlstest.Fail(codes.Internal, "worse"), controlstest.OK("fine"),
			{Err: &controls.CallError{Code: codes.Unavailable, Message: "breaker", Refused: true}},
			controlstest.Fail(codes.Canceled, "cancelled"),
			controlstest.Fail(codes.Unavailable, "down again"),
		},
	})
	f := NewFailures(clock)
	d := f.Record(fakes, tenantOfTest)
	ctx := context.Background()
	call := func(ctx context.Context) {
		_, _ = d.Call(ctx, controls.Call{Delegate: "gpt"})
		_ = clock.Sleep(context.Background(), time.Second)
	}
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

	assert.Equal(t, LastCall{}, f.Last("gpt", []string{""}), "no call yet")
	call(ctx) // at 0: down
	call(ctx) // at 1: worse
	assert.Equal(t, LastCall{At: at(1), Code: codes.Internal, FailingSince: at(0)}, f.Last("gpt", []string{""}))
	call(ctx) // at 2: fine
	assert.Equal(t, LastCall{At: at(2), Code: codes.OK}, f.Last("gpt", []string{""}))
	call(ctx) // at 3: refused
	call(ctx) // at 4: cancelled
	ended, cancel := context.WithCancel(ctx)
	cancel()
	call(ended) // at 5: its run ended
	assert.Equal(t, LastCall{At: at(2), Code: codes.OK}, f.Last("gpt", []string{""}), "neither refused, cancelled nor ended calls count")
	call(ctx) // at 6: down again
	assert.Equal(t, LastCall{At: at(6), Code: codes.Unavailable, FailingSince: at(6)}, f.Last("gpt", []string{""}))
	assert.Equal(t, LastCall{}, f.Last("gpt", []string{"b"}), "another tenant's calls are not b's")
	assert.Equal(t, LastCall{}, f.Last("nobody", []string{""}))

	// Tenant a fails from 10 on; the default tenant succeeds at 12; a
	// fails again at 13: for both together, failing since 12.
	fakes2 := controlstest.NewDelegates(map[string][]controlstest.Reply{"m": {
		controlstest.Fail(codes.Unavailable, "a1"), controlstest.Fail(codes.Unavailable, "a2"), controlstest.OK("ok"), controlstest.Fail(codes.Unavailable, "a3"),
	}})
	f2 := NewFailures(clock)
	d2 := f2.Record(fakes2, tenantOfTest)
	_ = clock.Sleep(ctx, at(10).Sub(clock.Now()))
	a := context.WithValue(ctx, tenantKeyTest{}, "a")
	for _, c := range []context.Context{a, a, ctx, a} {
		_, _ = d2.Call(c, controls.Call{Delegate: "m"})
		_ = clock.Sleep(ctx, time.Second)
	}
	assert.Equal(t, LastCall{At: at(13), Code: codes.Unavailable, FailingSince: at(10)}, f2.Last("m", []string{"a"}))
	assert.Equal(t, LastCall{At: at(13), Code: codes.Unavailable, FailingSince: at(12)}, f2.Last("m", []string{"a", ""}))
	assert.Equal(t, LastCall{At: at(12), Code: codes.OK}, f2.Last("m", []string{""}))
}

// The latest calls are kept for at most maxCallTenants tenants a
// delegate: past that, the tenant whose call is oldest is forgotten.
func TestLastCallIsBounded(t *testing.T) {
	clock := controlstest.NewClock()
	fakes := controlstest.NewDelegates(map[string][]controlstest.Reply{"m": {controlstest.OK("ok")}})
	f := NewFailures(clock)
	d := f.Record(fakes, tenantOfTest)
	for i := range maxCallTenants + 5 {
		_, err := d.Call(context.WithValue(context.Background(), tenantKeyTest{}, fmt.Sprint("t", i)), controls.Call{Delegate: "m"})
		require.NoError(t, err)
		_ = clock.Sleep(context.Background(), time.Second)
	}
	f.mu.Lock()
	n := len(f.calls["m"])
	f.mu.Unlock()
	assert.Equal(t, maxCallTenants, n)
	for i := range 5 {
		assert.True(t, f.Last("m", []string{fmt.Sprint("t", i)}).At.IsZero(), "t%d, the oldest, is forgotten", i)
	}
	assert.False(t, f.Last("m", []string{fmt.Sprint("t", maxCallTenants+4)}).At.IsZero())
}
