package server_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/memstore"
	"github.com/stubbornhq/stubborn/internal/runs/store"
	"github.com/stubbornhq/stubborn/internal/server"
)

// countingStore is the default in-memory store, noting every run id it is
// asked about.
type countingStore struct {
	store.Store
	mu  sync.Mutex
	ids []string
}

func (s *countingStore) saw(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ids = append(s.ids, id)
}

// seen returns the run ids the store was asked about so far.
func (s *countingStore) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.ids...)
}

func (s *countingStore) Append(ctx context.Context, w *store.Writer, evs ...store.Event) error {
	for _, ev := range evs {
		s.saw(ev.RunID)
	}
	return s.Store.Append(ctx, w, evs...)
}

func (s *countingStore) Events(ctx context.Context, id string, after int64) ([]runs.Event, error) {
	s.saw(id)
	return s.Store.Events(ctx, id, after)
}

func (s *countingStore) Follow(ctx context.Context, id string, after int64, fn func(runs.Event) error) error {
	s.saw(id)
	return s.Store.Follow(ctx, id, after, fn)
}

func (s *countingStore) PutState(ctx context.Context, id string, state []byte) error {
	s.saw(id)
	return s.Store.PutState(ctx, id, state)
}

func (s *countingStore) State(ctx context.Context, id string) (*stubbornv1.ControlState, error) {
	s.saw(id)
	return s.Store.State(ctx, id)
}

func (s *countingStore) Claim(ctx context.Context, id, owner string, state []byte) error {
	s.saw(id)
	return s.Store.Claim(ctx, id, owner, state)
}

func (s *countingStore) Driver(ctx context.Context, id string) (string, error) {
	s.saw(id)
	return s.Store.Driver(ctx, id)
}

func (s *countingStore) TakeOver(ctx context.Context, id, from, owner string) error {
	s.saw(id)
	return s.Store.TakeOver(ctx, id, from, owner)
}

func (s *countingStore) Release(ctx context.Context, id string) error {
	s.saw(id)
	return s.Store.Release(ctx, id)
}

func (s *countingStore) Send(ctx context.Context, owner string, cmd *store.Command) (*stubbornv1.ControlState, error) {
	s.saw(cmd.RunID)
	return s.Store.Send(ctx, owner, cmd)
}

// boundsEnv is a server over a countingStore, with the echo delegate under
// its name and under the longest name allowed, logging into logs.
type boundsEnv struct {
	client   stubbornv1.ControlServiceClient
	conn     *grpc.ClientConn
	store    *countingStore
	server   *server.Stubborn
	logs     *syncBuffer
	longName string
}

func startBounds(t *testing.T) *boundsEnv {
	t.Helper()
	e := &boundsEnv{
		store: &countingStore{Store: memstore.NewMemory(runs.DefaultLease)},
		logs:  &syncBuffer{},
		// The longest name: MaxNameBytes bytes, ending in a two-byte letter.
		longName: strings.Repeat("n", delegates.MaxNameBytes-2) + "é",
	}
	require.Len(t, e.longName, delegates.MaxNameBytes)
	cfg := &delegates.Config{}
	for _, name := range []string{"echo", e.longName} {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		s := demo.Serve(lis, demo.Echo{})
		t.Cleanup(s.Stop)
		cfg.Delegates = append(cfg.Delegates, delegates.Delegate{Name: name, Target: lis.Addr().String(), Idempotent: true, Timeout: delegates.Duration(time.Minute)})
	}
	st, err := server.New(server.Config{
		Registry: cfg,
		Logger:   slog.New(slog.NewTextHandler(e.logs, nil)),
		Runs:     runs.Config{Store: e.store, CancelOnClose: true},
	})
	require.NoError(t, err)
	e.server = st
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = st.Serve(lis) }()
	e.conn, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	e.client = stubbornv1.NewControlServiceClient(e.conn)
	t.Cleanup(func() {
		_ = e.conn.Close()
		st.Stop(5 * time.Second)
	})
	return e
}

// badRequest checks that err is INVALID_ARGUMENT whose BadRequest names
// exactly field, and returns its message.
func badRequest(t *testing.T, err error, field string) string {
	t.Helper()
	st := status.Convert(err)
	require.Equal(t, codes.InvalidArgument, st.Code(), st.Message())
	var fields []string
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				fields = append(fields, v.GetField())
			}
		}
	}
	assert.Equal(t, []string{field}, fields, st.Message())
	return st.Message()
}

