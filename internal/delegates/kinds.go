package delegates

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"sort"
	"strings"
	"text/template"

	"golang.org/x/net/http/httpguts"

	"github.com/stubbornhq/stubborn/internal/controls"
)

// The kinds of delegate a registry entry may be: exactly one of target
// (gRPC, the default), http, openai or anthropic is set.
const (
	KindGRPC      = "grpc"
	KindHTTP      = "http"
	KindOpenAI    = "openai"
	KindAnthropic = "anthropic"
)

// maxHeaderBytes bounds the headers a delegate entry configures (names and
// values, after ${VAR} expansion): below what HTTP servers commonly accept
// in all (8 KiB), with room for the headers Stubborn adds itself.
const maxHeaderBytes = 6 << 10

// defaultIdempotencyHeader is the header an http delegate's calls carry the
// run's idempotency key in, unless the entry names another (or "-", none).
const defaultIdempotencyHeader = "Idempotency-Key"

// defaultHTTPBody is the body an http delegate is sent when its entry has
// none: every field of the call, JSON-encoded.
const defaultHTTPBody = `{"brief": {{.Brief}}, "run_id": {{.RunID}}, "attempt": {{.Attempt}}, ` +
	`"idempotency_key": {{.IdempotencyKey}}, "metadata": {{.Metadata}}}`

// HTTP is a delegate reached with one JSON-over-HTTP request per call.
type HTTP struct {
	// URL is the endpoint, http:// or https://. Required.
	URL string `yaml:"url"`
	// Method is the HTTP method; empty means POST.
	Method string `yaml:"method,omitempty"`
	// Headers are sent with every call. A value may name environment
	// variables as ${NAME}, read once when the config is loaded (never from
	// a request), so secrets stay out of the file; $$ is a literal $.
	Headers map[string]string `yaml:"headers,omitempty"`
	// Body is a text/template of the request body, which must make JSON.
	// Its fields are already JSON-encoded values, so they are placed as
	// they are: {{.Brief}}, {{.RunID}}, {{.IdempotencyKey}} (strings),
	// {{.Attempt}} (a number), {{.Metadata}} (an object) and
	// {{.Meta "key"}} (one metadata value as a string, or null).
	// Empty means defaultHTTPBody.
	Body string `yaml:"body,omitempty"`
	// TextPointer is a JSON pointer (RFC 6901, such as /choices/0/text)
	// to the answer's text in a JSON body. Empty means the whole body is
	// the text. A JSON body is also the result's data.
	TextPointer string `yaml:"text_pointer,omitempty"`
	// StreamFormat, when set, makes the answer a stream: "sse" (Server-Sent
	// Events: each event's data is one piece) or "ndjson" (one JSON value
	// per line). Empty means one answer.
	StreamFormat string `yaml:"stream_format,omitempty"`
	// DeltaPointer is a JSON pointer to each streamed event's text (such
	// as /choices/0/delta/content); an event without it adds no text.
	// Empty means each event's data is the text as it is (sse only).
	DeltaPointer string `yaml:"delta_pointer,omitempty"`
	// IdempotencyHeader names the header that carries the run's
	// idempotency key; empty means defaultIdempotencyHeader, "-" none.
	IdempotencyHeader string `yaml:"idempotency_header,omitempty"`
	// HealthURL, when set, is asked with GET before a fallback chain or a
	// race calls the delegate: a 2xx answer is serving, any other answer
	// not serving. Without it the delegate is taken as serving.
	HealthURL string `yaml:"health_url,omitempty"`

	// Set by Load/Parse: the headers with their variables expanded, and
	// the parsed body template.
	headers http2Headers
	body    *template.Template
}

// ModelAPI is what the model kinds (openai, anthropic) are configured
// with.
type ModelAPI struct {
	// BaseURL is the API's base: for openai such as
	// https://api.openai.com/v1 or http://127.0.0.1:11434/v1 (the call goes
	// to BaseURL + /chat/completions), for anthropic such as
	// https://api.anthropic.com (the call goes to BaseURL + /v1/messages).
	// Required.
	BaseURL string `yaml:"base_url"`
	// Model is the model name. Required.
	Model string `yaml:"model"`
	// APIKeyEnv names the environment variable holding the API key, read
	// when the config is loaded (openai: a bearer token; anthropic:
	// x-api-key). Empty means no key (a local server); no other variable is
	// ever read.
	APIKeyEnv string `yaml:"api_key_env,omitempty"`
	// System is the system prompt; empty means none.
	System string `yaml:"system,omitempty"`
	// Temperature, when set, is sent as is.
	Temperature *float64 `yaml:"temperature,omitempty"`
	// MaxTokens, when positive, caps the answer's tokens. anthropic
	// requires a cap: zero means 1024 there.
	MaxTokens int `yaml:"max_tokens,omitempty"`
	// HealthURL is as for http; empty means serving.
	HealthURL string `yaml:"health_url,omitempty"`

	apiKey string
}

