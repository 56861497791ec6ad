// The delegates page: every delegate and preset the caller may use
// (ListDelegates, polled every 2s): each delegate's health, circuit
// breaker (and until when it stays open, and why), what its latest call
// did (ok, failing since when, or none yet: all a delegate without a
// health check has to show for health), calls in flight
// against its bulkhead, its rate use over the last minute, and its latest
// failed calls, all as this server sees them.

import { toJsonString } from "@bufbuild/protobuf";
import {
  BreakerState,
  GuardScope,
  BreakerStateSchema,
  DelegateDescriptionSchema,
  DelegateHealth,
  type DelegateDescription,
  type DelegateFailure,
} from "../../../clients/typescript/src/gen/stubborn/v1/control_pb.js";
import { api, isAbort, report } from "./api";
import { ServerClock } from "./clock";
import { attr, h, text } from "./dom";
import { durMs, enumName, fmtMs, fmtTime, isoTime, tsMs, words } from "./format";
import type { Page } from "./main";
import { describeControl } from "./run";
import { sleep } from "./shared";
import { codes } from "./timeline";

// pollMs is how often the page asks again.
const pollMs = 2000;

interface Row {
  tr: HTMLTableRowElement;
  key: string;
  // What moves with the time: the breaker's countdown, the failures' ages.
  until?: { el: HTMLElement; at: number };
  ages: { el: HTMLElement; at: number }[];
}

const healthWords: Record<number, [string, string]> = {
  [DelegateHealth.SERVING]: ["Serving", "ok"],
  [DelegateHealth.NOT_SERVING]: ["Not serving", "bad"],
  [DelegateHealth.UNREACHABLE]: ["Unreachable", "bad"],
};

