// The start form: a control over delegates and presets (from
// ListDelegates), a brief and options; StartRun, then the run's page.
// #/start?from=<run id> fills it in from that run.

import type { MessageInitShape } from "@bufbuild/protobuf";
import {
  BalanceStrategy,
  DelegateHealth,
  OnExhausted,
  type ControlState,
  type StartRunRequestSchema,
} from "../../../clients/typescript/src/gen/stubborn/v1/control_pb.js";
import { api, isAbort, report } from "./api";
import { h, text } from "./dom";
import { durMs, durationOf, fmtExact, fmtMs, parseDuration } from "./format";
import type { Page } from "./main";
import { controlNames, loadDelegates } from "./shared";
import { describeControl } from "./run";

type Field = HTMLInputElement | HTMLSelectElement | HTMLTextAreaElement;

// Which controls use a field (all when absent).
const uses: Record<string, string[]> = {
  attempts: ["retry", "retry_with_learning", "balance"],
  strategy: ["balance"],
  base_wait: ["retry"],
  max_wait: ["retry"],
  on_exhausted: ["retry"],
  decision_timeout: ["retry"],
  failure_criteria: ["retry_with_learning", "fallback_chain", "balance"],
  failure_when: ["retry_with_learning", "fallback_chain", "balance"],
  analyst: ["retry_with_learning"],
  acceptance_criteria: ["race"],
  accept_when: ["race"],
  hedge_delay: ["race"],
  judge: ["retry_with_learning", "fallback_chain", "race", "balance"],
};

