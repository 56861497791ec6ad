// Drives Stubborn's Responses API door (POST /v1/responses) with the
// official `openai` npm package (pinned in package.json and
// package-lock.json), changed in nothing but its base URL and API key.
// clients/check-frontdoor.sh starts the servers and runs it with:
//
//   FRONTDOOR_BASE_URL           http://127.0.0.1:PORT/v1 (stubborn serve -http-listen)
//   FRONTDOOR_API_KEY            a tenant's bearer token
//   FRONTDOOR_TOOLS_URL          the tool-calling fake model (its /last)
//
// It prints one line per check, and "run responses|responses-streamed ID"
// for the runs the script then reads back with `stubborn get`.
import OpenAI from "openai";
import { CheckError, check, env as envOf, expectAPIError, last, parts, sunny, want, weatherTool } from "./lib.mjs";

const env = (name) => envOf("openai responses (node)", name);

// The get_weather tool as the Responses API declares it.
const weatherFunction = { type: "function", name: weatherTool.function.name, description: weatherTool.function.description, parameters: weatherTool.function.parameters };

// functionCall is a response's one get_weather function_call item, whose
// arguments are {city: "Paris"}.
function functionCall(what, r) {
  const calls = (r.output ?? []).filter((o) => o.type === "function_call");
  check(calls.length === 1 && calls[0].name === "get_weather" && calls[0].call_id,
    `${what}: output ${JSON.stringify(r.output)}, want one get_weather function_call item with a call_id`);
  let args;
  try {
    args = JSON.parse(calls[0].arguments);
  } catch {
    throw new CheckError(`${what}: arguments ${JSON.stringify(calls[0].arguments)} are not JSON`);
  }
  check(args?.city === "Paris", `${what}: arguments ${calls[0].arguments}, want {"city": "Paris"}`);
  return calls[0];
}

