// A run's timeline: one lane per delegate (and per nesting path), in the
// order the delegates were first called, so a fallback chain reads top to
// bottom and race candidates run side by side; each attempt a bar coloured
// by its outcome, each backoff a gap with a live countdown, each wait for a
// decision a span. Bars are placed by CSS from custom properties (--s
// start, --d duration, both in ms, over the timeline's --span), so a tick
// writes one property per moving element, and a new event adds an element
// without laying out the others again.
//
// A long stretch with no attempt in flight (a 20 s wait for a decision, a
// long backoff) would squeeze attempts of a few milliseconds into a sliver:
// such a stretch is cut, drawn a fixed share of the rest's width and marked
// on the axis with its length, so the attempts keep the width. Attempts
// that would still overlap on a lane (a retry at once) are stacked on rows
// of the lane, so each bar can be read and clicked.
//
// Beside it, the attempts as a list: outcome, who judged a failure (error,
// judge, CEL, health), why, the analyst's advice, what each brief added to
// the one before (retry-with-learning's failure history), and the text an
// attempt streams (attempt_output), growing as it comes: provisional while
// failure criteria have yet to rule, struck out when the attempt's output
// is discarded (it failed, stalled or lost after streaming).

import {
  AttemptOutcome,
  AttemptOutcomeSchema,
  AttemptStartReason,
  FailureSource,
  NotRetried,
  type Attempt,
  type AttemptOutput,
  type BackoffScheduled,
  type FailureRecord,
} from "../../../clients/typescript/src/gen/stubborn/v1/control_pb.js";
import type { Result } from "../../../clients/typescript/src/gen/stubborn/v1/delegate_pb.js";
import { toJsonString } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { attr, h, text } from "./dom";
import { durMs, enumName, fmtMs, shortName, tsMs, words } from "./format";

interface Lane {
  key: string;
  delegate: string;
  path: string;
  el: HTMLElement;
  track: HTMLElement;
  last?: AttemptView;
}

interface AttemptView {
  n: number;
  a: Attempt;
  lane: Lane;
  start: number;
  end?: number;
  bar: HTMLElement;
  item: HTMLLIElement;
  why: HTMLElement;
  failure?: FailureRecord;
  willRetry?: boolean;
  // next is the delegate tried after this attempt failed, when known (the
  // chain's next, then the attempt that followed on the same path).
  next?: string;
  note: string;
  added: string;
  prevN?: number;
  out?: Output;
}

// Output is the text an attempt streamed, as attempt_output events brought
// it: bytes (UTF-8, as the events' offsets count) of the attempt's text
// received so far, of which held are shown (at most maxOutputBytes).
interface Output {
  box: HTMLElement;
  label: HTMLElement;
  pre: HTMLPreElement;
  // tail is the text node the next piece is appended to (a gap starts a
  // new one after its marker).
  tail: Text;
  bytes: number;
  held: number;
  provisional: boolean;
  gaps: number;
  truncated: boolean;
  // final: attempt_finished came; discarded: its output is not the answer.
  final: boolean;
  discarded: boolean;
  // streamed is AttemptFinished.output_bytes (0 until then).
  streamed: number;
  // seenHeight is the text's scrollHeight when it last followed its end.
  seenHeight: number;
}

// maxOutputBytes bounds the text held per attempt: the server's default
// max_result_bytes, the most an answer may be unless configured otherwise.
export const maxOutputBytes = 1 << 20;

// utf8Len is the length of s in UTF-8 bytes, as AttemptOutput.offset
// counts them.
export function utf8Len(s: string): number {
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) n += 1;
    else if (c < 0x800) n += 2;
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length && (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
      n += 4;
      i++;
    } else n += 3;
  }
  return n;
}

// utf8Cut is the index in s where its first n UTF-8 bytes end, not
// splitting a character (so at most n bytes lie before it).
export function utf8Cut(s: string, n: number): number {
  let b = 0;
  let i = 0;
  while (i < s.length) {
    const c = s.charCodeAt(i);
    let w = 1;
    let step = 1;
    if (c >= 0x80) w = c < 0x800 ? 2 : 3;
    if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length && (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
      w = 4;
      step = 2;
    }
    if (b + w > n) break;
    b += w;
    i += step;
  }
  return i;
}

