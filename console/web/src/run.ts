// A run's page: GetRun for what it is, then WatchRun from seq 1, reattached
// after the last seq seen when the stream drops, into the timeline; and the
// actions a person takes on it (DecideRun, CancelRun).

import { Code } from "@connectrpc/connect";
import {
  AttemptOutcomeSchema,
  Decision,
  DecisionSchema,
  OnExhausted,
  RunStatus,
  RunStatusSchema,
  type ControlSpec,
  type ControlState,
  type RunEvent,
  type RunOptions,
} from "../../../clients/typescript/src/gen/stubborn/v1/control_pb.js";
import { api, describe, errorCode, isAbort, report } from "./api";
import { attr, h, text } from "./dom";
import { durMs, enumName, fmtMs, fmtTime, shortName, tsMs, words } from "./format";
import type { Page } from "./main";
import { sleep, statusBadge, terminal } from "./shared";
import { resultText, startWhy, Timeline } from "./timeline";
import { ServerClock } from "./clock";

export function runPage(id: string): Page {
  const ac = new AbortController();
  const signal = ac.signal;

  let status = RunStatus.UNSPECIFIED;
  let state: ControlState | undefined;
  let snapshotAt = 0;
  // The server's clock (GetRun's server_time, bounded by the events):
  // what a wait or an attempt in progress is measured to, and countdowns
  // to a time the server set (a backoff's end) are counted on.
  const clock = new ServerClock();
  const serverNow = () => clock.now();
  let lastSeq = 0n;
  // The run's own control's attempts seen (a nested preset's are not
  // counted, as in ControlState.attempts), and where the page shows them.
  let topAttempts = 0;
  let attemptsEl: HTMLElement | undefined;
  let finished = false;
  const events: RunEvent[] = [];
  // What the page says meanwhile: a backoff's end, a decision's deadline.
  let waitUntil: { kind: "backoff" | "decision"; at?: number; next?: number; reason?: string } | undefined;

  const statusEl = h("span", { class: "badge", "data-testid": "status" });
  const live = h("span", { class: "live", "aria-live": "polite" });
  const facts = h("dl", { class: "facts" });
  const notice = h("div", { class: "notice", role: "status", hidden: true });
  const actions = h("div", { class: "actions" });
  const actionResult = h("p", { class: "action-result", "data-testid": "action-result", role: "status", "aria-live": "polite" });
  const error = h("p", { class: "error", role: "alert" });
  const tl = new Timeline(Date.now());
  const resultSection = h("section", { class: "result", hidden: true, "aria-labelledby": "result-title" });
  const eventList = h("ol", { class: "events" });
  const eventsBox = h("details", { class: "events-box" }, h("summary", null, "Events"), eventList);
  eventsBox.addEventListener("toggle", () => {
    if (eventsBox.open && eventList.childElementCount === 0) eventList.append(...events.map(eventLine));
  });

  const el = h("section", { class: "run-page", "data-testid": "run", "data-run-id": id, "data-status": "" },
    h("div", { class: "title" }, h("h1", null, "Run ", h("code", null, id)), statusEl, live),
    error,
    facts,
    notice,
    h("div", { class: "action-bar" }, actions, actionResult),
    h("section", { class: "timeline-section", "aria-labelledby": "timeline-title" },
      h("h2", { id: "timeline-title" }, "Timeline"),
      legend(),
      tl.el),
    resultSection,
    h("section", { "aria-labelledby": "attempts-title" }, h("h2", { id: "attempts-title" }, "Attempts"), tl.list),
    eventsBox);

  function setStatus(s: RunStatus): void {
    if (s === RunStatus.UNSPECIFIED) return;
    const changed = s !== status;
    status = s;
    attr(el, "data-status", enumName(RunStatusSchema, s));
    // In words; data-status and the title have the enum's name (what a
    // script reading the page compares, and what the API's JSON says).
    text(statusEl, words(RunStatusSchema, s));
    attr(statusEl, "title", enumName(RunStatusSchema, s));
    statusEl.className = "badge s-" + shortName(RunStatusSchema, s);
    if (changed) renderActions();
  }

  function showState(st: ControlState): void {
    state = st;
    const created = tsMs(st.createTime);
    if (created) tl.setStart(created);
    renderFacts();
  }

  function renderFacts(): void {
    const st = state;
    if (!st) return;
    const rows: [string, Node | string][] = [];
    rows.push(["Control", describeControl(st.control)]);
    rows.push(["Brief", h("pre", { class: "brief" }, st.taskBrief)]);
    const created = tsMs(st.createTime);
    rows.push(["Started", created ? fmtTime(created) : "–"]);
    const end = tsMs(st.endTime);
    if (end && created) rows.push(["Took", fmtMs(end - created)]);
    attemptsEl = h("span", null, String(Math.max(st.attempts, topAttempts)));
    rows.push(["Attempts", attemptsEl]);
    if (st.statusReason) rows.push(["Why", st.statusReason]);
    if (st.cost) {
      // "~" marks a cost partly estimated (calls that reported no usage).
      const by = Object.entries(st.cost.byDelegate).sort(([a], [b]) => a.localeCompare(b))
        .map(([d, c]) => d + " " + fmtCost(c)).join(", ");
      rows.push(["Cost", (st.cost.estimated ? "~" : "") + fmtCost(st.cost.total) + " · " +
        String(st.cost.totalTokens) + " tokens" + (by ? " (" + by + ")" : "")]);
    }
    const limit = st.options?.spendLimit;
    if (limit && (limit.maxCost > 0 || limit.maxTotalTokens > 0n)) {
      const parts: string[] = [];
      if (limit.maxCost > 0) parts.push("max cost " + fmtCost(limit.maxCost));
      if (limit.maxTotalTokens > 0n) parts.push("max " + String(limit.maxTotalTokens) + " tokens");
      rows.push(["Spend limit", parts.join(", ") + (limit.onExhausted === OnExhausted.FAIL ? ", then fail" : ", then ask")]);
    }
    const opts = describeOptions(st.options);
    if (opts) rows.push(["Options", opts]);
    if (st.tenant) rows.push(["Tenant", st.tenant]);
    facts.replaceChildren(...rows.flatMap(([k, v]) => [h("dt", null, k), h("dd", null, v)]));
  }

  // The actions shown, as a key: they are rebuilt only when it changes, so
  // that a status change that keeps them (RUNNING to BACKING_OFF) does not
  // replace a button under the pointer and lose a click.
  let actionsKey = "";

  function renderActions(): void {
    const key = (status === RunStatus.AWAITING_DECISION ? "decide," : "") +
      (status !== RunStatus.UNSPECIFIED && !terminal(status) ? "cancel" : "");
    if (key === actionsKey && actions.firstChild) return;
    actionsKey = key;
    const buttons: HTMLElement[] = [];
    if (status === RunStatus.AWAITING_DECISION) {
      buttons.push(
        h("button", { type: "button", "data-testid": "decide-retry", onclick: () => act("Retry", () => api.decideRun({ runId: id, decision: Decision.RETRY }, { signal })) }, "Retry"),
        h("button", { type: "button", class: "danger", "data-testid": "decide-fail", onclick: () => act("Fail", () => api.decideRun({ runId: id, decision: Decision.FAIL }, { signal })) }, "Fail"));
    }
    if (status !== RunStatus.UNSPECIFIED && !terminal(status)) {
      buttons.push(h("button", { type: "button", class: "secondary", "data-testid": "cancel", onclick: () => act("Cancel", () => api.cancelRun({ runId: id }, { signal })) }, "Cancel run"));
    }
    buttons.push(h("a", { class: "button secondary", href: "#/start?from=" + encodeURIComponent(id) }, "Start a similar run"));
    actions.replaceChildren(...buttons);
  }

  async function act(what: string, call: () => Promise<{ state?: ControlState }>): Promise<void> {
    for (const b of actions.querySelectorAll("button")) b.disabled = true;
    text(actionResult, what + "…");
    actionResult.className = "action-result";
    try {
      const res = await call();
      const st = res.state;
      // Worded as of the answer, which the run's own status (above, live)
      // soon overtakes.
      text(actionResult, what + ": done at " + new Date().toLocaleTimeString() +
        (st ? "; the run was " + words(RunStatusSchema, st.status).toLowerCase() + " then" : "") +
        (st?.statusReason ? " (" + st.statusReason + ")" : "") + ".");
      actionResult.classList.add("ok");
      if (st && (tsMs(st.updateTime) ?? 0) >= snapshotAt) {
        snapshotAt = tsMs(st.updateTime) ?? snapshotAt;
        showState(st);
        setStatus(st.status);
      }
    } catch (err) {
      if (isAbort(err)) return;
      report(actionResult, what + " failed: ", err);
      actionResult.classList.add("error");
    }
    for (const b of actions.querySelectorAll("button")) b.disabled = false;
    renderActions();
  }

  // apply takes one event in: to the timeline, the status (the one the
  // event carries: the server's fold of the run's events), the log.
  function apply(ev: RunEvent): void {
    if (ev.seq <= lastSeq) return;
    lastSeq = ev.seq;
    // The log keeps an output's first words, not all its text (the
    // attempt holds that).
    events.push(ev.kind.case === "attemptOutput" ? outputPreview(ev) : ev);
    if (eventsBox.open) eventList.append(eventLine(events[events.length - 1]));
    const t = tsMs(ev.time) ?? serverNow();
    // Events older than the snapshot GetRun gave replay history: the
    // status they imply is past.
    const current = t >= snapshotAt;
    // An event newer than the snapshot came as it happened.
    if (ev.time) clock.event(t, t > snapshotAt);
    const k = ev.kind;
    switch (k.case) {
      case "runStarted":
        if (k.value.state) {
          tl.setStart(tsMs(k.value.state.createTime) ?? t);
          if (!state) showState(k.value.state);
        }
        break;
      case "attemptStarted":
        if (k.value.attempt) tl.attemptStarted(k.value.attempt, t);
        if (!ev.path) {
          topAttempts++;
          if (attemptsEl && state) text(attemptsEl, String(Math.max(state.attempts, topAttempts)));
        }
        if (current) waitUntil = undefined;
        break;
      case "attemptFinished":
        if (k.value.attempt) tl.attemptFinished(k.value.attempt, k.value.note, t, k.value.outputDiscarded, Number(k.value.outputBytes));
        break;
      case "attemptOutput":
        tl.output(k.value);
        break;
      case "failureAnalyzed":
        if (k.value.failure) {
          // In the run's own fallback chain, the next delegate is the one
          // after the attempts made so far (a skip is an attempt too).
          const c = state?.control?.kind;
          const next = !ev.path && c?.case === "fallbackChain" ? c.value.chain[topAttempts] : undefined;
          tl.failure(k.value.failure, k.value.willRetry, next);
        }
        break;
      case "backoffScheduled":
        tl.backoff(ev.path, k.value, t);
        if (current) waitUntil = { kind: "backoff", at: tsMs(k.value.until), next: k.value.nextAttempt };
        break;
      case "decisionRequested":
        tl.decisionRequested(ev.path, t);
        if (current) waitUntil = { kind: "decision", at: tsMs(k.value.deadline), reason: k.value.reason };
        break;
      case "decisionReceived":
        tl.decisionReceived(ev.path, t, "decided " + words(DecisionSchema, k.value.decision).toLowerCase());
        if (current) waitUntil = undefined;
        break;
      case "runFinished": {
        const st = k.value.state;
        finished = true;
        waitUntil = undefined;
        if (st) {
          snapshotAt = Math.max(snapshotAt, tsMs(st.updateTime) ?? 0);
          showState(st);
          setStatus(st.status);
          showResult(st);
          tl.finish(tsMs(st.endTime) ?? t, st.winner);
        } else {
          tl.finish(t, "");
        }
        return;
      }
      case "runResumed":
        break;
    }
    if (current && ev.status !== RunStatus.UNSPECIFIED && !terminal(status)) setStatus(ev.status);
  }

  function showResult(st: ControlState): void {
    const r = resultText(st.result);
    const parts: HTMLElement[] = [h("h2", { id: "result-title" }, "Result")];
    if (st.winner) parts.push(h("p", { class: "winner" }, "★ Winner: ", h("strong", null, st.winner)));
    if (st.statusReason) parts.push(h("p", null, "Ended ", statusBadge(st.status), " — ", st.statusReason));
    parts.push(h("pre", { class: "result-text" + (st.result ? "" : " none"), "data-testid": "result" },
      st.result ? (r || "(an empty answer)") : "No result (" + words(RunStatusSchema, st.status).toLowerCase() + ")"));
    resultSection.replaceChildren(...parts);
    resultSection.hidden = false;
  }

  function renderNotice(now: number): void {
    const w = waitUntil;
    if (!w || finished) {
      notice.hidden = true;
      return;
    }
    notice.hidden = false;
    if (w.kind === "backoff") {
      const left = (w.at ?? now) - now;
      text(notice, left > 0 ? "Backing off: attempt " + w.next + " in " + fmtMs(left) + "." : "Attempt " + w.next + " is starting…");
    } else {
      const left = w.at !== undefined ? w.at - now : undefined;
      text(notice, "Awaiting a decision" + (w.reason ? " (" + w.reason + ")" : "") +
        ": Retry grants another round of retries, Fail ends the run." +
        (left !== undefined ? " Without one it ends FAILED in " + fmtMs(left) + "." : ""));
    }
    notice.dataset.kind = w.kind;
  }

  async function load(): Promise<void> {
    try {
      const sent = Date.now();
      const res = await api.getRun({ runId: id }, { signal });
      clock.answer(sent, Date.now(), tsMs(res.serverTime));
      if (res.state) {
        snapshotAt = tsMs(res.state.updateTime) ?? 0;
        showState(res.state);
        setStatus(res.state.status);
      }
    } catch (err) {
      if (isAbort(err)) return;
      report(error, "", err);
      const c = errorCode(err);
      if (c === Code.NotFound || c === Code.InvalidArgument || c === Code.Unauthenticated || c === Code.PermissionDenied) {
        if (c === Code.NotFound) text(error, "No run " + id + " here (" + describe(err) + ").");
        return;
      }
    }
    await watch();
  }

  // watch follows the run's events until it ends, reattaching after a
  // dropped stream with after_seq = the last seq seen (0.5s doubling to
  // 15s between tries).
  async function watch(): Promise<void> {
    let delay = 500;
    while (!signal.aborted && !finished) {
      text(live, "following live");
      live.dataset.state = "live";
      try {
        const stream = api.watchRun({ runId: id, afterSeq: lastSeq, maxBatch: 200 }, { signal });
        for await (const res of stream) {
          delay = 500;
          if (error.textContent) text(error, "");
          if (res.event) apply(res.event);
          for (const ev of res.events) apply(ev);
        }
        if (finished) break;
      } catch (err) {
        if (isAbort(err) || signal.aborted) return;
        const c = errorCode(err);
        report(error, "Following the run: ", err);
        if (c === Code.NotFound || c === Code.InvalidArgument || c === Code.Unauthenticated || c === Code.PermissionDenied) {
          text(live, "not following");
          live.dataset.state = "down";
          return;
        }
      }
      const until = Date.now() + delay * (0.5 + Math.random() / 2);
      delay = Math.min(delay * 2, 15000);
      live.dataset.state = "down";
      while (!signal.aborted && Date.now() < until) {
        text(live, "reconnecting in " + Math.ceil((until - Date.now()) / 1000) + "s (after event " + lastSeq + ")");
        await sleep(Math.min(1000, until - Date.now()), signal);
      }
    }
    if (finished) {
      text(live, "finished");
      live.dataset.state = "done";
      tick();
    }
  }

  function tick(): void {
    const now = serverNow();
    if (!finished) tl.tick(now);
    renderNotice(now);
  }

  renderActions();
  tick();
  const timer = setInterval(() => {
    tick();
    if (finished) clearInterval(timer);
  }, 100);
  void load();

  return {
    el,
    title: "Run " + id,
    dispose() {
      ac.abort();
      clearInterval(timer);
    },
  };
}

