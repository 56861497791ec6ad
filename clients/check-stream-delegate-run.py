"""check-stream-delegate-run.py [--streamed] BRIEF FILE: checks a `stubborn run
-json` of the retry control, with BRIEF, over the Python streaming example
delegate (clients/python/examples/stream_delegate.py), which breaks off its
first answer after three words with Transient(retry_after=0.2) and answers
every later call in full, a word at a time, with data at the end.

Checked, from the run's events (protojson lines): seq runs 1, 2, 3, ...;
attempt 1 ended in an UNAVAILABLE error with its message and a retry hint of
0.2s, and was retried; the run ended SUCCEEDED after 2 attempts, its result
the whole answer (the generator's pieces joined) with the data the generator
returned. So a generator handler of the kit answers Stubborn, whichever
method Stubborn calls.

When the run has attempt_output events (Stubborn called ExecuteStream), also:
each attempt's pieces follow each other with no gap (offset) and are not
provisional (the run has no failure criteria); attempt 1 streamed the three
words it sent before it failed, and its attempt_finished says
output_discarded with their bytes; attempt 2 streamed the whole answer, and
its attempt_finished accepts it (output_discarded false, output_bytes its
length). With --streamed, a run without attempt_output events fails: use it
once the Stubborn server streams (ExecuteStream, the registry's stream: auto).
Prints one line per event, then a summary.
"""

import json
import re
import sys

UNAVAILABLE = 14
HINT = "0.200s"
MESSAGE = "upstream connection reset mid-answer"


def snake(value):
    """value with its keys in the .proto's snake_case: `stubborn run -json`
    prints protojson's JSON names (runId, attemptFinished)."""
    if isinstance(value, dict):
        return {re.sub(r"(?<!^)([A-Z])", r"_\1", k).lower(): snake(v) for k, v in value.items()}
    if isinstance(value, list):
        return [snake(v) for v in value]
    return value


def main(argv) -> int:
    streamed_required = "--streamed" in argv
    brief, path = [a for a in argv if a != "--streamed"]
    answer = f"Here is what I found for {brief}: all three figures are up."
    words = answer.split(" ")
    partial = " ".join(words[:3])

    events = [snake(json.loads(line)) for line in open(path) if line.strip()]
    kinds = [next(k for k in e if k not in ("run_id", "seq", "time", "path", "status")) for e in events]
    for e, kind in zip(events, kinds):
        print(f"  {e['seq']:>3} {kind} {json.dumps(e[kind], sort_keys=True, ensure_ascii=False)[:160]}")
    problems = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            problems.append(what)

    def only(kind, pred=lambda v: True):
        found = [e[kind] for e, k in zip(events, kinds) if k == kind and pred(e[kind])]
        check(len(found) == 1, f"{len(found)} {kind} events where 1 was expected")
        return found[0] if found else {}

    def finished(n):
        return only("attempt_finished", lambda v: v["attempt"]["number"] == n)

    check([int(e["seq"]) for e in events] == list(range(1, len(events) + 1)), "seq is not 1, 2, 3, …")
    first = finished(1)
    err = first.get("attempt", {}).get("error", {})
    check(first.get("attempt", {}).get("outcome") == "ATTEMPT_OUTCOME_ERROR", "attempt 1 did not fail")
    check(err.get("code") == UNAVAILABLE, f"attempt 1 code {err.get('code')}, want 14 (UNAVAILABLE)")
    check(err.get("message") == MESSAGE, f"attempt 1 message {err.get('message')!r}, want {MESSAGE!r}")
    check(err.get("retry_hint") == HINT, f"attempt 1 retry_hint {err.get('retry_hint')}, want {HINT}")
    check(only("failure_analyzed").get("will_retry") is True, "attempt 1's failure was not retried")
    second = finished(2)
    state = only("run_finished").get("state", {})
    check(state.get("status") == "RUN_STATUS_SUCCEEDED", f"run ended {state.get('status')}")
    check(state.get("attempts") == 2, f"run took {state.get('attempts')} attempts, want 2")
    result = state.get("result", {})
    check(result.get("text") == answer, f"result {result.get('text')!r}, want {answer!r}")
    check(result.get("data") == {"words": len(words), "attempt": 2}, f"result data {result.get('data')}")

    # What each attempt streamed, if anything.
    outputs, pieces = {}, {}
    for e, kind in zip(events, kinds):
        if kind != "attempt_output":
            continue
        o = e[kind]
        n, text, offset = o.get("attempt"), o.get("text", ""), int(o.get("offset", "0"))
        so_far = outputs.setdefault(n, "")
        check(offset == len(so_far.encode()), f"seq {e['seq']}: attempt {n} offset {offset} after {len(so_far.encode())} bytes")
        check(not o.get("provisional"), f"seq {e['seq']}: provisional, in a run without failure criteria")
        outputs[n] = so_far + text
        pieces[n] = pieces.get(n, 0) + 1
    if outputs:
        check(set(outputs) == {1, 2}, f"attempts {sorted(outputs)} streamed, want 1 and 2")
        check(outputs.get(1) == partial, f"attempt 1 streamed {outputs.get(1)!r}, want {partial!r}")
        check(first.get("output_discarded") is True, "attempt 1 streamed and failed, but its output is not discarded")
        check(int(first.get("output_bytes", "0")) == len(partial.encode()), f"attempt 1 output_bytes {first.get('output_bytes')}")
        check(outputs.get(2) == answer, f"attempt 2 streamed {outputs.get(2)!r}, want the answer")
        check(not second.get("output_discarded"), "attempt 2 succeeded, but its output is discarded")
        check(int(second.get("output_bytes", "0")) == len(answer.encode()), f"attempt 2 output_bytes {second.get('output_bytes')}")
    elif streamed_required:
        problems.append("no attempt_output events: Stubborn did not stream the delegate's output")

    if problems:
        for p in problems:
            print(f"{path}: {p}", file=sys.stderr)
        return 1
    how = (
        f"streamed: attempt 1 {outputs[1]!r} in {pieces[1]} attempt_output events, discarded; "
        f"attempt 2 in {pieces[2]}"
        if outputs
        else "not streamed (Stubborn called Execute: the pieces joined)"
    )
    print(f"{path}: attempt 1 UNAVAILABLE {MESSAGE!r}, hint {HINT}; SUCCEEDED after 2 attempts {answer!r}; {how}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