// TestOverlongRunIDNeverReachesTheStore: a run_id of 4,000 characters, or
// one that would be a NATS wildcard, is INVALID_ARGUMENT from every RPC
// that takes one, before the store hears of it (on JetStream it became part
// of a subject, and NATS closed the server's connection over it); the
// message and the log do not repeat it, and the server goes on. A run_id at
// the limit does reach the store, and is NOT_FOUND.
func TestOverlongRunIDNeverReachesTheStore(t *testing.T) {
	e := startBounds(t)
	ctx := testCtx(t)
	long := strings.Repeat("a", 4000)
	calls := map[string]func(id string) error{
		"GetRun": func(id string) error {
			_, err := e.client.GetRun(ctx, &stubbornv1.GetRunRequest{RunId: id})
			return err
		},
		"CancelRun": func(id string) error {
			_, err := e.client.CancelRun(ctx, &stubbornv1.CancelRunRequest{RunId: id})
			return err
		},
		"DecideRun": func(id string) error {
			_, err := e.client.DecideRun(ctx, &stubbornv1.DecideRunRequest{RunId: id, Decision: stubbornv1.Decision_DECISION_RETRY})
			return err
		},
		"WatchRun": func(id string) error {
			s, err := e.client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: id})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		},
	}
	for name, call := range calls {
		for _, id := range []string{long, strings.Repeat("a", 65), "run_*", "run.>", "run a"} {
			msg := badRequest(t, call(id), "run_id")
			assert.Less(t, len(msg), 256, "%s(%.20q): %s", name, id, msg)
			assert.NotContains(t, msg, strings.Repeat("a", 65), name)
		}
	}
	assert.Empty(t, e.store.seen(), "the store was asked about a refused run id")
	assert.NotContains(t, e.logs.String(), strings.Repeat("a", 65), "a refused run id is logged")

	// At the limit: well formed, so it is looked up.
	atLimit := strings.Repeat("b", 64)
	for name, call := range calls {
		st := status.Convert(call(atLimit))
		assert.Equal(t, codes.NotFound, st.Code(), "%s: %s", name, st.Message())
		assert.Less(t, len(st.Message()), 256, name)
	}
	assert.Contains(t, e.store.seen(), atLimit)

	// The server is still whole: a run starts and finishes.
	res, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "still here", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}})
	require.NoError(t, err)
	w, err := e.client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: res.GetRunId()})
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, lastState(t, collect(t, w)).GetStatus())
	h, err := healthpb.NewHealthClient(e.conn).Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, h.GetStatus())
}

// TestPageTokenIsBounded: a page_token over 256 bytes, or with a character
// no token has, is INVALID_ARGUMENT naming page_token before any run is
// read; one of the right shape that this server did not issue is refused
// by the runs layer; a token it issued pages on.
func TestPageTokenIsBounded(t *testing.T) {
	e := startBounds(t)
	ctx := testCtx(t)
	for range 3 {
		_, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "x", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}})
		require.NoError(t, err)
	}
	over := strings.Repeat("A", 257)
	msg := badRequest(t, func() error {
		_, err := e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{PageToken: over})
		return err
	}(), "page_token")
	assert.Equal(t, "page_token: is 257 bytes, more than the limit of 256", msg)
	badRequest(t, func() error {
		_, err := e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{PageToken: "MTIz/w=="})
		return err
	}(), "page_token")

	_, err := e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{PageToken: strings.Repeat("A", 256)})
	st := status.Convert(err)
	assert.Equal(t, codes.InvalidArgument, st.Code())
	assert.Equal(t, "page_token is not valid", st.Message(), "the shape passes; the runs layer refuses a token it did not issue")

	page, err := e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{PageSize: 2})
	require.NoError(t, err)
	require.NotEmpty(t, page.GetNextPageToken())
	next, err := e.client.ListRuns(ctx, &stubbornv1.ListRunsRequest{PageSize: 2, PageToken: page.GetNextPageToken()})
	require.NoError(t, err)
	assert.Len(t, next.GetRuns(), 1)
}

