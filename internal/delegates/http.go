package delegates

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/stubbornhq/stubborn/delegatekit"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
)

const (
	// maxResponseHeaderBytes bounds an answer's headers.
	maxResponseHeaderBytes = 64 << 10
	// maxErrorExcerpt bounds what an attempt error quotes of an answer.
	maxErrorExcerpt = 512
)

// httpClient is what the HTTP kinds share: one client with its own
// connection pool, answers read up to max_result_bytes, and failures turned
// into CallErrors the retry control understands.
type httpClient struct {
	client    *http.Client
	idle      *http.Transport // the transport under any wrapper
	maxResult int
	healthURL string
}

// newHTTPClient is the client of one HTTP kind's delegate.
func (p *Pool) newHTTPClient(tc *tls.Config, healthURL string) *httpClient {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tc
	tr.MaxIdleConnsPerHost = 64
	tr.MaxResponseHeaderBytes = maxResponseHeaderBytes
	client := &http.Client{
		Transport: tr,
		// A redirect is an answer like any other non-2xx one: followed,
		// it could carry a key in a header of the config's (x-api-key,
		// say) to another host.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	h := &httpClient{client: client, idle: tr, maxResult: p.maxResult, healthURL: healthURL}
	if p.wrapHTTP != nil {
		h.client.Transport = p.wrapHTTP(tr)
	}
	return h
}

// answer is a 2xx answer's body, at most max_result_bytes.
type answer struct {
	body        []byte
	contentType string
}

// do sends req and returns its 2xx answer; any other answer or failure is a
// *controls.CallError.
func (h *httpClient) do(req *http.Request) (*answer, error) {
	resp, err := h.client.Do(req)
	if err != nil {
		return nil, requestError(req.Context(), err)
	}
	defer resp.Body.Close()
	return h.read(req, resp)
}

// read reads resp, req's answer, as do does.
func (h *httpClient) read(req *http.Request, resp *http.Response) (*answer, error) {
	body, err := io.ReadAll(io.LimitReader(resp.Body, int64(h.maxResult)+1))
	if err != nil {
		return nil, requestError(req.Context(), err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, statusError(resp, body)
	}
	if len(body) > h.maxResult {
		return nil, resultTooLarge(h.maxResult, fmt.Sprintf("the answer's body is over %d bytes", h.maxResult))
	}
	return &answer{body: body, contentType: resp.Header.Get("Content-Type")}, nil
}

// serving GETs the health URL: a 2xx answer is serving, any other answer
// not; no URL says nothing (serving); no answer is unreachable.
func (h *httpClient) serving(ctx context.Context) health {
	if h.healthURL == "" {
		return healthServing
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.healthURL, nil)
	if err != nil {
		return healthServing
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return healthUnreachable
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
		return healthServing
	}
	return healthNotServing
}

func (h *httpClient) close() error {
	h.idle.CloseIdleConnections()
	return nil
}

// setCallHeaders sets the headers naming the call: those a gRPC delegate
// gets as metadata (headerAttempt, headerRunID, headerIdempotencyKey).
func setCallHeaders(req *http.Request, c controls.Call) {
	if c.Attempt > 0 {
		req.Header.Set(headerAttempt, strconv.Itoa(int(c.Attempt)))
	}
	if c.RunID != "" {
		req.Header.Set(headerRunID, c.RunID)
	}
	if c.IdempotencyKey != "" {
		req.Header.Set(headerIdempotencyKey, c.IdempotencyKey)
	}
}

// requestError turns a failed request into a CallError: a connection that
// was never made is UNAVAILABLE and not sent; the attempt's deadline is
// DEADLINE_EXCEEDED (Pool.Call words it); anything else UNAVAILABLE.
func requestError(ctx context.Context, err error) *controls.CallError {
	if ctx.Err() != nil {
		return &controls.CallError{Code: codes.DeadlineExceeded, Message: ctx.Err().Error()}
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return &controls.CallError{Code: codes.Unavailable, Message: "HTTP request not sent: " + op.Error(), NotSent: true}
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return &controls.CallError{Code: codes.Unavailable, Message: "HTTP request not sent: " + dns.Error(), NotSent: true}
	}
	return &controls.CallError{Code: codes.Unavailable, Message: "HTTP request failed: " + strings.ToValidUTF8(err.Error(), "\uFFFD")}
}

// statusError is the CallError of a non-2xx answer: its status as
// HTTPStatus (so the retry control's HTTP rules apply), Retry-After as the
// hint, and the answer's error message (or the start of its body).
func statusError(resp *http.Response, body []byte) *controls.CallError {
	ce := &controls.CallError{
		Code:       delegatekit.CodeForHTTP(resp.StatusCode),
		HTTPStatus: resp.StatusCode,
		Message:    fmt.Sprintf("HTTP %s", resp.Status),
	}
	if msg := errorMessage(body); msg != "" {
		ce.Message += ": " + msg
	}
	if d, ok := retryAfter(resp.Header, time.Now()); ok {
		ce.RetryHint, ce.HasHint = d, true
	}
	return ce
}

// errorMessage is what an error answer says: error.message or message of a
// JSON body (OpenAI's, Anthropic's and many REST APIs' shape), or the start
// of the body, on one line.
func errorMessage(body []byte) string {
	var shaped struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
	}
	msg := ""
	if json.Unmarshal(body, &shaped) == nil {
		var inner struct {
			Message string `json:"message"`
		}
		var s string
		switch {
		case json.Unmarshal(shaped.Error, &inner) == nil && inner.Message != "":
			msg = inner.Message
		case json.Unmarshal(shaped.Error, &s) == nil && s != "":
			msg = s
		case shaped.Message != "":
			msg = shaped.Message
		}
	}
	if msg == "" {
		msg = string(body)
	}
	msg = strings.Join(strings.Fields(strings.ToValidUTF8(msg, "\uFFFD")), " ")
	return controls.Cut(msg, maxErrorExcerpt)
}

// retryAfter reads how long an answer asks to wait: retry-after-ms
// (OpenAI's), else Retry-After in seconds or as an HTTP date.
func retryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms >= 0 && !math.IsInf(ms, 0) {
			if ns := ms * float64(time.Millisecond); ns < math.MaxInt64 {
				return time.Duration(ns), true
			}
			return time.Duration(math.MaxInt64), true
		}
	}
	return delegatekit.ParseRetryAfter(h.Get("Retry-After"), now)
}

