package conversation

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"google.golang.org/protobuf/types/known/structpb"
)

// raw is a JSON object's fields, undecoded: the codecs read the fields they
// know and keep the rest.
type raw = map[string]json.RawMessage

func isNull(r json.RawMessage) bool {
	r = bytes.TrimSpace(r)
	return len(r) == 0 || string(r) == "null"
}

// object reads r as a JSON object; null is an empty one.
func object(r json.RawMessage, field string) (raw, error) {
	if isNull(r) {
		return raw{}, nil
	}
	if !depthOK(r) {
		return nil, fieldErr(field, "nests more than %d levels deep", MaxDepth)
	}
	var o raw
	if err := json.Unmarshal(r, &o); err != nil || o == nil {
		return nil, fieldErr(field, "must be an object")
	}
	return o, nil
}

func array(r json.RawMessage, field string, limit int) ([]json.RawMessage, error) {
	if isNull(r) {
		return nil, nil
	}
	var a []json.RawMessage
	if err := json.Unmarshal(r, &a); err != nil {
		return nil, fieldErr(field, "must be an array")
	}
	if len(a) > limit {
		return nil, fieldErr(field, "has %d elements, more than %d", len(a), limit)
	}
	return a, nil
}

func str(r json.RawMessage, field string) (string, error) {
	if isNull(r) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(r, &s); err != nil {
		return "", fieldErr(field, "must be a string")
	}
	return s, nil
}

func boolean(r json.RawMessage, field string) (*bool, error) {
	if isNull(r) {
		return nil, nil
	}
	var b bool
	if err := json.Unmarshal(r, &b); err != nil {
		return nil, fieldErr(field, "must be true or false")
	}
	return &b, nil
}

func number(r json.RawMessage, field string) (*float64, error) {
	if isNull(r) {
		return nil, nil
	}
	var f float64
	if err := json.Unmarshal(r, &f); err != nil {
		return nil, fieldErr(field, "must be a number")
	}
	return &f, nil
}

func integer(r json.RawMessage, field string) (*int64, error) {
	if isNull(r) {
		return nil, nil
	}
	var n int64
	if err := json.Unmarshal(r, &n); err != nil {
		return nil, fieldErr(field, "must be an integer")
	}
	return &n, nil
}

// depthOK says whether a JSON text nests at most MaxDepth arrays and objects
// (controls.MaxDataDepth), counted without decoding it.
func depthOK(b []byte) bool { return DepthWithin(b, MaxDepth) }

// DepthWithin says whether a JSON text nests at most max arrays and
// objects, counted without decoding it: what a codec refuses for its
// depth, a caller can tell before it decodes.
func DepthWithin(b []byte, max int) bool {
	depth, inString, escaped := 0, false, false
	for _, c := range b {
		switch {
		case escaped:
			escaped = false
		case inString:
			if c == '\\' {
				escaped = true
			} else if c == '"' {
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			if depth++; depth > max {
				return false
			}
		case c == '}' || c == ']':
			depth--
		}
	}
	return true
}

// structOf reads r (a JSON object) as a Struct, bounded by MaxDepth.
func structOf(r json.RawMessage, field string) (*structpb.Struct, error) {
	if isNull(r) {
		return nil, nil
	}
	if !depthOK(r) {
		return nil, fieldErr(field, "nests more than %d levels deep", MaxDepth)
	}
	var m map[string]any
	if err := json.Unmarshal(r, &m); err != nil || m == nil {
		return nil, fieldErr(field, "must be an object")
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		return nil, fieldErr(field, "%v", err)
	}
	return s, nil
}

// extraOf keeps the fields of o that are not known: a Struct of them, or nil.
func extraOf(o raw, known map[string]bool, field string) (*structpb.Struct, error) {
	var m map[string]any
	for k, v := range o {
		if known[k] {
			continue
		}
		if !depthOK(v) {
			return nil, fieldErr(join(field, k), "nests more than %d levels deep", MaxDepth)
		}
		var x any
		if err := json.Unmarshal(v, &x); err != nil {
			return nil, fieldErr(join(field, k), "is not JSON")
		}
		if m == nil {
			m = map[string]any{}
		}
		m[k] = x
	}
	if m == nil {
		return nil, nil
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		return nil, fieldErr(field, "%v", err)
	}
	return s, nil
}

// putExtra adds s's fields to out (the typed fields win).
func putExtra(out map[string]any, s *structpb.Struct) {
	for k, v := range s.GetFields() {
		if _, set := out[k]; !set {
			out[k] = v.AsInterface()
		}
	}
}

func join(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "." + name
}

func at(parent string, i int) string { return parent + "[" + strconv.Itoa(i) + "]" }

func set(known ...string) map[string]bool {
	m := make(map[string]bool, len(known))
	for _, k := range known {
		m[k] = true
	}
	return m
}

// Text is a message's text parts joined.
func Text(m *stubbornv1.ChatMessage) string {
	var b strings.Builder
	for _, p := range m.GetContent() {
		b.WriteString(p.GetText())
	}
	return b.String()
}

func textPart(s string) *stubbornv1.ContentPart {
	return &stubbornv1.ContentPart{Kind: &stubbornv1.ContentPart_Text{Text: s}}
}

// compactJSON is the compact encoding of a JSON text, or the text as it is
// when it is not JSON.
func compactJSON(r json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Compact(&b, r); err != nil {
		return string(r)
	}
	return b.String()
}

func marshal(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("conversation: encode: %w", err)
	}
	return b, nil
}

// resultOf makes a Result of choices (sorted by index) and usage: text is
// choice 0's.
func resultOf(choices []*stubbornv1.Choice, usage *stubbornv1.Usage, model string) *stubbornv1.Result {
	r := &stubbornv1.Result{Choices: choices, Usage: usage, Model: model}
	for _, c := range choices {
		if c.GetIndex() == 0 {
			r.Text = Text(c.GetMessage())
		}
	}
	return r
}
