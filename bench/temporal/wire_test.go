package main

import (
	"os"
	"regexp"
	"testing"
)

func TestWireRoundTrip(t *testing.T) {
	for _, want := range []executeRequest{
		{},
		{Brief: "b", RunID: "r", Attempt: 3},
		{Brief: "é\x00", Attempt: -1},
	} {
		var got executeRequest
		if err := got.unmarshal(want.marshal()); err != nil || got != want {
			t.Errorf("request %+v: round trip gave %+v, %v", want, got, err)
		}
	}
	for _, want := range []executeResponse{{}, {Text: "answer"}} {
		var got executeResponse
		if err := got.unmarshal(want.marshal()); err != nil || got != want {
			t.Errorf("response %+v: round trip gave %+v, %v", want, got, err)
		}
	}
}

// TestWireMatchesProto checks the field numbers and types this module
// encodes by hand against the main module's delegate.proto, so that a change
// there fails here rather than on the wire.
func TestWireMatchesProto(t *testing.T) {
	src, err := os.ReadFile("../../proto/stubborn/v1/delegate.proto")
	if err != nil {
		t.Skipf("delegate.proto not found beside this module: %v", err)
	}
	for _, decl := range []string{
		`package stubborn\.v1;`,
		`service DelegateService \{`,
		`rpc Execute\(ExecuteRequest\) returns \(ExecuteResponse\);`,
		`message ExecuteRequest \{[^}]*\bstring brief = 1;`,
		`message ExecuteRequest \{[^}]*\bstring run_id = 2;`,
		`message ExecuteRequest \{[^}]*\bint32 attempt = 3;`,
		`message ExecuteResponse \{[^}]*\bResult result = 1;`,
		`message Result \{[^}]*\bstring text = 1;`,
	} {
		if !regexp.MustCompile(decl).Match(src) {
			t.Errorf("delegate.proto no longer has %s: update wire.go", decl)
		}
	}
}
