package delegates

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/stubbornhq/stubborn/internal/controls"
)

// TestALegacyRunsMessagesGetTheAdditionAsTheTypedOnes: a gRPC delegate of
// a run journaled with the legacy messages gets what the control added to
// the brief where the typed conversation gets it (appended to the last
// user message's text, or a text part of its parts, or a user message of
// its own after another role's), the messages before it as they are;
// messages that do not read go as they are.
func TestALegacyRunsMessagesGetTheAdditionAsTheTypedOnes(t *testing.T) {
	t.Parallel()
	const added = "\n\nPrevious attempts failed:\n1. too vague"
	structs := func(ms ...map[string]any) []*structpb.Struct {
		var out []*structpb.Struct
		for _, m := range ms {
			s, err := structpb.NewStruct(m)
			require.NoError(t, err)
			out = append(out, s)
		}
		return out
	}
	maps := func(ss []*structpb.Struct) []map[string]any {
		var out []map[string]any
		for _, s := range ss {
			out = append(out, s.AsMap())
		}
		return out
	}
	system := map[string]any{"role": "system", "content": "Be brief.", "x_vendor": map[string]any{"k": 1.0}}
	toolCall := map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": "call_1", "type": "function", "function": map[string]any{"name": "get_weather", "arguments": "{}"}}}}
	for _, tc := range []struct {
		name string
		msgs []map[string]any
		want []map[string]any
	}{
		{"to the last user message's text",
			[]map[string]any{system, {"role": "user", "content": "Hi"}},
			[]map[string]any{system, {"role": "user", "content": "Hi" + added}}},
		{"as a part of the last user message's parts",
			[]map[string]any{{"role": "user", "content": []any{map[string]any{"type": "text", "text": "Hi"}}}},
			[]map[string]any{{"role": "user", "content": []any{map[string]any{"type": "text", "text": "Hi"}, map[string]any{"type": "text", "text": added}}}}},
		{"to a user message without content",
			[]map[string]any{{"role": "user", "content": nil}},
			[]map[string]any{{"role": "user", "content": added}}},
		{"after a tool's answer",
			[]map[string]any{{"role": "user", "content": "Weather?"}, toolCall, {"role": "tool", "tool_call_id": "call_1", "content": "18C"}},
			[]map[string]any{{"role": "user", "content": "Weather?"}, toolCall, {"role": "tool", "tool_call_id": "call_1", "content": "18C"}, {"role": "user", "content": added[2:]}}},
		{"not to messages that do not read",
			[]map[string]any{{"role": "root", "content": "Hi"}},
			[]map[string]any{{"role": "root", "content": "Hi"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msgs := structs(tc.msgs...)
			got := legacyMessagesOf(controls.Call{Task: true, Added: added, Messages: msgs})
			assert.Equal(t, tc.want, maps(got))
			assert.Equal(t, tc.msgs, maps(msgs), "the run's messages are not changed")
			if len(msgs) > 1 {
				assert.Same(t, msgs[0], got[0], "the messages before the last are the run's")
			}
		})
	}
	msgs := structs(map[string]any{"role": "user", "content": "Hi"})
	assert.Nil(t, legacyMessagesOf(controls.Call{Added: added, Messages: msgs}), "a call not at the task")
	assert.Equal(t, msgs, legacyMessagesOf(controls.Call{Task: true, Messages: msgs}), "nothing added")
}
