package notify_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/fleetguard/fleetguardtest"
	"github.com/stubbornhq/stubborn/internal/notify"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const secret = "whsec-unit"

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestSignAndVerify(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	body := []byte(`{"id":"r.3"}`)
	sig := notify.Sign(secret, now, body)
	assert.True(t, strings.HasPrefix(sig, "t=1800000000,v1="), sig)
	require.NoError(t, notify.Verify(sig, secret, body, now.Add(time.Minute), 5*time.Minute))
	for name, tt := range map[string]struct {
		header, secret string
		body           []byte
		at             time.Time
		want           string
	}{
		"other body":   {sig, secret, []byte(`{"id":"r.4"}`), now, "no v1 signature matches"},
		"other secret": {sig, "nope", body, now, "no v1 signature matches"},
		"stale":        {sig, secret, body, now.Add(time.Hour), "away from now"},
		"no timestamp": {"v1=00", secret, body, now, "no timestamp"},
	} {
		t.Run(name, func(t *testing.T) {
			assert.ErrorContains(t, notify.Verify(tt.header, tt.secret, tt.body, tt.at, 5*time.Minute), tt.want)
		})
	}
}

// receiver is a webhook receiver on 127.0.0.1 that counts each notice id,
// answering 503 while down.
type receiver struct {
	*httptest.Server
	down     atomic.Bool
	mu       sync.Mutex
	got      map[string]int // delivered (2xx) per id
	tries    int            // posts, answered or not
	bodies   map[string][]byte
	inFlight map[string]int // posts of an id being answered now
	overlap  bool           // two posts of one id at once
	hold     chan struct{}  // when set, posts wait on it, then fail
}

func newReceiver(t *testing.T) *receiver {
	rc := &receiver{got: map[string]int{}, bodies: map[string][]byte{}, inFlight: map[string]int{}}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		id := r.Header.Get(notify.HeaderNoticeID)
		rc.mu.Lock()
		rc.tries++
		rc.inFlight[id]++
		if rc.inFlight[id] > 1 {
			rc.overlap = true
		}
		hold := rc.hold
		rc.mu.Unlock()
		defer func() {
			rc.mu.Lock()
			rc.inFlight[id]--
			rc.mu.Unlock()
		}()
		if hold != nil {
			// A held post never completes: its sender is gone by the
			// time it is let go.
			select {
			case <-hold:
			case <-r.Context().Done():
			}
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if rc.down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if err := notify.Verify(r.Header.Get(notify.HeaderSignature), secret, body, time.Now(), time.Minute); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		rc.mu.Lock()
		rc.got[id]++
		rc.bodies[id] = body
		rc.mu.Unlock()
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) delivered() map[string]int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := map[string]int{}
	for k, v := range rc.got {
		out[k] = v
	}
	return out
}

func target(url, format string, on ...string) delegates.NotifyTarget {
	return delegates.NotifyTarget{URL: url, SecretEnv: "HOOK", Format: format, On: on}.WithSecret(secret)
}

// newNotifier starts a Notifier on q posting to ts, with short waits.
func newNotifier(t *testing.T, q notify.Queue, owner string, tune func(*notify.Config), ts ...delegates.NotifyTarget) *notify.Notifier {
	t.Helper()
	cfg := notify.Config{
		PublicURL: "https://stubborn.example.com", Queue: q, Owner: owner,
		Targets: func(string, []string) []delegates.NotifyTarget { return ts },
		Secret: func(u, env string) (string, bool) {
			for _, tg := range ts {
				if tg.URL == u && tg.SecretEnv == env {
					return tg.Secret(), true
				}
			}
			return "", false
		},
		Poll: 5 * time.Millisecond, BaseWait: 5 * time.Millisecond, MaxWait: 50 * time.Millisecond, PostTimeout: time.Second,
	}
	if tune != nil {
		tune(&cfg)
	}
	n, err := notify.New(cfg)
	require.NoError(t, err)
	n.Start(nil)
	t.Cleanup(n.Close)
	return n
}

