package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/jsstore"
	"github.com/stubbornhq/stubborn/internal/server"
)

// FuzzAPI sends mutated requests to every RPC of one real Stubborn server
// per fuzz process, on the embedded JetStream store, over loopback gRPC,
// and after each checks what issue 17 found broken: the call ends with a
// status that is neither INTERNAL nor UNKNOWN (a panic is INTERNAL too) and
// fits in the 8 KiB of trailers C-core clients accept; no answer is larger
// than a client's default 4 MiB; health says SERVING and the store still
// answers (GetRun of a well-formed unknown id is NOT_FOUND); no malformed
// request is left noted. Every apiCheckEvery inputs, and once more at the
// end of the process, a normal run is started and must succeed within 10 s,
// and every run that has not ended must be driven by this server.
//
// An input is a selector — its low 7 bits pick the RPC (modulo 7) and a
// variant (the quotient), its high bit whether raw is sent as the request's
// wire bytes as it is — and, otherwise, fuzzer strings placed into the
// request's fields, then encoded (strings that are not UTF-8 included,
// which proto.Marshal refuses to write: see apiRequest).
func FuzzAPI(f *testing.F) {
	e := startAPIFuzz(f)
	for _, s := range apiSeeds() {
		f.Add(s.sel, s.raw, s.id, s.brief, s.names, s.meta, s.cel, s.n)
	}
	f.Fuzz(func(t *testing.T, sel uint8, raw []byte, id, brief, names, meta, cel string, n int64) {
		if e.inputs%apiCheckEvery == 0 {
			e.checkpoint(t)
		}
		e.inputs++
		rpc := apiRPCs[int(sel&0x7f)%len(apiRPCs)]
		in := apiInput{variant: int(sel&0x7f) / len(apiRPCs), id: id, brief: brief, names: names, meta: meta, cel: cel, n: n}
		b, what := raw, "raw bytes"
		if sel&0x80 == 0 {
			in.recent, in.token = e.recentID(in.variant/2), e.lastToken
			b, what = apiRequest(t, rpc.build(&in)), "fields"
		}
		err := e.call(rpc, b)
		e.checkStatus(t, fmt.Sprintf("%s with %s %.300q", rpc.name, what, b), err)
		e.checkAlive(t)
	})
}

// apiCheckEvery is how often, in inputs, a fuzz process checks that a
// normal run still succeeds and that every run in flight has its driver.
const apiCheckEvery = 50

// apiUnknownID is a well-formed run id that no server makes (ids start
// with their creation time).
const apiUnknownID = "run_00000000000000000000000000000"

// apiFuzz is the server under fuzz, and what inputs remember of it.
type apiFuzz struct {
	server *server.Stubborn
	store  *jsstore.JetStream
	conn   *grpc.ClientConn
	client stubbornv1.ControlServiceClient
	health healthpb.HealthClient
	logs   *tailBuffer

	inputs    int      // inputs run in this process
	recent    []string // ids of runs started lately, newest last
	lastToken string   // the last next_page_token ListRuns gave
}

