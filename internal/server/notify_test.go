package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/notify"
	"github.com/stubbornhq/stubborn/internal/runs/jsstore"
	"github.com/stubbornhq/stubborn/internal/server"
)

const hookSecret = "whsec-test"

// hookReceiver is a webhook receiver on 127.0.0.1 that checks each
// notice's signature and hands it to the test.
type hookReceiver struct {
	*httptest.Server
	notices chan notify.Notice
	bad     atomic.Int32 // notices whose signature did not verify
}

func newHookReceiver(t *testing.T) *hookReceiver {
	h := &hookReceiver{notices: make(chan notify.Notice, 64)}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := notify.Verify(r.Header.Get(notify.HeaderSignature), hookSecret, body, time.Now(), 5*time.Minute); err != nil {
			h.bad.Add(1)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var n notify.Notice
		if err := json.Unmarshal(body, &n); err != nil || n.ID != r.Header.Get(notify.HeaderNoticeID) {
			h.bad.Add(1)
			http.Error(w, "bad notice", http.StatusBadRequest)
			return
		}
		h.notices <- n
	}))
	t.Cleanup(h.Close)
	return h
}

// notifyEnv is a server whose config notifies url, its HTTP listener (the
// public URL) and the notifier's clock, which the test may move on.
type notifyEnv struct {
	*env
	http *httptest.Server
	skew atomic.Int64 // added to the notifier's clock
}

func startNotifying(t *testing.T, hookURL string, su setup) *notifyEnv {
	t.Helper()
	ne := &notifyEnv{}
	var handler atomic.Value
	ne.http = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handler.Load().(http.Handler).ServeHTTP(w, r)
	}))
	prev := su.configure
	su.configure = func(cfg *delegates.Config) {
		if prev != nil {
			prev(cfg)
		}
		if hookURL != "" {
			cfg.Notify = []delegates.NotifyTarget{(delegates.NotifyTarget{URL: hookURL, SecretEnv: "HOOK_SECRET"}).WithSecret(hookSecret)}
		}
	}
	su.notify.PublicURL = "http://" + ne.http.Listener.Addr().String()
	su.notify.Tune = func(c *notify.Config) {
		c.Now = func() time.Time { return time.Now().Add(time.Duration(ne.skew.Load())) }
		c.Poll, c.BaseWait, c.MaxWait = 10*time.Millisecond, 10*time.Millisecond, 100*time.Millisecond
		c.PostTimeout = 2 * time.Second
	}
	ne.env = startWith(t, su)
	h, err := ne.st.HTTPHandler()
	require.NoError(t, err)
	handler.Store(h)
	ne.http.Start()
	t.Cleanup(ne.http.Close)
	return ne
}

// jetStreamNotices is a JetStream store and the notices' queue on it.
func jetStreamNotices(t *testing.T) (*jsstore.JetStream, notify.Queue) {
	t.Helper()
	ns, err := jsstore.StartEmbedded(jsstore.EmbeddedConfig{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(ns.Close)
	nc, err := nats.Connect("", nats.InProcessServer(ns.Server))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	st, err := jsstore.NewJetStream(testCtx(t), nc, jsstore.JetStreamConfig{})
	require.NoError(t, err)
	q, err := notify.OpenKV(testCtx(t), nc, 1, nil)
	require.NoError(t, err)
	t.Cleanup(func() { q.Close(); _ = st.Close() })
	return st, q
}

// askRun starts a run on the delegate that is always down, which awaits
// a decision after its one try.
func askRun(t *testing.T, e *env) string {
	t.Helper()
	res, err := e.client.StartRun(testCtx(t), &stubbornv1.StartRunRequest{
		TaskBrief: "do it", Retry: &stubbornv1.RetrySpec{Target: "down", Attempts: ptr(int32(0))},
	})
	require.NoError(t, err)
	return res.GetRunId()
}

func awaitNotice(t *testing.T, h *hookReceiver, within time.Duration) notify.Notice {
	t.Helper()
	select {
	case n := <-h.notices:
		return n
	case <-time.After(within):
		t.Fatalf("no notice within %v", within)
		return notify.Notice{}
	}
}

func get(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func post(t *testing.T, u string, form url.Values) (int, string) {
	t.Helper()
	resp, err := http.PostForm(u, form)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestNotifyAwaitingDecisionAndDecideByLink(t *testing.T) {
	for _, storeName := range []string{"memory", "jetstream"} {
		t.Run(storeName, func(t *testing.T) {
			hook := newHookReceiver(t)
			su := setup{}
			if storeName == "jetstream" {
				su.store, su.notify.Queue = jetStreamNotices(t)
			}
			e := startNotifying(t, hook.URL, su)
			ctx := testCtx(t)
			id := askRun(t, e.env)

			// The signed notice arrives within a second of the request.
			n := awaitNotice(t, hook, time.Second)
			assert.Zero(t, hook.bad.Load(), "every notice's signature verifies")
			assert.Equal(t, "awaiting_decision", n.Type)
			assert.Equal(t, id, n.RunID)
			assert.True(t, strings.HasPrefix(n.ID, id+"."), n.ID)
			assert.Equal(t, "RUN_STATUS_AWAITING_DECISION", n.Status)
			assert.Equal(t, "STATUS_REASON_RETRIES_EXHAUSTED", n.ReasonCode)
			require.NotNil(t, n.LastFailure)
			assert.Equal(t, "down", n.LastFailure.Delegate)
			assert.Equal(t, e.http.URL+"/#/runs/"+id, n.ConsoleURL)
			require.NotNil(t, n.Decision)
			assert.True(t, n.Decision.ExpiresAt.After(time.Now().Add(6*24*time.Hour)), "a link lives 7 days without a deadline")

			// GET shows the page and changes nothing.
			code, body := get(t, n.Decision.RetryURL)
			assert.Equal(t, http.StatusOK, code)
			assert.Contains(t, body, "retry")
			assert.Contains(t, body, "<form method=\"post\">")
			code, _ = get(t, n.Decision.FailURL)
			assert.Equal(t, http.StatusOK, code)
			got, err := e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
			require.NoError(t, err)
			assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION, got.GetState().GetStatus(), "a GET decides nothing")

			// A forged or cut token is refused.
			code, body = get(t, n.Decision.RetryURL[:len(n.Decision.RetryURL)-3]+"AAA")
			assert.Equal(t, http.StatusForbidden, code)
			assert.Contains(t, body, "not valid")
			code, _ = post(t, e.http.URL+notify.DecidePath+strings.Repeat("a", 2000), nil)
			assert.Equal(t, http.StatusForbidden, code)

			// POST decides: the run goes on (and, down again, asks again).
			code, body = post(t, n.Decision.RetryURL, nil)
			require.Equal(t, http.StatusOK, code, body)
			assert.Contains(t, body, "RETRY")
			next := awaitNotice(t, hook, 5*time.Second)
			assert.NotEqual(t, n.ID, next.ID, "a new request is a new notice")

			// The link works once; the notice's other link is spent too.
			code, body = post(t, n.Decision.RetryURL, nil)
			assert.Equal(t, http.StatusConflict, code)
			assert.Contains(t, body, "already decided: RETRY at")
			code, _ = get(t, n.Decision.FailURL)
			assert.Equal(t, http.StatusConflict, code)

			// The new request's fail link fails the run.
			code, body = post(t, next.Decision.FailURL, nil)
			require.Equal(t, http.StatusOK, code, body)
			w, err := e.client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: id})
			require.NoError(t, err)
			var decisions []stubbornv1.Decision
			for {
				m, err := w.Recv()
				if err == io.EOF {
					break
				}
				require.NoError(t, err)
				if d := m.GetEvent().GetDecisionReceived(); d != nil {
					decisions = append(decisions, d.GetDecision())
				}
				if f := m.GetEvent().GetRunFinished(); f != nil {
					assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, f.GetState().GetStatus())
				}
			}
			assert.Equal(t, []stubbornv1.Decision{stubbornv1.Decision_DECISION_RETRY, stubbornv1.Decision_DECISION_FAIL}, decisions,
				"decisions by link are journaled as every decision")
		})
	}
}

