// The runs page: ListRuns (summaries, newest first, paged) merged live with
// WatchRuns, filtered by status, control and delegate.

import { Code } from "@connectrpc/connect";
import {
  RunStatus,
  RunStatusSchema,
  RunView,
  type RunSummary,
} from "../../../clients/typescript/src/gen/stubborn/v1/control_pb.js";
import { api, describe, errorCode, isAbort, report } from "./api";
import { attr, h, text } from "./dom";
import { enumName, fmtMs, fmtTime, isoTime, tsMs } from "./format";
import type { Page } from "./main";
import { ServerClock } from "./clock";
import { controlNames, loadDelegates, sleep, statusBadge, terminal } from "./shared";

interface Row {
  sum: RunSummary;
  tr: HTMLTableRowElement;
  age: HTMLElement;
  dur: HTMLElement;
}

const pageSize = 50;

export function runsPage(q: URLSearchParams): Page {
  const ac = new AbortController();
  const signal = ac.signal;
  const statusName = q.get("status") ?? "";
  const status = RunStatusSchema.values.find((v) => v.name === statusName)?.number ?? RunStatus.UNSPECIFIED;
  const control = q.get("control") ?? "";
  const delegate = q.get("delegate") ?? "";

  const rows = new Map<string, Row>();
  // deleted holds the runs WatchRuns said were deleted: a page listed
  // before a deletion may still name the run when it arrives after it.
  const deleted = new Set<string>();
  // Ages are counted on the server's clock (ListRuns' server_time).
  const clock = new ServerClock();
  const tbody = h("tbody");
  const table = h("table", { class: "runs", "data-testid": "runs" },
    h("caption", { class: "visually-hidden" }, "Runs, newest first"),
    h("thead", null, h("tr", null,
      h("th", { scope: "col" }, "Run"), h("th", { scope: "col" }, "Brief"), h("th", { scope: "col" }, "Control"), h("th", { scope: "col" }, "Delegates"),
      h("th", { scope: "col" }, "Status"), h("th", { scope: "col", class: "num" }, "Attempts"),
      h("th", { scope: "col" }, "Age"), h("th", { scope: "col" }, "Duration"))),
    tbody);
  const empty = h("p", { class: "empty", hidden: true }, "No runs", status || control || delegate ? " match these filters" : " yet", ". ",
    h("a", { href: "#/start" }, "Start one"), ".");
  const error = h("p", { class: "error", role: "alert" });
  const live = h("span", { class: "live", "data-testid": "live", "aria-live": "polite" }, "connecting…");
  const more = h("button", { type: "button", class: "secondary", hidden: true }, "Load more");
  let nextToken = "";
  let listed = false;
  let pagedBeyond = false;

  // Filters: each change is a new route (#/?status=…), so the URL says what
  // is shown and Back works.
  const statusSel = h("select", { name: "status", id: "f-status" },
    h("option", { value: "" }, "any"),
    RunStatusSchema.values.filter((v) => v.number !== RunStatus.UNSPECIFIED && v.number !== RunStatus.PENDING)
      .map((v) => h("option", { value: v.name, selected: v.number === status }, v.localName.replace(/_/g, " ").toLowerCase())));
  const controlSel = h("select", { name: "control", id: "f-control" },
    h("option", { value: "" }, "any"),
    Object.entries(controlNames).map(([v, label]) => h("option", { value: v, selected: v === control }, label)));
  const delegateSel = h("select", { name: "delegate", id: "f-delegate" },
    h("option", { value: "" }, "any"),
    delegate ? h("option", { value: delegate, selected: true }, delegate) : null);
  const filters = h("form", { class: "filters", role: "search", "aria-label": "Filter runs" },
    h("label", { for: "f-status" }, "Status"), statusSel,
    h("label", { for: "f-control" }, "Control"), controlSel,
    h("label", { for: "f-delegate" }, "Delegate"), delegateSel);
  filters.addEventListener("change", () => {
    const p = new URLSearchParams();
    if (statusSel.value) p.set("status", statusSel.value);
    if (controlSel.value) p.set("control", controlSel.value);
    if (delegateSel.value) p.set("delegate", delegateSel.value);
    const s = p.toString();
    location.hash = "#/" + (s ? "?" + s : "");
  });
  filters.addEventListener("submit", (e) => e.preventDefault());
  loadDelegates(signal).then((d) => {
    if (!d) return;
    const names = [...d.delegates.map((x) => x.name), ...d.presets.map((x) => x.name)];
    delegateSel.replaceChildren(h("option", { value: "" }, "any"),
      ...names.map((n) => h("option", { value: n, selected: n === delegate }, n)));
    if (delegate && !names.includes(delegate)) delegateSel.append(h("option", { value: delegate, selected: true }, delegate));
  });

  const el = h("section", { class: "runs-page" },
    h("div", { class: "title" }, h("h1", null, "Runs"), live, h("a", { class: "button", href: "#/start" }, "Start a run")),
    filters, error, table, empty, more);

  function matches(s: RunSummary): boolean {
    return (!status || s.status === status) && (!control || s.control === control) && (!delegate || s.delegates.includes(delegate));
  }

  function render(r: Row): void {
    const s = r.sum;
    attr(r.tr, "data-status", enumName(RunStatusSchema, s.status));
    const cells = r.tr.cells;
    text(cells[1], s.brief);
    attr(cells[1], "title", s.brief);
    text(cells[2], controlNames[s.control] ?? s.control);
    text(cells[3], s.delegates.join(", "));
    cells[4].replaceChildren(statusBadge(s.status), s.winner ? h("span", { class: "winner" }, " ★ " + s.winner) : "");
    text(cells[5], String(s.attempts));
    tickRow(r, clock.now());
  }

  function tickRow(r: Row, now: number): void {
    const created = tsMs(r.sum.createTime) ?? now;
    text(r.age, fmtMs(now - created));
    const end = terminal(r.sum.status) ? tsMs(r.sum.updateTime) ?? now : now;
    text(r.dur, fmtMs(end - created) + (terminal(r.sum.status) ? "" : "…"));
  }

  function newRow(s: RunSummary): Row {
    const id = s.runId;
    const age = h("time", { datetime: isoTime(tsMs(s.createTime)), title: fmtTime(tsMs(s.createTime)) });
    const dur = h("span");
    const tr = h("tr", { "data-testid": "run-row", "data-run-id": id, class: "run" },
      h("td", null, h("a", { href: "#/runs/" + encodeURIComponent(id) }, id)),
      h("td", { class: "brief", "data-testid": "brief" }), h("td"), h("td"), h("td"), h("td", { class: "num" }), h("td", null, age), h("td", null, dur));
    tr.addEventListener("click", (e) => {
      if ((e.target as Element).closest("a")) return;
      location.hash = "#/runs/" + encodeURIComponent(id);
    });
    const r = { sum: s, tr, age, dur };
    render(r);
    return r;
  }

  // upsert shows s: a newer summary of a row replaces it, a new run goes
  // in its place by age (if that place is on the pages loaded), a run that
  // left the status filtered on leaves.
  function upsert(s: RunSummary, fromList: boolean): void {
    if (deleted.has(s.runId)) return;
    const r = rows.get(s.runId);
    if (!matches(s)) {
      if (r) {
        r.tr.remove();
        rows.delete(s.runId);
      }
      return updateEmpty();
    }
    if (r) {
      // Whichever arrives last, a page or the stream, the newer state wins.
      if ((tsMs(s.updateTime) ?? 0) >= (tsMs(r.sum.updateTime) ?? 0)) {
        r.sum = s;
        render(r);
      }
      return;
    }
    const created = tsMs(s.createTime) ?? 0;
    let before: Element | null = null;
    for (const tr of tbody.rows) {
      const o = rows.get(tr.dataset.runId ?? "");
      if (o && (tsMs(o.sum.createTime) ?? 0) < created) {
        before = tr;
        break;
      }
    }
    // Older than every row loaded while more pages remain: paging brings it.
    if (!before && !fromList && nextToken) return;
    const row = newRow(s);
    rows.set(s.runId, row);
    tbody.insertBefore(row.tr, before);
    updateEmpty();
  }

  // remove drops the row of run id, which was deleted, for good.
  function remove(id: string): void {
    deleted.add(id);
    const r = rows.get(id);
    if (r) {
      r.tr.remove();
      rows.delete(id);
    }
    updateEmpty();
  }

  function updateEmpty(): void {
    empty.hidden = !listed || rows.size > 0;
  }

  async function list(token: string): Promise<void> {
    try {
      const sent = Date.now();
      const res = await api.listRuns({ view: RunView.SUMMARY, pageSize, pageToken: token, status, control, delegate }, { signal });
      clock.answer(sent, Date.now(), tsMs(res.serverTime));
      // The first page listed again (on a reconnect) does not move the
      // token once later pages are loaded.
      if (token) {
        pagedBeyond = true;
        nextToken = res.nextPageToken;
      } else if (!pagedBeyond) nextToken = res.nextPageToken;
      for (const s of res.summaries) upsert(s, true);
      listed = true;
      updateEmpty();
      more.hidden = !nextToken;
      text(error, "");
    } catch (err) {
      if (!isAbort(err)) report(error, "Listing runs: ", err);
    }
  }

  // relistLoaded lists again, after the first page, the later pages
  // loaded with "Load more", down to the oldest row shown: after a
  // reconnect no change to any row shown is missed. ("Load more" goes on
  // from where it was.)
  async function relistLoaded(): Promise<void> {
    if (!pagedBeyond) return;
    let oldest = Infinity;
    for (const r of rows.values()) oldest = Math.min(oldest, tsMs(r.sum.createTime) ?? 0);
    let token = "";
    for (let pages = 0; pages < 200; pages++) {
      const res = await api.listRuns({ view: RunView.SUMMARY, pageSize, pageToken: token, status, control, delegate }, { signal });
      for (const s of res.summaries) upsert(s, true);
      const last = res.summaries[res.summaries.length - 1];
      token = res.nextPageToken;
      if (!token || !last || (tsMs(last.createTime) ?? 0) <= oldest) return;
    }
  }

  more.addEventListener("click", async () => {
    more.disabled = true;
    await list(nextToken);
    more.disabled = false;
  });

  // follow keeps WatchRuns open, and lists the pages loaded again each
  // time it opens one, so nothing that happened while the stream was down
  // is missed. The list waits for the stream's first message, which has no
  // run and says the server follows the runs (or for its headers, or 300ms,
  // from a server that sends no such message). A dropped stream is reopened
  // after a backoff (1s doubling to 30s, jittered).
  async function follow(): Promise<void> {
    let delay = 1000;
    while (!signal.aborted) {
      text(live, "connecting…");
      attr(live, "data-state", "connecting");
      let relisted = false;
      const relist = () => {
        if (relisted || signal.aborted) return;
        relisted = true;
        void list("").then(relistLoaded).catch((err) => {
          if (!isAbort(err)) report(error, "Listing runs: ", err);
        }).then(() => {
          if (!failed) {
            text(live, "live");
            attr(live, "data-state", "live");
          }
        });
      };
      let failed = false;
      const timer = setTimeout(relist, 300);
      try {
        const stream = api.watchRuns({ control, delegate }, { signal, onHeader: relist });
        for await (const res of stream) {
          relist();
          delay = 1000;
          if (res.deletedRunId) remove(res.deletedRunId);
          else if (res.run) upsert(res.run, false);
        }
      } catch (err) {
        failed = true;
        clearTimeout(timer);
        if (isAbort(err) || signal.aborted) return;
        const why = describe(err);
        relist();
        if (errorCode(err) === Code.Unauthenticated || errorCode(err) === Code.PermissionDenied) {
          // UNAUTHENTICATED: the token prompt says why.
          text(live, errorCode(err) === Code.Unauthenticated ? "not live" : "not live: " + why);
          attr(live, "data-state", "down");
          return;
        }
        text(live, "not live (" + why + ")");
      }
      failed = true;
      clearTimeout(timer);
      const wait = delay * (0.5 + Math.random() / 2);
      delay = Math.min(delay * 2, 30000);
      attr(live, "data-state", "down");
      const until = Date.now() + wait;
      while (!signal.aborted && Date.now() < until) {
        text(live, "reconnecting in " + Math.ceil((until - Date.now()) / 1000) + "s");
        await sleep(Math.min(1000, until - Date.now()), signal);
      }
    }
  }

  void follow();
  const timer = setInterval(() => {
    const now = clock.now();
    for (const r of rows.values()) tickRow(r, now);
  }, 1000);

  return {
    el,
    title: "Runs",
    dispose() {
      ac.abort();
      clearInterval(timer);
    },
  };
}