// startAPIFuzz starts, for the whole fuzz process, demo delegates and a
// Stubborn server on an embedded JetStream store, as `stubborn serve` does
// by default: health follows the store's NATS connection.
func startAPIFuzz(f *testing.F) *apiFuzz {
	f.Helper()
	e := &apiFuzz{logs: &tailBuffer{max: 32 << 10}}
	logger := slog.New(dropCalls{slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelWarn})})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	ns, err := jsstore.StartEmbedded(jsstore.EmbeddedConfig{DataDir: f.TempDir(), Logger: logger})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(ns.Close)
	e.store, err = jsstore.NewJetStream(ctx, ns.Conn, jsstore.JetStreamConfig{Logger: logger})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = e.store.Close() })

	// A chain as long as the 60 empty names of issue 17 is checked name
	// by name, not refused for its length.
	cfg := &delegates.Config{Limits: delegates.Limits{MaxChain: 100}}
	for name, svc := range map[string]stubbornv1.DelegateServiceServer{
		"echo":  demo.Echo{},
		"flaky": &demo.Flaky{FailFirst: 2},
		"down":  demo.Down{},
	} {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			f.Fatal(err)
		}
		s := demo.Serve(lis, svc)
		f.Cleanup(s.Stop)
		cfg.Delegates = append(cfg.Delegates, delegates.Delegate{
			Name: name, Target: lis.Addr().String(), Idempotent: true, Timeout: delegates.Duration(5 * time.Second),
		})
	}
	// Delegates that answer with what the fuzzer wrote (issue 30): an
	// http one whose answer is the brief it is sent, and a model whose
	// usage is (JSON of every depth and size, and not JSON).
	answer, model := briefAnswers(f)
	cfg.Delegates = append(cfg.Delegates,
		delegates.Delegate{Name: "answer", HTTP: &delegates.HTTP{URL: answer}, Idempotent: true, Timeout: delegates.Duration(5 * time.Second)},
		delegates.Delegate{Name: "model", OpenAI: &delegates.OpenAI{ModelAPI: delegates.ModelAPI{BaseURL: model, Model: "m"}}, Idempotent: true, Timeout: delegates.Duration(5 * time.Second)},
	)
	e.server, err = server.New(server.Config{Registry: cfg, Logger: logger, Runs: runs.Config{Store: e.store, SoleOwner: true}})
	if err != nil {
		f.Fatal(err)
	}
	stopWatch := jsstore.WatchConn(ns.Conn, logger, func(st jsstore.ConnState, _ error) { e.server.SetServing(st == jsstore.ConnUp) })
	f.Cleanup(stopWatch)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	go func() { _ = e.server.Serve(lis) }()
	f.Cleanup(func() { e.server.Stop(5 * time.Second) })
	e.conn, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = e.conn.Close() })
	e.client = stubbornv1.NewControlServiceClient(e.conn)
	e.health = healthpb.NewHealthClient(e.conn)
	// Last registered, first run: the server is whole at the end too.
	f.Cleanup(func() { e.checkpoint(f) })
	return e
}

// call sends b as the request of rpc and returns how the call ended: a
// stream is read for at most a few messages, and hung up on after that, or
// when none comes for a moment (a run waiting, a watch past the last
// event): a hang-up returns nil. Every call has a deadline.
func (e *apiFuzz) call(rpc apiRPC, b []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	raw := grpc.ForceCodecV2(newRawCodec())
	method := "/stubborn.v1.ControlService/" + rpc.name
	if !rpc.stream {
		out := rpc.answer()
		err := e.conn.Invoke(ctx, method, b, out, raw)
		e.remember(out)
		return err
	}
	s, err := e.conn.NewStream(ctx, &grpc.StreamDesc{StreamName: rpc.name, ServerStreams: true}, method, raw)
	if err != nil {
		return err
	}
	if err := s.SendMsg(b); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	msgs := make(chan proto.Message)
	end := make(chan error, 1)
	go func() {
		for {
			out := rpc.answer()
			if err := s.RecvMsg(out); err != nil {
				end <- err
				return
			}
			select {
			case msgs <- out:
			case <-ctx.Done():
				end <- ctx.Err()
				return
			}
		}
	}()
	const idle = 50 * time.Millisecond
	timer := time.NewTimer(idle)
	defer timer.Stop()
	for got := 0; got < 5; {
		select {
		case out := <-msgs:
			e.remember(out)
			got++
			timer.Reset(idle)
			continue
		case err := <-end:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-timer.C:
		}
		break // idle
	}
	cancel() // hang up
	<-end
	return nil
}

// remember keeps the run ids and page tokens answers carry, for the
// variants that use them.
func (e *apiFuzz) remember(out proto.Message) {
	id := ""
	switch m := out.(type) {
	case *stubbornv1.StartRunResponse:
		id = m.GetRunId()
	case *stubbornv1.RunResponse:
		if m.GetEvent().GetRunStarted() != nil {
			id = m.GetEvent().GetRunId()
		}
	case *stubbornv1.ListRunsResponse:
		if m.GetNextPageToken() != "" {
			e.lastToken = m.GetNextPageToken()
		}
	}
	if id != "" {
		e.recent = append(e.recent, id)
		if len(e.recent) > 8 {
			e.recent = e.recent[1:]
		}
	}
}

