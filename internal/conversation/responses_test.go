package conversation_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/conversation"
)

// Requests as the openai SDKs send them to POST /v1/responses.
var responsesRequests = map[string]string{
	"plain":               `{"model":"smart","input":"Hi","instructions":"Be brief.","temperature":0.2,"top_p":0.9,"max_output_tokens":50,"user":"u1","metadata":{"app":"demo"},"store":false}`,
	"messages and images": `{"model":"smart","input":[{"role":"developer","content":"Answer in French."},{"type":"message","role":"user","content":[{"type":"input_text","text":"What is this?"},{"type":"input_image","image_url":"data:image/png;base64,iVBORw0KGgo=","detail":"low"},{"type":"input_image","image_url":"https://example.com/cat.jpg"}]},{"role":"assistant","content":"A cat."},{"role":"user","content":"Sure?"}]}`,
	"tools":               `{"model":"smart","input":[{"role":"user","content":"Weather in Paris?"}],"tools":[{"type":"function","name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},"strict":true}],"tool_choice":{"type":"function","name":"get_weather"},"parallel_tool_calls":false}`,
	"second turn": `{"model":"smart","input":[{"role":"user","content":"Weather in Paris and Rome?"},` +
		`{"id":"msg_1","type":"message","role":"assistant","status":"completed","content":[{"type":"output_text","text":"Let me look.","annotations":[]}]},` +
		`{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}","status":"completed"},` +
		`{"type":"function_call","call_id":"call_2","name":"get_weather","arguments":"{\"city\":\"Rome\"}"},` +
		`{"type":"function_call_output","call_id":"call_1","output":"18C"},` +
		`{"type":"function_call_output","call_id":"call_2","output":[{"type":"input_text","text":"24C"}]}],` +
		`"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}],"tool_choice":"auto"}`,
	"format and extras": `{"model":"smart","input":"JSON please","text":{"format":{"type":"json_schema","name":"answer","schema":{"type":"object","properties":{"a":{"type":"number"}}},"strict":true,"description":"An answer"},"verbosity":"low"},"reasoning":{"effort":"low"},"truncation":"auto","stream":true,"stubborn":{"drop_params":true}}`,
}

