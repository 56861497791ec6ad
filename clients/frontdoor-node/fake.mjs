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
import { CheckError, badTemperature, check, checkToolCalls, checkToolUse, env as envOf, expectAPIError, last, sunny, weatherTool, weatherToolAnthropic } from "./lib.mjs";

const env = (name) => envOf("fake model", name);

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
