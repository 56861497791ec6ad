package server

import (
	"slices"
	"testing"
)

// FuzzDoorParse reads any body as a Chat Completions and as a Messages
// request: never a panic; an accepted one has messages as objects, model
// parameters without the fields the door acts on (a Chat Completions
// request's unknown ones, "system" say, pass through), and, from the Messages
// door, only user and assistant messages after an optional system one.
func FuzzDoorParse(f *testing.F) {
	for _, s := range []string{
		`{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true, "stream_options": {"include_usage": true}, "seed": 1}`,
		`{"model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "s"}], "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}], "stop_sequences": ["a"], "metadata": {"user_id": "u"}}`,
		`{"model": "m", "messages": [], "stubborn": {"failure_when": "true"}}`,
		`{"messages": {"role": "user"}}`, `null`, `[]`, `{"stream": "yes"}`, `{"system": 5}`, `{"tools": []}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, d := range []dialect{openAIDialect{}, anthropicDialect{}} {
			req, err := d.parse(body)
			if err != nil {
				if err.Error() == "" {
					t.Fatalf("%T: an empty error", d)
				}
				continue
			}
			_, isAnthropic := d.(anthropicDialect)
			for _, k := range []string{"model", "messages", "stream", "stream_options", "stubborn", "system"} {
				if _, ok := req.params.GetFields()[k]; ok && (isAnthropic || k != "system") {
					t.Fatalf("%T: the model parameters hold %q", d, k)
				}
			}
			for i, m := range req.messages {
				if m == nil {
					t.Fatalf("%T: message %d is nil", d, i)
				}
				if isAnthropic {
					role := m.GetFields()["role"].GetStringValue()
					if !slices.Contains([]string{"user", "assistant"}, role) && (i > 0 || role != "system") {
						t.Fatalf("messages[%d]: role %q from the Messages door", i, role)
					}
				}
			}
		}
	})
}
