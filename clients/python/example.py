#!/usr/bin/python3
"""Stubborn from Python: a retry run followed live, dropped, reattached and decided.

The run retries the demo delegate flaky-api, which fails its first two calls
UNAVAILABLE, with no automatic retries and on_exhausted ASK: after each failure
the run waits for a decision. The example prints every event as the server
streams it, hangs up once the first attempt has started, reattaches with
WatchRun(after_seq=last seen) (the run went on meanwhile; nothing is lost or
repeated), answers each decision with DecideRun(RETRY), and exits 0 when the
run ends SUCCEEDED.

    stubborn delegates &    # a fresh one: flaky-api counts its calls
    stubborn serve -config stubborn.yaml -listen 127.0.0.1:7300 &
    /usr/bin/python3 clients/python/example.py --addr 127.0.0.1:7300

An attempt that streams its output (attempt_output events: --target names a
delegate that streams) is printed as it comes, each piece written at once
with no newline of its own, in a block that begins on the first piece's
event line and ends with a line naming the events it held:

      6 10:48:56.791 attempt_output     attempt 1 | Here is
    -- attempt 1 streamed 7 bytes in seq 6-7
      8 10:48:57.050 attempt_finished   attempt 1 <- model: ERROR UNAVAILABLE 'reset' [output discarded]

"[output discarded]": the attempt failed after it streamed, so that text is
not the answer; the next attempt's output follows.
"""

import argparse
import os
import sys
import time

import grpc
from google.protobuf.duration_pb2 import Duration

from stubborn.v1 import control_pb2 as pb
from stubborn.v1 import control_pb2_grpc

CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


def name(enum, value: int, prefix: str) -> str:
    return enum.Name(value).removeprefix(prefix)


def describe(event: pb.RunEvent) -> str:
    """One line: seq, time (UTC), kind, and what happened."""
    kind = event.WhichOneof("kind")
    e = getattr(event, kind) if kind else None
    if kind == "run_started":
        text = f"run {event.run_id} started: {e.state.task_brief!r}"
    elif kind == "attempt_started":
        text = f"attempt {e.attempt.number} -> {e.attempt.delegate}"
        if e.attempt.HasField("wait_before"):
            text += f" after waiting {e.attempt.wait_before.ToMilliseconds()}ms"
    elif kind == "attempt_finished":
        a = e.attempt
        text = f"attempt {a.number} <- {a.delegate}: {name(pb.AttemptOutcome, a.outcome, 'ATTEMPT_OUTCOME_')}"
        if a.HasField("error"):
            text += f" {CODE_NAMES.get(a.error.code, a.error.code)} {a.error.message!r}"
        elif a.HasField("result"):
            text += f" {a.result.text!r}"
        if e.output_discarded:
            text += " [output discarded]"
    elif kind == "failure_analyzed":
        f = e.failure
        text = f"attempt {f.attempt} failed: {f.reason}; "
        text += "retrying" if e.will_retry else f"not retried: {f.not_retried_reason}"
    elif kind == "backoff_scheduled":
        text = f"waiting {e.wait.ToMilliseconds()}ms before attempt {e.next_attempt}"
    elif kind == "decision_requested":
        text = f"awaiting a decision: {e.reason}"
    elif kind == "decision_received":
        text = f"decision: {name(pb.Decision, e.decision, 'DECISION_')}"
    elif kind == "run_resumed":
        text = f"resumed by {e.owner}: {e.reason}"
    elif kind == "run_finished":
        text = f"{name(pb.RunStatus, e.state.status, 'RUN_STATUS_')} after {e.state.attempts} attempt(s)"
    else:
        text = "an event this client does not know"
    return f"{head(event)} {text}"


def head(event: pb.RunEvent) -> str:
    """An event line's start: seq, time (UTC), kind."""
    clock = event.time.ToDatetime().strftime("%H:%M:%S.%f")[:-3]
    return f"{event.seq:3d} {clock} {event.WhichOneof('kind') or 'unknown':<18}"


