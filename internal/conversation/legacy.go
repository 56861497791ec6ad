package conversation

import (
	"encoding/json"
	"fmt"
	"math"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Runs journaled before the typed conversation carry it as two Structs
// (RunRequest.task_messages and model_params): Chat Completions messages,
// and the rest of a Chat Completions request body. FromLegacy and ToLegacy
// translate between the two forms, through the Chat Completions codec, so
// the Structs keep the meaning they had: what Chat Completions names, the
// codec reads; every other field is an extra field sent as it is to a
// Chat Completions delegate (and one that another API cannot carry).

// legacyDropped are the request fields model_params never carried: a
// delegate sets its own model and stream (a delegate always replaced or
// removed them).
var legacyDropped = []string{"model", "stream", "stream_options"}

// legacyMaxTokens are the model parameters an Anthropic delegate always
// bounded to int32 (a JSON number may be 1e300): the bound is kept, so
// such a run still reads.
var legacyMaxTokens = []string{"max_tokens", "max_completion_tokens"}

// FromLegacy is the typed conversation of a run's legacy messages and
// model parameters (Chat Completions' shapes and names). The conversation's
// API is Chat Completions. An error names the field, as a path into the
// Chat Completions body the Structs make (`messages[2].content[0].type`).
func FromLegacy(msgs []*structpb.Struct, params *structpb.Struct) (*stubbornv1.Conversation, error) {
	body := params.AsMap()
	if body == nil {
		body = map[string]any{}
	}
	for _, k := range legacyDropped {
		delete(body, k)
	}
	for _, k := range legacyMaxTokens {
		if n, ok := body[k].(float64); ok && n > math.MaxInt32 {
			body[k] = math.MaxInt32
		}
	}
	// The codec keeps "stubborn" aside as the door's business; in
	// model_params it was sent as it was, so it stays an extra field.
	stubborn, hasStubborn := body["stubborn"]
	delete(body, "stubborn")
	messages := make([]any, len(msgs))
	for i, m := range msgs {
		messages[i] = m.AsMap()
	}
	body["messages"] = messages
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("conversation: legacy messages: %w", err)
	}
	req, err := Chat{}.DecodeRequest(b)
	if err != nil {
		return nil, err
	}
	c := req.Conversation
	if hasStubborn {
		v, err := structpb.NewValue(stubborn)
		if err != nil {
			return nil, fieldErr("stubborn", "%v", err)
		}
		if c.Options == nil {
			c.Options = &stubbornv1.ModelOptions{}
		}
		if c.Options.Extra == nil {
			c.Options.Extra = &structpb.Struct{Fields: map[string]*structpb.Value{}}
		}
		c.Options.Extra.Fields["stubborn"] = v
	}
	return c, nil
}

// ToLegacy renders c as the legacy Structs: its messages as Chat
// Completions messages, its options as the rest of a Chat Completions body
// (nil when none is set). What Chat Completions cannot carry (a
// conversation written for another API may have such fields) is left out:
// the Structs are what a reader of the legacy fields understood, the typed
// conversation is the whole. nil is none.
func ToLegacy(c *stubbornv1.Conversation) ([]*structpb.Struct, *structpb.Struct, error) {
	if c == nil {
		return nil, nil, nil
	}
	all := proto.CloneOf(c)
	all.DropAllParams, all.DropParams = true, nil
	if all.Options == nil {
		all.Options = &stubbornv1.ModelOptions{} // the codec reads its fields
	}
	b, err := Chat{}.EncodeRequest(all, Entry{}, false)
	if err != nil {
		return nil, nil, err
	}
	var body map[string]any
	if err := json.Unmarshal(b, &body); err != nil {
		return nil, nil, fmt.Errorf("conversation: legacy messages: %w", err)
	}
	raw, _ := body["messages"].([]any)
	msgs := make([]*structpb.Struct, 0, len(raw))
	for i, m := range raw {
		obj, _ := m.(map[string]any)
		s, err := structpb.NewStruct(obj)
		if err != nil {
			return nil, nil, fieldErr(at("messages", i), "%v", err)
		}
		msgs = append(msgs, s)
	}
	delete(body, "messages")
	delete(body, "model")
	if len(body) == 0 {
		return msgs, nil, nil
	}
	params, err := structpb.NewStruct(body)
	if err != nil {
		return nil, nil, fieldErr("", "%v", err)
	}
	return msgs, params, nil
}