func TestResponsesRequestsDecodeIntoTheTypedConversation(t *testing.T) {
	t.Parallel()
	user := stubbornv1.ChatRole_CHAT_ROLE_USER
	text := func(s string) *stubbornv1.ContentPart {
		return &stubbornv1.ContentPart{Kind: &stubbornv1.ContentPart_Text{Text: s}}
	}
	image := func(url, detail string) *stubbornv1.ContentPart {
		return &stubbornv1.ContentPart{Kind: &stubbornv1.ContentPart_Image{Image: &stubbornv1.ImagePart{Url: url, Detail: detail}}}
	}
	f, tr := false, true
	temp, topP, maxTokens := 0.2, 0.9, int64(50)
	for _, row := range []struct {
		name string
		want *stubbornv1.Conversation
	}{
		{"plain", &stubbornv1.Conversation{Api: conversation.ResponsesAPI, Messages: []*stubbornv1.ChatMessage{
			{Role: stubbornv1.ChatRole_CHAT_ROLE_SYSTEM, Content: []*stubbornv1.ContentPart{text("Be brief.")}},
			{Role: user, Content: []*stubbornv1.ContentPart{text("Hi")}},
		}, Options: &stubbornv1.ModelOptions{Temperature: &temp, TopP: &topP, MaxTokens: &maxTokens, User: "u1", Metadata: map[string]string{"app": "demo"}}}},
		{"messages and images", &stubbornv1.Conversation{Api: conversation.ResponsesAPI, Messages: []*stubbornv1.ChatMessage{
			{Role: stubbornv1.ChatRole_CHAT_ROLE_DEVELOPER, Content: []*stubbornv1.ContentPart{text("Answer in French.")}},
			{Role: user, ContentAsParts: true, Content: []*stubbornv1.ContentPart{text("What is this?"),
				image("data:image/png;base64,iVBORw0KGgo=", "low"), image("https://example.com/cat.jpg", "")}},
			{Role: stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT, Content: []*stubbornv1.ContentPart{text("A cat.")}},
			{Role: user, Content: []*stubbornv1.ContentPart{text("Sure?")}},
		}, Options: &stubbornv1.ModelOptions{}}},
		{"second turn", &stubbornv1.Conversation{Api: conversation.ResponsesAPI, Messages: []*stubbornv1.ChatMessage{
			{Role: user, Content: []*stubbornv1.ContentPart{text("Weather in Paris and Rome?")}},
			{Role: stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT, ContentAsParts: true, Content: []*stubbornv1.ContentPart{text("Let me look.")},
				ToolCalls: []*stubbornv1.ToolCall{{Id: "call_1", Name: "get_weather", Arguments: `{"city":"Paris"}`}, {Id: "call_2", Name: "get_weather", Arguments: `{"city":"Rome"}`}}},
			{Role: stubbornv1.ChatRole_CHAT_ROLE_TOOL, ToolCallId: "call_1", Content: []*stubbornv1.ContentPart{text("18C")}},
			{Role: stubbornv1.ChatRole_CHAT_ROLE_TOOL, ToolCallId: "call_2", ContentAsParts: true, Content: []*stubbornv1.ContentPart{text("24C")}},
		}, Options: &stubbornv1.ModelOptions{Tools: []*stubbornv1.Tool{{Name: "get_weather", Parameters: mustStruct(t, `{"type":"object"}`)}},
			ToolChoice: &stubbornv1.ToolChoice{Mode: stubbornv1.ToolChoiceMode_TOOL_CHOICE_MODE_AUTO}}}},
		{"tools", &stubbornv1.Conversation{Api: conversation.ResponsesAPI, Messages: []*stubbornv1.ChatMessage{
			{Role: user, Content: []*stubbornv1.ContentPart{text("Weather in Paris?")}},
		}, Options: &stubbornv1.ModelOptions{Tools: []*stubbornv1.Tool{{Name: "get_weather", Description: "Weather of a city", Strict: &tr,
			Parameters: mustStruct(t, `{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`)}},
			ToolChoice:        &stubbornv1.ToolChoice{Mode: stubbornv1.ToolChoiceMode_TOOL_CHOICE_MODE_NAMED, Name: "get_weather"},
			ParallelToolCalls: &f}}},
		{"format and extras", &stubbornv1.Conversation{Api: conversation.ResponsesAPI, Messages: []*stubbornv1.ChatMessage{
			{Role: user, Content: []*stubbornv1.ContentPart{text("JSON please")}},
		}, Options: &stubbornv1.ModelOptions{ResponseFormat: &stubbornv1.ResponseFormat{Type: stubbornv1.ResponseFormatType_RESPONSE_FORMAT_TYPE_JSON_SCHEMA,
			Name: "answer", Description: "An answer", Strict: &tr, Schema: mustStruct(t, `{"type":"object","properties":{"a":{"type":"number"}}}`)},
			Extra: mustStruct(t, `{"reasoning":{"effort":"low"},"truncation":"auto","text.verbosity":"low"}`)}}},
	} {
		t.Run(row.name, func(t *testing.T) {
			t.Parallel()
			got := decode(t, conversation.Responses{}, responsesRequests[row.name]).Conversation
			assert.True(t, proto.Equal(row.want, got), "want: %v\ngot:  %v", row.want, got)
		})
	}
	req := decode(t, conversation.Responses{}, responsesRequests["format and extras"])
	assert.True(t, req.Stream)
	assert.JSONEq(t, `{"drop_params":true}`, string(req.Stubborn))
	assert.Equal(t, "smart", req.Model)
}

func mustStruct(t *testing.T, s string) *structpb.Struct {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(s), &m))
	v, err := structpb.NewStruct(m)
	require.NoError(t, err)
	return v
}