function legend(): HTMLElement {
  const item = (cls: string, label: string) => h("li", null, h("span", { class: "swatch sw-" + cls }), label);
  return h("ul", { class: "legend", "aria-label": "Legend" },
    item("running", "running"), item("SUCCEEDED", "succeeded"), item("ERROR", "error"),
    item("REJECTED", "rejected"), item("CANCELLED", "cancelled"), item("SKIPPED", "skipped"),
    item("INTERRUPTED", "interrupted"), item("backoff", "backoff"), item("await", "awaiting decision"));
}

function dur(d: { seconds: bigint; nanos: number } | undefined, unset: string): string {
  return d ? fmtMs(durMs(d)) : unset;
}

export function describeControl(c: ControlSpec | undefined): string {
  const k = c?.kind;
  switch (k?.case) {
    case "retry": {
      const r = k.value;
      return "retry of " + r.target + ": " + (r.attempts ?? 6) + " retries, base wait " + dur(r.baseWait, "1s") +
        ", max wait " + dur(r.maxWait, "60s") + ", when exhausted " + (r.onExhausted === OnExhausted.FAIL ? "fail" : "ask") +
        (r.decisionTimeout && durMs(r.decisionTimeout) > 0 ? " (decide within " + dur(r.decisionTimeout, "") + ")" : "");
    }
    case "retryWithLearning": {
      const r = k.value;
      return "retry with learning of " + r.target + ": " + (r.maxRetries ?? 3) + " attempts" +
        (r.failureCriteria ? ", failure criteria “" + r.failureCriteria + "”" : "") +
        (r.failureWhen ? ", failure_when " + r.failureWhen : "") + (r.analyst ? ", analyst " + r.analyst : "");
    }
    case "fallbackChain": {
      const r = k.value;
      return "fallback chain " + r.chain.join(" → ") + (r.failureCriteria ? ", failure criteria “" + r.failureCriteria + "”" : "") +
        (r.failureWhen ? ", failure_when " + r.failureWhen : "");
    }
    case "race": {
      const r = k.value;
      return "race of " + r.candidates.join(", ") +
        (r.hedgeDelay && durMs(r.hedgeDelay) > 0 ? ", hedged: each next after " + dur(r.hedgeDelay, "") : "") +
        (r.acceptanceCriteria ? ", acceptance criteria “" + r.acceptanceCriteria + "”" : "") +
        (r.acceptWhen ? ", accept_when " + r.acceptWhen : "");
    }
    case "balance": {
      const r = k.value;
      const strategy = ["weighted", "weighted", "least busy", "latency", "usage"][r.strategy] ?? "weighted";
      return "balance (" + strategy + ") of " + r.targets.map((t) => t.name + (t.weight !== undefined ? " ×" + t.weight : "")).join(", ") +
        (r.maxAttempts !== undefined ? ", at most " + r.maxAttempts + " tried" : "") +
        (r.failureCriteria ? ", failure criteria “" + r.failureCriteria + "”" : "") +
        (r.failureWhen ? ", failure_when " + r.failureWhen : "");
    }
  }
  return "–";
}