// stalled reports whether an attempt ended on a stall: no first output
// within first_output_timeout, or none for idle_timeout after some. The
// error's message starts with "stalled:"; a failure's reason may quote it.
export function stalled(a: Attempt, f?: FailureRecord): boolean {
  if (a.error?.message.startsWith("stalled:")) return true;
  return !!f && /(^|: )stalled:/.test(f.reason);
}

// A cut is a stretch [from, to] of the run, in ms on the server's clock,
// with no attempt in flight, drawn shorter than its length.
interface Cut {
  from: number;
  to: number;
}

// A stretch is cut when it lasts at least cutMinMs and longer than all the
// rest of the timeline left uncut (it would take over half the width).
const cutMinMs = 1000;
// Each cut is drawn cutShare of the uncut time wide.
const cutShare = 0.2;
// At most maxCuts stretches are cut, the longest.
const maxCuts = 20;
// At most maxRows rows a lane: past them, bars overlap again.
const maxRows = 4;

interface Span {
  el: HTMLElement;
  start: number;
  end?: number;
  until?: number;
  label?: HTMLElement;
  wait?: number;
}

// gRPC codes by number, for AttemptError.code.
export const codes = [
  "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
  "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
  "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
];

// Why a race candidate started when it did (Attempt.start_reason; see
// RaceSpec.hedge_delay), or why a balance picked its deployment. Other
// attempts have none.
export const startReasons: Record<number, string> = {
  [AttemptStartReason.AT_ONCE]: "started with the race",
  [AttemptStartReason.HEDGE_DELAY]: "started after the hedge delay",
  [AttemptStartReason.EARLIER_FAILED]: "started early: the candidates before it failed",
  [AttemptStartReason.BALANCE_PICK]: "picked by the balance",
};

// startWhy is why an attempt started: a balance's pick with its figures
// (Attempt.start_detail), else its start reason's words; "" for none.
export function startWhy(a: { startReason: AttemptStartReason; startDetail: string } | undefined): string {
  if (!a) return "";
  return a.startDetail || startReasons[a.startReason] || "";
}

const sourceLabels: Record<number, string> = {
  [FailureSource.ERROR]: "error",
  [FailureSource.JUDGE]: "judge",
  [FailureSource.CEL]: "CEL",
  [FailureSource.HEALTH]: "health",
  [FailureSource.CANCELLED]: "cancelled",
  [FailureSource.CIRCUIT_BREAKER]: "circuit breaker",
  [FailureSource.BULKHEAD]: "bulkhead",
  [FailureSource.RATE_LIMIT]: "rate limit",
};

export function resultText(r: Result | undefined): string {
  if (!r) return "";
  if (r.text) return r.text;
  if (r.data) return toJsonString(ValueSchema, r.data, { prettySpaces: 2 });
  return "";
}

// fmtBytes writes a size shortly: 850 B, 12.3 KiB, 1.0 MiB.
function fmtBytes(n: number): string {
  if (n < 1024) return n + " B";
  if (n < 1024 * 1024) return (n / 1024).toFixed(1) + " KiB";
  return (n / 1024 / 1024).toFixed(1) + " MiB";
}

function outcomeName(o: AttemptOutcome): string {
  return o === AttemptOutcome.UNSPECIFIED ? "running" : enumName(AttemptOutcomeSchema, o);
}

function commonPrefix(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a.charCodeAt(i) === b.charCodeAt(i)) i++;
  return i;
}

export class Timeline {
  readonly el: HTMLElement;
  readonly list: HTMLOListElement;
  private readonly axis: HTMLElement;
  private readonly lanesEl: HTMLElement;
  private readonly lanes = new Map<string, Lane>();
  private readonly attempts = new Map<number, AttemptView>();
  private readonly atPath = new Map<string, Lane>();
  // lastAt is the latest attempt at each path.
  private readonly lastAt = new Map<string, AttemptView>();
  private readonly spans: Span[] = [];
  private readonly waiting = new Map<string, Span>();
  private readonly growing = new Set<Output>();
  private followFrame = 0;
  private ticksKey = "";
  private t0: number;
  private endMs?: number;
  // span is the axis' length as drawn: the run's time less the cuts'.
  private span = 1;
  private cuts: Cut[] = [];
  // cutShown is how long each cut is drawn, in the axis' ms.
  private cutShown = 0;
  private cutsKey = "";
  // cutMarks are the axis' marks of the cuts; the last one's label grows
  // while its stretch goes on.
  private cutMarks: { el: HTMLElement }[] = [];
  private rowsKey = "";

