// What several pages use.

import { Code } from "@connectrpc/connect";
import {
  RunStatus,
  RunStatusSchema,
  type ListDelegatesResponse,
} from "../../../clients/typescript/src/gen/stubborn/v1/control_pb.js";
import { api, describe, errorCode, isAbort } from "./api";
import { h } from "./dom";
import { enumName, shortName, words } from "./format";

// controlNames are the controls as ListRuns' filter and RunSummary name
// them, and as people read them.
export const controlNames: Record<string, string> = {
  retry: "retry",
  retry_with_learning: "retry with learning",
  fallback_chain: "fallback chain",
  race: "race",
  balance: "balance",
};

export function terminal(s: RunStatus): boolean {
  return s === RunStatus.SUCCEEDED || s === RunStatus.EXHAUSTED || s === RunStatus.FAILED || s === RunStatus.CANCELLED;
}

// statusBadge shows a run's status in words ("Awaiting decision"); its
// class (s-AWAITING_DECISION) colours it, its title is the enum's name.
export function statusBadge(s: RunStatus): HTMLElement {
  return h("span", { class: "badge s-" + shortName(RunStatusSchema, s), title: enumName(RunStatusSchema, s) }, words(RunStatusSchema, s));
}

// sleep waits ms, or less if signal aborts.
export function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const t = setTimeout(done, Math.max(0, ms));
    signal.addEventListener("abort", done, { once: true });
    function done() {
      clearTimeout(t);
      signal.removeEventListener("abort", done);
      resolve();
    }
  });
}

let cached: { at: number; res: Promise<ListDelegatesResponse> } | undefined;

// loadDelegates returns the registry as the caller may use it (cached for
// 10s), or undefined after reporting the error to onError.
export async function loadDelegates(signal: AbortSignal, onError?: (msg: string) => void): Promise<ListDelegatesResponse | undefined> {
  if (!cached || Date.now() - cached.at > 10000) {
    cached = { at: Date.now(), res: api.listDelegates({}) };
  }
  try {
    const res = await cached.res;
    return signal.aborted ? undefined : res;
  } catch (err) {
    cached = undefined;
    if (!isAbort(err) && !signal.aborted) {
      const msg = describe(err);
      // UNAUTHENTICATED: the token prompt says it.
      if (errorCode(err) !== Code.Unauthenticated) onError?.(msg);
    }
    return undefined;
  }
}
