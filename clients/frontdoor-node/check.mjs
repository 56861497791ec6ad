// Drives Stubborn's OpenAI-compatible front door with the official `openai`
// npm package (pinned in package.json and package-lock.json), changed in
// nothing but its base URL and API key, and fails on the first answer that
// is not what an app would want. clients/check-frontdoor.sh starts the
// servers and runs it with:
//
//   FRONTDOOR_BASE_URL           http://127.0.0.1:PORT/v1 (stubborn serve -http-listen)
//   FRONTDOOR_API_KEY            a tenant's bearer token
//   FRONTDOOR_LIMITED_API_KEY    the token of a tenant with one run start, then 429
//   FRONTDOOR_THROTTLE_HITS_URL  the throttling fake model's /hits
//   FRONTDOOR_TOOLS_URL          the tool-calling fake model (its /last)
//
// It prints one line per check, and "run nonstreamed|streamed ID" for the
// runs the script then reads back with `stubborn get`.
import OpenAI from "openai";
import {
  CheckError, check, checkToolCalls, env as envOf, expectAPIError as expectError, expectBadRequest, hits, last, parts, sunny, want, weatherTool,
} from "./lib.mjs";

const expectAPIError = (what, p, cls, status, value) => expectError(what, p, cls, status, "code", value);
const env = (name) => envOf("openai (node)", name);

const messages = [
  { role: "system", content: "Be brief." },
  { role: "user", content: "What is it?" },
];