  constructor(t0: number) {
    this.t0 = t0;
    this.axis = h("div", { class: "axis", "aria-hidden": "true" });
    this.lanesEl = h("div", { class: "lanes" });
    this.el = h("div", { class: "timeline", "data-testid": "timeline", role: "group", "aria-label": "Timeline of the attempts" },
      h("div", { class: "axis-row" }, h("span", { class: "lane-label" }), this.axis),
      this.lanesEl,
      h("p", { class: "empty tl-empty" }, "No attempt yet."));
    this.list = h("ol", { class: "attempts", "aria-label": "Attempts" });
    new ResizeObserver(() => this.fit()).observe(this.el);
  }

  // setStart moves the axis' origin (the run's create time, once known).
  setStart(t0: number): void {
    if (this.attempts.size === 0 && t0) this.t0 = t0;
  }

  private lane(delegate: string, path: string): Lane {
    const key = path + "\u0000" + delegate;
    let l = this.lanes.get(key);
    if (l) return l;
    const depth = path ? path.split("/").length : 0;
    const track = h("div", { class: "track" });
    const label = h("div", { class: "lane-label", title: path ? delegate + " at " + path : delegate },
      h("span", { class: "lane-name" }, delegate), path ? h("span", { class: "lane-path" }, path) : null);
    label.style.setProperty("--depth", String(depth));
    const el = h("div", { class: "lane", "data-delegate": delegate, "data-path": path }, label, track);
    l = { key, delegate, path, el, track };
    this.lanes.set(key, l);
    this.lanesEl.append(el);
    this.el.classList.add("has-lanes");
    return l;
  }

  // x is where time t is drawn on the axis, in ms from its start with the
  // cuts drawn cutShown long.
  private x(t: number): number {
    let d = t - this.t0;
    for (const c of this.cuts) {
      if (t <= c.from) break;
      const len = c.to - c.from;
      if (t >= c.to) {
        d -= len - this.cutShown;
      } else {
        d -= (t - c.from) * (1 - this.cutShown / len);
        break;
      }
    }
    return Math.max(0, d);
  }

  private place(el: HTMLElement, start: number, end: number): void {
    const s = this.x(start);
    el.style.setProperty("--s", String(s));
    el.style.setProperty("--d", String(Math.max(0, this.x(end) - s)));
  }

  // layout picks the stretches to cut, from the run's start to end, and
  // places everything again when they changed.
  private layout(end: number, now: number): void {
    const busy = [...this.attempts.values()].map((v) => [v.start, v.end ?? Math.max(now, v.start)]).sort((a, b) => a[0] - b[0]);
    const gaps: Cut[] = [];
    let at = this.t0;
    for (const [s, e] of busy) {
      if (s > at) gaps.push({ from: at, to: s });
      if (e > at) at = e;
    }
    if (busy.length && end > at) gaps.push({ from: at, to: end });
    // Longest first: once one is not longer than the rest, no shorter one is.
    gaps.sort((a, b) => (b.to - b.from) - (a.to - a.from));
    let uncut = Math.max(0, end - this.t0);
    const cuts: Cut[] = [];
    for (const g of gaps) {
      const len = g.to - g.from;
      if (cuts.length >= maxCuts || len < cutMinMs || len <= uncut - len) break;
      cuts.push(g);
      uncut -= len;
    }
    cuts.sort((a, b) => a.from - b.from);
    this.cuts = cuts;
    this.cutShown = cuts.length ? Math.max(1, uncut) * cutShare : 0;
    this.span = Math.max(1, uncut + cuts.length * this.cutShown);
    // A stretch going on (to the axis' end) keeps its key as it grows:
    // what lies before it does not move.
    const key = cuts.map((c) => c.from + "-" + (c.to === end && this.endMs === undefined ? "now" : c.to)).join(",") + "/" + this.cutShown;
    if (key === this.cutsKey) return;
    this.cutsKey = key;
    for (const v of this.attempts.values()) if (v.end !== undefined) this.place(v.bar, v.start, v.end);
    for (const s of this.spans) if (s.end !== undefined) this.place(s.el, s.start, s.end);
  }