// recentID picks one of the runs started lately, counting from the
// newest, or "".
func (e *apiFuzz) recentID(i int) string {
	if len(e.recent) == 0 {
		return ""
	}
	return e.recent[len(e.recent)-1-i%len(e.recent)]
}

// checkStatus fails t for an end of call that is a bug.
func (e *apiFuzz) checkStatus(t *testing.T, what string, err error) {
	t.Helper()
	st := status.Convert(err)
	switch st.Code() {
	case codes.Internal, codes.Unknown:
		t.Fatalf("%s: %s: %.1000s\nserver log:\n%s", what, st.Code(), st.Message(), e.logs)
	case codes.ResourceExhausted:
		if strings.Contains(st.Message(), "received message larger than max") {
			t.Fatalf("%s: the answer is larger than a client accepts by default: %.300s", what, st.Message())
		}
	}
	// grpc-message carries the message, grpc-status-details-bin the status
	// again with its details.
	if size := len(st.Message()) + proto.Size(st.Proto()); size > 8<<10 {
		t.Fatalf("%s: %s status of %d bytes, over the 8 KiB of trailers C-core clients accept: %.300s", what, st.Code(), size, st.Message())
	}
}

// checkAlive fails t unless the server says it serves and its store
// answers, and it forgot every malformed request it answered.
func (e *apiFuzz) checkAlive(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h, err := e.health.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v, %v\nserver log:\n%s", h.GetStatus(), err, e.logs)
	}
	_, err = e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: apiUnknownID})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("GetRun of an unknown run, with health SERVING: %v, not NOT_FOUND\nserver log:\n%s", err, e.logs)
	}
	for server.PendingMalformed(e.server) != 0 {
		if ctx.Err() != nil {
			t.Fatalf("%d malformed requests noted and never answered", server.PendingMalformed(e.server))
		}
		time.Sleep(time.Millisecond)
	}
}

// checkpoint fails t unless the server is alive, a normal run succeeds
// within 10 s, and every run that has not ended is driven by this server.
// Each read of the store has 5 s to answer.
func (e *apiFuzz) checkpoint(t testing.TB) {
	t.Helper()
	e.checkAlive(t)
	e.checkNormalRun(t)
	owner := e.server.Runs.Owner()
	for _, st := range []stubbornv1.RunStatus{
		stubbornv1.RunStatus_RUN_STATUS_PENDING, stubbornv1.RunStatus_RUN_STATUS_RUNNING,
		stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF, stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION,
	} {
		for token, more := "", true; more; more = token != "" {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			// The check reads whole pages, whatever their size.
			page, err := e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{Status: st, PageSize: 100, PageToken: token}, grpc.MaxCallRecvMsgSize(1<<30))
			if err != nil {
				cancel()
				t.Fatalf("ListRuns %v: %v\nserver log:\n%s", st, err, e.logs)
			}
			for _, r := range page.GetRuns() {
				e.checkDriven(ctx, t, r, owner)
			}
			cancel()
			token = page.GetNextPageToken()
		}
	}
	e.checkListings(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.store.Owners(ctx, func(id, o string) bool {
		if o != owner {
			t.Errorf("run %s is driven by %q, not by this server (%q), the store's only one", id, o, owner)
		}
		return true
	}); err != nil {
		t.Fatalf("listing the runs' drivers: %v", err)
	}
}

// checkNormalRun fails t unless a fallback chain of echo, started and
// watched, succeeds within 10 s.
func (e *apiFuzz) checkNormalRun(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "checkpoint", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}})
	if err != nil {
		t.Fatalf("a normal run: %v\nserver log:\n%s", err, e.logs)
	}
	w, err := e.client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: res.GetRunId()})
	if err != nil {
		t.Fatalf("watching a normal run: %v", err)
	}
	var last *stubbornv1.RunEvent
	for {
		m, err := w.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("watching a normal run after %v: %v\nserver log:\n%s", last, err, e.logs)
		}
		last = m.GetEvent()
	}
	if got := last.GetRunFinished().GetState().GetStatus(); got != stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("a normal run ended with %v (%v)\nserver log:\n%s", got, last, e.logs)
	}
}

