// The fake model (clients/frontdoor-go/fakemodel) under the official openai
// npm package and @anthropic-ai/sdk, without Stubborn: the tool calls, the
// choices and the errors the scenarios of check.mjs and anthropic.mjs expect
// through the front door must first be what the SDKs parse from the fake
// itself, plain and streamed. clients/check-frontdoor.sh runs it with:
//
//   FAKE_TOOLS_URL        http://127.0.0.1:PORT of a fakemodel -mode tools
//   FAKE_GOOD_URL         of a fakemodel -mode good
//   FAKE_BAD_REQUEST_URL  of a fakemodel -mode bad-request
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { CheckError, check, env as envOf, expectAPIError } from "./lib.mjs";

const env = (name) => envOf("fake model", name);
export const weatherTool = {
  type: "function",
  function: { name: "get_weather", description: "The weather in a city.", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } },
};
export const weatherToolAnthropic = { name: "get_weather", description: "The weather in a city.", input_schema: weatherTool.function.parameters };
export const sunny = "It is sunny in Paris.";
export const badTemperature = "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 5 instead.";

// checkToolCalls checks that an OpenAI message is one get_weather call
// with JSON arguments {city: "Paris"}, and returns the call.
export function checkToolCalls(what, msg) {
  const calls = msg?.tool_calls ?? [];
  check(calls.length === 1 && calls[0].type === "function" && calls[0].function.name === "get_weather" && calls[0].id,
    `${what}: tool_calls ${JSON.stringify(calls)}, want one get_weather call with an id`);
  let args;
  try {
    args = JSON.parse(calls[0].function.arguments);
  } catch {
    throw new CheckError(`${what}: arguments ${JSON.stringify(calls[0].function.arguments)} are not JSON`);
  }
  check(args?.city === "Paris", `${what}: arguments ${calls[0].function.arguments}, want {"city": "Paris"}`);
  return calls[0];
}

// checkToolUse checks that an Anthropic message is one get_weather
// tool_use block with input {city: "Paris"}, and returns the block.
export function checkToolUse(what, msg) {
  const uses = (msg?.content ?? []).filter((b) => b.type === "tool_use");
  check(uses.length === 1 && uses[0].name === "get_weather" && uses[0].id && uses[0].input?.city === "Paris" && msg.stop_reason === "tool_use",
    `${what}: ${JSON.stringify(msg)}, want one get_weather tool_use block with input {"city": "Paris"}, stop_reason tool_use`);
  return uses[0];
}

// last is what the fake at url recorded of its last request of api
// ("chat" or "messages").
export async function last(url, api) {
  const resp = await fetch(url + "/last");
  check(resp.ok, `the fake model's /last: ${resp.status}`);
  return (await resp.json())[api] ?? {};
}

async function main() {
  const toolsURL = env("FAKE_TOOLS_URL"), goodURL = env("FAKE_GOOD_URL"), badURL = env("FAKE_BAD_REQUEST_URL");
  const question = { role: "user", content: "What is the weather in Paris?" };

  // Chat Completions.
  {
    const client = new OpenAI({ baseURL: toolsURL + "/v1", apiKey: "k", maxRetries: 0 });
    const req = { model: "m", messages: [question], tools: [weatherTool] };
    const c = await client.chat.completions.create(req);
    check(c.choices[0].finish_reason === "tool_calls", `openai: finish_reason ${c.choices[0].finish_reason}`);
    const call = checkToolCalls("openai: chat.completions.create", c.choices[0].message);
    const final = await client.chat.completions.stream(req).finalChatCompletion();
    checkToolCalls("openai: chat.completions.stream().finalChatCompletion()", final.choices[0].message);
    const turn = { ...req, messages: [question, c.choices[0].message, { role: "tool", tool_call_id: call.id, content: '{"sky": "clear"}' }] };
    const answer = await client.chat.completions.create(turn);
    check(answer.choices[0].message.content === sunny, `openai: the second turn: ${JSON.stringify(answer.choices)}`);
    const got = await last(toolsURL, "chat");
    check(JSON.stringify(got.tool_result_ids) === JSON.stringify([call.id]), `openai: /last ${JSON.stringify(got)}, want the result of ${call.id}`);
    console.log(`ok: fake model, openai: a get_weather call ${call.id}, plain and streamed; its result answered ${JSON.stringify(sunny)}`);

    const good = new OpenAI({ baseURL: goodURL + "/v1", apiKey: "k", maxRetries: 0 });
    const two = await good.chat.completions.create({ model: "m", messages: [question], n: 2 });
    const texts = two.choices.map((ch) => ch.message.content);
    check(JSON.stringify(texts) === JSON.stringify(["The answer is 42.", "The answer is 43."]), `openai: n 2: ${JSON.stringify(texts)}`);
    const streamed = await good.chat.completions.stream({ model: "m", messages: [question], n: 2 }).finalChatCompletion();
    check(JSON.stringify(streamed.choices.map((ch) => ch.message.content)) === JSON.stringify(texts), `openai: n 2 streamed: ${JSON.stringify(streamed.choices)}`);
    const bad = new OpenAI({ baseURL: badURL + "/v1", apiKey: "k", maxRetries: 0 });
    const err = await expectAPIError("openai: bad-request", bad.chat.completions.create({ model: "m", messages: [question], temperature: 5 }),
      OpenAI.BadRequestError, 400, "code", "decimal_above_max_value");
    check(err.message.includes(badTemperature), `openai: bad-request: ${err.message}`);
    console.log("ok: fake model, openai: n 2 is two choices, plain and streamed; bad-request is OpenAI.BadRequestError");
  }

  // Messages.
  {
    const client = new Anthropic({ baseURL: toolsURL, apiKey: "k", maxRetries: 0 });
    const req = { model: "m", max_tokens: 256, messages: [question], tools: [weatherToolAnthropic] };
    const m = await client.messages.create(req);
    const use = checkToolUse("anthropic: messages.create", m);
    const final = await client.messages.stream(req).finalMessage();
    checkToolUse("anthropic: messages.stream().finalMessage()", final);
    const turn = { ...req, messages: [question, { role: "assistant", content: m.content },
      { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: '{"sky": "clear"}' }] }] };
    const answer = await client.messages.stream(turn).finalMessage();
    check(answer.content[0]?.text === sunny && answer.stop_reason === "end_turn", `anthropic: the second turn: ${JSON.stringify(answer)}`);
    const got = await last(toolsURL, "messages");
    check(JSON.stringify(got.tool_result_ids) === JSON.stringify([use.id]), `anthropic: /last ${JSON.stringify(got)}, want the result of ${use.id}`);
    const bad = new Anthropic({ baseURL: badURL, apiKey: "k", maxRetries: 0 });
    const err = await expectAPIError("anthropic: bad-request", bad.messages.create({ ...req, temperature: 5 }), Anthropic.BadRequestError, 400, "type", "invalid_request_error");
    check(err.message.includes(badTemperature), `anthropic: bad-request: ${err.message}`);
    console.log(`ok: fake model, anthropic: a get_weather tool_use ${use.id}, plain and streamed; its tool_result answered; bad-request is Anthropic.BadRequestError`);
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  try {
    await main();
  } catch (err) {
    console.error(`FAIL: fake model: ${err instanceof CheckError ? err.message : err?.stack ?? err}`);
    process.exit(1);
  }
}