  attemptStarted(a: Attempt, evTime: number): void {
    if (this.attempts.has(a.number)) return;
    const lane = this.lane(a.delegate, a.path);
    const start = tsMs(a.startTime) ?? evTime;
    const bar = h("button", {
      type: "button", class: "bar running", "data-testid": "attempt",
      "data-attempt": a.number, "data-delegate": a.delegate, "data-outcome": "running",
    }, h("span", { class: "bar-label" }, "#" + a.number));
    bar.addEventListener("click", () => this.select(a.number));
    const prev = lane.last;
    let added = "";
    if (prev && prev.a.brief !== a.brief) added = a.brief.slice(commonPrefix(prev.a.brief, a.brief));
    const why = h("div", { class: "why" });
    const item = h("li", { class: "attempt-detail", id: "attempt-" + a.number, "data-testid": "attempt-detail", "data-attempt": a.number, "data-outcome": "running" });
    const v: AttemptView = { n: a.number, a, lane, start, bar, item, why, note: "", added, prevN: prev?.n };
    lane.last = v;
    this.atPath.set(a.path, lane);
    // The attempt this one follows on its path, failed and retried: it
    // now says who was tried next.
    const before = this.lastAt.get(a.path);
    this.lastAt.set(a.path, v);
    if (before?.willRetry && before.next !== a.delegate) {
      before.next = a.delegate;
      this.renderItem(before);
    }
    this.attempts.set(a.number, v);
    lane.track.append(bar);
    this.place(bar, start, start);
    this.renderItem(v);
    this.list.append(item);
    this.describeBar(v);
  }

  // output appends the next piece of an attempt's streamed text: a piece
  // already had (an offset before the text's end) adds only what it has
  // beyond it; one after the end leaves a marked gap, and the text goes on
  // from there. Pieces past maxOutputBytes are counted, not kept.
  output(o: AttemptOutput): void {
    const v = this.attempts.get(o.attempt);
    if (!v || v.out?.final) return;
    const out = v.out ?? this.newOutput(v);
    const offset = Number(o.offset);
    let piece = o.text;
    if (offset < out.bytes) {
      const skip = out.bytes - offset;
      if (utf8Len(piece) <= skip) return;
      piece = piece.slice(utf8Cut(piece, skip));
    } else if (offset > out.bytes) {
      out.gaps++;
      if (!out.truncated) {
        out.pre.append(h("span", { class: "gap", "data-testid": "output-gap", title: "bytes " + out.bytes + " to " + offset + " did not reach this page" },
          "[… " + (offset - out.bytes) + " bytes missing …]"));
        out.tail = document.createTextNode("");
        out.pre.append(out.tail);
      }
      out.bytes = offset;
    }
    const n = utf8Len(piece);
    out.bytes += n;
    if (o.provisional !== out.provisional) {
      out.provisional = o.provisional;
      out.box.classList.toggle("provisional", o.provisional);
    }
    if (!out.truncated) {
      if (out.held + n > maxOutputBytes) {
        piece = piece.slice(0, utf8Cut(piece, maxOutputBytes - out.held));
        out.truncated = true;
      }
      out.held += utf8Len(piece);
      out.tail.appendData(piece);
      this.follow(out);
    }
    this.labelOutput(out);
  }

  private newOutput(v: AttemptView): Output {
    const label = h("span", { class: "output-label", "data-testid": "output-label" });
    const tail = document.createTextNode("");
    const pre = h("pre", { class: "output-text", "data-testid": "output-text" }, tail);
    const box = h("div", { class: "output", "data-testid": "output", "data-state": "streaming" }, label, pre);
    const out: Output = { box, label, pre, tail, bytes: 0, held: 0, provisional: false, gaps: 0, truncated: false, final: false, discarded: false, streamed: 0, seenHeight: 0 };
    v.out = out;
    this.renderItem(v);
    return out;
  }

  // follow keeps a growing text scrolled to its end, unless the reader
  // scrolled up: once a frame for all of them (measuring after each piece
  // would lay the page out once per event).
  private follow(out: Output): void {
    this.growing.add(out);
    if (this.followFrame) return;
    this.followFrame = requestAnimationFrame(() => {
      this.followFrame = 0;
      for (const o of this.growing) {
        const p = o.pre;
        if (p.scrollTop + p.clientHeight >= o.seenHeight - 4) p.scrollTop = p.scrollHeight;
        o.seenHeight = p.scrollHeight;
      }
      this.growing.clear();
    });
  }

