package notify

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/runs"
)

// Runs is what the notifier needs of the run engine (runs.Manager).
type Runs interface {
	Get(ctx context.Context, id string) (*stubbornv1.ControlState, error)
	Decide(ctx context.Context, id string, d stubbornv1.Decision, limit *stubbornv1.SpendLimit) (*stubbornv1.ControlState, error)
}

// Config configures a Notifier.
type Config struct {
	// PublicURL is the base URL people reach the HTTP listener at
	// (serve -public-url): the console's and the decision links are built
	// on it. Required.
	PublicURL string
	// Queue keeps the notices. Required.
	Queue Queue
	// Targets returns the targets of a run of tenant whose control names
	// presets at its top, from the config in use.
	Targets func(tenant string, presets []string) []delegates.NotifyTarget
	// Secret returns the secret of the target url, secretEnv in the
	// config in use; false when the config lists it no more.
	Secret func(url, secretEnv string) (string, bool)
	// Events returns a run's events with seq > after, as the journal has
	// them now (the store's Events).
	Events func(ctx context.Context, runID string, after int64) ([]*stubbornv1.RunEvent, error)
	// States calls fn with every run's state (the store's States): the
	// sweep finds the runs awaiting a decision there. Nil means no sweep.
	States func(ctx context.Context, fn func(*stubbornv1.ControlState) bool) error
	// Owner names this replica in its claims.
	Owner string
	// Client posts the notices; nil means one with PostTimeout and no
	// redirects followed.
	Client *http.Client
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now defaults to time.Now.
	Now func() time.Time

	// PostTimeout bounds a post (default 10s); Lease is how long a claim
	// holds (default 3×PostTimeout).
	PostTimeout, Lease time.Duration
	// BaseWait and MaxWait shape the full-jitter backoff between posts of
	// a notice (defaults 1s and 10m); MaxAge is how long a notice is tried
	// (default 24h).
	BaseWait, MaxWait, MaxAge time.Duration
	// Poll is how often the due notices are looked for (default 250ms);
	// SweepEvery how often the runs awaiting a decision are looked for
	// (default 5m).
	Poll, SweepEvery time.Duration
}

// maxInbox bounds the events handed off and not yet queued: past it (a
// store out of reach for long), events are dropped, logged, and the sweep
// finds the runs awaiting a decision again.
const maxInbox = 100_000

// maxInFlight bounds the posts in flight at once.
const maxInFlight = 16

// Notifier delivers notices and serves decision links.
type Notifier struct {
	cfg    Config
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	sem    chan struct{}
	runs   Runs // set by Start

	mu      sync.Mutex
	inbox   []handed // guarded by mu
	dropped int      // guarded by mu
	wake    chan struct{}
	kick    chan struct{} // a notice queued: look for due ones now

	flightMu sync.Mutex
	inFlight map[string]bool // guarded by flightMu: keys posted by this replica now
}

// handed is an event the Observer handed off.
type handed struct {
	ev      *stubbornv1.RunEvent
	tenant  string
	presets []string
}

// New returns a Notifier; Start starts it.
func New(cfg Config) (*Notifier, error) {
	if cfg.Queue == nil || cfg.Targets == nil || cfg.Secret == nil {
		return nil, errors.New("notify: Config.Queue, Targets and Secret are required")
	}
	if err := CheckPublicURL(cfg.PublicURL); err != nil {
		return nil, err
	}
	setDefaults(&cfg)
	ctx, cancel := context.WithCancel(context.Background())
	return &Notifier{
		cfg: cfg, log: cfg.Logger, ctx: ctx, cancel: cancel, sem: make(chan struct{}, maxInFlight),
		wake: make(chan struct{}, 1), kick: make(chan struct{}, 1), inFlight: map[string]bool{},
	}, nil
}

