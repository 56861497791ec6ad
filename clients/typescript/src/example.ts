// Stubborn from TypeScript (Node): a retry run followed live, dropped,
// reattached and decided.
//
// The run retries the demo delegate flaky-api, which fails its first two calls
// UNAVAILABLE, with no automatic retries and on_exhausted ASK: after each
// failure the run waits for a decision. The example prints every event as the
// server streams it, hangs up once the first attempt has started, reattaches
// with WatchRun(after_seq=last seen) (the run went on meanwhile; nothing is
// lost or repeated), answers each decision with DecideRun(RETRY), and exits 0
// when the run ends SUCCEEDED.
//
//   stubborn delegates &    # a fresh one: flaky-api counts its calls
//   stubborn serve -config stubborn.yaml -listen 127.0.0.1:7300 &
//   cd clients/typescript && npm run example -- --addr 127.0.0.1:7300
//
// An attempt that streams its output (attempt_output events: --target names
// a delegate that streams) is printed as it comes, each piece written at once
// with no newline of its own, in a block that begins on the first piece's
// event line and ends with a line naming the events it held:
//
//     6 10:48:56.791 attempt_output     attempt 1 | Here is
//   -- attempt 1 streamed 7 bytes in seq 6-7
//     8 10:48:57.050 attempt_finished   attempt 1 <- model: ERROR UNAVAILABLE "reset" [output discarded]
//
// "[output discarded]": the attempt failed after it streamed, so that text is
// not the answer; the next attempt's output follows.

