package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
)

// The front door's scenarios (issue #34) measure `stubborn serve`'s
// OpenAI-compatible front door (POST /v1/chat/completions on
// -http-listen) against the SSE model it calls, in the streaming
// scenarios' rotation (streaming.go):
//
//	client ── POST /v1/chat/completions (model: bench) ──> SSE model
//	client ── POST /v1/chat/completions (model: model) ──> stubborn serve ──> SSE model
//	client ── POST /v1/responses        (model: model) ──> stubborn serve ──> SSE model
//
// The four scenarios:
//
//   - proc-sse-plain: the Chat Completions request without stream, to the
//     SSE model, which answers one chat.completion with the whole text
//     when its streamed answer would end;
//   - proc-frontdoor: the same request to the front door, model = the
//     `openai` delegate over the SSE model (which it calls streaming);
//   - proc-frontdoor-stream: with stream: true, to the front door, beside
//     proc-stream-sse, the same request to the SSE model; a call's first
//     output is its first chunk with text;
//   - proc-frontdoor-responses: the Responses API's request without stream
//     (input: the brief) to the front door's POST /v1/responses, beside
//     proc-sse-plain as proc-frontdoor is: the two doors' added latency in
//     one run.
//
// "-scenarios frontdoor" selects these four and proc-stream-sse.
var frontDoorNames = []string{"proc-sse-plain", "proc-frontdoor", "proc-frontdoor-stream", "proc-frontdoor-responses"}

// frontDoorGroup is what "-scenarios frontdoor" selects.
var frontDoorGroup = append([]string{"proc-stream-sse"}, frontDoorNames...)

// frontDoorModel is the model a client of scenario asks for: the delegate
// through the front door, the SSE model's own name directly.
func frontDoorModel(scenario string) string {
	if strings.HasPrefix(scenario, "frontdoor") {
		return modelName
	}
	return "bench"
}

// wantsFrontDoor says whether o selects a scenario through the front door.
func wantsFrontDoor(o options) bool {
	return o.scenarios["proc-frontdoor"] || o.scenarios["proc-frontdoor-stream"] || o.scenarios["proc-frontdoor-responses"]
}

// freeHTTPListen is a loopback address free a moment ago, for serve's
// -http-listen (serve logs the HTTP address it binds, but the bench
// watches its log for the gRPC one).
func freeHTTPListen() (string, error) {
	lis, err := listen()
	if err != nil {
		return "", err
	}
	addr := lis.Addr().String()
	return addr, lis.Close()
}

// frontDoorTargets are the scenarios through s's front door at base (its
// /v1 URL), on store.
func (p *streamProcs) frontDoorTargets(o options, client func(target, scenario string) []string, s *child, store, base string) []shippedTarget {
	if p == nil {
		return nil
	}
	var out []shippedTarget
	for _, sc := range frontDoorNames[1:] {
		if o.scenarios[sc] {
			out = append(out, shippedTarget{scenario: sc, store: store, client: append(client(base, strings.TrimPrefix(sc, "proc-")), o.stream.args()...), server: s, delegate: p.sse})
		}
	}
	return out
}

// waitHTTP waits until the front door at base lists its models.
func waitHTTP(ctx context.Context, s *child, base string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := http.Get(base + "/models")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET /v1/models: %s", resp.Status)
		}
		if err := s.alive(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return s.failure(fmt.Sprintf("no front door at %s within %v (%v)", base, timeout, err))
		}
		if err := sleepUntil(ctx, time.Now().Add(50*time.Millisecond)); err != nil {
			return err
		}
	}
}

// chatClient is an HTTP client keeping a connection for each of conc
// callers.
func chatClient(conc int) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = max(conc, 2)
	return &http.Client{Transport: tr}
}

// plainOp is proc-sse-plain's and proc-frontdoor's call: a Chat
// Completions request without stream; the answer's message must be the
// whole text. Its one output is the whole answer.
func plainOp(base, model string, conc int, sh streamShape, win *window) streamOp {
	want := sh.text()
	hc := chatClient(conc)
	url := strings.TrimSuffix(base, "/") + "/chat/completions"
	body, _ := json.Marshal(map[string]any{"model": model, "messages": []map[string]string{{"role": "user", "content": brief}}})
	return func(ctx context.Context) (streamSample, error) {
		var s streamSample
		t0 := time.Now()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return s, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return s, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return s, err
		}
		if resp.StatusCode != http.StatusOK {
			return s, fmt.Errorf("%s: %.1024s", resp.Status, b)
		}
		var ans struct {
			Object  string `json:"object"`
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(b, &ans); err != nil || ans.Object != "chat.completion" || len(ans.Choices) == 0 {
			return s, fmt.Errorf("not a chat.completion (%v): %.200s", err, b)
		}
		text := ans.Choices[0].Message.Content
		s.seen(t0, len(text), win)
		return s, s.whole(text, want)
	}
}