export function startPage(q: URLSearchParams): Page {
  const ac = new AbortController();
  const signal = ac.signal;
  const fields = new Map<string, Field>();
  const wrappers: HTMLElement[] = [];

  function field(name: string, label: string, input: Field, hint?: string): HTMLElement {
    input.name = name;
    input.id = "start-" + name;
    fields.set(name, input);
    const hintEl = hint ? h("small", { id: "start-" + name + "-hint", class: "hint" }, hint) : null;
    if (hintEl) input.setAttribute("aria-describedby", hintEl.id);
    const w = h("div", { class: "field", "data-field": name }, h("label", { for: input.id }, label), input, hintEl);
    wrappers.push(w);
    return w;
  }

  const control = h("select", null, Object.entries(controlNames).map(([v, l]) => h("option", { value: v }, l)));
  const delegates = h("input", { type: "text", required: true, autocomplete: "off", spellcheck: "false", placeholder: "echo, flaky" });
  const brief = h("textarea", { rows: 4, required: true, placeholder: "What the delegates should do" });
  const attempts = h("input", { type: "number", min: 0, step: 1, inputmode: "numeric", placeholder: "default" });
  const dur = (placeholder: string) => h("input", { type: "text", autocomplete: "off", spellcheck: "false", placeholder, pattern: "\\s*([0-9.]+(ns|us|µs|ms|s|m|h))+\\s*|\\s*0\\s*" });
  const strategy = h("select", null, h("option", { value: "weighted" }, "weighted"), h("option", { value: "least_busy" }, "least busy"),
    h("option", { value: "latency" }, "latency"), h("option", { value: "usage" }, "usage"));
  const onExhausted = h("select", null, h("option", { value: "ask" }, "ask (await a decision)"), h("option", { value: "fail" }, "fail"));
  const text1 = (placeholder = "") => h("input", { type: "text", autocomplete: "off", placeholder });
  const available = h("div", { class: "available", "aria-live": "polite" });
  const error = h("p", { class: "error", role: "alert", "data-testid": "start-error" });
  const submit = h("button", { type: "submit", "data-testid": "start" }, "Start run");

  const form = h("form", { class: "start-form", "data-testid": "start-form", novalidate: true },
    field("control", "Control", control),
    field("delegates", "Delegates", delegates, "Comma-separated names of delegates or presets: the target for retry and retry with learning (one), the chain in order, the race's candidates, or the balance's deployments (name:weight, e.g. a:3, b)."),
    available,
    field("brief", "Brief", brief),
    h("fieldset", null, h("legend", null, "Retries"),
      field("attempts", "Attempts", attempts, "retry: retries after the first try (default 6); retry with learning: attempts in all (default 3); balance: deployments tried at most (default all)."),
      field("base_wait", "Base wait", dur("1s"), "retry: backoff base, e.g. 100ms"),
      field("max_wait", "Max wait", dur("60s"), "retry: no wait exceeds it"),
      field("on_exhausted", "When retries run out", onExhausted),
      field("decision_timeout", "Decision timeout", dur("none"), "retry: how long a decision is awaited")),
    h("fieldset", null, h("legend", null, "Race"),
      field("hedge_delay", "Hedge delay", dur("none"), "race: start each next candidate only after this, or once all before it failed; none: all at once")),
    h("fieldset", null, h("legend", null, "Balance"),
      field("strategy", "Strategy", strategy, "balance: how the deployment is picked; a tie is drawn by weight")),
    h("fieldset", null, h("legend", null, "Judging"),
      field("failure_criteria", "Failure criteria", text1("e.g. the answer is empty"), "retry with learning, fallback chain, balance: judged by the judge delegate"),
      field("failure_when", "failure_when (CEL)", text1('e.g. result.text == ""')),
      field("acceptance_criteria", "Acceptance criteria", text1(), "race: judged by the judge delegate"),
      field("accept_when", "accept_when (CEL)", text1('e.g. size(result.text) > 10')),
      field("analyst", "Analyst", text1(), "retry with learning: a delegate asked what to try differently"),
      field("judge", "Judge", text1("the server's"))),
    h("fieldset", null, h("legend", null, "Run"),
      field("run_timeout", "Run timeout", dur("none")),
      field("attempt_timeout", "Attempt timeout", dur("the delegate's")),
      field("first_output_timeout", "First output timeout", dur("the delegate's"), "a streamed attempt that sends nothing for this long stalls"),
      field("idle_timeout", "Idle timeout", dur("the delegate's"), "a streamed attempt silent this long between outputs stalls")),
    error,
    h("div", { class: "buttons" }, submit));

  function relevance(): void {
    for (const w of wrappers) {
      const u = uses[w.dataset.field ?? ""];
      const na = !!u && !u.includes(control.value);
      w.classList.toggle("na", na);
      const f = fields.get(w.dataset.field ?? "");
      if (f) f.title = na ? "not used by " + controlNames[control.value] : "";
    }
  }
  control.addEventListener("change", relevance);
  relevance();

  // The registry: names to click into the delegates field.
  loadDelegates(signal, (msg) => text(available, "Delegates could not be listed: " + msg)).then((d) => {
    if (!d) return;
    const chip = (name: string, title: string, cls: string) =>
      h("button", { type: "button", class: "chip " + cls, title, onclick: () => addName(name) }, name);
    available.replaceChildren(
      h("span", { class: "hint" }, "Delegates: "),
      ...d.delegates.map((x) => chip(x.name,
        x.kind + (x.idempotent ? ", idempotent" : "") + (x.readOnly ? ", read-only" : "") +
        (x.health === DelegateHealth.NOT_SERVING ? ", NOT SERVING" : x.health === DelegateHealth.UNREACHABLE ? ", unreachable (still called)" : x.health === DelegateHealth.SERVING ? ", serving" : "") +
        (x.timeout ? ", timeout " + fmtMs(durMs(x.timeout)) : "") +
        (x.stream ? ", stream " + x.stream : "") +
        (x.firstOutputTimeout && durMs(x.firstOutputTimeout) > 0 ? ", first output timeout " + fmtMs(durMs(x.firstOutputTimeout)) : "") +
        (x.idleTimeout && durMs(x.idleTimeout) > 0 ? ", idle timeout " + fmtMs(durMs(x.idleTimeout)) : ""),
        x.health === DelegateHealth.NOT_SERVING || x.health === DelegateHealth.UNREACHABLE ? "down" : "")),
      d.presets.length ? h("span", { class: "hint" }, " Presets: ") : "",
      ...d.presets.map((p) => chip(p.name, describeControl(p.spec), "preset")));
  });

  function addName(name: string): void {
    const names = splitNames(delegates.value);
    if (control.value === "retry" || control.value === "retry_with_learning") delegates.value = name;
    else if (!names.includes(name)) delegates.value = [...names, name].join(", ");
    delegates.focus();
  }

  const from = q.get("from");
  if (from) {
    api.getRun({ runId: from }, { signal }).then((res) => res.state && fill(res.state), (err) => {
      if (!isAbort(err)) report(error, "Could not read run " + from + ": ", err);
    });
  }

  function fill(st: ControlState): void {
    const set = (name: string, v: string) => {
      const f = fields.get(name);
      if (f) f.value = v;
    };
    const d = (x: { seconds: bigint; nanos: number } | undefined) => (x ? fmtExact(durMs(x)) : "");
    set("brief", st.taskBrief);
    const k = st.control?.kind;
    switch (k?.case) {
      case "retry":
        set("control", "retry");
        set("delegates", k.value.target);
        set("attempts", k.value.attempts === undefined ? "" : String(k.value.attempts));
        set("base_wait", d(k.value.baseWait));
        set("max_wait", d(k.value.maxWait));
        set("on_exhausted", k.value.onExhausted === OnExhausted.FAIL ? "fail" : "ask");
        set("decision_timeout", k.value.decisionTimeout && durMs(k.value.decisionTimeout) > 0 ? d(k.value.decisionTimeout) : "");
        break;
      case "retryWithLearning":
        set("control", "retry_with_learning");
        set("delegates", k.value.target);
        set("attempts", k.value.maxRetries === undefined ? "" : String(k.value.maxRetries));
        set("failure_criteria", k.value.failureCriteria);
        set("failure_when", k.value.failureWhen);
        set("analyst", k.value.analyst);
        break;
      case "fallbackChain":
        set("control", "fallback_chain");
        set("delegates", k.value.chain.join(", "));
        set("failure_criteria", k.value.failureCriteria);
        set("failure_when", k.value.failureWhen);
        break;
      case "balance":
        set("control", "balance");
        set("delegates", k.value.targets.map((t) => t.name + (t.weight !== undefined ? ":" + t.weight : "")).join(", "));
        set("attempts", k.value.maxAttempts === undefined ? "" : String(k.value.maxAttempts));
        set("strategy", ["weighted", "weighted", "least_busy", "latency", "usage"][k.value.strategy] ?? "weighted");
        set("failure_criteria", k.value.failureCriteria);
        set("failure_when", k.value.failureWhen);
        break;
      case "race":
        set("control", "race");
        set("delegates", k.value.candidates.join(", "));
        set("acceptance_criteria", k.value.acceptanceCriteria);
        set("accept_when", k.value.acceptWhen);
        set("hedge_delay", k.value.hedgeDelay && durMs(k.value.hedgeDelay) > 0 ? d(k.value.hedgeDelay) : "");
        break;
    }
    const o = st.options;
    set("judge", o?.judge ?? "");
    set("run_timeout", o?.runTimeout && durMs(o.runTimeout) > 0 ? d(o.runTimeout) : "");
    set("attempt_timeout", o?.attemptTimeout && durMs(o.attemptTimeout) > 0 ? d(o.attemptTimeout) : "");
    set("first_output_timeout", o?.firstOutputTimeout && durMs(o.firstOutputTimeout) > 0 ? d(o.firstOutputTimeout) : "");
    set("idle_timeout", o?.idleTimeout && durMs(o.idleTimeout) > 0 ? d(o.idleTimeout) : "");
    relevance();
  }

  const formKey = "console-" + (globalThis.crypto?.randomUUID?.() ??
    Array.from({ length: 4 }, () => Math.random().toString(36).slice(2, 10)).join(""));

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    text(error, "");
    let req: MessageInitShape<typeof StartRunRequestSchema>;
    try {
      req = build();
    } catch (err) {
      text(error, (err as Error).message);
      return;
    }
    submit.disabled = true;
    text(submit, "Starting…");
    try {
      const res = await api.startRun(req, { signal });
      location.hash = "#/runs/" + encodeURIComponent(res.runId);
    } catch (err) {
      if (!isAbort(err)) report(error, "", err);
    } finally {
      submit.disabled = false;
      text(submit, "Start run");
    }
  });

  // build reads the form into a StartRunRequest; its errors say which
  // field to fix.
  function build(): MessageInitShape<typeof StartRunRequestSchema> {
    const v = (name: string) => (fields.get(name)?.value ?? "").trim();
    const duration = (name: string, label: string) => {
      const s = v(name);
      if (!s) return undefined;
      const ms = parseDuration(s);
      if (ms === undefined) throw new Error(label + ": “" + s + "” is not a duration (write e.g. 100ms, 1.5s, 2m)");
      return durationOf(ms);
    };
    const names = splitNames(v("delegates"));
    if (!names.length) throw new Error("Delegates: name at least one delegate or preset.");
    const taskBrief = fields.get("brief")!.value;
    if (!taskBrief.trim()) throw new Error("Brief: say what the delegates should do.");
    let count: number | undefined;
    if (v("attempts")) {
      count = Number(v("attempts"));
      if (!Number.isInteger(count) || count < 0 || count > 2 ** 31 - 1) throw new Error("Attempts: a whole number, 0 or more.");
    }
    const one = (c: string) => {
      if (names.length > 1) throw new Error("Delegates: " + c + " calls one delegate (or preset), the target; got " + names.length + ".");
      return names[0];
    };
    const req: MessageInitShape<typeof StartRunRequestSchema> = { taskBrief };
    switch (control.value) {
      case "retry":
        req.retry = {
          target: one("retry"),
          attempts: count,
          baseWait: duration("base_wait", "Base wait"),
          maxWait: duration("max_wait", "Max wait"),
          onExhausted: v("on_exhausted") === "fail" ? OnExhausted.FAIL : OnExhausted.ASK,
          decisionTimeout: duration("decision_timeout", "Decision timeout"),
        };
        break;
      case "retry_with_learning":
        req.retryWithLearning = {
          target: one("retry with learning"),
          maxRetries: count,
          failureCriteria: v("failure_criteria"),
          failureWhen: v("failure_when"),
          analyst: v("analyst"),
        };
        break;
      case "fallback_chain":
        req.fallbackChain = { chain: names, failureCriteria: v("failure_criteria"), failureWhen: v("failure_when") };
        break;
      case "balance":
        req.balance = {
          targets: names.map((n) => {
            const [name, w] = n.split(":").map((x) => x.trim());
            if (w === undefined) return { name };
            const weight = Number(w);
            if (!Number.isInteger(weight)) throw new Error("Delegates: the weight of " + name + " is a whole number (write e.g. a:3, b); got “" + w + "”.");
            return { name, weight };
          }),
          strategy: { weighted: BalanceStrategy.WEIGHTED, least_busy: BalanceStrategy.LEAST_BUSY, latency: BalanceStrategy.LATENCY, usage: BalanceStrategy.USAGE }[v("strategy")] ?? BalanceStrategy.WEIGHTED,
          maxAttempts: count,
          failureCriteria: v("failure_criteria"),
          failureWhen: v("failure_when"),
        };
        break;
      case "race":
        req.race = {
          candidates: names, acceptanceCriteria: v("acceptance_criteria"), acceptWhen: v("accept_when"),
          hedgeDelay: duration("hedge_delay", "Hedge delay"),
        };
        break;
    }
    req.options = {
      // One key a form: a second click on Start (or a retry after a lost
      // answer) gets the run the first one started.
      idempotencyKey: formKey,
      judge: uses.judge.includes(control.value) ? v("judge") : "",
      runTimeout: duration("run_timeout", "Run timeout"),
      attemptTimeout: duration("attempt_timeout", "Attempt timeout"),
      firstOutputTimeout: duration("first_output_timeout", "First output timeout"),
      idleTimeout: duration("idle_timeout", "Idle timeout"),
    };
    return req;
  }

  const el = h("section", { class: "start-page" },
    h("h1", null, "Start a run"),
    form);
  return {
    el,
    title: "Start a run",
    dispose() {
      ac.abort();
    },
  };
}

function splitNames(s: string): string[] {
  return s.split(/[\s,]+/).map((x) => x.trim()).filter(Boolean);
}