function describeOptions(o: RunOptions | undefined): string {
  if (!o) return "";
  const bits: string[] = [];
  if (o.runTimeout && durMs(o.runTimeout) > 0) bits.push("run timeout " + dur(o.runTimeout, ""));
  if (o.attemptTimeout && durMs(o.attemptTimeout) > 0) bits.push("attempt timeout " + dur(o.attemptTimeout, ""));
  if (o.judge) bits.push("judge " + o.judge);
  if (o.firstOutputTimeout && durMs(o.firstOutputTimeout) > 0) bits.push("first output timeout " + dur(o.firstOutputTimeout, ""));
  if (o.idleTimeout && durMs(o.idleTimeout) > 0) bits.push("idle timeout " + dur(o.idleTimeout, ""));
  const md = Object.entries(o.metadata);
  if (md.length) bits.push("metadata " + md.map(([k, v]) => k + "=" + v).join(", "));
  return bits.join("; ");
}

// outputPreview is an attempt_output event with its text cut to its
// first 60 characters, for the log.
function outputPreview(ev: RunEvent): RunEvent {
  const k = ev.kind;
  if (k.case !== "attemptOutput" || k.value.text.length <= 60) return ev;
  return { ...ev, kind: { case: "attemptOutput", value: { ...k.value, text: k.value.text.slice(0, 60) + "…" } } };
}