// What needs the provider's state, and what the typed conversation cannot
// hold, is refused naming the field; every bound is kept.
func TestAResponsesRequestItCannotCarryNamesItsField(t *testing.T) {
	t.Parallel()
	many := func(n int, item string) string { return strings.TrimSuffix(strings.Repeat(item+",", n), ",") }
	deep := `{"type":"object"` + strings.Repeat(`,"p":{"a":[`, 13) + `1` + strings.Repeat(`]}`, 13) + `}`
	for _, row := range []struct{ name, body, err string }{
		{"previous_response_id", `{"input":"x","previous_response_id":"resp_1"}`, "previous_response_id: is not carried"},
		{"store true", `{"input":"x","store":true}`, "store: true is not carried"},
		{"conversation", `{"input":"x","conversation":"conv_1"}`, "conversation: is not carried"},
		{"background", `{"input":"x","background":true}`, "background: true is not carried"},
		{"prompt", `{"input":"x","prompt":{"id":"pmpt_1"}}`, "prompt: is not carried"},
		{"web search", `{"input":"x","tools":[{"type":"web_search"}]}`, `tools[0].type: "web_search" is not carried`},
		{"file search", `{"input":"x","tools":[{"type":"function","name":"f"},{"type":"file_search","vector_store_ids":["v"]}]}`, `tools[1].type: "file_search" is not carried`},
		{"computer use", `{"input":"x","tools":[{"type":"computer_use_preview"}]}`, `tools[0].type: "computer_use_preview"`},
		{"code interpreter", `{"input":"x","tools":[{"type":"code_interpreter"}]}`, `tools[0].type: "code_interpreter"`},
		{"mcp", `{"input":"x","tools":[{"type":"mcp","server_label":"s"}]}`, `tools[0].type: "mcp"`},
		{"a hosted tool_choice", `{"input":"x","tool_choice":{"type":"web_search_preview"}}`, `tool_choice.type: "web_search_preview" is not carried`},
		{"a reasoning item", `{"input":[{"role":"user","content":"x"},{"type":"reasoning","id":"rs_1","summary":[]}]}`, `input[1].type: "reasoning" is not carried`},
		{"an item reference", `{"input":[{"type":"item_reference","id":"msg_1"}]}`, `input[0].type: "item_reference" is not carried`},
		{"a file input", `{"input":[{"role":"user","content":[{"type":"input_file","file_id":"file_1"}]}]}`, `input[0].content[0].type: "input_file" is not carried`},
		{"an image by file id", `{"input":[{"role":"user","content":[{"type":"input_image","file_id":"file_1"}]}]}`, `input[0].content[0].file_id: is not carried`},
		{"an image without its URL", `{"input":[{"role":"user","content":[{"type":"input_image","detail":"low"}]}]}`, `input[0].content[0].image_url: is required`},
		{"an input part in an assistant message", `{"input":[{"role":"assistant","content":[{"type":"input_text","text":"x"}]}]}`, `input[0].content[0].type: "input_text" is not an assistant's part`},
		{"an output part in a user message", `{"input":[{"role":"user","content":[{"type":"output_text","text":"x"}]}]}`, `input[0].content[0].type: "output_text" is an assistant's part`},
		{"a role that is none", `{"input":[{"role":"tool","content":"x"}]}`, `input[0].role: "tool" is not a role`},
		{"a call without its id", `{"input":[{"type":"function_call","name":"f","arguments":"{}"}]}`, `input[0].call_id: is required`},
		{"a call without its name", `{"input":[{"type":"function_call","call_id":"c","arguments":"{}"}]}`, `input[0].name: is required`},
		{"an output without its call", `{"input":[{"type":"function_call_output","output":"x"}]}`, `input[0].call_id: is required`},
		{"an output without output", `{"input":[{"type":"function_call_output","call_id":"c"}]}`, `input[0].output: is required`},
		{"a call's unknown field", `{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}","namespace":"n"}]}`, `input[0].namespace: is not carried`},
		{"a tool without a name", `{"input":"x","tools":[{"type":"function"}]}`, `tools[0].name: is required`},
		{"a text format that is none", `{"input":"x","text":{"format":{"type":"grammar"}}}`, `text.format.type: "grammar" is not text, json_object or json_schema`},
		{"a named tool_choice without a name", `{"input":"x","tool_choice":{"type":"function"}}`, `tool_choice.name: is required`},
		{"input neither string nor array", `{"input":5}`, `input: must be a string or an array of items`},
		{"instructions not a string", `{"input":"x","instructions":[{"role":"system"}]}`, `instructions: must be a string`},
		{"1001 items", `{"input":[` + many(1001, `{"role":"user","content":"x"}`) + `]}`, `input: has 1001 elements, more than 1000`},
		{"1000 items and instructions", `{"instructions":"x","input":[` + many(1000, `{"role":"user","content":"x"}`) + `]}`, `input: makes 1001 messages with the instructions, more than 1000`},
		{"129 calls in one turn", `{"input":[` + many(129, `{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}`) + `]}`, `input[128]: is more than 128 tool calls`},
		{"1001 parts", `{"input":[{"role":"user","content":[` + many(1001, `{"type":"input_text","text":"x"}`) + `]}]}`, `input[0].content: has 1001 elements, more than 1000`},
		{"129 tools", `{"input":"x","tools":[` + many(129, `{"type":"function","name":"f"}`) + `]}`, `tools: has 129 elements, more than 128`},
		{"a schema 25 deep", `{"input":"x","tools":[{"type":"function","name":"f","parameters":` + deep + `}]}`, `nests more than 24 levels deep`},
		{"a metadata value too long", `{"input":"x","metadata":{"k":"` + strings.Repeat("v", 513) + `"}}`, `metadata.k: is longer than 512 characters`},
		{"a metadata key too long", `{"input":"x","metadata":{"` + strings.Repeat("k", 65) + `":"v"}}`, `metadata: key`},
		{"a metadata value not a string", `{"input":"x","metadata":{"k":1}}`, `metadata.k: must be a string`},
		{"not an object", `[1]`, `the body must be a JSON object`},
	} {
		t.Run(row.name, func(t *testing.T) {
			t.Parallel()
			_, err := conversation.Responses{}.DecodeRequest([]byte(row.body))
			require.Error(t, err)
			assert.Contains(t, err.Error(), row.err)
			var fe *conversation.FieldError
			assert.ErrorAs(t, err, &fe)
		})
	}
	keys := make([]string, 17)
	for i := range keys {
		keys[i] = `"k` + strings.Repeat("x", i) + `":"v"`
	}
	_, err := conversation.Responses{}.DecodeRequest([]byte(`{"input":"x","metadata":{` + strings.Join(keys, ",") + `}}`))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "metadata: has 17 keys, more than 16")
}

