package server

import (
	"slices"
	"testing"
)

// FuzzDoorParse reads any body as a Chat Completions and as a Messages
// request: never a panic, never an empty error; an accepted one has a
// conversation, and criteria only of the known keys.
func FuzzDoorParse(f *testing.F) {
	for _, s := range []string{
		`{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true, "stream_options": {"include_usage": true}, "seed": 1}`,
		`{"model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "s"}], "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}], "stop_sequences": ["a"], "metadata": {"user_id": "u"}}`,
		`{"model": "m", "messages": [], "stubborn": {"failure_when": "true", "drop_params": ["n"]}}`,
		`{"model": "m", "messages": [{"role": "user", "content": "x"}], "stubborn": {"drop_params": true}}`,
		`{"model": "m", "max_tokens": 5, "tools": [{"name": "t", "input_schema": {"type": "object"}}], "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "r"}]}]}`,
		`{"messages": {"role": "user"}}`, `null`, `[]`, `{"stream": "yes"}`, `{"system": 5}`, `{"tools": []}`, `{"stubborn": {"drop_params": 3}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, d := range []dialect{openAIDialect{}, anthropicDialect{}} {
			req, err := parseRequest(d.codec(), body)
			if err != nil {
				if err.Error() == "" {
					t.Fatalf("%T: an empty error", d)
				}
				continue
			}
			if req.conv == nil {
				t.Fatalf("%T: no conversation", d)
			}
			for k := range req.criteria {
				if !slices.Contains(criteriaKeys, k) {
					t.Fatalf("%T: criterion %q", d, k)
				}
			}
		}
	})
}