async function main() {
  const baseURL = env("FRONTDOOR_BASE_URL");
  const apiKey = env("FRONTDOOR_API_KEY");
  const limitedKey = env("FRONTDOOR_LIMITED_API_KEY");
  const brokeKey = env("FRONTDOOR_BROKE_API_KEY");
  const hitsURL = env("FRONTDOOR_THROTTLE_HITS_URL");

  // The change an app makes: the base URL and the API key.
  const client = new OpenAI({ baseURL, apiKey, timeout: 30_000 });

  // GET /v1/models lists the presets and the delegates.
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  for (const m of ["smart", "patient", "brittle", "throttled", "good"]) {
    check(ids.includes(m), `models.list: ${m} missing from ${JSON.stringify(ids)}`);
  }
  console.log(`ok: models.list lists ${ids.join(", ")}`);

  // Not streamed: the chain's first model answers 503, the second answers.
  {
    const { data: c, response } = await client.chat.completions.create({ model: "smart", messages }).withResponse();
    const runID = response.headers.get("stubborn-run-id");
    check(c.choices.length === 1 && c.choices[0].message.content === want,
      `chat.completions.create(smart): choices ${JSON.stringify(c.choices)}, want one with ${JSON.stringify(want)}`);
    check(runID && c.id === runID, `chat.completions.create(smart): id ${c.id}, header Stubborn-Run-Id ${runID}: want the run id in both`);
    check(c.object === "chat.completion" && c.model === "smart" && c.choices[0].finish_reason === "stop" && c.choices[0].message.role === "assistant",
      `chat.completions.create(smart): ${JSON.stringify(c)}`);
    check(c.usage?.total_tokens === 7, `chat.completions.create(smart): usage ${JSON.stringify(c.usage)}, want total_tokens 7`);
    console.log(`ok: chat.completions.create(smart) = ${JSON.stringify(c.choices[0].message.content)}, id = Stubborn-Run-Id = ${c.id}`);
    console.log(`run nonstreamed ${c.id}`);
  }

  // Streamed (stream: true): over a 503 (which spent no tokens).
  for (const [model, tokens] of [["smart", 7]]) {
    const { data: stream, response } = await client.chat.completions
      .create({ model, messages, stream: true, stream_options: { include_usage: true } })
      .withResponse();
    const runID = response.headers.get("stubborn-run-id");
    check(runID, `stream(${model}): no Stubborn-Run-Id header`);
    check((response.headers.get("content-type") ?? "").startsWith("text/event-stream"), `stream(${model}): Content-Type ${response.headers.get("content-type")}`);
    let text = "", pieces = 0, finish = null, usage = null;
    for await (const ch of stream) {
      check(ch.id === runID, `stream(${model}): a chunk's id ${ch.id}, want the run id ${runID}`);
      check(ch.object === "chat.completion.chunk", `stream(${model}): a chunk's object ${ch.object}`);
      for (const choice of ch.choices) {
        if (choice.delta?.content) {
          pieces++;
          text += choice.delta.content;
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
      if (ch.usage) usage = ch.usage;
    }
    check(text === want && pieces >= 2 && finish === "stop" && usage?.total_tokens === tokens,
      `stream(${model}): ${pieces} pieces ${JSON.stringify(text)}, finish_reason ${finish}, usage ${JSON.stringify(usage)}: want ${JSON.stringify(want)} in 2 pieces or more, stop, ${tokens} tokens`);
    console.log(`ok: chat.completions.create(${model}, stream: true) = ${JSON.stringify(text)} in ${pieces} pieces, usage ${usage?.total_tokens} tokens, every chunk's id = Stubborn-Run-Id = ${runID}`);
    if (model === "smart") console.log(`run streamed ${runID}`);
  }

  // Streamed with the SDK's stream helper: over a model that stalls.
  {
    const runner = client.chat.completions.stream({ model: "patient", messages });
    let pieces = 0;
    runner.on("content", () => pieces++);
    const final = await runner.finalChatCompletion();
    check(final.choices[0]?.message?.content === want && pieces >= 2,
      `chat.completions.stream(patient): ${JSON.stringify(final.choices)} in ${pieces} pieces, want ${JSON.stringify(want)} in 2 or more`);
    console.log(`ok: chat.completions.stream(patient).finalChatCompletion() = ${JSON.stringify(want)} in ${pieces} pieces, id ${final.id}`);
  }

  // The chain's first model drops its connection mid-answer. Not streamed,
  // the client gets the second model's answer; streamed, it had part of the
  // first's, so the stream ends with an error event naming the run, which
  // the SDK raises.
  {
    const c = await client.chat.completions.create({ model: "brittle", messages });
    check(c.choices[0]?.message?.content === want, `chat.completions.create(brittle): ${JSON.stringify(c)}, want ${JSON.stringify(want)}`);
    console.log(`ok: chat.completions.create(brittle) = ${JSON.stringify(want)}: nothing of the broken attempt`);
    const { data: stream, response } = await client.chat.completions.create({ model: "brittle", messages, stream: true }).withResponse();
    const runID = response.headers.get("stubborn-run-id");
    let text = "";
    try {
      for await (const ch of stream) text += ch.choices[0]?.delta?.content ?? "";
      throw new CheckError(`stream(brittle): ended after ${JSON.stringify(text)} without an error`);
    } catch (err) {
      if (err instanceof CheckError) throw err;
      check(err instanceof OpenAI.APIError && err.status === undefined && err.code === "stream_interrupted" && runID &&
        err.error?.run_id === runID && err.message.includes(runID),
        `stream(brittle): after ${JSON.stringify(text)}: got ${err?.constructor?.name} ${err?.message} (${JSON.stringify(err?.error)}), want OpenAI.APIError stream_interrupted naming the run ${runID}`);
    }
    check(text && text !== want && want.startsWith(text), `stream(brittle): before the error: ${JSON.stringify(text)}, want the start of ${JSON.stringify(want)}`);
    console.log(`ok: chat.completions.create(brittle, stream: true): ${JSON.stringify(text)}, then OpenAI.APIError naming the run ${runID}`);
  }

  // A wrong API key: 401.
  const bad = new OpenAI({ baseURL, apiKey: "sk-not-a-stubborn-token", maxRetries: 0 });
  await expectAPIError("wrong API key", bad.chat.completions.create({ model: "smart", messages }), OpenAI.AuthenticationError, 401, "invalid_api_key");
  console.log("ok: a wrong API key is OpenAI.AuthenticationError 401");

  // An unknown model: 404.
  await expectAPIError("unknown model", client.chat.completions.create({ model: "no-such-model", messages }), OpenAI.NotFoundError, 404, "model_not_found");
  console.log("ok: an unknown model is OpenAI.NotFoundError 404");

  // A run whose retries ran out (the model only answers 429): 503 with
  // x-should-retry: false, so the SDK (2 retries by default) sends it once,
  // and the model saw Stubborn's two attempts only.
  {
    const before = await hits(hitsURL);
    const err = await expectAPIError("throttled", client.chat.completions.create({ model: "throttled", messages }), OpenAI.InternalServerError, 503, "run_failed");
    check(err.headers.get("x-should-retry") === "false" && err.headers.get("stubborn-run-id"),
      `throttled: headers x-should-retry ${err.headers.get("x-should-retry")} stubborn-run-id ${err.headers.get("stubborn-run-id")}, want false and the run`);
    const sent = (await hits(hitsURL)) - before;
    check(sent === 2, `throttled: the 429 model got ${sent} requests, want 2 (Stubborn's try and retry, the SDK's request once)`);
    console.log(`ok: retries exhausted is OpenAI.InternalServerError 503, x-should-retry false, sent once (the model saw ${sent} attempts)`);
  }

  // The tenant's run_starts_per_second: its one start, then 429.
  {
    const limited = new OpenAI({ baseURL, apiKey: limitedKey, maxRetries: 0 });
    const first = await limited.chat.completions.create({ model: "good", messages });
    check(first.choices[0]?.message?.content === want, `limited tenant, first run: ${JSON.stringify(first)}`);
    const err = await expectAPIError("limited tenant, second run", limited.chat.completions.create({ model: "good", messages }), OpenAI.RateLimitError, 429, "rate_limit_exceeded");
    check(err.headers.get("retry-after"), "limited tenant: a 429 without Retry-After");
    console.log(`ok: over the tenant's rate is OpenAI.RateLimitError 429, Retry-After ${err.headers.get("retry-after")}`);
  }

  // The tenant's daily spend limit (0.5): its first run costs 1 (the
  // stubborn field says so), then 429 insufficient_quota until midnight UTC.
  {
    const broke = new OpenAI({ baseURL, apiKey: brokeKey, maxRetries: 0 });
    const first = await broke.chat.completions.create({ model: "priced-good", messages });
    check(first.choices[0]?.message?.content === want, `broke tenant, first run: ${JSON.stringify(first)}`);
    check(first.stubborn?.cost?.total === 1, `broke tenant, first run: stubborn.cost ${JSON.stringify(first.stubborn)}, want total 1`);
    const err = await expectAPIError("broke tenant, second run", broke.chat.completions.create({ model: "priced-good", messages }), OpenAI.RateLimitError, 429, "insufficient_quota");
    const after = Number(err.headers.get("retry-after"));
    check(after > 0 && after <= 86400, `broke tenant: Retry-After ${err.headers.get("retry-after")}, want the seconds until midnight UTC`);
    check(/daily spend limit/.test(err.message) && /resets at/.test(err.message), `broke tenant: ${err.message}`);
    console.log(`ok: over the tenant's daily spend limit is OpenAI.RateLimitError 429 insufficient_quota, Retry-After ${after}s: ${err.message}`);
  }

  await whole(client, env("FRONTDOOR_TOOLS_URL"));
}

// whole checks the model's whole answer: tool calls across providers,
// choices, the model's own 400; each part also when another failed.
async function whole(client, toolsURL) {
  const question = { role: "user", content: "What is the weather in Paris?" };
  const req = { model: "tools-to-anthropic", messages: [question], tools: [weatherTool] };
  await parts("openai (node)", [
    // A get_weather tool over tools-to-anthropic = fallback_chain [an
    // openai model answering 500, an anthropic model answering tool_use]:
    // the app gets tool_calls. The second turn, the assistant's tool calls
    // and the tool's result back: the anthropic model gets a tool_result
    // with the call's id, the app its text, plain and streamed.
    ["tool calls, then the second turn", async () => {
      const c = await client.chat.completions.create(req);
      check(c.choices.length === 1 && c.choices[0].finish_reason === "tool_calls",
        `chat.completions.create(tools-to-anthropic): ${JSON.stringify(c.choices)}, want one choice with finish_reason tool_calls`);
      const call = checkToolCalls("chat.completions.create(tools-to-anthropic)", c.choices[0].message);
      console.log(`ok: chat.completions.create(tools-to-anthropic): tool_calls[0] = ${call.function.name}(${call.function.arguments}), id ${call.id}`);
      const turn = { ...req, messages: [question, c.choices[0].message, { role: "tool", tool_call_id: call.id, content: '{"sky": "clear", "celsius": 21}' }] };
      for (const streamed of [false, true]) {
        const how = streamed ? "chat.completions.stream(second turn).finalChatCompletion()" : "chat.completions.create(second turn)";
        const answer = streamed ? await client.chat.completions.stream(turn).finalChatCompletion() : await client.chat.completions.create(turn);
        check(answer.choices[0]?.message?.content === sunny && answer.choices[0].finish_reason === "stop",
          `${how}: ${JSON.stringify(answer.choices)}, want ${JSON.stringify(sunny)}, stop`);
        const got = await last(toolsURL, "messages");
        check(JSON.stringify(got.tool_result_ids) === JSON.stringify([call.id]) && got.tool_results?.[0]?.includes("clear"),
          `${how}: the anthropic model got ${JSON.stringify(got)}, want a tool_result for ${call.id} with the tool's content`);
        console.log(`ok: ${how} = ${JSON.stringify(sunny)}: the anthropic model got a tool_result for ${call.id}`);
      }
    }],
    // The same, through the SDK's stream helper.
    ["tool calls streamed", async () => {
      const runner = client.chat.completions.stream(req);
      let deltas = 0;
      runner.on("chunk", (ch) => { if (ch.choices[0]?.delta?.tool_calls) deltas++; });
      const final = await runner.finalChatCompletion();
      const got = checkToolCalls("chat.completions.stream(tools-to-anthropic).finalChatCompletion()", final.choices[0]?.message);
      check(final.choices[0].finish_reason === "tool_calls" && deltas >= 1,
        `chat.completions.stream(tools-to-anthropic): finish_reason ${final.choices[0].finish_reason} after ${deltas} tool_calls deltas`);
      console.log(`ok: chat.completions.stream(tools-to-anthropic).finalChatCompletion(): tool_calls[0] = ${got.function.name}(${got.function.arguments}) from ${deltas} deltas`);
    }],
    // n: 2 over choices = fallback_chain [a model answering 500, good]:
    // two choices with their own texts, plain and streamed.
    ["n: 2", async () => {
      const wantTexts = JSON.stringify(["The answer is 42.", "The answer is 43."]);
      const two = await client.chat.completions.create({ model: "choices", messages: [question], n: 2 });
      const texts = JSON.stringify([...two.choices].sort((a, b) => a.index - b.index).map((ch) => ch.message.content));
      check(texts === wantTexts, `chat.completions.create(choices, n: 2): ${JSON.stringify(two.choices)}, want ${wantTexts}`);
      const final = await client.chat.completions.stream({ model: "choices", messages: [question], n: 2 }).finalChatCompletion();
      const streamed = JSON.stringify(final.choices.map((ch) => ch.message.content));
      check(streamed === wantTexts, `chat.completions.stream(choices, n: 2): ${JSON.stringify(final.choices)}, want ${wantTexts}`);
      console.log(`ok: chat.completions.create(choices, n: 2) = ${texts}, the same streamed`);
    }],
    // The model's own 400 (an anthropic model's, here): the SDK's
    // BadRequestError with the model's message.
    ["the model's 400", async () => {
      const err = await expectBadRequest("chat.completions.create(rejects-anthropic)",
        client.chat.completions.create({ model: "rejects-anthropic", messages: [question], temperature: 1 }), OpenAI.BadRequestError);
      console.log(`ok: the model's 400 is OpenAI.BadRequestError: ${err.message}`);
    }],
  ]);
}

try {
  await main();
  console.log("openai (node): all checks passed");
} catch (err) {
  if (err instanceof OpenAI.APIError) {
    console.error(`FAIL: openai (node): ${err.constructor.name}${err.status ? " " + err.status : ""}: ${err.message}`);
  } else {
    console.error(`FAIL: openai (node): ${err instanceof CheckError ? err.message : err?.stack ?? err}`);
  }
  process.exit(1);
}
