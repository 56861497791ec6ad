package conversation

import (
	"fmt"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// The APIs, as their proto enum: a conversation records the one it was
// written in (Conversation.api), whose names its extra fields use.
const (
	ChatCompletions   = stubbornv1.ConversationAPI_CONVERSATION_API_CHAT_COMPLETIONS
	AnthropicMessages = stubbornv1.ConversationAPI_CONVERSATION_API_ANTHROPIC_MESSAGES
	ResponsesAPI      = stubbornv1.ConversationAPI_CONVERSATION_API_RESPONSES
)

// Bounds every decoder keeps: a body over one is an error naming the field,
// so a door refuses it before a run is made of it.
const (
	// MaxMessages bounds a conversation's messages.
	MaxMessages = 1000
	// MaxParts bounds one message's content parts.
	MaxParts = 1000
	// MaxTools bounds the tools a request offers.
	MaxTools = 128
	// MaxToolCalls bounds one message's (or one choice's) tool calls.
	MaxToolCalls = 128
	// MaxChoices bounds n, and the choices a response may have.
	MaxChoices = 128
	// MaxStops bounds the stop sequences.
	MaxStops = 128
	// MaxDepth bounds how deeply a JSON value (a tool's schema, an extra
	// field) nests: controls.MaxDataDepth, so what a codec accepts the run
	// can journal.
	MaxDepth = 24
)

// FieldError is a body a codec will not take, naming the field (a path into
// the body, such as `messages[3].content[1].type`).
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return e.Msg
	}
	return e.Field + ": " + e.Msg
}

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Request is a model request as a front door decodes it: the typed
// conversation, and the few fields that are the door's own business rather
// than the model's.
type Request struct {
	// Model is the request's model: a preset or delegate name at a door.
	Model string
	// Stream asks for the answer as server-sent events.
	Stream bool
	// IncludeUsage is Chat Completions' stream_options.include_usage: a last
	// chunk with the usage. Anthropic's streams always carry it.
	IncludeUsage bool
	// Conversation is the messages and options, typed.
	Conversation *stubbornv1.Conversation
	// Stubborn is the request's "stubborn" extension field, as sent (nil
	// when absent), for the door to read (criteria, drop_params).
	Stubborn []byte
}

// Entry is what a model delegate's registry entry adds to a request: its
// model always, the rest where the conversation sets none.
type Entry struct {
	// Model is the model the API is asked for.
	Model string
	// System is a system prompt sent before the conversation's. Empty
	// means none.
	System string
	// Temperature is used when the conversation sets none. nil means the
	// API's default.
	Temperature *float64
	// MaxTokens is used when the conversation sets none. 0 means the API's
	// default (Anthropic, which requires one: defaultAnthropicMaxTokens).
	MaxTokens int64
}

// defaultAnthropicMaxTokens is the max_tokens sent to Anthropic when neither
// the conversation nor the entry sets one: the Messages API requires it.
const defaultAnthropicMaxTokens = 1024

// Meta is what a door's response says about itself beside the answer.
type Meta struct {
	// ID is the response's id (the door uses its run's).
	ID string
	// Model is the model named in the response.
	Model string
	// Created is the response's Unix time in seconds (Chat Completions'
	// created, the Responses API's created_at).
	Created int64
	// IncludeUsage adds the usage chunk to a Chat Completions stream.
	IncludeUsage bool
	// Conversation is the request's conversation: the Responses API echoes
	// the request's options in its response (tools, tool_choice,
	// temperature, top_p, text.format, metadata, ...). nil echoes the
	// API's defaults.
	Conversation *stubbornv1.Conversation
}

// Event is one server-sent event: its name (empty for Chat Completions'
// unnamed events) and its data.
type Event struct {
	Name string
	Data []byte
}

// AppendSSE appends e in the text/event-stream format.
func (e Event) AppendSSE(b []byte) []byte {
	if e.Name != "" {
		b = append(b, "event: "...)
		b = append(b, e.Name...)
		b = append(b, '\n')
	}
	b = append(b, "data: "...)
	b = append(b, e.Data...)
	return append(b, '\n', '\n')
}

// Codec is one model API's wire format, both directions: Chat, Messages and
// Responses implement it over the same types.
type Codec interface {
	// API names the API.
	API() stubbornv1.ConversationAPI
	// DecodeRequest reads a request body as a front door gets it. Its
	// fields that the typed conversation has no place for go to the
	// conversation's extra fields (in this API's names), never away.
	DecodeRequest(body []byte) (*Request, error)
	// EncodeRequest writes the body a delegate of this API is sent: the
	// conversation, translated when it was written in another API, over
	// the entry's defaults. A field the API cannot carry that the
	// conversation does not allow dropping is an error (Carry says which
	// beforehand).
	EncodeRequest(c *stubbornv1.Conversation, e Entry, stream bool) ([]byte, error)
	// DecodeResponse reads a whole answer: its choices, usage and model
	// (Result.text is choice 0's text).
	DecodeResponse(body []byte) (*stubbornv1.Result, error)
	// EncodeResponse writes a whole answer as a front door returns it.
	EncodeResponse(r *stubbornv1.Result, m Meta) ([]byte, error)
	// NewStreamDecoder reads a streamed answer, one event at a time.
	NewStreamDecoder() StreamDecoder
	// NewStreamEncoder writes a streamed answer, as a front door sends it.
	NewStreamEncoder(m Meta) StreamEncoder
}

// StreamDecoder accumulates a streamed answer. Routing is by the events'
// own indexes (a choice's index, a call's index, a content block's index),
// never by their order, so n > 1 and tool calls come out whole.
type StreamDecoder interface {
	// Next takes one event and returns the deltas it carried (offsets
	// set), and whether it was the stream's end marker. An event that
	// reports an error is returned as a *StreamError.
	Next(ev Event) (deltas []*stubbornv1.OutputDelta, done bool, err error)
	// Result is the answer so far: every choice with its text and tool
	// calls, finish reasons, usage and model.
	Result() *stubbornv1.Result
}

// StreamEncoder writes a streamed answer.
type StreamEncoder interface {
	// Deltas returns the events that carry ds (the first call also opens
	// the stream).
	Deltas(ds []*stubbornv1.OutputDelta) ([]Event, error)
	// End returns the events that finish the stream with r: whatever of
	// r's choices the deltas did not carry yet, each choice's finish
	// reason, the usage, and the end marker.
	End(r *stubbornv1.Result) ([]Event, error)
}

// StreamError is an error a model reported inside its stream.
type StreamError struct {
	Type    string
	Message string
}

func (e *StreamError) Error() string { return "stream error: " + e.Type + ": " + e.Message }

// codecFor returns the codec of api, or nil for an API Stubborn does not speak.
func codecFor(api stubbornv1.ConversationAPI) Codec {
	switch api {
	case ChatCompletions:
		return Chat{}
	case AnthropicMessages:
		return Messages{}
	case ResponsesAPI:
		return Responses{}
	}
	return nil
}
