package notify

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"time"
)

// A decision link's token: base64url(JSON claims) "." base64url(HMAC-SHA256
// of "decide." and the claims' part, with the store's signing key). It
// names the run, the seq of the decision_requested it answers, the
// decision and the run's tenant, and expires.
type claims struct {
	Run      string `json:"r"`
	Seq      int64  `json:"s"`
	Decision string `json:"d"` // retry or fail
	Tenant   string `json:"t"`
	Exp      int64  `json:"e"` // unix seconds
}

// Bounds of tokens.
const (
	// MaxTokenBytes bounds a token read from a request.
	MaxTokenBytes = 1024
	// maxLinkLife is how long a link lives when the run has no decision
	// deadline (or a later one).
	maxLinkLife = 7 * 24 * time.Hour
)

// Token errors, each a page of its own.
var (
	errBadToken     = errors.New("this link is not valid")
	errExpiredToken = errors.New("this link has expired")
)

func signToken(key []byte, c claims) (string, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	body := base64.RawURLEncoding.EncodeToString(b)
	return body + "." + base64.RawURLEncoding.EncodeToString(tokenMAC(key, body)), nil
}

func tokenMAC(key []byte, body string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte("decide."))
	h.Write([]byte(body))
	return h.Sum(nil)
}

// parseToken checks tok's signature, then its expiry.
func parseToken(key []byte, tok string, now time.Time) (claims, error) {
	if len(tok) == 0 || len(tok) > MaxTokenBytes {
		return claims{}, errBadToken
	}
	body, sig, ok := strings.Cut(tok, ".")
	if !ok {
		return claims{}, errBadToken
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, tokenMAC(key, body)) {
		return claims{}, errBadToken
	}
	raw, err := base64.RawURLEncoding.DecodeString(body)
	if err != nil {
		return claims{}, errBadToken
	}
	var c claims
	if err := json.Unmarshal(raw, &c); err != nil || c.Run == "" || c.Seq <= 0 || (c.Decision != "retry" && c.Decision != "fail") {
		return claims{}, errBadToken
	}
	if !now.Before(time.Unix(c.Exp, 0)) {
		return c, errExpiredToken
	}
	return c, nil
}
