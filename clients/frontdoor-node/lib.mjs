// What check.mjs (openai) and anthropic.mjs (@anthropic-ai/sdk) share.

export const want = "The answer is 42.";

// env is the environment variable name, which clients/check-frontdoor.sh
// sets; who names the program in the failure.
export function env(who, name) {
  const v = process.env[name];
  if (!v) {
    console.error(`FAIL: ${who}: ${name} is not set`);
    process.exit(2);
  }
  return v;
}

export class CheckError extends Error {}
export function check(ok, msg) {
  if (!ok) throw new CheckError(msg);
}

// expectAPIError awaits p, which must reject with the SDK's own class for
// the status, whose field (the error's code in openai, its type in
// @anthropic-ai/sdk) is value.
export async function expectAPIError(what, p, cls, status, field, value) {
  try {
    const got = await p;
    throw new CheckError(`${what}: answered ${JSON.stringify(got).slice(0, 300)}, want ${cls.name} ${status}`);
  } catch (err) {
    if (err instanceof CheckError) throw err;
    check(err instanceof cls, `${what}: got ${err?.constructor?.name}: ${err?.message}, want ${cls.name}`);
    check(err.status === status && err[field] === value && err.message,
      `${what}: got ${cls.name} ${err.status} ${field} ${JSON.stringify(err[field])} message ${JSON.stringify(err.message)}, want ${status} ${value}`);
    return err;
  }
}

// hits is how many requests the fake model at url has had.
export async function hits(url) {
  const resp = await fetch(url);
  check(resp.ok, `the fake model's hits: ${resp.status}`);
  return (await resp.json()).hits;
}

// The get_weather tool, as each API declares it, and what the fake model
// (clients/frontdoor-go/fakemodel -mode tools, -mode bad-request) answers.
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

// expectBadRequest awaits p, which must reject with the SDK's own
// BadRequestError (cls) carrying the bad-request model's message.
export async function expectBadRequest(what, p, cls) {
  try {
    const got = await p;
    throw new CheckError(`${what}: answered ${JSON.stringify(got).slice(0, 300)}, want ${cls.name} 400`);
  } catch (err) {
    if (err instanceof CheckError) throw err;
    check(err instanceof cls && err.status === 400 && err.message.includes(badTemperature),
      `${what}: got ${err?.constructor?.name} ${err?.status}: ${err?.message}, want ${cls.name} 400 with the model's message ${JSON.stringify(badTemperature)}`);
    return err;
  }
}

// parts runs each [name, fn] of parts, also after one failed, so that a
// run says every part that failed; then throws if any did.
export async function parts(who, list) {
  const failed = [];
  for (const [name, fn] of list) {
    try {
      await fn();
    } catch (err) {
      const msg = err instanceof CheckError ? err.message : `${err?.constructor?.name}${err?.status ? " " + err.status : ""}: ${err?.message}`;
      console.error(`FAIL: ${who}: ${name}: ${msg}`);
      failed.push(name);
    }
  }
  check(failed.length === 0, `${failed.length} of ${list.length} parts failed: ${failed.join("; ")}`);
}
