// Drives Stubborn's Messages door (POST /v1/messages) with the official
// `@anthropic-ai/sdk` npm package (pinned in package.json and
// package-lock.json), changed in nothing but its base URL and API key, over
// the same fake models and presets as check.mjs (the door runs the chain
// whatever the delegates' kind), then tools over a chain whose answering
// model speaks Chat Completions. clients/check-frontdoor.sh starts the
// servers and runs it with:
//
//   FRONTDOOR_BASE_URL           http://127.0.0.1:PORT/v1 (the SDK's base URL is without /v1)
//   FRONTDOOR_API_KEY            a tenant's bearer token (sent as X-Api-Key)
//   FRONTDOOR_LIMITED_API_KEY    the token of a tenant with one run start, then 429
//   FRONTDOOR_THROTTLE_HITS_URL  the throttling fake model's /hits
//   FRONTDOOR_TOOLS_URL          the tool-calling fake model (its /last)
//
// It prints one line per check, and "run nonstreamed|streamed ID" for the
// runs the script then reads back with `stubborn get`.
import Anthropic from "@anthropic-ai/sdk";
import {
  CheckError, check, checkToolUse, env as envOf, expectAPIError as expectError, expectBadRequest, hits, last, parts, sunny, want, weatherToolAnthropic,
} from "./lib.mjs";

const expectAPIError = (what, p, cls, status, value) => expectError(what, p, cls, status, "type", value);
const env = (name) => envOf("@anthropic-ai/sdk", name);

const request = { max_tokens: 256, system: "Be brief.", messages: [{ role: "user", content: "What is it?" }] };