// OpenAI is a delegate that speaks the OpenAI Chat Completions API (OpenAI,
// vLLM, Ollama, llama.cpp's server, LiteLLM, …): the brief is the user
// message, the answer's text the result's text; the model, finish reason
// and token usage are the result's data.
type OpenAI struct {
	ModelAPI `yaml:",inline"`
}

// Anthropic is a delegate that speaks Anthropic's Messages API: the brief
// is the user message, the answer's text blocks the result's text; the
// model, stop reason and token usage are the result's data.
type Anthropic struct {
	ModelAPI `yaml:",inline"`
}

// http2Headers are configured headers, expanded, in a stable order.
type http2Headers [][2]string

// Kind returns which kind of delegate d is: KindGRPC, KindHTTP, KindOpenAI
// or KindAnthropic ("" when d sets none or several).
func (d Delegate) Kind() string {
	kinds := d.kinds()
	if len(kinds) != 1 {
		return ""
	}
	return kinds[0]
}

func (d Delegate) kinds() []string {
	var k []string
	if strings.TrimSpace(d.Target) != "" {
		k = append(k, KindGRPC)
	}
	if d.HTTP != nil {
		k = append(k, KindHTTP)
	}
	if d.OpenAI != nil {
		k = append(k, KindOpenAI)
	}
	if d.Anthropic != nil {
		k = append(k, KindAnthropic)
	}
	return k
}

// checkKind reports what is wrong with d's kind and its settings, each
// message naming the field, and prepares the settings read at load time
// (environment variables, the body template).
func (d *Delegate) checkKind(lookupEnv func(string) (string, bool)) []string {
	switch k := d.kinds(); {
	case len(k) == 0:
		return []string{"target is empty, and no other kind is set: set one of target (gRPC), http, openai or anthropic"}
	case len(k) > 1:
		return []string{fmt.Sprintf("sets %s: a delegate has one kind; keep one of them", strings.Join(fieldsOf(k), " and "))}
	}
	switch {
	case d.HTTP != nil:
		return d.HTTP.check(lookupEnv)
	case d.OpenAI != nil:
		return d.OpenAI.check(KindOpenAI, lookupEnv)
	case d.Anthropic != nil:
		return d.Anthropic.check(KindAnthropic, lookupEnv)
	}
	return nil
}

// fieldsOf names the config field of each kind.
func fieldsOf(kinds []string) []string {
	out := make([]string, len(kinds))
	for i, k := range kinds {
		out[i] = k
		if k == KindGRPC {
			out[i] = "target"
		}
	}
	return out
}

func (h *HTTP) check(lookupEnv func(string) (string, bool)) []string {
	var bad []string
	if msg := checkURL(h.URL); msg != "" {
		bad = append(bad, "http.url: "+msg)
	}
	if h.HealthURL != "" {
		if msg := checkURL(h.HealthURL); msg != "" {
			bad = append(bad, "http.health_url: "+msg)
		}
	}
	if h.Method != "" && !httpguts.ValidHeaderFieldName(h.Method) {
		bad = append(bad, fmt.Sprintf("http.method: %q is not an HTTP method", h.Method))
	}
	if h.IdempotencyHeader != "" && h.IdempotencyHeader != "-" && !httpguts.ValidHeaderFieldName(h.IdempotencyHeader) {
		bad = append(bad, fmt.Sprintf("http.idempotency_header: %q is not a header name", h.IdempotencyHeader))
	}
	if p := h.TextPointer; p != "" && !strings.HasPrefix(p, "/") {
		bad = append(bad, fmt.Sprintf("http.text_pointer: %q is not a JSON pointer: it starts with / (such as /choices/0/text)", p))
	}
	switch h.StreamFormat {
	case "", "sse":
	case "ndjson":
		if h.DeltaPointer == "" {
			bad = append(bad, "http.delta_pointer: required with stream_format ndjson (such as /response)")
		}
	default:
		bad = append(bad, fmt.Sprintf("http.stream_format: %q is not sse or ndjson", h.StreamFormat))
	}
	if p := h.DeltaPointer; p != "" && !strings.HasPrefix(p, "/") {
		bad = append(bad, fmt.Sprintf("http.delta_pointer: %q is not a JSON pointer: it starts with / (such as /choices/0/delta/content)", p))
	}
	headers, msgs := expandHeaders(h.Headers, lookupEnv)
	bad = append(bad, msgs...)
	h.headers = headers
	body := h.Body
	if body == "" {
		body = defaultHTTPBody
	}
	t, msg := parseBody(body)
	if msg != "" {
		bad = append(bad, "http.body: "+msg)
	}
	h.body = t
	return bad
}

// check reports what is wrong with m (its fields under kind) and reads its
// key.
func (m *ModelAPI) check(kind string, lookupEnv func(string) (string, bool)) []string {
	bad := checkModelAPI(kind, m.BaseURL, m.Model, m.HealthURL, m.MaxTokens)
	key, msg := readKey(kind, m.APIKeyEnv, lookupEnv)
	if msg != "" {
		bad = append(bad, msg)
	}
	m.apiKey = key
	return bad
}

