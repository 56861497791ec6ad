package notify

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/runs"
)

// DecidePath is the path of the decision links; the token follows it.
const DecidePath = "/decide/"

// Bounds of a decision's form.
const (
	maxFormBytes  = 4 << 10
	maxFieldBytes = 32
)

// Handler serves the decision links: GET DecidePath+token shows what the
// link does and a form to confirm it, POST decides. Only a POST changes
// anything: chat apps unfurl links and browsers prefetch them with GETs.
func (n *Notifier) Handler() http.Handler { return http.HandlerFunc(n.serveDecide) }

// request is a link's request as the journal has it now.
type request struct {
	c      claims
	asked  *stubbornv1.DecisionRequested
	state  *stubbornv1.ControlState
	closed string // why the link no longer decides ("" while it does)
}

func (n *Notifier) serveDecide(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("Referrer-Policy", "no-referrer") // the token is in the URL
	h.Set("X-Robots-Tag", "noindex")
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
	if r.Method != http.MethodGet && r.Method != http.MethodHead && r.Method != http.MethodPost {
		h.Set("Allow", "GET, HEAD, POST")
		page(w, http.StatusMethodNotAllowed, "Not allowed", "A decision link is opened (GET) and confirmed (POST).", nil)
		return
	}
	tok := strings.TrimPrefix(r.URL.Path, DecidePath)
	if n.runs == nil {
		page(w, http.StatusServiceUnavailable, "Not ready", "The server is starting: try again in a moment.", nil)
		return
	}
	req, status, err := n.lookup(r.Context(), tok)
	if err != nil {
		page(w, status, "Cannot decide", err.Error(), nil)
		return
	}
	if req.closed != "" {
		page(w, http.StatusConflict, "Nothing to decide", req.closed, nil)
		return
	}
	if r.Method != http.MethodPost {
		n.confirmPage(w, req)
		return
	}
	n.decide(w, r, req)
}

// lookup checks tok and finds its request in the run's journal; the
// error is what a person is told, with its HTTP status.
func (n *Notifier) lookup(ctx context.Context, tok string) (*request, int, error) {
	key, err := n.cfg.Queue.SigningKey(ctx)
	if err != nil {
		n.log.Warn("notify: reading the signing key", "err", err)
		return nil, http.StatusServiceUnavailable, errors.New("the store is out of reach: try again in a moment")
	}
	c, err := parseToken(key, tok, n.cfg.Now())
	switch {
	case errors.Is(err, errExpiredToken):
		return nil, http.StatusGone, fmt.Errorf("This link has expired (at %s). Decide run %s in the console or with stubborn decide.", time.Unix(c.Exp, 0).UTC().Format(time.RFC3339), c.Run)
	case err != nil:
		return nil, http.StatusForbidden, errors.New("This link is not valid: it was changed or cut short. Open the link from the notice whole.")
	}
	ctx = runs.WithTenant(ctx, c.Tenant)
	st, err := n.runs.Get(ctx, c.Run)
	if errors.Is(err, runs.ErrNotFound) {
		return nil, http.StatusNotFound, fmt.Errorf("Run %s does not exist (any more).", c.Run)
	}
	if err != nil {
		return nil, http.StatusServiceUnavailable, errors.New("the run is out of reach: try again in a moment")
	}
	evs, err := n.eventsFrom(ctx, c.Run, c.Seq)
	if err != nil {
		return nil, http.StatusServiceUnavailable, errors.New("the run's journal is out of reach: try again in a moment")
	}
	if len(evs) == 0 || evs[0].GetSeq() != c.Seq || evs[0].GetDecisionRequested() == nil {
		return nil, http.StatusNotFound, fmt.Errorf("Run %s has no such request for a decision.", c.Run)
	}
	req := &request{c: c, asked: evs[0].GetDecisionRequested(), state: st}
	for _, ev := range evs[1:] {
		switch {
		case ev.GetDecisionReceived() != nil:
			req.closed = fmt.Sprintf("Run %s was already decided: %s at %s.", c.Run,
				decisionWord(ev.GetDecisionReceived().GetDecision()), ev.GetTime().AsTime().UTC().Format(time.RFC3339))
			return req, 0, nil
		case ev.GetRunFinished() != nil:
			req.closed = fmt.Sprintf("Run %s has ended: %s.", c.Run, strings.TrimPrefix(ev.GetRunFinished().GetState().GetStatus().String(), "RUN_STATUS_"))
			return req, 0, nil
		case ev.GetDecisionRequested() != nil:
			req.closed = fmt.Sprintf("Run %s no longer waits for this decision: it asks again, in a newer notice.", c.Run)
			return req, 0, nil
		}
	}
	return req, 0, nil
}