  private labelOutput(out: Output): void {
    const bits: string[] = [];
    if (!out.final) {
      bits.push("Streaming…");
      if (out.provisional) bits.push("provisional: the failure criteria have yet to rule");
    } else if (out.discarded) {
      bits.push("Output of an attempt that did not succeed: not the answer");
    } else {
      bits.push("Answer");
    }
    const size = Math.max(out.bytes, out.streamed);
    if (size) bits.push(fmtBytes(size) + " streamed");
    if (out.gaps) bits.push(out.gaps === 1 ? "a piece is missing" : out.gaps + " pieces are missing");
    if (out.truncated) bits.push("only the first " + fmtBytes(out.held) + " shown");
    text(out.label, bits.join(" · "));
  }

  attemptFinished(a: Attempt, note: string, evTime: number, discarded = false, outputBytes = 0): void {
    let v = this.attempts.get(a.number);
    if (!v) {
      this.attemptStarted(a, evTime);
      v = this.attempts.get(a.number)!;
    }
    v.a = a;
    v.note = note;
    v.end = tsMs(a.endTime) ?? evTime;
    const o = outcomeName(a.outcome);
    attr(v.bar, "data-outcome", o);
    v.bar.classList.remove("running");
    v.bar.classList.add("o-" + shortName(AttemptOutcomeSchema, a.outcome));
    attr(v.item, "data-outcome", o);
    if (stalled(a, v.failure)) this.markStalled(v);
    if (v.out || discarded || outputBytes > 0) this.finishOutput(v, a, discarded, outputBytes);
    this.place(v.bar, v.start, v.end);
    this.renderItem(v);
    this.describeBar(v);
  }

  // finishOutput settles an attempt's streamed text: accepted, it becomes
  // the attempt's result (the answer as the run has it: no gap, no cap);
  // discarded, it stays as streamed (or the result a judge rejected),
  // struck out.
  private finishOutput(v: AttemptView, a: Attempt, discarded: boolean, outputBytes: number): void {
    const out = v.out ?? this.newOutput(v);
    out.final = true;
    out.streamed = outputBytes;
    out.discarded = discarded || a.outcome !== AttemptOutcome.SUCCEEDED;
    if (a.result) {
      out.tail = document.createTextNode(resultText(a.result));
      out.pre.replaceChildren(out.tail);
      out.gaps = 0;
      out.truncated = false;
      out.held = out.bytes = utf8Len(out.tail.data);
    } else if (outputBytes > out.bytes && !out.truncated) {
      // The end of the text did not reach this page.
      out.gaps++;
      out.pre.append(h("span", { class: "gap", "data-testid": "output-gap" }, "[… " + (outputBytes - out.bytes) + " bytes missing]"));
    }
    out.provisional = false;
    out.box.classList.remove("provisional");
    out.box.classList.toggle("discarded", out.discarded);
    out.box.classList.toggle("accepted", !out.discarded);
    attr(out.box, "data-state", out.discarded ? "discarded" : "accepted");
    if (out.discarded && !out.box.querySelector(".discarded-tag")) {
      out.box.insertBefore(h("span", { class: "badge discarded-tag", "data-testid": "discarded" }, "discarded"), out.label);
    }
    this.labelOutput(out);
  }

  private markStalled(v: AttemptView): void {
    if (v.bar.dataset.stalled) return;
    v.bar.dataset.stalled = "true";
    text(v.bar.firstElementChild!, "#" + v.n + " stalled");
  }

  // failure marks an attempt failed; next, when the caller knows it (a
  // fallback chain's next delegate), is who is tried after it.
  failure(f: FailureRecord, willRetry: boolean, next?: string): void {
    const v = this.attempts.get(f.attempt);
    if (!v) return;
    v.failure = f;
    v.willRetry = willRetry;
    if (willRetry && next && !v.next) v.next = next;
    const src = sourceLabels[f.source];
    if (src) {
      v.bar.dataset.source = src;
      text(v.bar.firstElementChild!, "#" + v.n + " " + src);
    }
    if (stalled(v.a, f)) {
      delete v.bar.dataset.stalled;
      this.markStalled(v);
    }
    this.renderItem(v);
    this.describeBar(v);
  }