function eventLine(ev: RunEvent): HTMLElement {
  const k = ev.kind;
  let what = k.case ?? "?";
  switch (k.case) {
    case "attemptStarted": {
      const why = startWhy(k.value.attempt);
      what = "attempt " + k.value.attempt?.number + " started: " + k.value.attempt?.delegate + (why ? " (" + why + ")" : "");
      break;
    }
    case "attemptFinished":
      what = "attempt " + k.value.attempt?.number + " finished: " + k.value.attempt?.delegate + " " +
        shortName(AttemptOutcomeSchema, k.value.attempt?.outcome ?? 0) + (k.value.note ? " — " + k.value.note : "") +
        (k.value.outputBytes > 0n ? " (" + k.value.outputBytes + " bytes streamed" + (k.value.outputDiscarded ? ", discarded)" : ")") :
          k.value.outputDiscarded ? " (output discarded)" : "");
      break;
    case "attemptOutput":
      what = "attempt " + k.value.attempt + " output at byte " + k.value.offset + (k.value.provisional ? " (provisional)" : "") +
        ": " + JSON.stringify(k.value.text);
      break;
    case "failureAnalyzed":
      what = "failure of attempt " + k.value.failure?.attempt + ": " + k.value.failure?.reason + (k.value.willRetry ? " (will retry)" : "");
      break;
    case "backoffScheduled":
      what = "backoff " + fmtMs(durMs(k.value.wait)) + " before attempt " + k.value.nextAttempt;
      break;
    case "decisionRequested":
      what = "decision requested: " + k.value.reason;
      break;
    case "decisionReceived":
      what = "decision: " + shortName(DecisionSchema, k.value.decision);
      break;
    case "runFinished":
      what = "run finished: " + (k.value.state ? shortName(RunStatusSchema, k.value.state.status) : "");
      break;
    case "runResumed":
      what = "run resumed by " + k.value.owner + ": " + k.value.reason;
      break;
    case "runStarted":
      what = "run started";
      break;
  }
  const t = tsMs(ev.time);
  return h("li", null, h("span", { class: "seq" }, String(ev.seq)), " ",
    h("time", { datetime: t ? new Date(t).toISOString() : "" }, t ? new Date(t).toISOString().slice(11, 23) : ""), " ",
    ev.path ? h("span", { class: "path" }, ev.path) : null, " ", what);
}

// fmtCost writes a cost with up to six significant digits.
function fmtCost(c: number): string {
  return Number(c.toPrecision(6)).toString();
}