func answer(text string, finish stubbornv1.FinishReason, calls ...*stubbornv1.ToolCall) *stubbornv1.Result {
	m := &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT, ToolCalls: calls}
	if text != "" || len(calls) == 0 {
		m.Content = []*stubbornv1.ContentPart{{Kind: &stubbornv1.ContentPart_Text{Text: text}}}
	}
	return &stubbornv1.Result{Text: text, Choices: []*stubbornv1.Choice{{Message: m, FinishReason: finish}},
		Usage: &stubbornv1.Usage{InputTokens: 10, OutputTokens: 5, CacheReadTokens: 2, ReasoningTokens: 1}, Model: "gpt-x"}
}

// The whole answer as the API returns it, with the echo of the request.
func TestAResponsesAnswerEncodesAsAResponseObject(t *testing.T) {
	t.Parallel()
	conv := decode(t, conversation.Responses{}, responsesRequests["tools"]).Conversation
	m := conversation.Meta{ID: "run1", Model: "smart", Created: 1700000000, Conversation: conv}
	out, err := conversation.Responses{}.EncodeResponse(answer("Let me look.", stubbornv1.FinishReason_FINISH_REASON_TOOL_CALLS,
		&stubbornv1.ToolCall{Id: "call_1", Name: "get_weather", Arguments: `{"city":"Paris"}`}), m)
	require.NoError(t, err)
	assert.JSONEq(t, `{"id":"run1","object":"response","created_at":1700000000,"status":"completed","background":false,"error":null,
		"incomplete_details":null,"instructions":null,"max_output_tokens":null,"metadata":{},"model":"smart",
		"output":[{"id":"msg_run1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Let me look.","annotations":[],"logprobs":[]}]},
		          {"id":"fc_run1_0","type":"function_call","status":"completed","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"}],
		"parallel_tool_calls":false,"previous_response_id":null,"reasoning":{"effort":null,"summary":null},"store":false,"temperature":1,
		"text":{"format":{"type":"text"}},"tool_choice":{"type":"function","name":"get_weather"},
		"tools":[{"type":"function","name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},"strict":true}],
		"top_p":1,"truncation":"disabled",
		"usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":2},"output_tokens":5,"output_tokens_details":{"reasoning_tokens":1},"total_tokens":15},"user":null}`, string(out))

	for _, row := range []struct {
		finish stubbornv1.FinishReason
		status string
		reason string
	}{
		{stubbornv1.FinishReason_FINISH_REASON_LENGTH, "incomplete", `{"reason":"max_output_tokens"}`},
		{stubbornv1.FinishReason_FINISH_REASON_CONTENT_FILTER, "incomplete", `{"reason":"content_filter"}`},
		{stubbornv1.FinishReason_FINISH_REASON_STOP, "completed", `null`},
	} {
		out, err := conversation.Responses{}.EncodeResponse(answer("Hi", row.finish), conversation.Meta{ID: "r"})
		require.NoError(t, err)
		assert.Equal(t, `"`+row.status+`"`, field(t, out, "status"))
		assert.JSONEq(t, row.reason, field(t, out, "incomplete_details"))
		assert.Equal(t, `"`+row.status+`"`, gjsonItemStatus(t, out))
	}
	// Tool calls only: no message item. A result without choices (a
	// delegate that is no model) is its text.
	out, err = conversation.Responses{}.EncodeResponse(answer("", stubbornv1.FinishReason_FINISH_REASON_TOOL_CALLS, &stubbornv1.ToolCall{Id: "c", Name: "f", Arguments: "{}"}), conversation.Meta{ID: "r"})
	require.NoError(t, err)
	assert.JSONEq(t, `[{"id":"fc_r_0","type":"function_call","status":"completed","call_id":"c","name":"f","arguments":"{}"}]`, field(t, out, "output"))
	out, err = conversation.Responses{}.EncodeResponse(&stubbornv1.Result{Text: "plain"}, conversation.Meta{ID: "r"})
	require.NoError(t, err)
	assert.Contains(t, field(t, out, "output"), `"text":"plain"`)
	assert.Equal(t, "null", field(t, out, "usage"))
}