  backoff(path: string, b: BackoffScheduled, evTime: number): void {
    const lane = this.atPath.get(path);
    if (!lane) return;
    const start = evTime;
    const until = tsMs(b.until) ?? start + durMs(b.wait);
    const label = h("span", { class: "countdown", "data-testid": "countdown" });
    const wait = durMs(b.wait);
    const el = h("div", {
      class: "backoff", "data-testid": "backoff", "data-next-attempt": b.nextAttempt,
      title: "backoff before attempt " + b.nextAttempt + ": " + fmtMs(wait) +
        (b.fromHint ? " (the delegate's hint)" : b.bound ? " (drawn from [0, " + fmtMs(durMs(b.bound)) + "])" : ""),
    }, label);
    lane.track.append(el);
    this.place(el, start, until);
    this.spans.push({ el, start, end: until, until, label, wait });
  }

  decisionRequested(path: string, evTime: number): void {
    const lane = this.atPath.get(path) ?? this.lanes.values().next().value;
    if (!lane) return;
    const el = h("div", { class: "await", "data-testid": "await", title: "awaiting a decision" }, h("span", null, "awaiting decision"));
    lane.track.append(el);
    const s: Span = { el, start: evTime };
    this.place(el, evTime, evTime);
    this.spans.push(s);
    this.waiting.set(path, s);
  }

  decisionReceived(path: string, evTime: number, label: string): void {
    const s = this.waiting.get(path);
    if (!s) return;
    s.end = evTime;
    this.waiting.delete(path);
    this.place(s.el, s.start, evTime);
    s.el.title = "awaited a decision: " + label;
    s.el.firstElementChild!.textContent = label;
  }

  // finish fixes the axis' end and marks the winner's lane.
  finish(end: number, winner: string): void {
    this.endMs = end;
    for (const s of this.waiting.values()) {
      s.end = end;
      this.place(s.el, s.start, end);
    }
    this.waiting.clear();
    for (const l of this.lanes.values()) {
      if (winner && l.delegate === winner && !l.path) l.el.classList.add("won");
    }
    this.tick(end);
  }

  get size(): number {
    return this.attempts.size;
  }

  // tick moves what depends on the time: the axis, the bars in flight, the
  // countdowns.
  tick(now: number): void {
    let end = this.endMs ?? now;
    if (this.endMs === undefined) {
      for (const s of this.spans) if (s.until && s.until > end) end = s.until;
      for (const v of this.attempts.values()) if (v.end === undefined && v.start > end) end = v.start;
    }
    this.layout(end, now);
    for (const v of this.attempts.values()) {
      if (v.end === undefined) this.place(v.bar, v.start, this.endMs ?? Math.max(now, v.start));
    }
    for (const s of this.spans) {
      if (s.end === undefined) this.place(s.el, s.start, Math.max(now, s.start));
      if (s.label && s.until !== undefined) {
        const left = s.until - now;
        text(s.label, left > 0 && this.endMs === undefined ? fmtMs(left) : fmtMs(s.wait ?? 0));
        s.el.classList.toggle("active", left > 0 && this.endMs === undefined);
      }
    }
    this.el.style.setProperty("--span", String(this.span));
    this.ticks(end);
    // The last cut's stretch may go on: its length grows.
    this.cutMarks.forEach((m, i) => {
      const c = this.cuts[i];
      if (c) text(m.el.firstElementChild!, fmtMs(c.to - c.from));
    });
    this.fit();
  }

  // fit makes the countdown of a past backoff too narrow for it
  // transparent (shown on hover), so a hundred short waits do not write
  // over each other; the countdown of a wait going on always shows. It
  // stacks the bars of a lane that would overlap as drawn on rows.
  private fit(): void {
    const w = this.axis.clientWidth;
    if (!w) return;
    const pxPerMs = w / this.span;
    for (const s of this.spans) {
      if (!s.label || s.until === undefined) continue;
      const active = s.el.classList.contains("active");
      s.el.classList.toggle("tight", !active && (this.x(s.until) - this.x(s.start)) * pxPerMs < 44);
    }
    this.stack(w, pxPerMs);
  }

  // stack puts each bar of a lane on the first of its rows where it
  // overlaps no bar before it, as wide as drawn (at least its label's
  // minimum width).
  private stack(w: number, pxPerMs: number): void {
    const [minPx, marginPx] = this.barRoom();
    const rows = new Map<Lane, number[]>();
    const at: string[] = [];
    for (const v of this.attempts.values()) {
      // As the CSS draws it: a bar at the end moves left to fit its width.
      const left = Math.min(this.x(v.start) * pxPerMs, w + marginPx - minPx);
      const right = left + Math.max(minPx, (Number(v.bar.style.getPropertyValue("--d")) || 0) * pxPerMs) + 2;
      let ends = rows.get(v.lane);
      if (!ends) rows.set(v.lane, (ends = []));
      let row = ends.findIndex((e) => e <= left);
      if (row < 0) row = ends.length < maxRows ? ends.length : ends.indexOf(Math.min(...ends));
      ends[row] = right;
      at.push(v.n + ":" + row);
      if (v.bar.dataset.row !== String(row)) {
        v.bar.dataset.row = String(row);
        v.bar.style.setProperty("--row", String(row));
      }
    }
    const key = at.join(",");
    if (key === this.rowsKey) return;
    this.rowsKey = key;
    for (const l of this.lanes.values()) l.track.style.setProperty("--rows", String(rows.get(l)?.length ?? 1));
  }

