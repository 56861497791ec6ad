package notify_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/notify"
	"github.com/stubbornhq/stubborn/internal/runs"
)

// spendRuns is one run that waits for a raised spend limit.
type spendRuns struct {
	mu      sync.Mutex
	decided []*stubbornv1.SpendLimit
	tenant  string
}

func (r *spendRuns) Get(ctx context.Context, id string) (*stubbornv1.ControlState, error) {
	if runs.TenantFrom(ctx) != r.tenant {
		return nil, runs.ErrNotFound
	}
	return &stubbornv1.ControlState{
		RunId: id, Tenant: r.tenant, Status: stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION,
		Options: &stubbornv1.RunOptions{SpendLimit: &stubbornv1.SpendLimit{MaxCost: 0.5, MaxTotalTokens: 900}},
		Cost:    &stubbornv1.RunCost{Total: 0.49},
	}, nil
}

func (r *spendRuns) Decide(ctx context.Context, id string, d stubbornv1.Decision, limit *stubbornv1.SpendLimit) (*stubbornv1.ControlState, error) {
	if runs.TenantFrom(ctx) != r.tenant {
		return nil, runs.ErrNotFound
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.decided = append(r.decided, limit)
	return &stubbornv1.ControlState{RunId: id, Status: stubbornv1.RunStatus_RUN_STATUS_RUNNING}, nil
}

// linkOf starts a notifier over fake whose journal is events, has it
// notify ev (run r's request, of tenant "team") to a receiver, and returns
// the notice and its retry link on a test server of the notifier's handler.
func linkOf(t *testing.T, fake notify.Runs, ev *stubbornv1.RunEvent, events func(context.Context, string, int64) ([]*stubbornv1.RunEvent, error)) (notify.Notice, string) {
	t.Helper()
	rc := newReceiver(t)
	n, err := notify.New(notify.Config{
		PublicURL: "https://stubborn.example.com", Queue: notify.NewMemory(),
		Targets: func(string, []string) []delegates.NotifyTarget { return []delegates.NotifyTarget{target(rc.URL, "")} },
		Secret:  func(string, string) (string, bool) { return secret, true },
		Events:  events,
		Poll:    5 * time.Millisecond,
	})
	require.NoError(t, err)
	n.Start(fake)
	t.Cleanup(n.Close)
	_, observe := n.Observer(nil).ObserveRun(context.Background(), context.Background(), &stubbornv1.ControlState{RunId: ev.GetRunId(), Tenant: "team"}, false)
	observe(ev)
	id := fmt.Sprintf("%s.%d", ev.GetRunId(), ev.GetSeq())
	eventually(t, 5*time.Second, func() bool { return rc.delivered()[id] == 1 }, "the notice arrives")
	rc.mu.Lock()
	var notice notify.Notice
	require.NoError(t, json.Unmarshal(rc.bodies[id], &notice))
	rc.mu.Unlock()
	srv := httptest.NewServer(n.Handler())
	t.Cleanup(srv.Close)
	return notice, srv.URL + strings.TrimPrefix(notice.Decision.RetryURL, "https://stubborn.example.com")
}

// TestSpendLimitedRetryAsksForANewLimit: the retry page of a run waiting
// for a raised spend limit has a max_cost field (twice the limit), and its
// POST passes the new limit, which must be above the old one.
func TestSpendLimitedRetryAsksForANewLimit(t *testing.T) {
	fake := &spendRuns{tenant: "team"}
	ev := &stubbornv1.RunEvent{RunId: "r9", Seq: 4, Time: timestamppb.Now(), Kind: &stubbornv1.RunEvent_DecisionRequested{DecisionRequested: &stubbornv1.DecisionRequested{
		Reason: "spend limit reached", ReasonCode: stubbornv1.StatusReason_STATUS_REASON_SPEND_LIMIT_REACHED,
	}}}
	notice, link := linkOf(t, fake, ev, func(_ context.Context, id string, after int64) ([]*stubbornv1.RunEvent, error) {
		if after < 4 {
			return []*stubbornv1.RunEvent{ev}, nil
		}
		return nil, nil
	})
	assert.Equal(t, "STATUS_REASON_SPEND_LIMIT_REACHED", notice.ReasonCode)
	require.NotNil(t, notice.Cost)
	assert.InDelta(t, 0.49, notice.Cost.Total, 1e-9, "the cost is the run's state's")

	resp, err := http.Get(link)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, string(body), `name="max_cost" value="1"`, "twice the limit by default")

	for _, bad := range []struct{ v, want string }{
		{"0.4", "must be above the limit the run reached (0.5)"},
		{"NaN", "must be a positive number"},
		{"", "give the new spend limit"},
		{strings.Repeat("9", 40), "at most 32 characters"},
	} {
		resp, err := http.PostForm(link, url.Values{"max_cost": {bad.v}})
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, bad.v)
		assert.Contains(t, string(body), bad.want, bad.v)
	}
	fake.mu.Lock()
	assert.Empty(t, fake.decided, "a refused form decides nothing")
	fake.mu.Unlock()

	resp, err = http.PostForm(link, url.Values{"max_cost": {"2.5"}})
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	fake.mu.Lock()
	require.Len(t, fake.decided, 1)
	assert.InDelta(t, 2.5, fake.decided[0].GetMaxCost(), 0)
	assert.Equal(t, int64(900), fake.decided[0].GetMaxTotalTokens(), "the limit's other fields stay")
	fake.mu.Unlock()

	// The link was used: a second POST decides nothing.
	resp, err = http.PostForm(link, url.Values{"max_cost": {"3"}})
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusConflict, resp.StatusCode)
	fake.mu.Lock()
	assert.Len(t, fake.decided, 1)
	fake.mu.Unlock()

	// Only GET, HEAD and POST.
	req, _ := http.NewRequest(http.MethodDelete, link, nil)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
}

// TestALinkClickedBeforeItsRequestIsWrittenWaitsForIt: a run hands its
// request for a decision to the notifier as it records it, a moment before
// its journal has it; a link clicked meanwhile (the notice was quick) shows
// the request once the journal has it, not "no such request".
func TestALinkClickedBeforeItsRequestIsWrittenWaitsForIt(t *testing.T) {
	ev := &stubbornv1.RunEvent{RunId: "r7", Seq: 3, Time: timestamppb.Now(), Kind: &stubbornv1.RunEvent_DecisionRequested{DecisionRequested: &stubbornv1.DecisionRequested{
		Reason: "retries exhausted", ReasonCode: stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED,
	}}}
	var (
		mu            sync.Mutex
		before, reads int
	)
	_, link := linkOf(t, &spendRuns{tenant: "team"}, ev, func(_ context.Context, id string, after int64) ([]*stubbornv1.RunEvent, error) {
		mu.Lock()
		defer mu.Unlock()
		if before < 3 {
			before++
			return nil, nil // the journal has not the request yet: its first three reads
		}
		reads++
		if after < 3 {
			return []*stubbornv1.RunEvent{ev}, nil
		}
		return nil, nil
	})
	resp, err := http.Get(link)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	assert.Contains(t, string(body), "retries exhausted")
	mu.Lock()
	assert.Positive(t, reads, "the page was made from the journal once it had the request")
	mu.Unlock()
}