func gjsonItemStatus(t *testing.T, body []byte) string {
	t.Helper()
	var r struct {
		Output []map[string]json.RawMessage `json:"output"`
	}
	require.NoError(t, json.Unmarshal(body, &r))
	require.NotEmpty(t, r.Output)
	return string(r.Output[0]["status"])
}

// A response object decodes into the answer it encodes: text, tool calls,
// finish reason, usage.
func TestAResponsesAnswerRoundTrips(t *testing.T) {
	t.Parallel()
	for _, want := range []*stubbornv1.Result{
		answer("Hello", stubbornv1.FinishReason_FINISH_REASON_STOP),
		answer("Let me look.", stubbornv1.FinishReason_FINISH_REASON_TOOL_CALLS, &stubbornv1.ToolCall{Id: "call_1", Name: "get_weather", Arguments: `{"city":"Paris"}`},
			&stubbornv1.ToolCall{Id: "call_2", Name: "get_time", Arguments: `{}`}),
		answer("", stubbornv1.FinishReason_FINISH_REASON_TOOL_CALLS, &stubbornv1.ToolCall{Id: "c", Name: "f", Arguments: "{}"}),
		answer("Hel", stubbornv1.FinishReason_FINISH_REASON_LENGTH),
	} {
		body, err := conversation.Responses{}.EncodeResponse(want, conversation.Meta{ID: "r", Model: "gpt-x"})
		require.NoError(t, err)
		got, err := conversation.Responses{}.DecodeResponse(body)
		require.NoError(t, err)
		got.GetChoices()[0].NativeFinishReason = ""
		want.Usage.TotalTokens = 15
		assert.True(t, proto.Equal(want, got), "want: %v\ngot:  %v\n%s", want, got, body)
	}
	_, err := conversation.Responses{}.DecodeResponse([]byte(`{"status":"failed","error":{"code":"server_error","message":"boom"}}`))
	var se *conversation.StreamError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, "boom", se.Message)
}

// events is a stream's events as (type, data).
func events(t *testing.T, evs []conversation.Event) ([]string, []map[string]any) {
	t.Helper()
	names := make([]string, len(evs))
	datas := make([]map[string]any, len(evs))
	for i, ev := range evs {
		require.NoError(t, json.Unmarshal(ev.Data, &datas[i]), "%s", ev.Data)
		names[i] = ev.Name
		assert.Equal(t, ev.Name, datas[i]["type"], "the event's name is its type")
		assert.Equal(t, float64(i), datas[i]["sequence_number"], "sequence numbers count the events from 0")
		_, hasError := datas[i]["error"]
		assert.Equal(t, ev.Name == "error", hasError, "only an error event has a top-level error, which the SDKs raise")
	}
	return names, datas
}

