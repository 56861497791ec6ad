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