import { parseArgs } from "node:util";
import { setTimeout as sleep } from "node:timers/promises";
import { durationFromMs, durationMs, timestampDate } from "@bufbuild/protobuf/wkt";
import { Code, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import {
  AttemptOutcome,
  ControlService,
  Decision,
  OnExhausted,
  RunStatus,
  type AttemptOutput,
  type ControlState,
  type RunEvent,
} from "./gen/stubborn/v1/control_pb.js";

// One line: seq, time (UTC), kind, and what happened.
function describe(event: RunEvent): string {
  const e = event.kind;
  let text: string;
  switch (e.case) {
    case "runStarted":
      text = `run ${event.runId} started: ${JSON.stringify(e.value.state?.taskBrief)}`;
      break;
    case "attemptStarted": {
      const a = e.value.attempt!;
      text = `attempt ${a.number} -> ${a.delegate}`;
      if (a.waitBefore) text += ` after waiting ${durationMs(a.waitBefore)}ms`;
      break;
    }
    case "attemptFinished": {
      const a = e.value.attempt!;
      text = `attempt ${a.number} <- ${a.delegate}: ${AttemptOutcome[a.outcome]}`;
      if (a.error) text += ` ${Code[a.error.code]} ${JSON.stringify(a.error.message)}`;
      else if (a.result) text += ` ${JSON.stringify(a.result.text)}`;
      if (e.value.outputDiscarded) text += " [output discarded]";
      break;
    }
    case "failureAnalyzed": {
      const f = e.value.failure!;
      text = `attempt ${f.attempt} failed: ${f.reason}; `;
      text += e.value.willRetry ? "retrying" : `not retried: ${f.notRetriedReason}`;
      break;
    }
    case "backoffScheduled":
      text = `waiting ${durationMs(e.value.wait!)}ms before attempt ${e.value.nextAttempt}`;
      break;
    case "decisionRequested":
      text = `awaiting a decision: ${e.value.reason}`;
      break;
    case "decisionReceived":
      text = `decision: ${Decision[e.value.decision]}`;
      break;
    case "runResumed":
      text = `resumed by ${e.value.owner}: ${e.value.reason}`;
      break;
    case "runFinished":
      text = `${RunStatus[e.value.state!.status]} after ${e.value.state!.attempts} attempt(s)`;
      break;
    default:
      text = "an event this client does not know";
  }
  return `${head(event)} ${text}`;
}

// An event line's start: seq, time (UTC), kind.
function head(event: RunEvent): string {
  const clock = timestampDate(event.time!).toISOString().slice(11, 23);
  const kind = (event.kind.case ?? "unknown").replace(/[A-Z]/g, (c) => "_" + c.toLowerCase());
  return `${String(event.seq).padStart(3)} ${clock} ${kind.padEnd(18)}`;
}

// Prints a run's events, checking that seq runs 1, 2, 3, ... An attempt's
// streamed text (attempt_output) is written as it comes, each piece at once
// with no newline of its own, in a block: its first line is the first
// piece's event line, with "| " before the text; the text's own line breaks
// start lines with "| " under it. The block ends, with a line "-- attempt N
// streamed B bytes in seq F-L", before anything else is printed: another
// event, another attempt's text, a note.
class Printer {
  lastSeq = 0n;
  // The open block: its attempt's key, label, first and last seq, bytes.
  private block?: { key: string; label: string; first: bigint; last: bigint; bytes: number };
  private margin = ""; // what starts each later line of the block
  private lineOpen = false; // the block's last line has yet to end
  private printed = new Map<string, bigint>(); // bytes of each attempt's text printed

  show(event: RunEvent): void {
    if (event.seq !== this.lastSeq + 1n) {
      throw new Error(`event seq ${event.seq} after ${this.lastSeq}: a gap or a duplicate`);
    }
    this.lastSeq = event.seq;
    if (event.kind.case === "attemptOutput") {
      this.output(event, event.kind.value);
    } else {
      this.endBlock();
      console.log(describe(event));
    }
  }

  // One of the example's own lines: "-- text".
  note(text: string): void {
    this.endBlock();
    console.log(`-- ${text}`);
  }

  private output(event: RunEvent, o: AttemptOutput): void {
    const key = `${event.path}\x00${o.attempt}`;
    if (this.block?.key !== key || o.offset !== (this.printed.get(key) ?? 0n)) {
      this.endBlock();
      const label = event.path ? `[${event.path}] attempt ${o.attempt}` : `attempt ${o.attempt}`;
      let shown = label;
      if (o.offset !== (this.printed.get(key) ?? 0n)) shown += ` from byte ${o.offset}`; // text before it never seen here
      if (o.provisional) shown += " (provisional)"; // failure criteria have yet to rule on it
      const start = `${head(event)} ${shown} | `;
      process.stdout.write(start);
      this.margin = " ".repeat(start.length - 2) + "| ";
      this.block = { key, label, first: event.seq, last: event.seq, bytes: 0 };
      this.lineOpen = true;
    }
    o.text.split("\n").forEach((line, i) => {
      if (i > 0) {
        process.stdout.write((this.lineOpen ? "" : this.margin.trimEnd()) + "\n");
        this.lineOpen = false;
      }
      if (line) {
        if (!this.lineOpen) process.stdout.write(this.margin);
        this.lineOpen = true;
        process.stdout.write(line);
      }
    });
    const size = Buffer.byteLength(o.text, "utf8");
    this.block!.last = event.seq;
    this.block!.bytes += size;
    this.printed.set(key, o.offset + BigInt(size));
  }

  endBlock(): void {
    if (!this.block) return;
    if (this.lineOpen) process.stdout.write("\n");
    const b = this.block;
    console.log(`-- ${b.label} streamed ${b.bytes} bytes in seq ${b.first}-${b.last}`);
    this.block = undefined;
    this.lineOpen = false;
  }
}

async function main(): Promise<number> {
  const { values: args } = parseArgs({
    options: {
      addr: { type: "string", default: process.env.STUBBORN_ADDR || "127.0.0.1:7300" }, // STUBBORN_ADDR sets the default
      target: { type: "string", default: "flaky-api" },
    },
  });
  const client = createClient(
    ControlService,
    createGrpcTransport({ baseUrl: `http://${args.addr}` }),
  );

  const out = new Printer();

  // Start the run and follow it live; hang up once the first attempt has started.
  const hangUp = new AbortController();
  let runId = "";
  const request = {
    taskBrief: "fetch the quarterly numbers",
    retry: {
      target: args.target,
      attempts: 0, // no automatic retry: every failure asks for a decision
      onExhausted: OnExhausted.ASK,
      baseWait: durationFromMs(100),
      maxWait: durationFromMs(1000),
    },
  };
  for await (const response of client.run(request, { signal: hangUp.signal })) {
    out.show(response.event!);
    runId = response.event!.runId;
    if (response.event!.kind.case === "attemptStarted") {
      hangUp.abort();
      break;
    }
  }
  out.note(`hung up after seq ${out.lastSeq}; the run goes on without a watcher`);
  await sleep(500);

  // Reattach after the last event seen, and answer each decision.
  out.note(`reattaching: WatchRun(run_id=${runId}, after_seq=${out.lastSeq})`);
  let final: ControlState | undefined;
  for await (const { event } of client.watchRun({ runId, afterSeq: out.lastSeq })) {
    out.show(event!);
    if (event!.kind.case === "decisionRequested") {
      const decided = await client.decideRun({ runId, decision: Decision.RETRY });
      out.note(`DecideRun(RETRY): run is ${RunStatus[decided.state!.status]}`);
    } else if (event!.kind.case === "runFinished") {
      final = event!.kind.value.state;
    }
  }
  out.endBlock();

  if (!final) throw new Error("the stream ended without run_finished");
  console.log(
    `final status: ${RunStatus[final.status]} after ${final.attempts} attempts, ` +
      `winner ${final.winner}, result ${JSON.stringify(final.result?.text)}`,
  );
  return final.status === RunStatus.SUCCEEDED ? 0 : 1;
}

process.exitCode = await main();