func TestTheResponsesStreamIsTheAPIsEventsInOrder(t *testing.T) {
	t.Parallel()
	text := func(s string) *stubbornv1.OutputDelta {
		return &stubbornv1.OutputDelta{Kind: &stubbornv1.OutputDelta_Text{Text: s}}
	}
	call := func(k int32, id, name, args string) *stubbornv1.OutputDelta {
		return &stubbornv1.OutputDelta{Kind: &stubbornv1.OutputDelta_ToolCall{ToolCall: &stubbornv1.ToolCallDelta{Index: k, Id: id, Name: name, Arguments: args}}}
	}
	e := conversation.Responses{}.NewStreamEncoder(conversation.Meta{ID: "r", Model: "smart"})
	var all []conversation.Event
	for _, ds := range [][]*stubbornv1.OutputDelta{{text("Let me "), text("look.")}, {call(0, "call_1", "get_weather", ""), call(0, "", "", `{"city":`)},
		{call(0, "", "", `"Paris"}`), call(1, "call_2", "get_time", "{}")}} {
		evs, err := e.Deltas(ds)
		require.NoError(t, err)
		all = append(all, evs...)
	}
	final := answer("Let me look.", stubbornv1.FinishReason_FINISH_REASON_TOOL_CALLS, &stubbornv1.ToolCall{Id: "call_1", Name: "get_weather", Arguments: `{"city":"Paris"}`},
		&stubbornv1.ToolCall{Id: "call_2", Name: "get_time", Arguments: `{}`})
	evs, err := e.End(final)
	require.NoError(t, err)
	all = append(all, evs...)
	names, datas := events(t, all)
	assert.Equal(t, []string{"response.created", "response.in_progress",
		"response.output_item.added", "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done",
		"response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
		"response.function_call_arguments.done", "response.output_item.done",
		"response.output_item.added", "response.function_call_arguments.delta",
		"response.function_call_arguments.done", "response.output_item.done",
		"response.completed"}, names)
	assert.Equal(t, "in_progress", datas[0]["response"].(map[string]any)["status"])
	assert.Equal(t, "Let me look.", datas[6]["text"])
	assert.Equal(t, float64(1), datas[10]["output_index"])
	assert.Equal(t, "fc_r_0", datas[10]["item_id"])
	assert.Equal(t, `{"city":"Paris"}`, datas[12]["arguments"])
	assert.Equal(t, float64(2), datas[15]["output_index"])
	// The final response is the items as streamed, and what EncodeResponse
	// writes of the same answer.
	completed, err := json.Marshal(datas[len(datas)-1]["response"])
	require.NoError(t, err)
	whole, err := conversation.Responses{}.EncodeResponse(final, conversation.Meta{ID: "r", Model: "smart"})
	require.NoError(t, err)
	assert.JSONEq(t, string(whole), string(completed))

	// The stream decodes into the same answer.
	d := conversation.Responses{}.NewStreamDecoder()
	var deltas []*stubbornv1.OutputDelta
	for i, ev := range all {
		ds, done, err := d.Next(ev)
		require.NoError(t, err)
		deltas = append(deltas, ds...)
		assert.Equal(t, i == len(all)-1, done)
	}
	got := d.Result()
	got.GetChoices()[0].NativeFinishReason = ""
	final.Usage.TotalTokens = 15
	final.Model = "smart"
	assert.True(t, proto.Equal(final, got), "want: %v\ngot:  %v", final, got)
	require.Len(t, deltas, 7)
	assert.Equal(t, int64(len("Let me ")), deltas[1].GetOffset())
}

func TestAResponsesStreamEndsIncompleteOrFailed(t *testing.T) {
	t.Parallel()
	e := conversation.Responses{}.NewStreamEncoder(conversation.Meta{ID: "r"})
	evs, err := e.End(answer("Hel", stubbornv1.FinishReason_FINISH_REASON_LENGTH))
	require.NoError(t, err)
	names, datas := events(t, evs)
	assert.Equal(t, "response.incomplete", names[len(names)-1])
	resp := datas[len(datas)-1]["response"].(map[string]any)
	assert.Equal(t, map[string]any{"reason": "max_output_tokens"}, resp["incomplete_details"])
	assert.Equal(t, "Hel", resp["output"].([]any)[0].(map[string]any)["content"].([]any)[0].(map[string]any)["text"], "End writes what no delta carried")

	e = conversation.Responses{}.NewStreamEncoder(conversation.Meta{ID: "r"})
	first, err := e.Deltas([]*stubbornv1.OutputDelta{{Kind: &stubbornv1.OutputDelta_Text{Text: "Hal"}}})
	require.NoError(t, err)
	failer, ok := e.(*conversation.ResponsesStreamEncoder)
	require.True(t, ok)
	failing, err := failer.Fail("stream_interrupted", "run r: the attempt failed")
	require.NoError(t, err)
	names, datas = events(t, append(first, failing...))
	assert.Equal(t, []string{"error", "response.failed"}, names[len(names)-2:])
	errEv := datas[len(datas)-2]
	assert.Equal(t, "stream_interrupted", errEv["code"])
	assert.Equal(t, "run r: the attempt failed", errEv["message"])
	assert.Equal(t, "run r: the attempt failed", errEv["error"].(map[string]any)["message"])
	failed := datas[len(datas)-1]["response"].(map[string]any)
	assert.Equal(t, "failed", failed["status"])
	assert.Equal(t, map[string]any{"code": "stream_interrupted", "message": "run r: the attempt failed"}, failed["error"])
	again, err := failer.Fail("x", "y")
	require.NoError(t, err)
	assert.Empty(t, again, "nothing after the end")

	// The decoder raises both as a *StreamError.
	d := conversation.Responses{}.NewStreamDecoder()
	for _, ev := range failing {
		_, _, err := d.Next(ev)
		var se *conversation.StreamError
		require.ErrorAs(t, err, &se)
		assert.Equal(t, "stream_interrupted", se.Type)
	}
}

