package server

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/stubbornhq/stubborn/internal/runs"
)

// A run's events are encoded once, when they are recorded (runs.Event), and
// sent as they are to every stream that follows the run: RunResponse and
// WatchRunResponse are both nothing but the event in field 1, so their
// encoding is that field's tag and length followed by the event's bytes.
// The server's codec passes an eventResponse through, joins the events of an
// eventBatch (WatchRunResponse.events, a repeated field: each element is its
// tag, length and bytes), and hands every other message to gRPC's own proto
// codec.

// eventResponseField is RunResponse.event's and WatchRunResponse.event's
// field number, eventsResponseField WatchRunResponse.events'; codec_test.go
// checks them against the generated code.
const (
	eventResponseField  protowire.Number = 1
	eventsResponseField protowire.Number = 2
)

// eventResponse is a RunResponse or a WatchRunResponse made of an event's
// encoding (runs.Event.Data).
type eventResponse []byte

// frame returns the encoding of the response: the event as field 1.
func (e eventResponse) frame() []byte {
	b := make([]byte, 0, len(e)+protowire.SizeTag(eventResponseField)+protowire.SizeVarint(uint64(len(e))))
	b = protowire.AppendTag(b, eventResponseField, protowire.BytesType)
	return protowire.AppendBytes(b, e)
}

// eventBatch is a WatchRunResponse whose events are recorded events.
type eventBatch []runs.Event

// frame returns the encoding of the response: each event as an element of
// the repeated field events.
func (b eventBatch) frame() []byte {
	n := 0
	for _, e := range b {
		n += protowire.SizeTag(eventsResponseField) + protowire.SizeBytes(len(e.Data))
	}
	out := make([]byte, 0, n)
	for _, e := range b {
		out = protowire.AppendTag(out, eventsResponseField, protowire.BytesType)
		out = protowire.AppendBytes(out, e.Data)
	}
	return out
}

// codec is gRPC's proto codec, except that an eventResponse is sent as it
// is encoded, and that a request it cannot decode is noted in malformed
// (when set) instead of failing (malformed.go).
type codec struct {
	proto     encoding.CodecV2
	malformed *malformedRequests
}

func newCodec(malformed *malformedRequests) codec {
	return codec{proto: encoding.GetCodecV2(grpcproto.Name), malformed: malformed}
}

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case eventResponse:
		return mem.BufferSlice{mem.SliceBuffer(m.frame())}, nil
	case eventBatch:
		return mem.BufferSlice{mem.SliceBuffer(m.frame())}, nil
	}
	return c.proto.Marshal(v)
}

// Unmarshal decodes a request. One that cannot be decoded is noted in
// c.malformed, for the interceptors to answer INVALID_ARGUMENT, and nil is
// returned: grpc-go would answer any error INTERNAL.
func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.proto.Unmarshal(data, v)
	if err == nil || c.malformed == nil {
		return err
	}
	m, ok := v.(proto.Message)
	if !ok {
		return err // not a message: gRPC's own error
	}
	// gRPC frees data once Unmarshal returns: the status is made now.
	c.malformed.note(m, data.Materialize(), err)
	return nil
}

func (c codec) Name() string { return c.proto.Name() }

// codecOption makes the server use codec for every message it sends and
// receives, noting the requests it cannot decode in malformed.
// (grpc.ForceServerCodecV2 is marked experimental, and promised "throughout
// 1.x".)
func codecOption(malformed *malformedRequests) grpc.ServerOption {
	return grpc.ForceServerCodecV2(newCodec(malformed))
}