async function main() {
  const baseURL = env("FRONTDOOR_BASE_URL").replace(/\/v1$/, "");
  const apiKey = env("FRONTDOOR_API_KEY");
  const limitedKey = env("FRONTDOOR_LIMITED_API_KEY");
  const hitsURL = env("FRONTDOOR_THROTTLE_HITS_URL");

  // The change an app makes: the base URL and the API key.
  const client = new Anthropic({ baseURL, apiKey, timeout: 30_000 });

  // GET /v1/models lists the presets and the delegates.
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  for (const m of ["smart", "patient", "brittle", "throttled", "good"]) {
    check(ids.includes(m), `models.list: ${m} missing from ${JSON.stringify(ids)}`);
  }
  console.log(`ok: models.list lists ${ids.join(", ")}`);

  // Not streamed: the chain's first model answers 503, the second answers.
  {
    const { data: m, response } = await client.messages.create({ model: "smart", ...request }).withResponse();
    const runID = response.headers.get("stubborn-run-id");
    const text = m.content.map((b) => (b.type === "text" ? b.text : "")).join("");
    check(text === want && m.content.length === 1, `messages.create(smart): content ${JSON.stringify(m.content)}, want one text block ${JSON.stringify(want)}`);
    check(runID && m.id === runID, `messages.create(smart): id ${m.id}, header Stubborn-Run-Id ${runID}: want the run id in both`);
    check(m.type === "message" && m.role === "assistant" && m.model === "smart" && m.stop_reason === "end_turn",
      `messages.create(smart): ${JSON.stringify(m)}`);
    check(m.usage?.input_tokens === 3 && m.usage?.output_tokens === 4, `messages.create(smart): usage ${JSON.stringify(m.usage)}, want 3 in, 4 out`);
    console.log(`ok: messages.create(smart) = ${JSON.stringify(text)}, id = Stubborn-Run-Id = ${m.id}`);
    console.log(`run nonstreamed ${m.id}`);
  }

  // Streamed with the SDK's stream helper (message_start … message_stop).
  {
    const stream = client.messages.stream({ model: "smart", ...request });
    let pieces = 0;
    stream.on("text", () => pieces++);
    const final = await stream.finalMessage();
    const text = final.content.map((b) => (b.type === "text" ? b.text : "")).join("");
    check(text === want && pieces >= 2 && final.stop_reason === "end_turn" && final.usage?.output_tokens === 4,
      `messages.stream(smart): ${JSON.stringify(final)} in ${pieces} pieces, want ${JSON.stringify(want)} in 2 or more, end_turn, 4 tokens out`);
    console.log(`ok: messages.stream(smart).finalMessage() = ${JSON.stringify(text)} in ${pieces} pieces, id ${final.id}`);
    console.log(`run streamed ${final.id}`);
  }

  // stream: true over a model that stalls: the second model's text.
  {
    const stream = await client.messages.create({ model: "patient", ...request, stream: true });
    let text = "";
    for await (const ev of stream) {
      if (ev.type === "content_block_delta" && ev.delta.type === "text_delta") text += ev.delta.text;
    }
    check(text === want, `messages.create(patient, stream: true): ${JSON.stringify(text)}, want ${JSON.stringify(want)}`);
    console.log(`ok: messages.create(patient, stream: true) = ${JSON.stringify(text)}`);
  }

  // The chain's first model drops its connection mid-answer: not streamed,
  // the second model's answer; streamed, part of the first's, then an error
  // event naming the run, which the SDK raises.
  {
    const m = await client.messages.create({ model: "brittle", ...request });
    check(m.content[0]?.text === want, `messages.create(brittle): ${JSON.stringify(m)}, want ${JSON.stringify(want)}`);
    console.log(`ok: messages.create(brittle) = ${JSON.stringify(want)}: nothing of the broken attempt`);
    const { data: stream, response } = await client.messages.create({ model: "brittle", ...request, stream: true }).withResponse();
    const runID = response.headers.get("stubborn-run-id");
    let text = "";
    try {
      for await (const ev of stream) {
        if (ev.type === "content_block_delta") text += ev.delta.text ?? "";
      }
      throw new CheckError(`stream(brittle): ended after ${JSON.stringify(text)} without an error`);
    } catch (err) {
      if (err instanceof CheckError) throw err;
      check(err instanceof Anthropic.APIError && err.status === undefined && err.type === "api_error" && runID &&
        err.error?.error?.run_id === runID && err.message.includes(runID),
        `stream(brittle): after ${JSON.stringify(text)}: got ${err?.constructor?.name} ${err?.message} (${JSON.stringify(err?.error)}), want Anthropic.APIError naming the run ${runID}`);
    }
    check(text && text !== want && want.startsWith(text), `stream(brittle): before the error: ${JSON.stringify(text)}, want the start of ${JSON.stringify(want)}`);
    console.log(`ok: messages.create(brittle, stream: true): ${JSON.stringify(text)}, then Anthropic.APIError naming the run ${runID}`);
  }

  // A wrong API key: 401.
  const bad = new Anthropic({ baseURL, apiKey: "sk-ant-not-a-stubborn-token", maxRetries: 0 });
  await expectAPIError("wrong API key", bad.messages.create({ model: "smart", ...request }), Anthropic.AuthenticationError, 401, "authentication_error");
  console.log("ok: a wrong API key is Anthropic.AuthenticationError 401");

  // An unknown model: 404.
  await expectAPIError("unknown model", client.messages.create({ model: "no-such-model", ...request }), Anthropic.NotFoundError, 404, "not_found_error");
  console.log("ok: an unknown model is Anthropic.NotFoundError 404");

  // Retries ran out (the model only answers 429): 503, x-should-retry
  // false, so the SDK (2 retries by default) sends it once.
  {
    const before = await hits(hitsURL);
    const err = await expectAPIError("throttled", client.messages.create({ model: "throttled", ...request }), Anthropic.InternalServerError, 503, "api_error");
    check(err.headers.get("x-should-retry") === "false" && err.headers.get("stubborn-run-id"),
      `throttled: headers x-should-retry ${err.headers.get("x-should-retry")} stubborn-run-id ${err.headers.get("stubborn-run-id")}, want false and the run`);
    const sent = (await hits(hitsURL)) - before;
    check(sent === 2, `throttled: the 429 model got ${sent} requests, want 2 (Stubborn's try and retry, the SDK's request once)`);
    console.log(`ok: retries exhausted is Anthropic.InternalServerError 503, x-should-retry false, sent once (the model saw ${sent} attempts)`);
  }

  // The tenant's run_starts_per_second: its one start, then 429.
  {
    const limited = new Anthropic({ baseURL, apiKey: limitedKey, maxRetries: 0 });
    const first = await limited.messages.create({ model: "good", ...request });
    check(first.content[0]?.text === want, `limited tenant, first run: ${JSON.stringify(first)}`);
    const err = await expectAPIError("limited tenant, second run", limited.messages.create({ model: "good", ...request }), Anthropic.RateLimitError, 429, "rate_limit_error");
    check(err.headers.get("retry-after"), "limited tenant: a 429 without Retry-After");
    console.log(`ok: over the tenant's rate is Anthropic.RateLimitError 429, Retry-After ${err.headers.get("retry-after")}`);
  }

  await whole(client, env("FRONTDOOR_TOOLS_URL"));
}

