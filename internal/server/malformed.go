package server

import (
	"context"
	"fmt"
	"sync"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// A request that cannot be decoded (a string field holding invalid UTF-8,
// broken wire format) is INVALID_ARGUMENT naming the field, as any other
// bad request. grpc-go answers INTERNAL "grpc: failed to unmarshal the
// received message" for every error the codec's Unmarshal returns, so the
// server's codec returns none for a request: it notes the error against the
// message it was decoding into (malformedRequests.note), and the last
// interceptor of every call takes it (malformedInterceptors): a unary call's
// request is decoded before the interceptors run, a stream's messages when
// the handler receives them through the stream the interceptor wraps. No
// handler sees a half-decoded request; the interceptors before it read none
// of its fields but a well-formed run_id (newGRPCServer).

// malformedRequests holds, for each message the codec could not decode
// into, the INVALID_ARGUMENT status to answer with, until an interceptor
// takes it. Every entry is taken by the call that made it: the map is empty
// between calls.
type malformedRequests struct {
	byMessage sync.Map // message pointer (any) → error
}

// note records that decoding b into m failed with err.
func (r *malformedRequests) note(m proto.Message, b []byte, err error) {
	r.byMessage.Store(any(m), malformedStatus(b, m.ProtoReflect().Descriptor(), err))
}

// take returns and forgets the status noted for m, or nil.
func (r *malformedRequests) take(m any) error {
	if err, ok := r.byMessage.LoadAndDelete(m); ok {
		return err.(error)
	}
	return nil
}

// pending counts the entries not taken yet (tests).
func (r *malformedRequests) pending() int {
	n := 0
	r.byMessage.Range(func(any, any) bool { n++; return true })
	return n
}

// malformedInterceptors answer a call whose request, or a stream message,
// the codec could not decode with the status noted for it. They come last
// in the chain, just before the handler.
func malformedInterceptors(r *malformedRequests) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	unary := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := r.take(req); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
	stream := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, &decodedStream{ServerStream: ss, malformed: r})
	}
	return unary, stream
}

// decodedStream is a server stream whose RecvMsg fails for a message the
// codec could not decode.
type decodedStream struct {
	grpc.ServerStream
	malformed *malformedRequests
}

func (s *decodedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.malformed.take(m)
}

// maxMalformedDepth bounds how deep malformedField looks into nested
// messages: Stubborn's requests nest a few levels; a deeper request is
// answered without naming the field.
const maxMalformedDepth = 32

// malformedStatus is the INVALID_ARGUMENT status for b, the encoding of a
// message of type md that failed to decode with err: it names the first
// string field holding invalid UTF-8 (proto3 requires UTF-8), or else says
// the request is not a valid protobuf message.
func malformedStatus(b []byte, md protoreflect.MessageDescriptor, _ error) error {
	var v violations
	if field, desc, ok := malformedField(b, md, "", 0); ok {
		v.add(field, "%s", desc)
	} else {
		// Not err's text: protobuf-go makes its error strings unstable on
		// purpose (a space or a no-break space at random), and it says no
		// more than this.
		v.add("request", "is not a valid protobuf message: its wire format cannot be parsed")
	}
	return v.err()
}

// malformedField walks b, the encoding of a message of type md, in order,
// and returns the path of the first string field that holds invalid UTF-8
// (prefix and field names joined by '.', the index of a repeated field's
// element in brackets: "fallback_chain.chain[2]"; a map by its field name
// only: its keys are the caller's) and what is wrong with it. ok is false
// when there is none, or when the wire format breaks before one is found.
// Fields unknown to md, or sent with another wire type than theirs, are
// skipped, as proto.Unmarshal keeps them as unknown fields.
func malformedField(b []byte, md protoreflect.MessageDescriptor, prefix string, depth int) (field, desc string, ok bool) {
	if depth > maxMalformedDepth {
		return "", "", false
	}
	fields := md.Fields()
	var seen map[protoreflect.FieldNumber]int // elements of repeated fields so far
	eachLengthDelimited(b, func(num protowire.Number, value []byte) bool {
		fd := fields.ByNumber(num)
		if fd == nil {
			return false
		}
		path := string(fd.Name())
		if prefix != "" {
			path = prefix + "." + path
		}
		switch {
		case fd.IsMap():
			field, desc, ok = malformedEntry(value, fd, path, depth)
			return ok
		case fd.IsList():
			if seen == nil {
				seen = make(map[protoreflect.FieldNumber]int)
			}
			path = fmt.Sprintf("%s[%d]", path, seen[num])
			seen[num]++
		}
		field, desc, ok = malformedValue(value, fd, path, "is not valid UTF-8", depth)
		return ok
	})
	return field, desc, ok
}

// malformedEntry walks b, an entry of map field fd at path: a string key
// or value that is not UTF-8 is named by the map's path, a message value's
// fields below it.
func malformedEntry(b []byte, fd protoreflect.FieldDescriptor, path string, depth int) (field, desc string, ok bool) {
	eachLengthDelimited(b, func(num protowire.Number, value []byte) bool {
		switch num {
		case fd.MapKey().Number():
			field, desc, ok = malformedValue(value, fd.MapKey(), path, "a key is not valid UTF-8", depth)
		case fd.MapValue().Number():
			field, desc, ok = malformedValue(value, fd.MapValue(), path, "a value is not valid UTF-8", depth)
		}
		return ok
	})
	return field, desc, ok
}

// malformedValue checks value, field fd's at path: a string must be UTF-8
// (else it is described as notUTF8), a message is walked.
func malformedValue(value []byte, fd protoreflect.FieldDescriptor, path, notUTF8 string, depth int) (field, desc string, ok bool) {
	switch fd.Kind() {
	case protoreflect.StringKind:
		if checksUTF8(fd) && !utf8.Valid(value) {
			return path, notUTF8, true
		}
	case protoreflect.MessageKind:
		return malformedField(value, fd.Message(), path, depth+1)
	}
	return "", "", false
}

// checksUTF8 reports whether proto.Unmarshal refuses invalid UTF-8 in fd,
// a string field: proto3 and editions (by default) do, proto2 does not.
func checksUTF8(fd protoreflect.FieldDescriptor) bool {
	return fd.Syntax() != protoreflect.Proto2
}

// eachLengthDelimited calls fn with each length-delimited field of b (a
// string, bytes, a message, a packed list), in order, skipping the others,
// until fn returns true or the wire format breaks.
func eachLengthDelimited(b []byte, fn func(num protowire.Number, value []byte) bool) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return
		}
		b = b[n:]
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return
			}
			b = b[n:]
			continue
		}
		value, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return
		}
		b = b[n:]
		if fn(num, value) {
			return
		}
	}
}