// A Responses conversation reaches the other APIs whole: tool calls and
// results, images, tool_choice, parallel_tool_calls, the format.
func TestTheResponsesAPITranslatesToTheOthers(t *testing.T) {
	t.Parallel()
	for _, row := range []struct {
		concept, body string
		to            conversation.Codec
		field, want   string
	}{
		{"function calls are the assistant's tool_calls, outputs tool messages", responsesRequests["second turn"], conversation.Chat{}, "messages",
			`[{"role":"user","content":"Weather in Paris and Rome?"},
			  {"role":"assistant","content":[{"type":"text","text":"Let me look."}],"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},{"id":"call_2","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Rome\"}"}}]},
			  {"role":"tool","tool_call_id":"call_1","content":"18C"},{"role":"tool","tool_call_id":"call_2","content":[{"type":"text","text":"24C"}]}]`},
		{"function calls are tool_use blocks, outputs tool_result blocks", responsesRequests["second turn"], conversation.Messages{}, "messages",
			`[{"role":"user","content":"Weather in Paris and Rome?"},
			  {"role":"assistant","content":[{"type":"text","text":"Let me look."},{"type":"tool_use","id":"call_1","name":"get_weather","input":{"city":"Paris"}},{"type":"tool_use","id":"call_2","name":"get_weather","input":{"city":"Rome"}}]},
			  {"role":"user","content":[{"type":"tool_result","tool_use_id":"call_1","content":"18C"},{"type":"tool_result","tool_use_id":"call_2","content":[{"type":"text","text":"24C"}]}]}]`},
		{"instructions are a system message", responsesRequests["plain"], conversation.Chat{}, "messages", `[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]`},
		{"instructions are Anthropic's system", responsesRequests["plain"], conversation.Messages{}, "system", `"Be brief."`},
		{"max_output_tokens is max_tokens", responsesRequests["plain"], conversation.Chat{}, "max_tokens", `50`},
		{"images are image_url parts", responsesRequests["messages and images"], conversation.Chat{}, "messages",
			`[{"role":"developer","content":"Answer in French."},{"role":"user","content":[{"type":"text","text":"What is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo=","detail":"low"}},{"type":"image_url","image_url":{"url":"https://example.com/cat.jpg"}}]},{"role":"assistant","content":"A cat."},{"role":"user","content":"Sure?"}]`},
		{"a named function is tool_choice", responsesRequests["tools"], conversation.Chat{}, "tool_choice", `{"type":"function","function":{"name":"get_weather"}}`},
		{"parallel_tool_calls stays", responsesRequests["tools"], conversation.Chat{}, "parallel_tool_calls", `false`},
		{"function tools are Chat Completions' tools", responsesRequests["tools"], conversation.Chat{}, "tools",
			`[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},"strict":true}}]`},
		{"a named function and no parallel calls to Anthropic", responsesRequests["tools"], conversation.Messages{}, "tool_choice", `{"type":"tool","name":"get_weather","disable_parallel_tool_use":true}`},
		{"text.format is response_format", responsesRequests["format and extras"], conversation.Chat{}, "response_format",
			`{"type":"json_schema","json_schema":{"name":"answer","description":"An answer","schema":{"type":"object","properties":{"a":{"type":"number"}}},"strict":true}}`},
		{"metadata is not sent to Chat Completions", responsesRequests["plain"], conversation.Chat{}, "metadata", `null`},
	} {
		t.Run(row.concept, func(t *testing.T) {
			t.Parallel()
			out := encode(t, row.to, decode(t, conversation.Responses{}, row.body).Conversation)
			assert.JSONEq(t, row.want, field(t, out, row.field), "%s", out)
		})
	}
	// And back: Chat Completions' and Anthropic's second turns as items.
	out := encode(t, conversation.Responses{}, decode(t, conversation.Chat{}, chatRequests["second turn"]).Conversation)
	assert.JSONEq(t, `[{"type":"message","role":"user","content":"Weather in Paris and Rome?"},
		{"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
		{"type":"function_call","call_id":"call_2","name":"get_weather","arguments":"{\"city\":\"Rome\"}"},
		{"type":"function_call_output","call_id":"call_1","output":"18C"},{"type":"function_call_output","call_id":"call_2","output":"24C"}]`, field(t, out, "input"))
	assert.JSONEq(t, `"auto"`, field(t, out, "tool_choice"))
	assert.JSONEq(t, `false`, field(t, out, "store"))
	out = encode(t, conversation.Responses{}, decode(t, conversation.Chat{}, chatRequests["response format and extras"]).Conversation)
	assert.JSONEq(t, `{"format":{"type":"json_schema","name":"answer","schema":{"type":"object","properties":{"a":{"type":"number"}}},"strict":true}}`, field(t, out, "text"))
	assert.JSONEq(t, `99`, field(t, out, "max_output_tokens"))
	out = encode(t, conversation.Responses{}, decode(t, conversation.Messages{}, messagesRequests["system blocks and images"]).Conversation)
	assert.JSONEq(t, `[{"type":"message","role":"system","content":[{"type":"input_text","text":"Be brief."}]},
		{"type":"message","role":"user","content":[{"type":"input_text","text":"What is this?"},{"type":"input_image","image_url":"data:image/png;base64,iVBORw0KGgo="},{"type":"input_image","image_url":"https://example.com/cat.jpg"}]}]`, field(t, out, "input"))
}

