package server

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// badUTF8Marker stands, in a message to encode, for badUTF8, bytes of the
// same length that are not UTF-8 (proto.Marshal refuses to encode them).
const (
	badUTF8Marker = "@BAD@"
	badUTF8       = "\xff\xfe\xc3\x28\x80"
)

// encodeWithBadUTF8 encodes m with every badUTF8Marker made badUTF8.
func encodeWithBadUTF8(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	require.NoError(t, err)
	require.Contains(t, string(b), badUTF8Marker)
	return bytes.ReplaceAll(b, []byte(badUTF8Marker), []byte(badUTF8))
}

// TestMalformedRequestNamesTheField: for bytes that proto.Unmarshal
// refuses, the status names the first string field holding invalid UTF-8,
// in wire order, however deep (messages, repeated fields with the
// element's index, maps by their field), or else says the request is not a
// valid protobuf message.
func TestMalformedRequestNamesTheField(t *testing.T) {
	t.Parallel()
	chain := func(names ...string) *stubbornv1.StartRunRequest {
		return &stubbornv1.StartRunRequest{TaskBrief: "x", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: names}}
	}
	withOptions := func(o *stubbornv1.RunOptions) *stubbornv1.StartRunRequest {
		r := chain("echo")
		r.Options = o
		return r
	}
	valid, err := proto.Marshal(chain("echo"))
	require.NoError(t, err)
	tests := []struct {
		name  string
		into  proto.Message // the type decoded into
		b     []byte
		field string
		msg   string // the whole message
	}{
		{"task_brief", &stubbornv1.StartRunRequest{}, encodeWithBadUTF8(t, &stubbornv1.StartRunRequest{TaskBrief: "a " + badUTF8Marker}),
			"task_brief", "task_brief: is not valid UTF-8"},
		{"a chain element", &stubbornv1.StartRunRequest{}, encodeWithBadUTF8(t, chain("a", "b", badUTF8Marker, "c")),
			"fallback_chain.chain[2]", "fallback_chain.chain[2]: is not valid UTF-8"},
		{"the first of two, in wire order", &stubbornv1.RunRequest{}, encodeWithBadUTF8(t, &stubbornv1.RunRequest{TaskBrief: badUTF8Marker, Race: &stubbornv1.RaceSpec{Candidates: []string{badUTF8Marker}}}),
			"task_brief", "task_brief: is not valid UTF-8"},
		{"a race candidate", &stubbornv1.RunRequest{}, encodeWithBadUTF8(t, &stubbornv1.RunRequest{TaskBrief: "x", Race: &stubbornv1.RaceSpec{Candidates: []string{"a", badUTF8Marker}}}),
			"race.candidates[1]", "race.candidates[1]: is not valid UTF-8"},
		{"a metadata key", &stubbornv1.StartRunRequest{}, encodeWithBadUTF8(t, withOptions(&stubbornv1.RunOptions{Metadata: map[string]string{"a": "b", "k" + badUTF8Marker: "v"}})),
			"options.metadata", "options.metadata: a key is not valid UTF-8"},
		{"a metadata value", &stubbornv1.StartRunRequest{}, encodeWithBadUTF8(t, withOptions(&stubbornv1.RunOptions{Metadata: map[string]string{"k": badUTF8Marker}})),
			"options.metadata", "options.metadata: a value is not valid UTF-8"},
		{"options.judge", &stubbornv1.StartRunRequest{}, encodeWithBadUTF8(t, withOptions(&stubbornv1.RunOptions{Judge: badUTF8Marker})),
			"options.judge", "options.judge: is not valid UTF-8"},
		{"run_id", &stubbornv1.GetRunRequest{}, encodeWithBadUTF8(t, &stubbornv1.GetRunRequest{RunId: badUTF8Marker}),
			"run_id", "run_id: is not valid UTF-8"},
		{"a repeated message's field", &stubbornv1.ControlState{}, encodeWithBadUTF8(t, &stubbornv1.ControlState{AttemptLog: []*stubbornv1.Attempt{{Brief: "ok"}, {Brief: badUTF8Marker}}}),
			"attempt_log[1].brief", "attempt_log[1].brief: is not valid UTF-8"},
		{"a message value of a map", &stubbornv1.ExecuteResponse{}, encodeWithBadUTF8(t, &stubbornv1.ExecuteResponse{Result: &stubbornv1.Result{Data: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"k": structpb.NewStringValue(badUTF8Marker)}})}}),
			"result.data.struct_value.fields.string_value", "result.data.struct_value.fields.string_value: is not valid UTF-8"},
		{"another service's request", &healthpb.HealthCheckRequest{}, encodeWithBadUTF8(t, &healthpb.HealthCheckRequest{Service: badUTF8Marker}),
			"service", "service: is not valid UTF-8"},
		{"truncated", &stubbornv1.StartRunRequest{}, valid[:len(valid)-2],
			"request", "request: is not a valid protobuf message: "},
		{"a field number 0", &stubbornv1.StartRunRequest{}, protowire.AppendTag(append([]byte(nil), valid...), 0, protowire.VarintType),
			"request", "request: is not a valid protobuf message: "},
		{"invalid UTF-8 after the break is not looked at", &stubbornv1.StartRunRequest{}, append(append([]byte(nil), valid[:len(valid)-2]...), encodeWithBadUTF8(t, &stubbornv1.StartRunRequest{TaskBrief: badUTF8Marker})...),
			"request", "request: is not a valid protobuf message: "},
		{"proto2 does not check UTF-8", &descriptorpb.FileDescriptorProto{}, append(encodeWithBadUTF8(t, &descriptorpb.FileDescriptorProto{Name: proto.String(badUTF8Marker)}), 0x0a),
			"request", "request: is not a valid protobuf message: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// The server's codec, as gRPC calls it.
			var r malformedRequests
			into := tt.into.ProtoReflect().New().Interface()
			require.NoError(t, newCodec(&r).Unmarshal(mem.BufferSlice{mem.SliceBuffer(tt.b)}, into), "noted, not returned")
			assert.Equal(t, 1, r.pending())
			err := r.take(into)
			assert.Equal(t, 0, r.pending(), "taken")
			assert.NoError(t, r.take(into), "taken once")

			require.Error(t, proto.Unmarshal(tt.b, tt.into.ProtoReflect().New().Interface()), "proto.Unmarshal refuses it")
			st := status.Convert(err)
			require.Equal(t, codes.InvalidArgument, st.Code(), st.Message())
			if tt.field == "request" {
				assert.Contains(t, st.Message(), tt.msg)
			} else {
				assert.Equal(t, tt.msg, st.Message())
			}
			assert.NotContains(t, st.Message(), badUTF8)
			var fields []string
			for _, d := range st.Details() {
				if br, ok := d.(*errdetails.BadRequest); ok {
					for _, v := range br.GetFieldViolations() {
						fields = append(fields, v.GetField())
					}
				}
			}
			assert.Equal(t, []string{tt.field}, fields)
		})
	}

	// A message that decodes is not noted; without a place to note them,
	// the codec returns gRPC's error as before.
	var r malformedRequests
	require.NoError(t, newCodec(&r).Unmarshal(mem.BufferSlice{mem.SliceBuffer(valid)}, &stubbornv1.StartRunRequest{}))
	assert.Equal(t, 0, r.pending())
	assert.Error(t, newCodec(nil).Unmarshal(mem.BufferSlice{mem.SliceBuffer(valid[:len(valid)-2])}, &stubbornv1.StartRunRequest{}))
}