// whole checks the model's whole answer: tool use across providers, the
// model's own 400; each part also when another failed.
async function whole(client, toolsURL) {
  const question = { role: "user", content: "What is the weather in Paris?" };
  const req = { model: "tools-to-openai", max_tokens: 256, messages: [question], tools: [weatherToolAnthropic] };
  await parts("@anthropic-ai/sdk", [
    // A get_weather tool over tools-to-openai = fallback_chain [an
    // anthropic model answering 500, an openai model answering
    // tool_calls]: the app gets a tool_use block. The second turn, the
    // tool_use and its tool_result back: the openai model gets a role
    // "tool" message with the same id, the app its text, plain and
    // streamed.
    ["tool use, then the second turn", async () => {
      const m = await client.messages.create(req);
      const use = checkToolUse("messages.create(tools-to-openai)", m);
      console.log(`ok: messages.create(tools-to-openai): tool_use ${use.name}(${JSON.stringify(use.input)}), id ${use.id}`);
      const turn = { ...req, messages: [question, { role: "assistant", content: m.content },
        { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: '{"sky": "clear", "celsius": 21}' }] }] };
      for (const streamed of [false, true]) {
        const how = streamed ? "messages.stream(second turn).finalMessage()" : "messages.create(second turn)";
        const answer = streamed ? await client.messages.stream(turn).finalMessage() : await client.messages.create(turn);
        const text = answer.content.map((b) => (b.type === "text" ? b.text : "")).join("");
        check(text === sunny && answer.stop_reason === "end_turn", `${how}: ${JSON.stringify(answer)}, want ${JSON.stringify(sunny)}, end_turn`);
        const got = await last(toolsURL, "chat");
        check(JSON.stringify(got.tool_result_ids) === JSON.stringify([use.id]) && got.tool_results?.[0]?.includes("clear"),
          `${how}: the openai model got ${JSON.stringify(got)}, want a role "tool" message for ${use.id} with the tool's content`);
        console.log(`ok: ${how} = ${JSON.stringify(sunny)}: the openai model got the tool result for ${use.id}`);
      }
    }],
    // The same, through the SDK's stream helper.
    ["tool use streamed", async () => {
      const stream = client.messages.stream(req);
      let fragments = 0;
      stream.on("inputJson", () => fragments++);
      const final = await stream.finalMessage();
      const got = checkToolUse("messages.stream(tools-to-openai).finalMessage()", final);
      check(fragments >= 1, `messages.stream(tools-to-openai): ${fragments} input_json_delta events`);
      console.log(`ok: messages.stream(tools-to-openai).finalMessage(): tool_use ${got.name}(${JSON.stringify(got.input)}) from ${fragments} input_json_delta events`);
    }],
    // The model's own 400 (an openai model's, here): the SDK's
    // BadRequestError with the model's message.
    ["the model's 400", async () => {
      const err = await expectBadRequest("messages.create(rejects)", client.messages.create({ model: "rejects", max_tokens: 256, messages: [question] }), Anthropic.BadRequestError);
      console.log(`ok: the model's 400 is Anthropic.BadRequestError: ${err.message}`);
    }],
  ]);
}

try {
  await main();
  console.log("@anthropic-ai/sdk: all checks passed");
} catch (err) {
  if (err instanceof Anthropic.APIError) {
    console.error(`FAIL: @anthropic-ai/sdk: ${err.constructor.name}${err.status ? " " + err.status : ""}: ${err.message}`);
  } else {
    console.error(`FAIL: @anthropic-ai/sdk: ${err instanceof CheckError ? err.message : err?.stack ?? err}`);
  }
  process.exit(1);
}
