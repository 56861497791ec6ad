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
    case "runFinished":
      text = `${RunStatus[e.value.state!.status]} after ${e.value.state!.attempts} attempt(s)`;
      break;
    default:
      text = "an event this client does not know";
  }
  const clock = timestampDate(event.time!).toISOString().slice(11, 23);
  const kind = (e.case ?? "unknown").replace(/[A-Z]/g, (c) => "_" + c.toLowerCase());
  return `${String(event.seq).padStart(3)} ${clock} ${kind.padEnd(18)} ${text}`;
}

async function main(): Promise<number> {
  const { values: args } = parseArgs({
    options: {
      addr: { type: "string", default: "127.0.0.1:7300" },
      target: { type: "string", default: "flaky-api" },
    },
  });
  const client = createClient(
    ControlService,
    createGrpcTransport({ baseUrl: `http://${args.addr}` }),
  );

  let lastSeq = 0n;
  const show = (event: RunEvent) => {
    if (event.seq !== lastSeq + 1n) {
      throw new Error(`event seq ${event.seq} after ${lastSeq}: a gap or a duplicate`);
    }
    lastSeq = event.seq;
    console.log(describe(event));
  };

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
    show(response.event!);
    runId = response.event!.runId;
    if (response.event!.kind.case === "attemptStarted") {
      hangUp.abort();
      break;
    }
  }
  console.log(`-- hung up after seq ${lastSeq}; the run goes on without a watcher`);
  await sleep(500);

  // Reattach after the last event seen, and answer each decision.
  console.log(`-- reattaching: WatchRun(run_id=${runId}, after_seq=${lastSeq})`);
  let final: ControlState | undefined;
  for await (const { event } of client.watchRun({ runId, afterSeq: lastSeq })) {
    show(event!);
    if (event!.kind.case === "decisionRequested") {
      const decided = await client.decideRun({ runId, decision: Decision.RETRY });
      console.log(`-- DecideRun(RETRY): run is ${RunStatus[decided.state!.status]}`);
    } else if (event!.kind.case === "runFinished") {
      final = event!.kind.value.state;
    }
  }

  if (!final) throw new Error("the stream ended without run_finished");
  console.log(
    `final status: ${RunStatus[final.status]} after ${final.attempts} attempts, ` +
      `winner ${final.winner}, result ${JSON.stringify(final.result?.text)}`,
  );
  return final.status === RunStatus.SUCCEEDED ? 0 : 1;
}

process.exitCode = await main();