async function main() {
  const client = new OpenAI({ baseURL: env("FRONTDOOR_BASE_URL"), apiKey: env("FRONTDOOR_API_KEY"), timeout: 30_000 });
  const toolsURL = env("FRONTDOOR_TOOLS_URL");
  const text = { model: "smart", instructions: "Be brief.", input: "What is it?" };
  const question = { role: "user", content: "What is the weather in Paris?" };
  const tools = { model: "tools-to-anthropic", input: [question], tools: [weatherFunction] };

  await parts("openai responses (node)", [
    // smart = fallback_chain [busy (503), good].
    ["responses.create", async () => {
      const { data: r, response } = await client.responses.create(text).withResponse();
      const runID = response.headers.get("stubborn-run-id");
      check(r.output_text === want, `responses.create(smart): output ${JSON.stringify(r.output)}, want the text ${JSON.stringify(want)}`);
      check(runID && r.id === runID, `responses.create(smart): id ${r.id}, header Stubborn-Run-Id ${runID}: want the run id in both`);
      check(r.object === "response" && r.status === "completed" && r.usage?.total_tokens === 7,
        `responses.create(smart): object ${r.object}, status ${r.status}, usage ${JSON.stringify(r.usage)}: want response, completed, 7 tokens`);
      console.log(`ok: responses.create(smart) = ${JSON.stringify(r.output_text)}, id = Stubborn-Run-Id = ${r.id}`);
      console.log(`run responses ${r.id}`);
    }],
    ["responses.stream", async () => {
      const stream = client.responses.stream(text);
      let deltas = "";
      stream.on("response.output_text.delta", (ev) => { deltas += ev.delta; });
      const final = await stream.finalResponse();
      check(final.output_text === want && deltas === want && final.status === "completed",
        `responses.stream(smart).finalResponse(): ${JSON.stringify(final.output)} (${final.status}) from deltas ${JSON.stringify(deltas)}, want ${JSON.stringify(want)}`);
      console.log(`ok: responses.stream(smart).finalResponse() = ${JSON.stringify(final.output_text)}, id ${final.id}`);
      console.log(`run responses-streamed ${final.id}`);
    }],
    // tools-to-anthropic = fallback_chain [an openai model answering 500,
    // an anthropic model answering tool_use]: a function_call item; the
    // second turn's function_call_output reaches the anthropic model as a
    // tool_result with the call's id.
    ["a function_call, then the second turn", async () => {
      const r = await client.responses.create(tools);
      const call = functionCall("responses.create(tools-to-anthropic)", r);
      console.log(`ok: responses.create(tools-to-anthropic): a function_call item ${call.name}(${call.arguments}), call_id ${call.call_id}`);
      const turn = { ...tools, input: [question, ...r.output, { type: "function_call_output", call_id: call.call_id, output: '{"sky": "clear", "celsius": 21}' }] };
      for (const streamed of [false, true]) {
        const how = streamed ? "responses.stream(second turn).finalResponse()" : "responses.create(second turn)";
        const answer = streamed ? await client.responses.stream(turn).finalResponse() : await client.responses.create(turn);
        check(answer.output_text === sunny, `${how}: ${JSON.stringify(answer.output)}, want ${JSON.stringify(sunny)}`);
        const got = await last(toolsURL, "messages");
        check(JSON.stringify(got.tool_result_ids) === JSON.stringify([call.call_id]) && got.tool_results?.[0]?.includes("clear"),
          `${how}: the anthropic model got ${JSON.stringify(got)}, want a tool_result for ${call.call_id} with the tool's output`);
        console.log(`ok: ${how} = ${JSON.stringify(sunny)}: the anthropic model got a tool_result for ${call.call_id}`);
      }
    }],
    ["a function_call streamed", async () => {
      const stream = client.responses.stream(tools);
      let deltas = 0;
      stream.on("response.function_call_arguments.delta", () => deltas++);
      const final = await stream.finalResponse();
      const call = functionCall("responses.stream(tools-to-anthropic).finalResponse()", final);
      check(deltas >= 1, `responses.stream(tools-to-anthropic): ${deltas} function_call_arguments deltas`);
      console.log(`ok: responses.stream(tools-to-anthropic).finalResponse(): a function_call item ${call.name}(${call.arguments}) from ${deltas} deltas`);
    }],
    // brittle = fallback_chain [breaks (drops its connection mid-answer),
    // good]: streamed, "The answer " then the SDK's own error naming the run.
    ["a stream cut mid-answer", async () => {
      const { data: stream, response } = await client.responses.create({ ...text, model: "brittle", stream: true }).withResponse();
      const runID = response.headers.get("stubborn-run-id");
      let deltas = "";
      try {
        for await (const ev of stream) if (ev.type === "response.output_text.delta") deltas += ev.delta;
        throw new CheckError(`responses.create(brittle, stream): ended after ${JSON.stringify(deltas)} without an error`);
      } catch (err) {
        if (err instanceof CheckError) throw err;
        check(err instanceof OpenAI.APIError && err.code === "stream_interrupted" && runID && err.error?.run_id === runID && err.message.includes(runID),
          `responses.create(brittle, stream): after ${JSON.stringify(deltas)}: got ${err?.constructor?.name} ${err?.message} (${JSON.stringify(err?.error)}), want OpenAI.APIError stream_interrupted naming the run ${runID}`);
      }
      check(deltas && deltas !== want && want.startsWith(deltas), `responses.create(brittle, stream): before the error: ${JSON.stringify(deltas)}, want the start of ${JSON.stringify(want)}`);
      console.log(`ok: responses.create(brittle, stream: true): ${JSON.stringify(deltas)}, then OpenAI.APIError naming the run ${runID}`);
    }],
    // What a gateway without a provider's state cannot do: the SDK's own
    // BadRequestError naming the field.
    ["refusals", async () => {
      for (const [field, extra] of [["previous_response_id", { previous_response_id: "resp_1" }], ["store", { store: true }], ["background", { background: true }]]) {
        const err = await expectAPIError(`responses.create(${field})`, client.responses.create({ ...text, ...extra }), OpenAI.BadRequestError, 400, "code", "invalid_request");
        check(err.param === field && err.message.includes(field), `responses.create(${field}): param ${err.param}, message ${err.message}: want the field named`);
      }
      await expectAPIError("responses.create(no such model)", client.responses.create({ ...text, model: "no-such-model" }), OpenAI.NotFoundError, 404, "code", "model_not_found");
      console.log("ok: previous_response_id, store: true and background are OpenAI.BadRequestError naming the field; an unknown model OpenAI.NotFoundError");
    }],
  ]);
}

try {
  await main();
  console.log("openai responses (node): all checks passed");
} catch (err) {
  console.error(`FAIL: openai responses (node): ${err instanceof CheckError ? err.message : err?.stack ?? err}`);
  process.exit(1);
}