// TestDelegateNameAtTheLimitRuns: a delegate whose name is exactly 128
// bytes can be configured and called; one byte more is INVALID_ARGUMENT,
// and the name is not repeated.
func TestDelegateNameAtTheLimitRuns(t *testing.T) {
	e := startBounds(t)
	ctx := testCtx(t)
	s, err := e.client.Run(ctx, &stubbornv1.RunRequest{TaskBrief: "hi", Race: &stubbornv1.RaceSpec{Candidates: []string{e.longName}}})
	require.NoError(t, err)
	st := lastState(t, collect(t, s))
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, st.GetStatus())
	assert.Equal(t, e.longName, st.GetWinner())

	over := e.longName + "x"
	_, err = e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "hi", Race: &stubbornv1.RaceSpec{Candidates: []string{"echo", over}}})
	msg := badRequest(t, err, "race.candidates[1]")
	assert.Equal(t, "race.candidates[1]: is 129 bytes, more than the limit of 128", msg)
}

// TestManyViolationsFitInTrailers: a request with very many violations (a
// chain of 60 empty names, under a max_chain of 100, besides an empty
// brief and wrong options) is INVALID_ARGUMENT whose status stays far
// below the 8 KiB of trailers C-core clients accept: it names the first
// violations and counts the rest, in the message and in the BadRequest
// detail. (Python got "INTERNAL: Received RST_STREAM" instead.)
func TestManyViolationsFitInTrailers(t *testing.T) {
	e := startWith(t, setup{limits: delegates.Limits{MaxChain: 100}})
	ctx := testCtx(t)
	chain := make([]string, 60)
	md := map[string]string{}
	for i := range 40 {
		md[fmt.Sprintf("k%02d\x01", i)] = strings.Repeat("v", 2000)
	}
	opts := &stubbornv1.RunOptions{IdempotencyKey: strings.Repeat("\n", 300), Metadata: md, RunTimeout: durationpb.New(-time.Second)}
	check := func(name string, err error) {
		t.Helper()
		st := status.Convert(err)
		require.Equal(t, codes.InvalidArgument, st.Code(), "%s: %.200s", name, st.Message())
		// grpc-message carries the message, grpc-status-details-bin the
		// status again, details and all.
		size := len(st.Message()) + proto.Size(st.Proto())
		assert.Less(t, size, 4<<10, "%s: %d bytes of status", name, size)
		var entries []*errdetails.BadRequest_FieldViolation
		for _, d := range st.Details() {
			if br, ok := d.(*errdetails.BadRequest); ok {
				entries = append(entries, br.GetFieldViolations()...)
			}
		}
		require.NotEmpty(t, entries, name)
		assert.LessOrEqual(t, len(entries), 11, name)
		assert.Equal(t, "task_brief", entries[0].GetField(), name)
		assert.Equal(t, "fallback_chain.chain[0]", entries[1].GetField(), name)
		last := entries[len(entries)-1]
		assert.Regexp(t, `^…and \d+ more violations$`, last.GetDescription(), name)
		assert.True(t, strings.HasSuffix(st.Message(), "; "+last.GetDescription()), "%s: %s", name, st.Message())
	}
	_, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: chain}, Options: opts})
	check("StartRun", err)
	s, err := e.client.Run(ctx, &stubbornv1.RunRequest{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: chain}, Options: opts})
	require.NoError(t, err)
	_, err = s.Recv()
	check("Run", err)
}

// rawCodec is a client codec that sends a []byte as it is: bytes that
// proto.Marshal would refuse to make. Everything else is gRPC's proto
// codec's.
type rawCodec struct{ encoding.CodecV2 }

func newRawCodec() rawCodec { return rawCodec{encoding.GetCodecV2("proto")} }