func TestNotifyLinkExpires(t *testing.T) {
	hook := newHookReceiver(t)
	e := startNotifying(t, hook.URL, setup{})
	askRun(t, e.env)
	n := awaitNotice(t, hook, time.Second)
	e.skew.Store(int64(8 * 24 * time.Hour))
	code, body := get(t, n.Decision.RetryURL)
	assert.Equal(t, http.StatusGone, code)
	assert.Contains(t, body, "expired")
	code, _ = post(t, n.Decision.RetryURL, nil)
	assert.Equal(t, http.StatusGone, code)
}

func TestNotifyTargetsNeedAPublicURL(t *testing.T) {
	cfg := &delegates.Config{Notify: []delegates.NotifyTarget{(delegates.NotifyTarget{URL: "https://h.example/x", SecretEnv: "X"}).WithSecret("s")}}
	_, err := server.New(server.Config{Registry: cfg})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "-public-url")

	// Nor may a reload add them to a server without one.
	e := start(t, delegates.Limits{})
	next := *e.cfg
	next.Notify = cfg.Notify
	err = e.st.Reload(&next)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "-public-url")
}

// TestNotifyNeverDelaysTheRun measures how long a run takes from its start
// to its decision_requested, with no notify target and with a receiver
// that never answers: the notices are handed off, not posted on the run's
// path.
func TestNotifyNeverDelaysTheRun(t *testing.T) {
	const runsEach = 40
	once := func(e *env) time.Duration {
		ctx := testCtx(t)
		t0 := time.Now()
		id := askRun(t, e)
		w, err := e.client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: id})
		require.NoError(t, err)
		for {
			m, err := w.Recv()
			require.NoError(t, err)
			if m.GetEvent().GetDecisionRequested() != nil {
				return time.Since(t0)
			}
		}
	}
	stuck := make(chan struct{})
	var posts atomic.Int32
	var closeOnce sync.Once
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		<-stuck
	}))
	t.Cleanup(hang.Close)
	t.Cleanup(func() { closeOnce.Do(func() { close(stuck) }) })

	// No notifier at all (no -public-url), and one posting to a receiver
	// that never answers; their runs interleaved, so that both see the
	// same machine.
	plain, hung := start(t, delegates.Limits{}), startNotifying(t, hang.URL, setup{}).env
	var none, hanging []time.Duration
	for range runsEach {
		none = append(none, once(plain))
		hanging = append(hanging, once(hung))
	}
	for _, d := range [][]time.Duration{none, hanging} {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	}
	p50 := func(d []time.Duration) time.Duration { return d[len(d)/2] }
	p90 := func(d []time.Duration) time.Duration { return d[len(d)*9/10] }
	t.Logf("start → decision_requested over %d runs: no target p50 %v p90 %v; a receiver that never answers p50 %v p90 %v",
		runsEach, p50(none), p90(none), p50(hanging), p90(hanging))
	assert.Positive(t, posts.Load(), "the receiver was posted to")
	// Generous for a shared machine; a post on the run's path would add
	// the post timeout (2s) to every run.
	assert.Less(t, p50(hanging), 2*p50(none)+50*time.Millisecond)
	closeOnce.Do(func() { close(stuck) })
}
