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
"""

import argparse
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
    e = getattr(event, kind)
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
    else:  # run_finished
        text = f"{name(pb.RunStatus, e.state.status, 'RUN_STATUS_')} after {e.state.attempts} attempt(s)"
    clock = event.time.ToDatetime().strftime("%H:%M:%S.%f")[:-3]
    return f"{event.seq:3d} {clock} {kind:<18} {text}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", default="127.0.0.1:7300", help="Stubborn server (host:port)")
    parser.add_argument("--target", default="flaky-api", help="delegate to retry")
    args = parser.parse_args()

    with grpc.insecure_channel(args.addr) as channel:
        stub = control_pb2_grpc.ControlServiceStub(channel)
        last_seq = 0

        def show(event: pb.RunEvent) -> None:
            nonlocal last_seq
            if event.seq != last_seq + 1:
                sys.exit(f"event seq {event.seq} after {last_seq}: a gap or a duplicate")
            last_seq = event.seq
            print(describe(event), flush=True)

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
            show(response.event)
            run_id = response.event.run_id
            if response.event.HasField("attempt_started"):
                stream.cancel()
                break
        print(f"-- hung up after seq {last_seq}; the run goes on without a watcher", flush=True)
        time.sleep(0.5)

        # Reattach after the last event seen, and answer each decision.
        print(f"-- reattaching: WatchRun(run_id={run_id}, after_seq={last_seq})", flush=True)
        final = None
        for response in stub.WatchRun(pb.WatchRunRequest(run_id=run_id, after_seq=last_seq)):
            event = response.event
            show(event)
            if event.HasField("decision_requested"):
                decided = stub.DecideRun(pb.DecideRunRequest(run_id=run_id, decision=pb.DECISION_RETRY))
                print(f"-- DecideRun(RETRY): run is {name(pb.RunStatus, decided.state.status, 'RUN_STATUS_')}", flush=True)
            elif event.HasField("run_finished"):
                final = event.run_finished.state

    if final is None:
        sys.exit("the stream ended without run_finished")
    status = name(pb.RunStatus, final.status, "RUN_STATUS_")
    print(f"final status: {status} after {final.attempts} attempts, winner {final.winner}, result {final.result.text!r}")
    return 0 if final.status == pb.RUN_STATUS_SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())