// unreadable is the error of a 2xx answer that is not what the delegate's
// kind reads: not retried (the same call would answer the same).
func unreadable(format string, args ...any) *controls.CallError {
	return &controls.CallError{Code: codes.Internal, Message: "the answer could not be read: " + fmt.Sprintf(format, args...)}
}

// httpTransport is an http delegate.
type httpTransport struct {
	*httpClient
	cfg *HTTP
	// stream: the answer streams (http.stream_format, not stream: off).
	stream bool
}

func (t *httpTransport) mayStream() bool { return t.stream }

func (t *httpTransport) call(ctx context.Context, c controls.Call, s *stream) (*stubbornv1.Result, error) {
	var body bytes.Buffer
	data := newBodyData(c.Brief, c.RunID, c.IdempotencyKey, c.Attempt, c.Metadata)
	if err := t.cfg.body.Execute(&body, data); err != nil || !json.Valid(body.Bytes()) {
		// Checked at load on a sample call; a template whose shape
		// depends on the call may still go wrong.
		return nil, &controls.CallError{Code: codes.FailedPrecondition, Refused: true,
			Message: "http.body did not make JSON for this call; fix the delegate's body template"}
	}
	method := t.cfg.Method
	if method == "" {
		method = http.MethodPost
	}
	req, err := http.NewRequestWithContext(ctx, method, t.cfg.URL, &body)
	if err != nil {
		return nil, &controls.CallError{Code: codes.FailedPrecondition, Refused: true, Message: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	setCallHeaders(req, c)
	if h := t.cfg.IdempotencyHeader; h != "-" && c.IdempotencyKey != "" {
		if h == "" {
			h = defaultIdempotencyHeader
		}
		req.Header.Set(h, c.IdempotencyKey)
	}
	for _, kv := range t.cfg.headers {
		req.Header.Set(kv[0], kv[1])
	}
	if !t.stream {
		a, err := t.do(req)
		if err != nil {
			return nil, err
		}
		return t.result(a)
	}
	var last *structpb.Value
	a, err := t.doStream(req, s, t.cfg.StreamFormat, func(ev event) error {
		if string(ev.data) == "[DONE]" {
			return errStreamDone
		}
		text, v, err := t.piece(ev.data)
		if err != nil {
			return err
		}
		if v != nil {
			last = v
		}
		return s.piece(text)
	})
	switch {
	case err != nil:
		return nil, err
	case a != nil:
		return t.result(a) // the server did not stream
	}
	return &stubbornv1.Result{Text: s.joined(), Data: last}, nil
}

// piece reads one streamed event's data: its text at delta_pointer (none
// when the event lacks it), and the event as JSON; without a pointer the
// data is the text.
func (t *httpTransport) piece(data []byte) (string, *structpb.Value, error) {
	p := t.cfg.DeltaPointer
	if p == "" {
		return string(data), nil, nil
	}
	v := &structpb.Value{}
	if err := protojson.Unmarshal(data, v); err != nil {
		return "", nil, unreadable("http.delta_pointer %s needs each streamed event to be JSON: %v", p, err)
	}
	at, err := pointer(v, p)
	if err != nil {
		return "", v, nil // an event without text (a start, an end, usage)
	}
	if _, isNull := at.GetKind().(*structpb.Value_NullValue); isNull {
		return "", v, nil
	}
	return textOf(at), v, nil
}

// result reads an answer: the text at text_pointer (or the whole body) and
// a JSON body as data.
func (t *httpTransport) result(a *answer) (*stubbornv1.Result, error) {
	var data *structpb.Value
	if len(bytes.TrimSpace(a.body)) > 0 {
		v := &structpb.Value{}
		if err := protojson.Unmarshal(a.body, v); err == nil {
			data = v
		}
	}
	p := t.cfg.TextPointer
	if p == "" {
		return &stubbornv1.Result{Text: strings.ToValidUTF8(string(a.body), "\uFFFD"), Data: data}, nil
	}
	if data == nil {
		return nil, unreadable("http.text_pointer %s needs a JSON body; got %d bytes of %s", p, len(a.body), orUnknown(a.contentType))
	}
	v, err := pointer(data, p)
	if err != nil {
		return nil, unreadable("http.text_pointer %s: %v", p, err)
	}
	return &stubbornv1.Result{Text: textOf(v), Data: data}, nil
}

func orUnknown(contentType string) string {
	if contentType == "" {
		return "no content type"
	}
	return controls.Cut(contentType, 100)
}

// textOf is a JSON value as text: a string as it is, anything else encoded.
func textOf(v *structpb.Value) string {
	if s, ok := v.GetKind().(*structpb.Value_StringValue); ok {
		return s.StringValue
	}
	b, err := protojson.Marshal(v)
	if err != nil {
		return ""
	}
	return string(b)
}

// pointer resolves a JSON pointer (RFC 6901) in v.
func pointer(v *structpb.Value, p string) (*structpb.Value, error) {
	at := ""
	for _, tok := range strings.Split(p, "/")[1:] {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		at += "/" + tok
		switch k := v.GetKind().(type) {
		case *structpb.Value_StructValue:
			next, ok := k.StructValue.GetFields()[tok]
			if !ok {
				return nil, fmt.Errorf("the answer has no %s", at)
			}
			v = next
		case *structpb.Value_ListValue:
			i, err := strconv.Atoi(tok)
			items := k.ListValue.GetValues()
			if err != nil || i < 0 || i >= len(items) || (len(tok) > 1 && tok[0] == '0') {
				return nil, fmt.Errorf("the answer has no %s (a list of %d)", at, len(items))
			}
			v = items[i]
		default:
			return nil, fmt.Errorf("the answer has no %s (not an object or a list)", at)
		}
	}
	return v, nil
}

// resultTooLarge is the error of an answer over max_result_bytes: refused
// by Stubborn, and not retried (the same call would answer the same).
func resultTooLarge(maxResult int, what string) *controls.CallError {
	return &controls.CallError{
		Code:    codes.ResourceExhausted,
		Message: fmt.Sprintf("%s, more than limits.max_result_bytes (%d)", what, maxResult),
		Refused: true,
	}
}