func setDefaults(cfg *Config) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.PostTimeout, 10*time.Second)
	def(&cfg.Lease, 3*cfg.PostTimeout)
	def(&cfg.BaseWait, time.Second)
	def(&cfg.MaxWait, 10*time.Minute)
	def(&cfg.MaxAge, 24*time.Hour)
	def(&cfg.Poll, 250*time.Millisecond)
	def(&cfg.SweepEvery, 5*time.Minute)
	if cfg.Client == nil {
		cfg.Client = &http.Client{
			Timeout: cfg.PostTimeout,
			// A redirect is the receiver's misconfiguration: the notice
			// and its signature go to the URL configured only.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
}

// CheckPublicURL reports what is wrong with a -public-url.
func CheckPublicURL(s string) error {
	if s == "" {
		return errors.New("notify targets need -public-url: the base URL people reach the HTTP listener at (the decision links are built on it)")
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || len(s) > delegates.MaxNotifyURLBytes {
		return fmt.Errorf("-public-url must be an http or https URL with a host and no query, such as https://stubborn.example.com, got %q", s)
	}
	return nil
}

// Start starts delivering, deciding through r. Close stops it.
func (n *Notifier) Start(r Runs) {
	n.runs = r
	n.wg.Add(2)
	go n.ingestLoop()
	go n.deliverLoop()
	if n.cfg.States != nil && n.cfg.Events != nil {
		n.wg.Add(1)
		go n.sweepLoop()
	}
}

// Close stops delivering; posts in flight are cut. What is left is in the
// queue, for the next start or another replica.
func (n *Notifier) Close() {
	n.cancel()
	n.wg.Wait()
}

// Observer returns inner (may be nil) seeing the runs as before, and the
// notifier seeing their decision_requested and run_finished events. It
// hands them off and returns: it never blocks a run.
func (n *Notifier) Observer(inner runs.Observer) runs.Observer {
	return observer{n: n, inner: inner}
}

type observer struct {
	n     *Notifier
	inner runs.Observer
}

func (o observer) ObserveRun(runCtx, reqCtx context.Context, st *stubbornv1.ControlState, resumed bool) (context.Context, func(*stubbornv1.RunEvent)) {
	ctx, next := runCtx, func(*stubbornv1.RunEvent) {}
	if o.inner != nil {
		ctx, next = o.inner.ObserveRun(runCtx, reqCtx, st, resumed)
	}
	tenant, presets := st.GetTenant(), delegates.References(st.GetControl())
	return ctx, func(ev *stubbornv1.RunEvent) {
		next(ev)
		switch {
		case ev == nil:
		case ev.GetDecisionRequested() != nil:
			o.n.hand(handed{ev: proto.CloneOf(ev), tenant: tenant, presets: presets})
		case ev.GetRunFinished() != nil:
			switch ev.GetRunFinished().GetState().GetStatus() {
			case stubbornv1.RunStatus_RUN_STATUS_FAILED, stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED:
				o.n.hand(handed{ev: proto.CloneOf(ev), tenant: tenant, presets: presets})
			}
		}
	}
}

// hand puts h in the inbox without waiting.
func (n *Notifier) hand(h handed) {
	n.mu.Lock()
	if len(n.inbox) >= maxInbox {
		n.dropped++
		n.mu.Unlock()
		return
	}
	n.inbox = append(n.inbox, h)
	n.mu.Unlock()
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// ingestLoop queues the notices of the events handed off.
func (n *Notifier) ingestLoop() {
	defer n.wg.Done()
	for {
		select {
		case <-n.ctx.Done():
			n.drain()
			return
		case <-n.wake:
		}
		batch, dropped := n.take()
		if dropped > 0 {
			n.log.Error("notify: events dropped while the queue was out of reach; the sweep finds the runs awaiting a decision again", "dropped", dropped)
		}
		for _, h := range batch {
			n.queueWithRetry(h)
		}
	}
}

// take empties the inbox.
func (n *Notifier) take() (batch []handed, dropped int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	batch, dropped = n.inbox, n.dropped
	n.inbox, n.dropped = nil, 0
	return batch, dropped
}

// drain queues what is left in the inbox at Close, once each, within
// drainTimeout: the runs' last events (a sweep finds a run awaiting a
// decision again, not a run that ended).
func (n *Notifier) drain() {
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	batch, _ := n.take()
	for _, h := range batch {
		if err := n.queue(ctx, h); err != nil {
			n.log.Warn("notify: a notice was not queued before the server stopped", "run_id", h.ev.GetRunId(), "seq", h.ev.GetSeq(), "err", err)
		}
	}
}

// drainTimeout bounds Close's queueing of the inbox.
const drainTimeout = 2 * time.Second

// queueWithRetry queues h's notices, trying again while the store is out
// of reach, until Close.
func (n *Notifier) queueWithRetry(h handed) {
	for try := 1; ; try++ {
		err := n.queue(n.ctx, h)
		if err == nil {
			return
		}
		n.log.Warn("notify: queueing a notice", "run_id", h.ev.GetRunId(), "seq", h.ev.GetSeq(), "err", err)
		t := time.NewTimer(jitter(try, 100*time.Millisecond, 10*time.Second))
		select {
		case <-n.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// queue adds one record per target of h's run that wants the event.
func (n *Notifier) queue(ctx context.Context, h handed) error {
	kind := kindOf(h.ev)
	var wanted []delegates.NotifyTarget
	for _, t := range n.cfg.Targets(h.tenant, h.presets) {
		if t.Wants(kind) {
			wanted = append(wanted, t)
		}
	}
	if len(wanted) == 0 {
		return nil
	}
	notice, err := n.notice(ctx, h, kind)
	if err != nil {
		return err
	}
	added := false
	for _, t := range wanted {
		body, err := encodeNotice(notice, t.Format)
		if err != nil {
			return err
		}
		now := n.cfg.Now()
		ok, err := n.cfg.Queue.Add(ctx, recordKey(notice.ID, t), Record{
			ID: notice.ID, RunID: notice.RunID, URL: t.URL, SecretEnv: t.SecretEnv, Format: t.Format,
			Body: body, Created: now, NextAt: now,
		})
		if err != nil {
			return err
		}
		added = added || ok
	}
	if added {
		select {
		case n.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

func kindOf(ev *stubbornv1.RunEvent) string {
	if ev.GetDecisionRequested() != nil {
		return delegates.NotifyAwaitingDecision
	}
	if ev.GetRunFinished().GetState().GetStatus() == stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED {
		return delegates.NotifyExhausted
	}
	return delegates.NotifyFailed
}

// recordKey is the queue's key of notice id to target t (KV key
// characters only).
func recordKey(id string, t delegates.NotifyTarget) string {
	sum := sha256.Sum256([]byte(id + "\x00" + t.URL + "\x00" + t.SecretEnv + "\x00" + t.Format))
	return "n_" + hex.EncodeToString(sum[:20])
}

// usedKey is the queue's key that marks the links of run id's request
// seq used.
func usedKey(run string, seq int64) string {
	sum := sha256.Sum256([]byte(run + "\x00" + strconv.FormatInt(seq, 10)))
	return "u_" + hex.EncodeToString(sum[:20])
}

// NoticeID is the id of the notice about run's event seq.
func NoticeID(run string, seq int64) string { return run + "." + strconv.FormatInt(seq, 10) }

// notice builds h's notice: the run's state (its cost) is read now.
func (n *Notifier) notice(ctx context.Context, h handed, kind string) (*Notice, error) {
	ev := h.ev
	id := ev.GetRunId()
	base := n.cfg.PublicURL
	for len(base) > 0 && base[len(base)-1] == '/' {
		base = base[:len(base)-1]
	}
	no := &Notice{
		ID: NoticeID(id, ev.GetSeq()), Type: kind, RunID: id, Tenant: h.tenant,
		ConsoleURL: base + "/#/runs/" + url.PathEscape(id), Time: ev.GetTime().AsTime(),
	}
	var history []*stubbornv1.FailureRecord
	if dr := ev.GetDecisionRequested(); dr != nil {
		no.Status = stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION.String()
		no.Reason, no.ReasonCode = dr.GetReason(), dr.GetReasonCode().String()
		history = dr.GetFailureHistory()
		exp := no.Time.Add(maxLinkLife)
		if d := dr.GetDeadline(); d != nil && d.AsTime().Before(exp) {
			exp = d.AsTime()
		}
		key, err := n.cfg.Queue.SigningKey(ctx)
		if err != nil {
			return nil, err
		}
		links := &DecisionLinks{ExpiresAt: exp.UTC().Truncate(time.Second)}
		for _, d := range []struct {
			name string
			url  *string
		}{{"retry", &links.RetryURL}, {"fail", &links.FailURL}} {
			tok, err := signToken(key, claims{Run: id, Seq: ev.GetSeq(), Decision: d.name, Tenant: h.tenant, Exp: exp.Unix()})
			if err != nil {
				return nil, err
			}
			*d.url = base + DecidePath + tok
		}
		no.Decision = links
	} else {
		st := ev.GetRunFinished().GetState()
		no.Status, no.Reason, no.ReasonCode = st.GetStatus().String(), st.GetStatusReason(), st.GetStatusReasonCode().String()
		history = st.GetFailureHistory()
		no.Cost = costOf(st.GetCost())
	}
	if len(history) > 0 {
		f := history[len(history)-1]
		no.LastFailure = &Failure{Attempt: f.GetAttempt(), Delegate: f.GetDelegate(), Summary: f.GetSummary(), Reason: f.GetReason()}
	}
	if no.Cost == nil && n.runs != nil {
		// The cost is the state's, not the event's: read it off the run's
		// path, now. A run out of reach goes without.
		if st, err := n.runs.Get(runs.WithTenant(ctx, h.tenant), id); err == nil {
			no.Cost = costOf(st.GetCost())
		}
	}
	return no, nil
}

func costOf(c *stubbornv1.RunCost) *Cost {
	if c == nil {
		return nil
	}
	return &Cost{Total: c.GetTotal(), ByDelegate: c.GetByDelegate(), TotalTokens: c.GetTotalTokens(), Estimated: c.GetEstimated()}
}

func encodeNotice(no *Notice, format string) ([]byte, error) {
	if format == "slack" {
		return slackBody(no)
	}
	return json.Marshal(no)
}

// deliverLoop posts the due notices.
func (n *Notifier) deliverLoop() {
	defer n.wg.Done()
	t := time.NewTicker(n.cfg.Poll)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		case <-n.kick:
		}
		n.deliverDue()
	}
}

// deliverDue claims each due notice and posts it.
func (n *Notifier) deliverDue() {
	now := n.cfg.Now()
	for _, e := range n.cfg.Queue.Pending() {
		r := e.Record
		if r.NextAt.After(now) || r.ClaimUntil.After(now) || n.posting(e.Key) {
			continue
		}
		select {
		case n.sem <- struct{}{}:
		case <-n.ctx.Done():
			return
		}
		r.Owner, r.ClaimUntil = n.cfg.Owner, now.Add(n.cfg.Lease)
		rev, err := n.cfg.Queue.Update(n.ctx, e.Key, e.Rev, r)
		if err != nil {
			<-n.sem
			if !errors.Is(err, ErrConflict) {
				n.log.Warn("notify: claiming a notice", "id", r.ID, "err", err)
			}
			continue // another replica has it, or the store will answer later
		}
		n.setPosting(e.Key, true)
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			defer func() { <-n.sem }()
			defer n.setPosting(e.Key, false)
			n.deliver(e.Key, rev, r)
		}()
	}
}

func (n *Notifier) posting(key string) bool {
	n.flightMu.Lock()
	defer n.flightMu.Unlock()
	return n.inFlight[key]
}

func (n *Notifier) setPosting(key string, on bool) {
	n.flightMu.Lock()
	defer n.flightMu.Unlock()
	if on {
		n.inFlight[key] = true
	} else {
		delete(n.inFlight, key)
	}
}

// deliver posts r (claimed at rev) and records the outcome.
func (n *Notifier) deliver(key string, rev uint64, r Record) {
	r.Attempts++
	wait, err := n.post(r)
	now := n.cfg.Now()
	r.Owner, r.ClaimUntil = "", time.Time{}
	switch {
	case err == nil:
		r.State, r.LastError = stateDelivered, ""
	case n.ctx.Err() != nil:
		return // closing: the claim lapses, and the notice is posted again
	case now.Sub(r.Created) >= n.cfg.MaxAge:
		r.State, r.LastError = stateGaveUp, err.Error()
		n.log.Error("notify: a notice was not delivered; giving up", "id", r.ID, "url", r.URL, "attempts", r.Attempts, "err", err)
	default:
		if wait <= 0 {
			wait = jitter(r.Attempts, n.cfg.BaseWait, n.cfg.MaxWait)
		}
		r.NextAt, r.LastError = now.Add(min(wait, n.cfg.MaxWait)), err.Error()
		n.log.Debug("notify: a notice will be posted again", "id", r.ID, "url", r.URL, "attempts", r.Attempts, "in", wait, "err", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := n.cfg.Queue.Update(ctx, key, rev, r); err != nil && !errors.Is(err, ErrConflict) {
		// Left claimed: once the lease lapses it is posted again.
		n.log.Warn("notify: recording a notice's delivery", "id", r.ID, "err", err)
	}
}

// maxResponseBytes bounds what is read of a receiver's answer.
const maxResponseBytes = 64 << 10

// post posts r once. A receiver's Retry-After (429, 503) is the wait it
// returns; 0 lets the backoff choose.
func (n *Notifier) post(r Record) (time.Duration, error) {
	secret, ok := n.cfg.Secret(r.URL, r.SecretEnv)
	if !ok {
		return 0, fmt.Errorf("the config lists the target no more")
	}
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.PostTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.URL, bytes.NewReader(r.Body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "stubborn-notify/1")
	req.Header.Set(HeaderNoticeID, r.ID)
	req.Header.Set(HeaderSignature, Sign(secret, n.cfg.Now(), r.Body))
	resp, err := n.cfg.Client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseBytes))
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return 0, nil
	}
	var wait time.Duration
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		wait = time.Duration(min(s, 86400)) * time.Second
	}
	return wait, fmt.Errorf("the receiver answered %s", resp.Status)
}

// jitter is the full-jitter wait before try n+1: uniform in [0,
// min(maxWait, base·2^(n-1))], the cap applied before the draw, as the
// retry control waits (internal/controls' backoff, which is unexported
// and replayed from a run's seeded source: a notice has no journal).
func jitter(n int, base, maxWait time.Duration) time.Duration {
	bound := maxWait
	if shift := max(n, 1) - 1; shift < 62 && base <= maxWait>>shift {
		bound = base << shift
	}
	if bound <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(bound) + 1))
}