func (c rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := v.([]byte); ok {
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return c.CodecV2.Marshal(v)
}

// withBadUTF8 encodes m with every "@BAD@" in it made 5 bytes that are not
// UTF-8.
func withBadUTF8(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	require.NoError(t, err)
	require.Contains(t, string(b), "@BAD@")
	return bytes.ReplaceAll(b, []byte("@BAD@"), []byte("\xff\xfe\xc3\x28\x80"))
}

// TestMalformedRequestsAreInvalidArgument: a request that is not valid
// protobuf — a string field holding invalid UTF-8, or broken wire format —
// is INVALID_ARGUMENT naming the field, from unary calls and from streams
// alike, not gRPC's "INTERNAL: grpc: failed to unmarshal the received
// message"; the call is logged with its code, nothing is kept for it, and
// the server goes on serving.
func TestMalformedRequestsAreInvalidArgument(t *testing.T) {
	e := startBounds(t)
	ctx := testCtx(t)
	raw := grpc.ForceCodecV2(newRawCodec())
	unary := func(method string, b []byte) error {
		return e.conn.Invoke(ctx, "/stubborn.v1.ControlService/"+method, b, &emptypb.Empty{}, raw)
	}
	stream := func(method string, b []byte) error {
		desc := &grpc.StreamDesc{StreamName: method, ServerStreams: true}
		s, err := e.conn.NewStream(ctx, desc, "/stubborn.v1.ControlService/"+method, raw)
		require.NoError(t, err)
		require.NoError(t, s.SendMsg(b))
		require.NoError(t, s.CloseSend())
		return s.RecvMsg(&emptypb.Empty{})
	}
	echo := &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}
	truncated, err := proto.Marshal(&stubbornv1.StartRunRequest{TaskBrief: "a brief", FallbackChain: echo})
	require.NoError(t, err)
	truncated = truncated[:len(truncated)-3]
	tests := []struct {
		name, field, msg string
		err              error
	}{
		{"StartRun, task_brief", "task_brief", "task_brief: is not valid UTF-8",
			unary("StartRun", withBadUTF8(t, &stubbornv1.StartRunRequest{TaskBrief: "brief @BAD@", FallbackChain: echo}))},
		{"StartRun, a chain element", "fallback_chain.chain[2]", "fallback_chain.chain[2]: is not valid UTF-8",
			unary("StartRun", withBadUTF8(t, &stubbornv1.StartRunRequest{TaskBrief: "x", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo", "echo", "@BAD@"}}}))},
		{"StartRun, a metadata key", "options.metadata", "options.metadata: a key is not valid UTF-8",
			unary("StartRun", withBadUTF8(t, &stubbornv1.StartRunRequest{TaskBrief: "x", FallbackChain: echo, Options: &stubbornv1.RunOptions{Metadata: map[string]string{"@BAD@": "v"}}}))},
		{"Run, task_brief", "task_brief", "task_brief: is not valid UTF-8",
			stream("Run", withBadUTF8(t, &stubbornv1.RunRequest{TaskBrief: "@BAD@", FallbackChain: echo}))},
		{"WatchRun, run_id", "run_id", "run_id: is not valid UTF-8",
			stream("WatchRun", withBadUTF8(t, &stubbornv1.WatchRunRequest{RunId: "run_@BAD@"}))},
		{"GetRun, run_id", "run_id", "run_id: is not valid UTF-8",
			unary("GetRun", withBadUTF8(t, &stubbornv1.GetRunRequest{RunId: "run_@BAD@"}))},
		{"StartRun, truncated", "request", "request: is not a valid protobuf message: its wire format cannot be parsed",
			unary("StartRun", truncated)},
		{"Run, truncated", "request", "request: is not a valid protobuf message: its wire format cannot be parsed",
			stream("Run", truncated)},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.msg, badRequest(t, tt.err, tt.field), tt.name)
	}
	assert.Equal(t, 0, server.PendingMalformed(e.server), "every noted request was answered and forgotten")
	assert.Empty(t, e.store.seen(), "no malformed request reached the store")
	logs := e.logs.String()
	assert.Contains(t, logs, "grpc.method=GetRun")
	assert.Contains(t, logs, "grpc.code=InvalidArgument")
	assert.NotContains(t, logs, "\xff\xfe")

	// The server still serves, through the same connection.
	res, err := e.client.StartRun(ctx, &stubbornv1.StartRunRequest{TaskBrief: "still here", FallbackChain: echo})
	require.NoError(t, err)
	w, err := e.client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: res.GetRunId()})
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, lastState(t, collect(t, w)).GetStatus())
	s, err := e.client.Run(ctx, &stubbornv1.RunRequest{TaskBrief: "and streams", FallbackChain: echo})
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, lastState(t, collect(t, s)).GetStatus())
	assert.Equal(t, 0, server.PendingMalformed(e.server))
}
