package server_test

import (
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// apiRPC is one RPC of the ControlService: how to fill its request from an
// input, what it answers.
type apiRPC struct {
	name   string
	stream bool
	build  func(in *apiInput) *apiMessage
	answer func() proto.Message
}

// apiRPCs are the RPCs in selector order.
var apiRPCs = []apiRPC{
	{"StartRun", false, func(in *apiInput) *apiMessage { return in.runRequest(&stubbornv1.StartRunRequest{}) },
		func() proto.Message { return &stubbornv1.StartRunResponse{} }},
	{"Run", true, func(in *apiInput) *apiMessage { return in.runRequest(&stubbornv1.RunRequest{}) },
		func() proto.Message { return &stubbornv1.RunResponse{} }},
	{"GetRun", false, func(in *apiInput) *apiMessage {
		m := &apiMessage{msg: &stubbornv1.GetRunRequest{}}
		m.str("run_id", in.runID())
		return m
	}, func() proto.Message { return &stubbornv1.GetRunResponse{} }},
	{"ListRuns", false, func(in *apiInput) *apiMessage {
		m := &apiMessage{msg: &stubbornv1.ListRunsRequest{Status: stubbornv1.RunStatus(int32(in.n)), PageSize: int32(in.n >> 32)}}
		token := in.id
		if in.variant%2 == 1 && in.token != "" {
			token = in.token
		}
		m.str("page_token", token)
		return m
	}, func() proto.Message { return &stubbornv1.ListRunsResponse{} }},
	{"CancelRun", false, func(in *apiInput) *apiMessage {
		m := &apiMessage{msg: &stubbornv1.CancelRunRequest{}}
		m.str("run_id", in.runID())
		return m
	}, func() proto.Message { return &stubbornv1.CancelRunResponse{} }},
	{"DecideRun", false, func(in *apiInput) *apiMessage {
		m := &apiMessage{msg: &stubbornv1.DecideRunRequest{Decision: stubbornv1.Decision(int32(in.n))}}
		m.str("run_id", in.runID())
		return m
	}, func() proto.Message { return &stubbornv1.DecideRunResponse{} }},
	{"WatchRun", true, func(in *apiInput) *apiMessage {
		m := &apiMessage{msg: &stubbornv1.WatchRunRequest{AfterSeq: in.n % 64, MaxBatch: int32(in.n >> 32)}}
		m.str("run_id", in.runID())
		return m
	}, func() proto.Message { return &stubbornv1.WatchRunResponse{} }},
}

// apiInput is what the fuzzer gives for the fields of a request.
type apiInput struct {
	variant                     int
	id, brief, names, meta, cel string
	n                           int64
	recent, token               string // a run id and a page token this server gave, or ""
}

// runID is the fuzzer's id, or for odd variants a run this server started
// (the variant's half-th newest), when there is one.
func (in *apiInput) runID() string {
	if in.variant%2 == 1 && in.recent != "" {
		return in.recent
	}
	return in.id
}

// runRequest fills a StartRunRequest or a RunRequest (the same fields): the
// variant picks the control (modulo 4), whether the CEL text is an
// expression or named criteria (bit 2), and whether the options name a
// judge and timeouts (bit 3).
func (in *apiInput) runRequest(msg proto.Message) *apiMessage {
	m := &apiMessage{msg: msg}
	m.str("task_brief", in.brief)
	var names []string
	if in.names != "" {
		names = strings.Split(in.names, ",")
	}
	name := func(i int) string {
		if i >= 0 && i < len(names) {
			return names[i]
		}
		return ""
	}
	criteria := in.variant/4%2 == 1
	switch in.variant % 4 {
	case 0:
		m.strs("fallback_chain.chain", names)
		m.str(pick(criteria, "fallback_chain.failure_criteria", "fallback_chain.failure_when"), in.cel)
	case 1:
		m.strs("race.candidates", names)
		m.str(pick(criteria, "race.acceptance_criteria", "race.accept_when"), in.cel)
	case 2:
		m.set("retry.attempts", protoreflect.ValueOfInt32(int32(in.n%16)))
		m.set("retry.base_wait", durationValue(time.Duration(in.n>>4%1000)*time.Millisecond))
		m.set("retry.max_wait", durationValue(time.Duration(in.n>>14)*time.Millisecond))
		m.set("retry.on_exhausted", protoreflect.ValueOfEnum(protoreflect.EnumNumber(in.variant/8%3)))
		m.str("retry.target", name(0))
	case 3:
		m.set("retry_with_learning.max_retries", protoreflect.ValueOfInt32(int32(in.n%8)))
		m.str("retry_with_learning.target", name(0))
		m.str("retry_with_learning.analyst", name(1))
		m.str(pick(criteria, "retry_with_learning.failure_criteria", "retry_with_learning.failure_when"), in.cel)
	}
	m.str("options.idempotency_key", in.id)
	if in.meta != "" {
		for _, kv := range strings.Split(in.meta, "\n") {
			k, v, _ := strings.Cut(kv, "=")
			m.entry("options.metadata", k, v)
		}
	}
	if in.variant/8%2 == 1 {
		m.str("options.judge", name(len(names)-1))
		m.set("options.run_timeout", durationValue(time.Duration(in.n%10000)*time.Millisecond))
		m.set("options.attempt_timeout", durationValue(time.Duration(in.n>>16%10000)*time.Millisecond))
	}
	return m
}

func pick(cond bool, yes, no string) string {
	if cond {
		return yes
	}
	return no
}

func durationValue(d time.Duration) protoreflect.Value {
	return protoreflect.ValueOfMessage(durationpb.New(d).ProtoReflect())
}

// apiMessage is a request being filled by field path ("options.metadata"),
// with what proto.Marshal would refuse to write (strings that are not
// UTF-8) kept aside as wire bytes to append: a later occurrence of a
// singular field replaces an earlier one, of a repeated field or a map
// entry adds one, of a message merges into it.
type apiMessage struct {
	msg   proto.Message
	extra []byte
}

// field returns the message that holds the last field of path (made on the
// way), the field, and the wire numbers of the path.
func (m *apiMessage) field(path string) (protoreflect.Message, protoreflect.FieldDescriptor, []protowire.Number) {
	msg := m.msg.ProtoReflect()
	var nums []protowire.Number
	parts := strings.Split(path, ".")
	for i, p := range parts {
		fd := msg.Descriptor().Fields().ByName(protoreflect.Name(p))
		if fd == nil {
			panic(fmt.Sprintf("%s has no field %s", msg.Descriptor().FullName(), p))
		}
		nums = append(nums, fd.Number())
		if i == len(parts)-1 {
			return msg, fd, nums
		}
		msg = msg.Mutable(fd).Message()
	}
	panic("empty path")
}

func (m *apiMessage) set(path string, v protoreflect.Value) {
	msg, fd, _ := m.field(path)
	msg.Set(fd, v)
}

func (m *apiMessage) str(path, s string) {
	if s == "" {
		return
	}
	msg, fd, nums := m.field(path)
	if utf8.ValidString(s) {
		msg.Set(fd, protoreflect.ValueOfString(s))
		return
	}
	m.extra = append(m.extra, nested(nums, []byte(s))...)
}

func (m *apiMessage) strs(path string, ss []string) {
	msg, fd, nums := m.field(path)
	list := msg.Mutable(fd).List()
	for _, s := range ss {
		if utf8.ValidString(s) {
			list.Append(protoreflect.ValueOfString(s))
		} else {
			m.extra = append(m.extra, nested(nums, []byte(s))...)
		}
	}
}

func (m *apiMessage) entry(path, k, v string) {
	msg, fd, nums := m.field(path)
	if utf8.ValidString(k) && utf8.ValidString(v) {
		msg.Mutable(fd).Map().Set(protoreflect.ValueOfString(k).MapKey(), protoreflect.ValueOfString(v))
		return
	}
	e := append(nested([]protowire.Number{1}, []byte(k)), nested([]protowire.Number{2}, []byte(v))...)
	m.extra = append(m.extra, nested(nums, e)...)
}

// nested encodes b as the length-delimited field at path, each number a
// field of the message the previous one holds.
func nested(path []protowire.Number, b []byte) []byte {
	for i := len(path) - 1; i >= 0; i-- {
		b = protowire.AppendBytes(protowire.AppendTag(nil, path[i], protowire.BytesType), b)
	}
	return b
}

// apiRequest encodes m, with its wire bytes aside.
func apiRequest(t *testing.T, m *apiMessage) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m.msg)
	if err != nil {
		t.Fatalf("encoding %v: %v", m.msg, err)
	}
	return append(b, m.extra...)
}
