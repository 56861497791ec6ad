// Package conversation is the model's whole conversation and answer, typed,
// and one codec per model API Stubborn speaks: Chat Completions (Chat,
// ChatCompletions), Anthropic's Messages (Messages, AnthropicMessages) and
// OpenAI's Responses API (Responses, ResponsesAPI). The types
// are the generated messages of proto/stubborn/v1/conversation.proto
// (stubbornv1.Conversation, ChatMessage, Choice, Usage, OutputDelta): one type
// system for the doors, the model delegates, the journal and CEL, with no copy
// between a Go and a proto form.
//
// A codec decodes and encodes the four bodies of its API — a request (door
// side: Decode; delegate side: Encode), a whole response, and a streamed one
// (StreamDecoder accumulates server-sent events into choices and returns the
// deltas as they come; StreamEncoder writes the events for deltas and for the
// end). A conversation decoded by one codec and encoded by another is
// translated (the table is in the README's "Model front doors" and in
// conversation.proto's comments). What the target API cannot carry is never
// dropped silently: Carry lists it, naming each field, for the caller to
// refuse before any call, unless the conversation allows dropping it
// (Conversation.drop_params); an encoder leaves out only what was allowed.
//
// The Responses API is spoken without provider state: each request carries
// the whole conversation. What needs a provider's stored responses or
// tools is refused naming the field (previous_response_id, store: true,
// conversation, background: true, prompt, built-in tools, reasoning items
// and item references, files by id). instructions become a system message
// first; function_call items become the assistant's tool calls (joining the
// assistant message before them), function_call_output items tool
// messages; text.format is response_format; metadata is echoed in the
// response and sent only to a Responses API delegate. An earlier answer's
// item ids, statuses and annotations, sent back as input, are read and
// left out: they are the provider's bookkeeping, not the model's input. Its
// answer is choice 0 (the API has no n). Its stream encoder also ends a
// stream with an error (its method Fail(code, message)): an
// `error` event, which the openai SDKs raise, then response.failed.
//
// response_format to Anthropic is refused, not emulated. The usual emulation
// (a forced tool whose input schema is the schema, its input returned as the
// text) changes the answer's shape (stop_reason tool_use, a tool_use block),
// clashes with the request's own tools and tool_choice, and would hide the
// translation from failure criteria that judge the text. A caller that can
// live without it drops it ("stubborn": {"drop_params": ["response_format"]}).
//
// Every decoder bounds what it accepts (MaxMessages, MaxTools, MaxChoices,
// MaxDepth…) and every error names the field it is about, as a path into the
// body: `messages[3].content[1].type: "input_audio" is not carried`.
package conversation