// ask hands n's observer the decision_requested of run id at seq.
func ask(n *notify.Notifier, id string, seq int64) {
	st := &stubbornv1.ControlState{RunId: id, Tenant: "team", Control: &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{Target: "p"}}}}
	_, observe := n.Observer(nil).ObserveRun(context.Background(), context.Background(), st, false)
	observe(&stubbornv1.RunEvent{RunId: id, Seq: seq, Time: timestamppb.Now(), Kind: &stubbornv1.RunEvent_DecisionRequested{DecisionRequested: &stubbornv1.DecisionRequested{
		Reason:         "retries exhausted",
		ReasonCode:     stubbornv1.StatusReason_STATUS_REASON_RETRIES_EXHAUSTED,
		FailureHistory: []*stubbornv1.FailureRecord{{Attempt: 1, Delegate: "d", Summary: "Error: <boom> & more"}},
	}}})
}

func eventually(t *testing.T, within time.Duration, cond func() bool, msg string) {
	t.Helper()
	require.Eventually(t, cond, within, 5*time.Millisecond, msg)
}

func TestReceiverDownThenUpGetsEveryNotice(t *testing.T) {
	for name, queue := range map[string]func(t *testing.T) notify.Queue{
		"memory":    func(*testing.T) notify.Queue { return notify.NewMemory() },
		"jetstream": func(t *testing.T) notify.Queue { return kvQueue(t, fleetguardtest.StartNATS(t)) },
	} {
		t.Run(name, func(t *testing.T) {
			rc := newReceiver(t)
			rc.down.Store(true)
			n := newNotifier(t, queue(t), "a", nil, target(rc.URL, ""))
			const runs = 20
			for i := range runs {
				ask(n, "run"+string(rune('a'+i)), 3)
			}
			eventually(t, 5*time.Second, func() bool {
				rc.mu.Lock()
				defer rc.mu.Unlock()
				return rc.tries >= 2*runs
			}, "the notices are tried again while the receiver is down")
			assert.Empty(t, rc.delivered())
			rc.down.Store(false)
			eventually(t, 10*time.Second, func() bool { return len(rc.delivered()) == runs }, "every id arrives once the receiver is back")
			for id, c := range rc.delivered() {
				assert.Equal(t, 1, c, "%s: a 2xx settles a notice", id)
			}
		})
	}
}

func TestNoticeShapes(t *testing.T) {
	rc := newReceiver(t)
	n := newNotifier(t, notify.NewMemory(), "a", nil, target(rc.URL+"/json", ""), target(rc.URL+"/slack", "slack"), target(rc.URL+"/failed-only", "", "failed"))
	ask(n, "r1", 7)
	eventually(t, 5*time.Second, func() bool { return rc.delivered()["r1.7"] == 2 }, "the json and the slack target get it, the failed-only one not")
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, 2, rc.delivered()["r1.7"])

	rc.mu.Lock()
	defer rc.mu.Unlock()
	var slack struct {
		Text   string `json:"text"`
		Blocks []struct {
			Type     string                `json:"type"`
			Text     struct{ Text string } `json:"text"`
			Elements []struct {
				URL string `json:"url"`
			} `json:"elements"`
		} `json:"blocks"`
	}
	var js notify.Notice
	// One of the bodies is Slack's, the other Stubborn's: the last one
	// stored wins per id, so each is checked by its shape.
	body := rc.bodies["r1.7"]
	if strings.Contains(string(body), `"blocks"`) {
		require.NoError(t, json.Unmarshal(body, &slack))
		assert.Equal(t, "Run r1 waits for a decision", slack.Text)
		require.Len(t, slack.Blocks, 2)
		assert.Contains(t, slack.Blocks[0].Text.Text, "&lt;boom&gt; &amp; more", "Slack's markup is escaped")
		require.Len(t, slack.Blocks[1].Elements, 2)
		assert.True(t, strings.HasPrefix(slack.Blocks[1].Elements[0].URL, "https://stubborn.example.com/decide/"))
	} else {
		require.NoError(t, json.Unmarshal(body, &js))
		assert.Equal(t, "r1.7", js.ID)
		assert.Equal(t, "team", js.Tenant)
		assert.True(t, strings.HasPrefix(js.Decision.RetryURL, "https://stubborn.example.com/decide/"))
	}
}

func kvQueue(t *testing.T, ns *fleetguardtest.NATS) *notify.KV {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	q, err := notify.OpenKV(testCtx(t), nc, 1, nil)
	require.NoError(t, err)
	t.Cleanup(func() { q.Close(); nc.Close() })
	return q
}