class Printer:
    """Prints a run's events, checking that seq runs 1, 2, 3, ... An
    attempt's streamed text (attempt_output) is written as it comes, each
    piece at once with no newline of its own, in a block: its first line
    is the first piece's event line, with "| " before the text; the text's
    own line breaks start lines with "| " under it. The block ends, with a
    line "-- attempt N streamed B bytes in seq F-L", before anything else
    is printed: another event, another attempt's text, a note."""

    def __init__(self) -> None:
        self.last_seq = 0
        self.block = None  # (path, attempt) of the open block, or None
        self.first = self.last = self.bytes = 0  # the open block's first and last seq, bytes
        self.margin = ""  # what starts each later line of the block
        self.line_open = False  # the block's last line has yet to end
        self.printed = {}  # (path, attempt): bytes of its text printed

    def show(self, event: pb.RunEvent) -> None:
        if event.seq != self.last_seq + 1:
            sys.exit(f"event seq {event.seq} after {self.last_seq}: a gap or a duplicate")
        self.last_seq = event.seq
        if event.HasField("attempt_output"):
            self.output(event)
        else:
            self.end_block()
            print(describe(event), flush=True)

    def note(self, text: str) -> None:
        """One of the example's own lines: "-- text"."""
        self.end_block()
        print(f"-- {text}", flush=True)

    def output(self, event: pb.RunEvent) -> None:
        o = event.attempt_output
        key = (event.path, o.attempt)
        if key != self.block or o.offset != self.printed.get(key, 0):
            self.end_block()
            label = f"[{event.path}] attempt {o.attempt}" if event.path else f"attempt {o.attempt}"
            if o.offset != self.printed.get(key, 0):  # text before it never seen here
                label += f" from byte {o.offset}"
            if o.provisional:  # failure criteria have yet to rule on it
                label += " (provisional)"
            start = f"{head(event)} {label} | "
            sys.stdout.write(start)
            self.margin = " " * (len(start) - 2) + "| "
            self.block, self.first, self.bytes, self.line_open = key, event.seq, 0, True
        for i, line in enumerate(o.text.split("\n")):
            if i > 0:
                sys.stdout.write(("" if self.line_open else self.margin.rstrip()) + "\n")
                self.line_open = False
            if line:
                if not self.line_open:
                    sys.stdout.write(self.margin)
                    self.line_open = True
                sys.stdout.write(line)
        sys.stdout.flush()
        size = len(o.text.encode())
        self.last, self.bytes = event.seq, self.bytes + size
        self.printed[key] = o.offset + size

    def end_block(self) -> None:
        if self.block is None:
            return
        if self.line_open:
            sys.stdout.write("\n")
        path, attempt = self.block
        label = f"[{path}] attempt {attempt}" if path else f"attempt {attempt}"
        print(f"-- {label} streamed {self.bytes} bytes in seq {self.first}-{self.last}", flush=True)
        self.block, self.line_open = None, False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--addr",
        default=os.environ.get("STUBBORN_ADDR") or "127.0.0.1:7300",
        help="Stubborn server (host:port; STUBBORN_ADDR sets the default)",
    )
    parser.add_argument("--target", default="flaky-api", help="delegate to retry")
    args = parser.parse_args()

    with grpc.insecure_channel(args.addr) as channel:
        stub = control_pb2_grpc.ControlServiceStub(channel)
        out = Printer()

        # Start the run and follow it live; hang up once the first attempt has started.
        request = pb.RunRequest(
            task_brief="fetch the quarterly numbers",
            retry=pb.RetrySpec(
                target=args.target,
                attempts=0,  # no automatic retry: every failure asks for a decision
                on_exhausted=pb.ON_EXHAUSTED_ASK,
                base_wait=Duration(nanos=100_000_000),
                max_wait=Duration(seconds=1),
            ),
        )
        stream = stub.Run(request)
        for response in stream:
            out.show(response.event)
            run_id = response.event.run_id
            if response.event.HasField("attempt_started"):
                stream.cancel()
                break
        out.note(f"hung up after seq {out.last_seq}; the run goes on without a watcher")
        time.sleep(0.5)

        # Reattach after the last event seen, and answer each decision.
        out.note(f"reattaching: WatchRun(run_id={run_id}, after_seq={out.last_seq})")
        final = None
        for response in stub.WatchRun(pb.WatchRunRequest(run_id=run_id, after_seq=out.last_seq)):
            event = response.event
            out.show(event)
            if event.HasField("decision_requested"):
                decided = stub.DecideRun(pb.DecideRunRequest(run_id=run_id, decision=pb.DECISION_RETRY))
                out.note(f"DecideRun(RETRY): run is {name(pb.RunStatus, decided.state.status, 'RUN_STATUS_')}")
            elif event.HasField("run_finished"):
                final = event.run_finished.state
        out.end_block()

    if final is None:
        sys.exit("the stream ended without run_finished")
    status = name(pb.RunStatus, final.status, "RUN_STATUS_")
    print(f"final status: {status} after {final.attempts} attempts, winner {final.winner}, result {final.result.text!r}")
    return 0 if final.status == pb.RUN_STATUS_SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())