export function delegatesPage(): Page {
  const ac = new AbortController();
  const signal = ac.signal;
  const clock = new ServerClock();
  const rows = new Map<string, Row>();

  const tbody = h("tbody");
  const table = h("table", { class: "delegates", "data-testid": "delegates" },
    h("caption", { class: "visually-hidden" }, "Delegates, in the registry's order"),
    h("thead", null, h("tr", null,
      h("th", { scope: "col" }, "Delegate"), h("th", { scope: "col" }, "Health"), h("th", { scope: "col" }, "Circuit breaker"),
      h("th", { scope: "col" }, "In flight"), h("th", { scope: "col" }, "Rate, last minute"), h("th", { scope: "col" }, "Recent failures"))),
    tbody);
  const presets = h("ul", { class: "presets", "data-testid": "presets" });
  const presetsSection = h("section", { hidden: true, "aria-labelledby": "presets-title" },
    h("h2", { id: "presets-title" }, "Presets"), presets);
  const empty = h("p", { class: "empty", hidden: true }, "No delegates are configured for you.");
  const error = h("p", { class: "error", role: "alert" });
  const live = h("span", { class: "live", "data-testid": "live", "aria-live": "polite" }, "loading…");
  const el = h("section", { class: "delegates-page" },
    h("div", { class: "title" }, h("h1", null, "Delegates"), live),
    h("p", { class: "hint" }, "As this server sees them (each replica keeps its own breakers, limits and failures). Refreshed every 2 seconds."),
    error, table, empty, presetsSection);

  function row(d: DelegateDescription): Row {
    const ages: Row["ages"] = [];
    const cell = (...c: (Node | string | null)[]) => h("td", null, ...c);
    const decl = [d.kind, d.idempotent ? "idempotent" : "", d.readOnly ? "read-only" : "",
      d.timeout && durMs(d.timeout) > 0 ? "timeout " + fmtMs(durMs(d.timeout)) : ""].filter(Boolean).join(" · ");
    // Health: the health check's answer, else what its calls did.
    const calls = lastCalls(d, ages);
    const [hw, hc] = healthWords[d.health] ?? calls.words;

    // The breaker: its state, until when it stays open, why it last opened.
    let until: Row["until"];
    const breaker: (Node | string)[] = [];
    if (d.circuitBreaker === BreakerState.UNSPECIFIED) {
      breaker.push(h("span", { class: "muted" }, "none"));
    } else {
      breaker.push(h("span", {
        class: "badge b-" + enumName(BreakerStateSchema, d.circuitBreaker), "data-testid": "breaker",
        "data-state": enumName(BreakerStateSchema, d.circuitBreaker), title: enumName(BreakerStateSchema, d.circuitBreaker),
      }, words(BreakerStateSchema, d.circuitBreaker)));
      const at = tsMs(d.circuitBreakerOpenUntil);
      if (at !== undefined) {
        const left = h("span", { "data-testid": "breaker-left" });
        breaker.push(h("div", { class: "until", "data-testid": "breaker-until" },
          "until ", h("time", { datetime: isoTime(at) }, fmtTime(at)), " (", left, ")"));
        until = { el: left, at };
      }
      if (d.circuitBreakerReason) {
        breaker.push(h("div", { class: "reason", "data-testid": "breaker-reason" },
          (d.circuitBreaker === BreakerState.CLOSED ? "last opened: " : "") + d.circuitBreakerReason +
          (d.circuitBreakerOpenedBy ? " (opened by " + d.circuitBreakerOpenedBy + ")" : "")));
      }
    }
    // Fleet-wide guards: whose counts the breaker and the rate limits go by.
    const scope = d.guardScope === GuardScope.FLEET ? h("div", { class: "muted", "data-testid": "guard-scope", "data-scope": "fleet" }, "the fleet's")
      : d.guardScope === GuardScope.LOCAL ? h("div", { class: "reason", "data-testid": "guard-scope", "data-scope": "local" },
        "this server's own: " + d.guardScopeReason)
      : null;
    if (scope && d.circuitBreaker !== BreakerState.UNSPECIFIED) breaker.push(scope);

    const inFlight = d.maxConcurrent > 0 ? d.inFlight + " of " + d.maxConcurrent : "no limit";
    const rate: (Node | string)[] = [];
    if (d.requestsPerMinute > 0 || d.tokensPerMinute > 0n) {
      rate.push(h("div", { "data-testid": "rate-requests" }, d.requestsLastMinute + (d.requestsPerMinute > 0 ? " of " + d.requestsPerMinute : "") + " requests"));
      if (d.tokensPerMinute > 0n) rate.push(h("div", { "data-testid": "rate-tokens" }, d.tokensLastMinute + " of " + d.tokensPerMinute + " tokens"));
      if (scope) rate.push(scope.cloneNode(true) as HTMLElement);
    } else {
      rate.push(h("span", { class: "muted" }, "no limit"));
    }

    const failures = d.recentFailures.length
      ? h("ol", { class: "failures" }, d.recentFailures.map((f) => failure(f, ages)))
      : h("span", { class: "muted" }, "none");

    const tr = h("tr", { "data-testid": "delegate-row", "data-delegate": d.name },
      h("th", { scope: "row" }, h("span", { class: "name" }, d.name), h("div", { class: "decl" }, decl)),
      cell(h("span", { class: "health h-" + hc, "data-testid": "health" }, hw),
        // "No calls yet" once is enough.
        healthWords[d.health] || calls.el.dataset.state !== "none" ? calls.el : null),
      cell(...breaker),
      h("td", { class: "num", "data-testid": "in-flight" }, inFlight),
      cell(...rate),
      cell(failures));
    return { tr, key: toJsonString(DelegateDescriptionSchema, d), until, ages };
  }

  // lastCalls says what the delegate's latest call did: when it
  // succeeded, or since when calls fail and with what error (the latest
  // failure's), or that none was made yet; and the health badge's words
  // for a delegate with no health answer.
  function lastCalls(d: DelegateDescription, ages: Row["ages"]): { el: HTMLElement; words: [string, string] } {
    const at = tsMs(d.lastCallTime);
    if (at === undefined) {
      return { el: h("div", { class: "calls", "data-testid": "calls", "data-state": "none" }, "No calls yet"), words: ["No calls yet", "none"] };
    }
    const ago = (t: number) => {
      const el = h("time", { datetime: isoTime(t), title: fmtTime(t) });
      ages.push({ el, at: t });
      return el;
    };
    if (d.lastCallCode === 0) {
      return {
        el: h("div", { class: "calls", "data-testid": "calls", "data-state": "ok" }, "Last call ok, ", ago(at)),
        words: ["OK", "ok"],
      };
    }
    const since = tsMs(d.failingSince) ?? at;
    const last = d.recentFailures[0];
    const code = codes[d.lastCallCode] ?? String(d.lastCallCode);
    return {
      el: h("div", { class: "calls", "data-testid": "calls", "data-state": "failing" },
        "Failing since ", h("time", { datetime: isoTime(since), "data-testid": "failing-since" }, fmtTime(since)), " (", ago(since), ")",
        h("div", { class: "last-error", "data-testid": "last-error" }, h("span", { class: "code" }, code),
          last && tsMs(last.time) === at ? " " + last.message : "")),
      words: ["Failing", "bad"],
    };
  }

  function failure(f: DelegateFailure, ages: Row["ages"]): HTMLElement {
    const at = tsMs(f.time) ?? clock.now();
    const age = h("time", { datetime: isoTime(at), title: fmtTime(at) });
    ages.push({ el: age, at });
    return h("li", { "data-testid": "failure", "data-code": codes[f.code] ?? String(f.code) },
      age, " ", h("span", { class: "code" }, codes[f.code] ?? String(f.code)), " ",
      h("span", { class: "message" }, f.message),
      f.runId ? h("span", { class: "run" }, " · ", h("a", { href: "#/runs/" + encodeURIComponent(f.runId) }, f.runId),
        f.attempt ? " attempt " + f.attempt : "") : null);
  }

  function tick(): void {
    const now = clock.now();
    for (const r of rows.values()) {
      if (r.until) text(r.until.el, r.until.at > now ? "in " + fmtMs(r.until.at - now) : "cooldown over: the next call is a probe");
      for (const a of r.ages) text(a.el, fmtMs(now - a.at) + " ago");
    }
  }

  function show(ds: DelegateDescription[]): void {
    const seen = new Set<string>();
    const order: HTMLTableRowElement[] = [];
    for (const d of ds) {
      seen.add(d.name);
      let r = rows.get(d.name);
      const key = toJsonString(DelegateDescriptionSchema, d);
      if (!r || r.key !== key) {
        const next = row(d);
        if (r) r.tr.replaceWith(next.tr);
        rows.set(d.name, next);
        r = next;
      }
      order.push(r.tr);
    }
    for (const name of [...rows.keys()]) if (!seen.has(name)) rows.delete(name);
    // Only when the registry's order changed: moving rows would lose a
    // selection or a hover.
    if (order.length !== tbody.rows.length || order.some((tr, i) => tbody.rows[i] !== tr)) tbody.replaceChildren(...order);
    empty.hidden = ds.length > 0;
    tick();
  }

  async function poll(): Promise<void> {
    while (!signal.aborted) {
      try {
        const sent = Date.now();
        const res = await api.listDelegates({}, { signal });
        clock.answer(sent, Date.now(), tsMs(res.serverTime));
        show(res.delegates);
        presets.replaceChildren(...res.presets.map((p) => h("li", { "data-testid": "preset", "data-preset": p.name },
          h("strong", null, p.name), ": ", describeControl(p.spec))));
        presetsSection.hidden = res.presets.length === 0;
        text(error, "");
        text(live, "updated " + new Date().toLocaleTimeString());
        attr(live, "data-state", "live");
      } catch (err) {
        if (isAbort(err) || signal.aborted) return;
        report(error, "Listing the delegates: ", err);
        text(live, "not updated");
        attr(live, "data-state", "down");
      }
      await sleep(pollMs, signal);
    }
  }

  void poll();
  const timer = setInterval(tick, 1000);
  return {
    el,
    title: "Delegates",
    dispose() {
      ac.abort();
      clearInterval(timer);
    },
  };
}
