package server

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// The codec's shortcut relies on both response messages being the event in
// field eventResponseField and nothing else.
func TestEventResponsesAreTheEventInField1(t *testing.T) {
	for _, m := range []proto.Message{&stubbornv1.RunResponse{}, &stubbornv1.WatchRunResponse{}} {
		fields := m.ProtoReflect().Descriptor().Fields()
		require.Equal(t, 1, fields.Len(), "%T", m)
		f := fields.Get(0)
		assert.Equal(t, protoreflect.FieldNumber(eventResponseField), f.Number(), "%T", m)
		assert.Equal(t, protoreflect.MessageKind, f.Kind(), "%T", m)
		assert.Equal(t, (&stubbornv1.RunEvent{}).ProtoReflect().Descriptor().FullName(), f.Message().FullName(), "%T", m)
	}
}

func TestCodecSendsAPreEncodedEventAsEitherResponse(t *testing.T) {
	ev := &stubbornv1.RunEvent{
		RunId: "run_x", Seq: 3, Time: timestamppb.Now(), Path: "chain[0]",
		Kind: &stubbornv1.RunEvent_AttemptFinished{AttemptFinished: &stubbornv1.AttemptFinished{
			Attempt: &stubbornv1.Attempt{Number: 2, Delegate: "echo", Brief: string(make([]byte, 300))}, Note: "n",
		}},
	}
	data, err := proto.Marshal(ev)
	require.NoError(t, err)
	c := newCodec()
	out, err := c.Marshal(eventResponse(data))
	require.NoError(t, err)

	var run stubbornv1.RunResponse
	require.NoError(t, c.Unmarshal(out, &run))
	assert.True(t, proto.Equal(ev, run.GetEvent()), "RunResponse: %v", run.GetEvent())
	var watch stubbornv1.WatchRunResponse
	require.NoError(t, c.Unmarshal(out, &watch))
	assert.True(t, proto.Equal(ev, watch.GetEvent()), "WatchRunResponse: %v", watch.GetEvent())

	// The same bytes as the proto codec's for the response built the usual way.
	want, err := proto.Marshal(&stubbornv1.RunResponse{Event: ev})
	require.NoError(t, err)
	assert.Equal(t, want, out.Materialize())

	// Every other message goes through the proto codec.
	other, err := c.Marshal(&stubbornv1.GetRunRequest{RunId: "run_x"})
	require.NoError(t, err)
	var back stubbornv1.GetRunRequest
	require.NoError(t, c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(other.Materialize())}, &back))
	assert.Equal(t, "run_x", back.GetRunId())
	assert.Equal(t, "proto", c.Name())
}