// TestOneReplicaAtATimeAndTakeover: two replicas on one bucket post each
// notice once at a time; one that stops mid-post leaves its notice to the
// other once its claim lapses; the signing key is the same for both.
func TestOneReplicaAtATimeAndTakeover(t *testing.T) {
	ns := fleetguardtest.StartNATS(t)
	qa, qb := kvQueue(t, ns), kvQueue(t, ns)
	ka, err := qa.SigningKey(testCtx(t))
	require.NoError(t, err)
	kb, err := qb.SigningKey(testCtx(t))
	require.NoError(t, err)
	assert.Equal(t, ka, kb, "replicas share the links' key")

	rc := newReceiver(t)
	hold := make(chan struct{})
	rc.hold = hold
	lease := func(c *notify.Config) { c.Lease = 500 * time.Millisecond; c.PostTimeout = 5 * time.Second }
	a := newNotifier(t, qa, "a", lease, target(rc.URL, ""))
	ask(a, "dies", 1)
	eventually(t, 5*time.Second, func() bool {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		return rc.tries == 1
	}, "replica a posts")
	rc.mu.Lock()
	rc.hold = nil // b's posts are answered
	rc.mu.Unlock()
	b := newNotifier(t, qb, "b", lease, target(rc.URL, ""))
	a.Close() // dies mid-post: its claim lapses
	close(hold)
	eventually(t, 5*time.Second, func() bool { return rc.delivered()["dies.1"] == 1 }, "replica b delivers what a left")
	rc.mu.Lock()
	assert.Equal(t, 2, rc.tries, "a's post, then b's once a's claim lapsed")
	rc.mu.Unlock()

	for i := range 10 {
		ask(b, "both"+string(rune('a'+i)), 2)
	}
	eventually(t, 5*time.Second, func() bool { return len(rc.delivered()) == 11 }, "every notice arrives")
	rc.mu.Lock()
	assert.False(t, rc.overlap, "never two posts of a notice at once")
	rc.mu.Unlock()
}

// TestQueuedNoticesOutliveTheServer: a notice queued on JetStream, its
// receiver down, is delivered by the next server on the store.
func TestQueuedNoticesOutliveTheServer(t *testing.T) {
	ns := fleetguardtest.StartNATS(t)
	rc := newReceiver(t)
	rc.down.Store(true)
	first := newNotifier(t, kvQueue(t, ns), "first", nil, target(rc.URL, ""))
	ask(first, "kept", 4)
	eventually(t, 5*time.Second, func() bool {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		return rc.tries > 0
	}, "queued and tried")
	first.Close()
	rc.down.Store(false)
	newNotifier(t, kvQueue(t, ns), "second", nil, target(rc.URL, ""))
	eventually(t, 5*time.Second, func() bool { return rc.delivered()["kept.4"] == 1 }, "the next server delivers it")
}

// TestSweepQueuesWhatWasNotHandedOff: a run awaiting a decision that no
// observer saw (its server died before queueing) is found by the sweep,
// once.
func TestSweepQueuesWhatWasNotHandedOff(t *testing.T) {
	rc := newReceiver(t)
	waiting := &stubbornv1.ControlState{RunId: "orphan", Status: stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION}
	journal := []*stubbornv1.RunEvent{
		{RunId: "orphan", Seq: 1, Kind: &stubbornv1.RunEvent_RunStarted{RunStarted: &stubbornv1.RunStarted{}}},
		{RunId: "orphan", Seq: 2, Time: timestamppb.Now(), Kind: &stubbornv1.RunEvent_DecisionRequested{DecisionRequested: &stubbornv1.DecisionRequested{Reason: "r"}}},
	}
	newNotifier(t, notify.NewMemory(), "a", func(c *notify.Config) {
		c.SweepEvery = 20 * time.Millisecond
		c.States = func(_ context.Context, fn func(*stubbornv1.ControlState) bool) error {
			fn(waiting)
			return nil
		}
		c.Events = func(_ context.Context, id string, after int64) ([]*stubbornv1.RunEvent, error) {
			return journal[after:], nil
		}
	}, target(rc.URL, ""))
	eventually(t, 5*time.Second, func() bool { return rc.delivered()["orphan.2"] == 1 }, "the sweep finds it")
	time.Sleep(100 * time.Millisecond) // several sweeps
	assert.Equal(t, 1, rc.delivered()["orphan.2"], "and queues it once")
}