// responsesOp is proc-frontdoor-responses' call: a Responses API request
// without stream; the response's output_text must be the whole text. Its
// one output is the whole answer.
func responsesOp(base, model string, conc int, sh streamShape, win *window) streamOp {
	want := sh.text()
	hc := chatClient(conc)
	url := strings.TrimSuffix(base, "/") + "/responses"
	body, _ := json.Marshal(map[string]any{"model": model, "input": brief})
	return func(ctx context.Context) (streamSample, error) {
		var s streamSample
		t0 := time.Now()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return s, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return s, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return s, err
		}
		if resp.StatusCode != http.StatusOK {
			return s, fmt.Errorf("%s: %.1024s", resp.Status, b)
		}
		var ans struct {
			Object string `json:"object"`
			Output []struct {
				Content []struct {
					Type string `json:"type"`
					Text string `json:"text"`
				} `json:"content"`
			} `json:"output"`
		}
		if err := json.Unmarshal(b, &ans); err != nil || ans.Object != "response" {
			return s, fmt.Errorf("not a response (%v): %.200s", err, b)
		}
		var text strings.Builder
		for _, o := range ans.Output {
			for _, c := range o.Content {
				if c.Type == "output_text" {
					text.WriteString(c.Text)
				}
			}
		}
		s.seen(t0, text.Len(), win)
		return s, s.whole(text.String(), want)
	}
}

// Issue #34's target: the front door's added p50 (non-streaming, memory
// store, lowest concurrency), µs.
const targetFrontDoorAddedUs = 1000

// printFrontDoor prints the front door beside the direct calls: the added
// p50 (the whole answer; streamed: the first chunk with text) at the
// lowest concurrency and the throughput ratio at the highest, by store.
func printFrontDoor(w io.Writer, load []LoadResult) {
	find := func(sc, store string, c int) (LoadResult, bool) {
		i := slices.IndexFunc(load, func(r LoadResult) bool { return r.Scenario == sc && r.Store == store && r.Concurrency == c })
		if i < 0 {
			return LoadResult{}, false
		}
		return load[i], true
	}
	var stores []string
	lo, hi := 0, 0
	for _, r := range load {
		if !slices.Contains(frontDoorNames[1:], r.Scenario) {
			continue
		}
		if !slices.Contains(stores, r.Store) {
			stores = append(stores, r.Store)
		}
		if lo == 0 || r.Concurrency < lo {
			lo = r.Concurrency
		}
		hi = max(hi, r.Concurrency)
	}
	if len(stores) == 0 {
		return
	}
	fmt.Fprintln(w, "### The front door's overhead (issue 34)")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "POST /v1/chat/completions (and POST /v1/responses: responses) to `stubborn serve`'s front door (model = the `openai` delegate over the SSE model) beside the Chat Completions request to the SSE model. p50: the whole answer (plain, responses) or the first chunk with text (stream), at concurrency %d; throughput at %d. Added = front door − direct.\n\n", lo, hi)
	fmt.Fprintf(w, "| mode | store | p50 front door (direct) | added p50 | ops/s at %d front door (direct) | ratio | target: added p50 |\n", hi)
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|---|")
	for _, m := range []struct{ mode, fd, direct string }{{"plain", "proc-frontdoor", "proc-sse-plain"}, {"stream", "proc-frontdoor-stream", "proc-stream-sse"}, {"responses", "proc-frontdoor-responses", "proc-sse-plain"}} {
		dLo, okDL := find(m.direct, "", lo)
		dHi, okDH := find(m.direct, "", hi)
		p50 := func(r LoadResult) float64 {
			if m.mode == "stream" {
				return r.TTFOP50us
			}
			return r.P50us
		}
		for _, store := range stores {
			fLo, okL := find(m.fd, store, lo)
			fHi, okH := find(m.fd, store, hi)
			if !okL && !okH {
				continue
			}
			lat, added, tput, ratio, target := "–", "–", "–", "–", "–"
			if okL && okDL {
				lat = fmt.Sprintf("%s (%s)", usStr(p50(fLo)), usStr(p50(dLo)))
				added = signedUs(p50(fLo) - p50(dLo))
				if m.mode == "plain" && store == "memory" {
					target = fmt.Sprintf("≤ %s: %s", usStr(targetFrontDoorAddedUs), verdict(p50(fLo)-p50(dLo) <= targetFrontDoorAddedUs))
				}
			}
			if okH && okDH && dHi.OpsPerSec > 0 {
				tput = fmt.Sprintf("%.0f (%.0f)", fHi.OpsPerSec, dHi.OpsPerSec)
				ratio = ratioStr(fHi.OpsPerSec / dHi.OpsPerSec)
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", m.mode, store, lat, added, tput, ratio, target)
		}
	}
	fmt.Fprintln(w)
}
