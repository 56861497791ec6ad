package server

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/runs"
)

// The codec's shortcuts rely on RunResponse being the event in field
// eventResponseField and nothing else, and WatchRunResponse that or the
// events in field eventsResponseField.
func TestEventResponsesAreTheEventInField1(t *testing.T) {
	event := (&stubbornv1.RunEvent{}).ProtoReflect().Descriptor().FullName()
	for _, m := range []proto.Message{&stubbornv1.RunResponse{}, &stubbornv1.WatchRunResponse{}} {
		f := m.ProtoReflect().Descriptor().Fields().ByNumber(protoreflect.FieldNumber(eventResponseField))
		require.NotNil(t, f, "%T", m)
		assert.Equal(t, protoreflect.MessageKind, f.Kind(), "%T", m)
		assert.Equal(t, protoreflect.Optional, f.Cardinality(), "%T", m)
		assert.Equal(t, event, f.Message().FullName(), "%T", m)
	}
	assert.Equal(t, 1, (&stubbornv1.RunResponse{}).ProtoReflect().Descriptor().Fields().Len())
	fields := (&stubbornv1.WatchRunResponse{}).ProtoReflect().Descriptor().Fields()
	assert.Equal(t, 2, fields.Len())
	f := fields.ByNumber(protoreflect.FieldNumber(eventsResponseField))
	require.NotNil(t, f)
	assert.Equal(t, protoreflect.Repeated, f.Cardinality())
	assert.Equal(t, event, f.Message().FullName())
}

func TestCodecSendsABatchAsWatchRunResponseEvents(t *testing.T) {
	var batch eventBatch
	want := &stubbornv1.WatchRunResponse{}
	for i := range 3 {
		ev := &stubbornv1.RunEvent{RunId: "run_x", Seq: int64(i + 1), Kind: &stubbornv1.RunEvent_RunResumed{
			RunResumed: &stubbornv1.RunResumed{Owner: strings.Repeat("o", 100*i)},
		}}
		data, err := proto.Marshal(ev)
		require.NoError(t, err)
		batch = append(batch, runs.Event{RunID: "run_x", Seq: int64(i + 1), Data: data})
		want.Events = append(want.Events, ev)
	}
	out, err := newCodec(nil).Marshal(batch)
	require.NoError(t, err)
	var got stubbornv1.WatchRunResponse
	require.NoError(t, newCodec(nil).Unmarshal(out, &got))
	assert.True(t, proto.Equal(want, &got), "%v", &got)
	assert.Nil(t, got.GetEvent())
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
	c := newCodec(nil)
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
