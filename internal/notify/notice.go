package notify

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Notice is the JSON a target of format json gets.
type Notice struct {
	// ID is the notice's id, also in the Stubborn-Notice-Id header: the
	// run's id and the seq of the event it is about.
	ID string `json:"id"`
	// Type is awaiting_decision, failed or exhausted.
	Type        string         `json:"type"`
	RunID       string         `json:"run_id"`
	Tenant      string         `json:"tenant"`
	Status      string         `json:"status"`
	Reason      string         `json:"reason"`
	ReasonCode  string         `json:"reason_code"`
	LastFailure *Failure       `json:"last_failure,omitempty"`
	Cost        *Cost          `json:"cost,omitempty"`
	ConsoleURL  string         `json:"console_url"`
	Decision    *DecisionLinks `json:"decision,omitempty"`
	// Time is when the event happened.
	Time time.Time `json:"time"`
}

// Failure is the run's last failure.
type Failure struct {
	Attempt  int32  `json:"attempt"`
	Delegate string `json:"delegate"`
	Summary  string `json:"summary"`
	Reason   string `json:"reason"`
}

// Cost is what the run has cost so far (ControlState.cost).
type Cost struct {
	Total       float64            `json:"total"`
	ByDelegate  map[string]float64 `json:"by_delegate,omitempty"`
	TotalTokens int64              `json:"total_tokens,omitempty"`
	Estimated   bool               `json:"estimated,omitempty"`
}

// DecisionLinks are the one-time links that decide the run: a GET shows
// what the link does and asks to confirm, a POST decides.
type DecisionLinks struct {
	RetryURL  string    `json:"retry_url"`
	FailURL   string    `json:"fail_url"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Headers of a notice's POST.
const (
	// HeaderSignature is "t=<unix seconds>,v1=<hex HMAC-SHA256 of
	// "<t>.<body>" with the target's secret>", as Stripe signs.
	HeaderSignature = "Stubborn-Signature"
	// HeaderNoticeID is the notice's id, to deduplicate by.
	HeaderNoticeID = "Stubborn-Notice-Id"
)

// Sign returns the Stubborn-Signature of body sent at t with secret.
func Sign(secret string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, ts, body))
}

func mac(secret, ts string, body []byte) []byte {
	h := hmac.New(sha256.New, []byte(secret))
	h.Write([]byte(ts))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// Verify checks a Stubborn-Signature header against body and secret, and
// that it was made within tolerance of now (a replayed notice is
// refused). It is what a receiver written in Go does.
func Verify(header, secret string, body []byte, now time.Time, tolerance time.Duration) error {
	var ts string
	var sigs []string
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			sigs = append(sigs, v)
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("no timestamp (t=) in the signature")
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("the signature's timestamp is %v away from now, over %v", d.Round(time.Second), tolerance)
	}
	want := mac(secret, ts, body)
	for _, s := range sigs {
		if got, err := hex.DecodeString(s); err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return fmt.Errorf("no v1 signature matches")
}

// maxSlackText bounds the text of a Slack block (Slack takes 3000).
const maxSlackText = 2900

// slackBody is n in Slack's incoming-webhook shape: a text, for
// notifications, and blocks with the links as buttons.
func slackBody(n *Notice) ([]byte, error) {
	var title string
	switch n.Type {
	case "awaiting_decision":
		title = "Run " + n.RunID + " waits for a decision"
	default:
		title = "Run " + n.RunID + " ended " + strings.TrimPrefix(n.Status, "RUN_STATUS_")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*<%s|%s>*", slackEscape(n.ConsoleURL), slackEscape(title))
	if n.Tenant != "" {
		fmt.Fprintf(&b, " (tenant %s)", slackEscape(n.Tenant))
	}
	if n.Reason != "" {
		fmt.Fprintf(&b, "\n%s", slackEscape(n.Reason))
	}
	if f := n.LastFailure; f != nil {
		fmt.Fprintf(&b, "\nLast failure (attempt %d, %s): %s", f.Attempt, slackEscape(f.Delegate), slackEscape(f.Summary))
	}
	if c := n.Cost; c != nil {
		fmt.Fprintf(&b, "\nCost so far: %.4f", c.Total)
	}
	text := b.String()
	if len(text) > maxSlackText {
		text = strings.ToValidUTF8(text[:maxSlackText], "") + "…"
	}
	blocks := []any{map[string]any{"type": "section", "text": map[string]any{"type": "mrkdwn", "text": text}}}
	if d := n.Decision; d != nil {
		blocks = append(blocks, map[string]any{"type": "actions", "elements": []any{
			map[string]any{"type": "button", "text": map[string]any{"type": "plain_text", "text": "Retry"}, "url": d.RetryURL, "style": "primary"},
			map[string]any{"type": "button", "text": map[string]any{"type": "plain_text", "text": "Fail"}, "url": d.FailURL, "style": "danger"},
		}})
	}
	return json.Marshal(map[string]any{"text": title, "blocks": blocks})
}

// slackEscape escapes what Slack's mrkdwn reads as markup.
func slackEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