  // barRoom is a bar's least width (its CSS min-width) and the room
  // right of the axis a bar may take (the track's right margin), read once.
  private barRoomSeen?: [number, number];
  private barRoom(): [number, number] {
    if (!this.barRoomSeen) {
      const bar = this.lanesEl.querySelector<HTMLElement>(".bar");
      if (!bar) return [0, 0];
      this.barRoomSeen = [parseFloat(getComputedStyle(bar).minWidth) || 0, parseFloat(getComputedStyle(bar.parentElement!).marginRight) || 0];
    }
    return this.barRoomSeen;
  }

  // ticks marks the axis: a round step of the time drawn uncut, ticks at
  // its multiples outside the cuts, and each cut with its length.
  private ticks(end: number): void {
    const steps = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 15e3, 3e4, 6e4, 12e4, 3e5, 6e5, 9e5, 18e5, 36e5, 72e5, 144e5, 288e5, 864e5];
    const uncut = this.span - this.cuts.length * this.cutShown;
    const step = steps.find((s) => uncut / s <= 8) ?? uncut / 8;
    // The multiples of step in the stretches drawn as they are: between
    // the cuts (at most about 8 in all, and a few at the cuts' ends).
    const at: number[] = [];
    let from = this.t0;
    for (const seg of [...this.cuts, { from: end, to: end }]) {
      for (let i = Math.ceil((from - this.t0) / step); this.t0 + i * step <= seg.from; i++) at.push(i * step);
      from = seg.to;
    }
    const key = step + "/" + at.length + "/" + at[at.length - 1] + "/" + this.cutsKey;
    if (key === this.ticksKey) return;
    this.ticksKey = key;
    const marks = at.map((ms) => {
      const t = h("span", { class: "tick" }, ms === 0 ? "0" : fmtMs(ms));
      t.style.setProperty("--s", String(this.x(this.t0 + ms)));
      return t;
    });
    this.cutMarks = this.cuts.map((c) => {
      const el = h("span", {
        class: "cut", "data-testid": "cut",
        title: "no attempt in flight for this long: drawn shorter than the rest of the axis",
      }, h("span", null, fmtMs(c.to - c.from)));
      el.style.setProperty("--s", String(this.x(c.from)));
      el.style.setProperty("--d", String(this.cutShown));
      return { el };
    });
    this.axis.replaceChildren(...marks, ...this.cutMarks.map((m) => m.el));
  }

  select(n: number): void {
    const v = this.attempts.get(n);
    if (!v) return;
    for (const x of this.list.querySelectorAll(".selected")) x.classList.remove("selected");
    for (const x of this.lanesEl.querySelectorAll(".bar.selected")) x.classList.remove("selected");
    v.item.classList.add("selected");
    v.bar.classList.add("selected");
    v.item.scrollIntoView({ block: "nearest", behavior: "smooth" });
  }

  private describeBar(v: AttemptView): void {
    const parts = ["attempt " + v.n, v.a.delegate + (v.a.path ? " at " + v.a.path : ""), outcomeName(v.a.outcome)];
    if (v.bar.dataset.stalled) parts.push("stalled");
    if (v.out?.discarded) parts.push("output discarded");
    if (startWhy(v.a)) parts.push(startWhy(v.a));
    if (v.end !== undefined) parts.push(fmtMs(v.end - v.start));
    if (v.failure) parts.push((sourceLabels[v.failure.source] ?? "failed") + ": " + v.failure.reason);
    if (v.failure?.analysis) parts.push("analyst: " + v.failure.analysis);
    const s = parts.join(" · ");
    v.bar.title = s;
    v.bar.setAttribute("aria-label", s);
  }

  private renderItem(v: AttemptView): void {
    const a = v.a;
    const f = v.failure;
    const outcome = a.outcome === AttemptOutcome.UNSPECIFIED ? "RUNNING" : shortName(AttemptOutcomeSchema, a.outcome);
    const outcomeWords = a.outcome === AttemptOutcome.UNSPECIFIED ? "Running" : words(AttemptOutcomeSchema, a.outcome);
    const head = h("div", { class: "head" },
      h("button", { type: "button", class: "link n", onclick: () => this.select(v.n) }, "#" + v.n),
      h("span", { class: "who" }, a.delegate),
      a.path ? h("span", { class: "path" }, a.path) : null,
      h("span", { class: "badge o-" + outcome, title: outcomeName(a.outcome) }, outcomeWords),
      stalled(a, f) ? h("span", { class: "badge stalled", "data-testid": "stalled", title: "no output within the first output or idle timeout" }, "stalled") : null,
      v.end !== undefined ? h("span", { class: "dur" }, fmtMs(v.end - v.start)) : null,
      durMs(a.waitBefore) > 0 ? h("span", { class: "wait" }, "after a " + fmtMs(durMs(a.waitBefore)) + " backoff") : null,
      startWhy(a) ? h("span", { class: "wait", "data-testid": "start-reason" }, startWhy(a)) : null);
    const lines: (HTMLElement | null)[] = [];
    if (f) {
      const src = sourceLabels[f.source] ?? "failed";
      lines.push(h("div", { class: "why" },
        h("span", { class: "src src-" + src.replaceAll(" ", "-") }, src), " ", f.reason,
        f.transient ? h("span", { class: "tag" }, "transient") : null,
        v.willRetry ? h("span", { class: "tag", "data-testid": "follows" }, v.next && v.next !== a.delegate ?
          "the next delegate, " + v.next + ", is tried" : "another attempt follows") : null,
        f.notRetriedReason ? h("span", { class: "not-retried" }, " · not retried: " + f.notRetriedReason) :
          f.notRetriedCode !== NotRetried.UNSPECIFIED ? h("span", { class: "not-retried" }, " · not retried") : null));
      if (f.analysis) lines.push(h("div", { class: "advice" }, h("strong", null, "Analyst: "), f.analysis));
      if (f.analysisError) lines.push(h("div", { class: "advice error" }, h("strong", null, "Analyst gave no advice: "), f.analysisError));
    } else if (a.error) {
      lines.push(h("div", { class: "why" }, (codes[a.error.code] ?? a.error.code) + ": " + a.error.message));
    }
    if (v.note && v.note !== f?.reason) lines.push(h("div", { class: "note" }, v.note));
    if (v.added) {
      lines.push(h("div", { class: "added" }, h("span", { class: "added-label" }, "Added to the brief since #" + v.prevN + ":"),
        h("pre", null, h("mark", null, v.added.replace(/^\n+/, "")))));
    }
    // The streamed text, the same element as it grows (renderItem moves
    // it, keeping what it holds).
    if (v.out) lines.push(v.out.box);
    // The brief, the answer and the error in full, built when opened: a
    // learning run's late briefs carry every failure before them.
    const more = h("details", { class: "more" }, h("summary", null, "Brief and answer"));
    more.addEventListener("toggle", () => {
      if (!more.open || more.childElementCount > 1) return;
      const keep = v.a.brief.length - v.added.length;
      more.append(
        h("h4", null, "Brief as sent"),
        h("pre", { class: "brief" }, v.a.brief.slice(0, keep), v.added ? h("mark", null, v.a.brief.slice(keep)) : null));
      // An attempt that streamed shows its answer above, not twice.
      const r = resultText(v.a.result);
      if (v.a.result && !v.out) more.append(h("h4", null, "Answer"), h("pre", null, r || "(empty)"));
      const e = v.a.error;
      if (e) {
        const bits = [(codes[e.code] ?? String(e.code)) + ": " + e.message];
        if (e.httpStatus) bits.push("upstream HTTP " + e.httpStatus);
        if (e.retryHint) bits.push("retry hint " + fmtMs(durMs(e.retryHint)));
        if (e.notSent) bits.push("never sent");
        if (e.refused) bits.push("refused by Stubborn");
        more.append(h("h4", null, "Error"), h("pre", null, bits.join("\n")));
      }
    });
    v.item.replaceChildren(head, ...lines.filter((x): x is HTMLElement => x !== null), more);
  }
}