// requestWait bounds how long a link waits for the request it names to
// reach the run's journal: a run hands its request to the notifier when it
// records it, a moment before the journal has it (longer while the store
// elects a leader), and a notice may be out and clicked meanwhile.
const requestWait = 5 * time.Second

// requestPoll is how often the journal is read again meanwhile.
const requestPoll = 20 * time.Millisecond

// eventsFrom returns run's events from seq on, waiting up to requestWait
// while the journal ends before seq.
func (n *Notifier) eventsFrom(ctx context.Context, run string, seq int64) ([]*stubbornv1.RunEvent, error) {
	deadline := time.Now().Add(requestWait)
	for {
		evs, err := n.cfg.Events(ctx, run, seq-1)
		if err != nil || len(evs) > 0 || !time.Now().Before(deadline) {
			return evs, err
		}
		t := time.NewTimer(requestPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

func decisionWord(d stubbornv1.Decision) string {
	return strings.TrimPrefix(d.String(), "DECISION_")
}

// spendLimited reports whether the request waits for a raised spend limit.
func (q *request) spendLimited() bool {
	return q.asked.GetReasonCode() == stubbornv1.StatusReason_STATUS_REASON_SPEND_LIMIT_REACHED
}

// suggestedMaxCost is the retry form's default: twice the limit (or,
// without one, twice what the run cost).
func (q *request) suggestedMaxCost() float64 {
	if v := q.state.GetOptions().GetSpendLimit().GetMaxCost(); v > 0 {
		return 2 * v
	}
	if v := q.state.GetCost().GetTotal(); v > 0 {
		return 2 * v
	}
	return 1
}

var confirmTmpl = template.Must(template.New("confirm").Parse(`<p>Run <b>{{.Run}}</b>{{if .Tenant}} (tenant {{.Tenant}}){{end}} waits for a decision{{if .Reason}}: {{.Reason}}{{end}}.</p>
{{if .LastFailure}}<p>Last failure: {{.LastFailure}}</p>{{end}}
{{if .Cost}}<p>Cost so far: {{.Cost}}</p>{{end}}
<p>This link will <b>{{.Action}}</b> the run.</p>
<form method="post">
{{if .MaxCost}}<p><label>New spend limit (max_cost): <input name="max_cost" value="{{.MaxCost}}" inputmode="decimal" maxlength="32"></label></p>{{end}}
<button type="submit">{{.Button}}</button>
</form>`))

func (n *Notifier) confirmPage(w http.ResponseWriter, q *request) {
	data := map[string]any{"Run": q.c.Run, "Tenant": q.c.Tenant, "Reason": q.asked.GetReason()}
	if h := q.asked.GetFailureHistory(); len(h) > 0 {
		f := h[len(h)-1]
		data["LastFailure"] = fmt.Sprintf("attempt %d, %s: %s", f.GetAttempt(), f.GetDelegate(), f.GetSummary())
	}
	if c := q.state.GetCost(); c != nil {
		data["Cost"] = strconv.FormatFloat(c.GetTotal(), 'f', -1, 64)
	}
	if q.c.Decision == "retry" {
		data["Action"], data["Button"] = "retry", "Retry run "+q.c.Run
		if q.spendLimited() {
			data["MaxCost"] = strconv.FormatFloat(q.suggestedMaxCost(), 'f', -1, 64)
		}
	} else {
		data["Action"], data["Button"] = "fail", "Fail run "+q.c.Run
	}
	page(w, http.StatusOK, "Decide run "+q.c.Run, "", func(b *strings.Builder) error { return confirmTmpl.Execute(b, data) })
}

// decide applies the link's decision, once.
func (n *Notifier) decide(w http.ResponseWriter, r *http.Request, q *request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		page(w, http.StatusBadRequest, "Cannot decide", "The form is not readable (or over 4 KiB).", nil)
		return
	}
	d := stubbornv1.Decision_DECISION_FAIL
	var limit *stubbornv1.SpendLimit
	if q.c.Decision == "retry" {
		d = stubbornv1.Decision_DECISION_RETRY
		if q.spendLimited() {
			v, err := formMaxCost(r.PostForm.Get("max_cost"), q.state.GetOptions().GetSpendLimit().GetMaxCost())
			if err != nil {
				page(w, http.StatusBadRequest, "Cannot decide", err.Error(), nil)
				return
			}
			limit = &stubbornv1.SpendLimit{}
			if cur := q.state.GetOptions().GetSpendLimit(); cur != nil {
				limit.MaxTotalTokens, limit.OnExhausted = cur.GetMaxTotalTokens(), cur.GetOnExhausted()
			}
			limit.MaxCost = v
		}
	}
	key := usedKey(q.c.Run, q.c.Seq)
	added, err := n.cfg.Queue.Add(r.Context(), key, Record{ID: NoticeID(q.c.Run, q.c.Seq), RunID: q.c.Run, State: stateUsed, Created: n.cfg.Now()})
	if err != nil {
		page(w, http.StatusServiceUnavailable, "Cannot decide", "The store is out of reach: try again in a moment.", nil)
		return
	}
	if !added {
		page(w, http.StatusConflict, "Nothing to decide", fmt.Sprintf("A link of this notice was used already: run %s was decided.", q.c.Run), nil)
		return
	}
	// As the run's tenant, through the engine: journaled like every
	// decision (decision_received).
	st, err := n.runs.Decide(runs.WithTenant(r.Context(), q.c.Tenant), q.c.Run, d, limit)
	switch {
	case errors.Is(err, runs.ErrNotAwaitingDecision):
		page(w, http.StatusConflict, "Nothing to decide", fmt.Sprintf("Run %s no longer waits for a decision.", q.c.Run), nil)
		return
	case err != nil:
		n.log.Warn("notify: deciding by link", "run_id", q.c.Run, "err", err)
		n.unuse(key)
		page(w, http.StatusServiceUnavailable, "Cannot decide", "The run could not be decided now: try the link again in a moment.", nil)
		return
	}
	n.log.Info("run decided by link", "run_id", q.c.Run, "tenant", q.c.Tenant, "decision", d.String())
	msg := fmt.Sprintf("Run %s: %s. It is now %s.", q.c.Run, decisionWord(d), strings.TrimPrefix(st.GetStatus().String(), "RUN_STATUS_"))
	page(w, http.StatusOK, "Decided", msg, nil)
}

// unuse frees the link's mark after a decision that did not happen.
func (n *Notifier) unuse(key string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if e, ok, err := n.cfg.Queue.Get(ctx, key); err == nil && ok {
		_ = n.cfg.Queue.Delete(ctx, key, e.Rev)
	}
}

// formMaxCost reads the retry form's max_cost: a number above the limit
// the run reached.
func formMaxCost(s string, current float64) (float64, error) {
	s = strings.TrimSpace(s)
	if s == "" || len(s) > maxFieldBytes {
		return 0, fmt.Errorf("max_cost: give the new spend limit, a number (at most %d characters)", maxFieldBytes)
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
		return 0, fmt.Errorf("max_cost: must be a positive number, got %q", s)
	}
	if v <= current {
		return 0, fmt.Errorf("max_cost: must be above the limit the run reached (%s), got %s", strconv.FormatFloat(current, 'f', -1, 64), s)
	}
	return v, nil
}

var pageTmpl = template.Must(template.New("page").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<meta name="robots" content="noindex"><title>{{.Title}} · Stubborn</title>
<style>body{font:16px/1.5 system-ui,sans-serif;max-width:40em;margin:3em auto;padding:0 1em}button{font-size:1em;padding:.4em 1em}</style>
</head><body><h1>{{.Title}}</h1>{{if .Message}}<p>{{.Message}}</p>{{end}}{{.Body}}</body></html>
`))

// page writes a small HTML page; body, when set, adds trusted HTML made by
// a template.
func page(w http.ResponseWriter, status int, title, message string, body func(*strings.Builder) error) {
	var b strings.Builder
	if body != nil {
		if err := body(&b); err != nil {
			status, message, b = http.StatusInternalServerError, "The page could not be made.", strings.Builder{}
		}
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_ = pageTmpl.Execute(w, map[string]any{"Title": title, "Message": message, "Body": template.HTML(b.String())}) //nolint:gosec // made by confirmTmpl, which escapes
}
