package main

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// The delegate's gRPC contract, stubborn.v1.DelegateService/Execute
// (proto/stubborn/v1/delegate.proto), spoken here without importing the
// main module's generated code: importing it would put the main module's
// go.mod in this module's build list, and the newer OpenTelemetry it
// requires does not compile with Temporal's server (go.opentelemetry.io/
// otel/log v1 dropped the KeyValue that the server's wideevents use). Only
// the fields this harness uses are encoded; the rest are skipped when
// decoding, as protobuf does. wire_test.go checks the field numbers against
// the .proto file.
const executeMethod = "/stubborn.v1.DelegateService/Execute"

// executeRequest is the subset of stubborn.v1.ExecuteRequest sent.
type executeRequest struct {
	Brief   string // 1
	RunID   string // 2
	Attempt int32  // 3
}

// executeResponse is the subset of stubborn.v1.ExecuteResponse read:
// result (1) .text (1).
type executeResponse struct {
	Text string
}

func (m *executeRequest) marshal() []byte {
	var b []byte
	if m.Brief != "" {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, m.Brief)
	}
	if m.RunID != "" {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendString(b, m.RunID)
	}
	if m.Attempt != 0 {
		b = protowire.AppendTag(b, 3, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(int64(m.Attempt))) // int32: sign-extended
	}
	return b
}

func (m *executeRequest) unmarshal(b []byte) error {
	*m = executeRequest{}
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			m.Brief = string(v)
		case num == 2 && typ == protowire.BytesType:
			m.RunID = string(v)
		case num == 3 && typ == protowire.VarintType:
			m.Attempt = int32(x)
		}
		return nil
	})
}

func (m *executeResponse) marshal() []byte {
	var result []byte
	if m.Text != "" {
		result = protowire.AppendTag(result, 1, protowire.BytesType)
		result = protowire.AppendString(result, m.Text)
	}
	b := protowire.AppendTag(nil, 1, protowire.BytesType)
	return protowire.AppendBytes(b, result)
}

func (m *executeResponse) unmarshal(b []byte) error {
	*m = executeResponse{}
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if num != 1 || typ != protowire.BytesType {
			return nil
		}
		return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
			if num == 1 && typ == protowire.BytesType {
				m.Text = string(v)
			}
			return nil
		})
	})
}

// eachField calls fn with each field of a message: v for a length-delimited
// field, x for a varint; other types are skipped.
func eachField(b []byte, fn func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := fn(num, typ, v, x); err != nil {
			return err
		}
	}
	return nil
}

// wireCodec is a gRPC codec for the two messages above. Its name is
// "proto", so the content type on the wire is application/grpc+proto, as
// with generated code: the other side cannot tell the difference.
type wireCodec struct{}

func (wireCodec) Name() string { return "proto" }

func (wireCodec) Marshal(v any) ([]byte, error) {
	switch m := v.(type) {
	case *executeRequest:
		return m.marshal(), nil
	case *executeResponse:
		return m.marshal(), nil
	}
	return nil, fmt.Errorf("wireCodec: cannot marshal %T", v)
}

func (wireCodec) Unmarshal(data []byte, v any) error {
	switch m := v.(type) {
	case *executeRequest:
		return m.unmarshal(data)
	case *executeResponse:
		return m.unmarshal(data)
	}
	return fmt.Errorf("wireCodec: cannot unmarshal into %T", v)
}
