package controls_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
)

func jsonValue(t *testing.T, s string) *structpb.Value {
	t.Helper()
	v := &structpb.Value{}
	require.NoError(t, protojson.Unmarshal([]byte(s), v))
	return v
}

// TestBoundResultKeepsDeepDataAsText: data at most MaxDataDepth deep is
// left as it is; deeper, each object or list at that depth becomes its
// JSON text, and the shallow parts stay. The result given is not changed.
func TestBoundResultKeepsDeepDataAsText(t *testing.T) {
	shallow := &stubbornv1.Result{Text: "t", Data: jsonValue(t, strings.Repeat("[", controls.MaxDataDepth)+"1"+strings.Repeat("]", controls.MaxDataDepth))}
	assert.Same(t, shallow, controls.BoundResult(shallow))
	assert.Equal(t, controls.MaxDataDepth, controls.DataDepth(shallow.GetData()))

	for name, deep := range map[string]string{
		"objects": strings.Repeat(`{"a":`, 3400) + "1" + strings.Repeat("}", 3400),
		"lists":   strings.Repeat(`[`, 5000) + `"x"` + strings.Repeat("]", 5000),
		"mixed":   `{"model":"m","finish_reason":"stop","usage":` + strings.Repeat(`{"b":[`, 100) + "null" + strings.Repeat("]}", 100) + `}`,
	} {
		t.Run(name, func(t *testing.T) {
			in := &stubbornv1.Result{Text: "t", Data: jsonValue(t, deep)}
			before := proto.CloneOf(in)
			out := controls.BoundResult(in)
			assert.True(t, proto.Equal(before, in), "the result given is not changed")
			assert.Equal(t, controls.MaxDataDepth, controls.DataDepth(out.GetData()))
			assert.Equal(t, "t", out.GetText())
			// Back to JSON, with the texts read as JSON again, it is the
			// answer.
			var want any
			require.NoError(t, json.Unmarshal([]byte(deep), &want))
			assert.Equal(t, want, unText(out.GetData().AsInterface(), controls.MaxDataDepth))
			// A client of any language reads it inside the deepest message
			// that carries it (protobuf C++, Java and Python allow 100).
			resp := &stubbornv1.WatchRunResponse{Events: []*stubbornv1.RunEvent{{Kind: &stubbornv1.RunEvent_RunFinished{RunFinished: &stubbornv1.RunFinished{
				State: &stubbornv1.ControlState{Result: out, AttemptLog: []*stubbornv1.Attempt{{Result: out}}},
			}}}}}
			b, err := proto.Marshal(resp)
			require.NoError(t, err)
			require.NoError(t, proto.UnmarshalOptions{RecursionLimit: 100}.Unmarshal(b, &stubbornv1.WatchRunResponse{}))
		})
	}
}

// unText undoes BoundResult's texts: the strings at depth in v, read as
// JSON.
func unText(v any, depth int) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = unText(e, depth-1)
		}
	case []any:
		for i, e := range x {
			x[i] = unText(e, depth-1)
		}
	case string:
		if depth == 0 {
			var out any
			if json.Unmarshal([]byte(x), &out) == nil {
				return out
			}
		}
	}
	return v
}