// What the other APIs cannot carry of a Responses conversation is named in
// the Responses API's words, and the other way round.
func TestWhatTheResponsesAPICannotCarryIsNamed(t *testing.T) {
	t.Parallel()
	for _, row := range []struct {
		why      string
		from, to conversation.Codec
		body     string
		want     []string
	}{
		{"reasoning and verbosity to Chat Completions", conversation.Responses{}, conversation.Chat{}, responsesRequests["format and extras"], []string{"reasoning", "text.verbosity", "truncation"}},
		{"json_schema to Anthropic", conversation.Responses{}, conversation.Messages{}, `{"input":"x","text":{"format":{"type":"json_schema","name":"a","schema":{}}}}`, []string{"response_format"}},
		{"metadata is the caller's bookkeeping", conversation.Responses{}, conversation.Messages{}, responsesRequests["plain"], nil},
		{"a tool's extra field to Chat Completions", conversation.Responses{}, conversation.Chat{}, `{"input":"x","tools":[{"type":"function","name":"f","defer_loading":true}]}`, []string{"tools[0].defer_loading"}},
		{"n, stop, seed, penalties to the Responses API", conversation.Chat{}, conversation.Responses{}, `{"messages":[],"n":2,"stop":"x","seed":1,"presence_penalty":0.1,"frequency_penalty":0.1}`,
			[]string{"n", "stop", "seed", "presence_penalty", "frequency_penalty"}},
		{"Chat Completions' extras to the Responses API", conversation.Chat{}, conversation.Responses{}, `{"messages":[{"role":"user","name":"ann","content":"x"}],"logprobs":true}`, []string{"logprobs", "messages[0].name"}},
		{"top_k and is_error to the Responses API", conversation.Messages{}, conversation.Responses{}, `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"x","is_error":true}]}],"top_k":3}`,
			[]string{"top_k", "messages[0].is_error"}},
		{"the whole Chat Completions tool turn carries", conversation.Chat{}, conversation.Responses{}, chatRequests["second turn"], nil},
	} {
		t.Run(row.why, func(t *testing.T) {
			t.Parallel()
			conv := decode(t, row.from, row.body).Conversation
			var got []string
			for _, u := range conversation.Carry(row.to.API(), conv, conversation.Drop{}) {
				got = append(got, u.Field)
			}
			assert.ElementsMatch(t, row.want, got)
			_, err := row.to.EncodeRequest(conv, conversation.Entry{Model: "m"}, false)
			assert.Equal(t, len(row.want) > 0, err != nil, "the encoder refuses what Carry lists: %v", err)
		})
	}
}