// checkDriven fails t if run r, listed as not ended, has no driver or
// another one, and has still not ended.
func (e *apiFuzz) checkDriven(ctx context.Context, t testing.TB, r *stubbornv1.ControlState, owner string) {
	t.Helper()
	d, err := e.store.Driver(ctx, r.GetRunId())
	if err != nil {
		t.Fatalf("the driver of %s: %v", r.GetRunId(), err)
	}
	if d == owner {
		return
	}
	// It may have ended since it was listed, and let go of its claim.
	now, err := e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: r.GetRunId()}, grpc.MaxCallRecvMsgSize(1<<30))
	if err != nil {
		t.Fatalf("GetRun %s: %v", r.GetRunId(), err)
	}
	if now.GetState().GetEndTime() == nil {
		t.Fatalf("run %s is %v with driver %q, not this server (%q)\nserver log:\n%s", r.GetRunId(), now.GetState().GetStatus(), d, owner, e.logs)
	}
}

// dropCalls leaves out the log of every call that did not end OK: most of
// the fuzzer's do not.
type dropCalls struct{ slog.Handler }

func (h dropCalls) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "finished call" {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h dropCalls) WithAttrs(attrs []slog.Attr) slog.Handler {
	return dropCalls{h.Handler.WithAttrs(attrs)}
}

func (h dropCalls) WithGroup(name string) slog.Handler { return dropCalls{h.Handler.WithGroup(name)} }

// tailBuffer keeps the last max bytes written to it, for a failure to
// show the server's latest warnings and errors.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (l *tailBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = append(l.b, p...)
	if over := len(l.b) - l.max; over > 0 {
		l.b = append(l.b[:0], l.b[over:]...)
	}
	return len(p), nil
}

func (l *tailBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b)
}

// briefAnswers serves, on loopback, the URL of an http delegate that
// answers with the brief it is sent, and the base URL of a Chat
// Completions endpoint whose answer's usage is the brief (as it is when
// it is JSON, else as a JSON string).
func briefAnswers(f *testing.F) (answer, model string) {
	brief := func(r *http.Request) string {
		var req struct {
			Brief    string                     `json:"brief"`
			Messages []struct{ Content string } `json:"messages"`
		}
		_ = json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req)
		if len(req.Messages) > 0 {
			return req.Messages[len(req.Messages)-1].Content
		}
		return req.Brief
	}
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, brief(r))
	}))
	f.Cleanup(a.Close)
	m := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		usage := brief(r)
		if !json.Valid([]byte(usage)) {
			b, _ := json.Marshal(usage)
			usage = string(b)
		}
		_, _ = io.WriteString(w, `{"model":"m","choices":[{"message":{"content":"ok"},"finish_reason":"stop"}],"usage":`+usage+`}`)
	}))
	f.Cleanup(m.Close)
	return a.URL, m.URL + "/v1"
}

// checkListings fails t unless every run can be listed, in both views,
// and read (issue 30: one run with an answer nested too deep made every
// listing and its own GetRun INTERNAL).
func (e *apiFuzz) checkListings(t testing.TB) {
	t.Helper()
	for _, view := range []stubbornv1.RunView{stubbornv1.RunView_RUN_VIEW_FULL, stubbornv1.RunView_RUN_VIEW_SUMMARY} {
		for token, more := "", true; more; more = token != "" {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			page, err := e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{View: view, PageSize: 1000, PageToken: token}, grpc.MaxCallRecvMsgSize(1<<30))
			cancel()
			if err != nil {
				t.Fatalf("ListRuns, view %v: %v\nserver log:\n%s", view, err, e.logs)
			}
			token = page.GetNextPageToken()
		}
	}
	for _, id := range e.recent {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id}, grpc.MaxCallRecvMsgSize(1<<30))
		cancel()
		if err != nil {
			t.Fatalf("GetRun %s: %v\nserver log:\n%s", id, err, e.logs)
		}
	}
}