func checkModelAPI(kind, baseURL, model, healthURL string, maxTokens int) []string {
	var bad []string
	if msg := checkURL(baseURL); msg != "" {
		bad = append(bad, kind+".base_url: "+msg)
	}
	if strings.TrimSpace(model) == "" {
		bad = append(bad, kind+".model: is empty")
	}
	if healthURL != "" {
		if msg := checkURL(healthURL); msg != "" {
			bad = append(bad, kind+".health_url: "+msg)
		}
	}
	if maxTokens < 0 {
		bad = append(bad, fmt.Sprintf("%s.max_tokens: must not be negative (got %d)", kind, maxTokens))
	}
	return bad
}

// readKey reads the API key from the environment variable env names.
func readKey(kind, env string, lookupEnv func(string) (string, bool)) (string, string) {
	if env == "" {
		return "", ""
	}
	v, ok := lookupEnv(env)
	if !ok || v == "" {
		return "", fmt.Sprintf("%s.api_key_env: environment variable %s is not set", kind, env)
	}
	if !httpguts.ValidHeaderFieldValue(v) || len(v) > maxHeaderBytes {
		return "", fmt.Sprintf("%s.api_key_env: the value of %s cannot be a header value (control characters, or over %d bytes)", kind, env, maxHeaderBytes)
	}
	return v, ""
}

// checkURL reports what is wrong with an endpoint URL, or "".
func checkURL(s string) string {
	if strings.TrimSpace(s) == "" {
		return "is empty"
	}
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Sprintf("%q is not a URL: %v", s, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Sprintf("%q: the scheme must be http or https", s)
	}
	if u.Host == "" {
		return fmt.Sprintf("%q has no host", s)
	}
	if u.User != nil {
		return "must not carry credentials: put them in a header from an environment variable"
	}
	return ""
}

// expandHeaders checks the configured headers and expands ${NAME} in their
// values from the environment. A message never quotes a value: it may be a
// secret.
func expandHeaders(in map[string]string, lookupEnv func(string) (string, bool)) (http2Headers, []string) {
	names := make([]string, 0, len(in))
	for k := range in {
		names = append(names, k)
	}
	sort.Strings(names)
	var (
		out   http2Headers
		bad   []string
		total int
	)
	for _, k := range names {
		where := "http.headers." + k
		if !httpguts.ValidHeaderFieldName(k) {
			bad = append(bad, fmt.Sprintf("http.headers: %q is not a header name", k))
			continue
		}
		var unset []string
		v := os.Expand(in[k], func(name string) string {
			if name == "$" {
				return "$"
			}
			val, ok := lookupEnv(name)
			if !ok {
				unset = append(unset, name)
			}
			return val
		})
		if len(unset) > 0 {
			bad = append(bad, fmt.Sprintf("%s: environment variable %s is not set", where, strings.Join(unset, ", ")))
			continue
		}
		if !httpguts.ValidHeaderFieldValue(v) {
			bad = append(bad, where+": the value (after expanding variables) has control characters")
			continue
		}
		total += len(k) + len(v)
		out = append(out, [2]string{k, v})
	}
	if total > maxHeaderBytes {
		bad = append(bad, fmt.Sprintf("http.headers: %d bytes in all (after expanding variables), more than %d", total, maxHeaderBytes))
	}
	return out, bad
}

// bodyData is what a body template is executed with: every field already
// encoded as JSON.
type bodyData struct {
	Brief, RunID, IdempotencyKey, Metadata string
	Attempt                                int32
	meta                                   map[string]string
}

// Meta returns metadata value k as a JSON string, or null.
func (d bodyData) Meta(k string) string {
	v, ok := d.meta[k]
	if !ok {
		return "null"
	}
	return jsonString(v)
}

// newBodyData encodes a call's fields for a body template.
func newBodyData(brief, runID, key string, attempt int32, metadata map[string]string) bodyData {
	d := bodyData{
		Brief: jsonString(brief), RunID: jsonString(runID), IdempotencyKey: jsonString(key),
		Attempt: attempt, meta: metadata,
	}
	m := metadata
	if m == nil {
		m = map[string]string{}
	}
	b, _ := json.Marshal(m) // a map of strings always encodes
	d.Metadata = string(b)
	return d
}

func jsonString(s string) string {
	b, _ := json.Marshal(s) // a string always encodes (invalid UTF-8 as U+FFFD)
	return string(b)
}

// parseBody parses a body template and tries it on a sample call: it must
// make JSON. It returns the template, or why it cannot be used.
func parseBody(body string) (*template.Template, string) {
	t, err := template.New("body").Option("missingkey=error").Parse(body)
	if err != nil {
		return nil, err.Error()
	}
	sample := newBodyData("a \"brief\"\n", "run_1", "key-1", 1, map[string]string{"k": "v"})
	var buf bytes.Buffer
	if err := t.Execute(&buf, sample); err != nil {
		return nil, err.Error()
	}
	if !json.Valid(buf.Bytes()) {
		return nil, fmt.Sprintf("does not make JSON (for a sample call it makes %q); the fields are JSON values already: write {{.Brief}}, not \"{{.Brief}}\"", controls.Cut(buf.String(), 200))
	}
	return t, ""
}
