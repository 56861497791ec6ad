"""check-delegate-run.py FILE: checks a `stubborn run -json` of the retry
control over the Python example delegate (clients/python/examples/delegate.py),
which fails its first call with Upstream(429, retry_after=0.3).

Checked, from the run's events (protojson lines): attempt 1 ended in an error
Stubborn classified as RESOURCE_EXHAUSTED with HTTP 429 and a retry hint of
0.3s (so the code, the UpstreamStatus and the RetryInfo all crossed from
Python to grpc-go); the failure was transient and retried; the backoff was the
delegate's hint (from_hint, wait 0.3s, where the run's base_wait would have
drawn from up to 20s); attempt 2 started at least 0.3s after attempt 1 ended
and says it waited 0.3s; the run ended SUCCEEDED after 2 attempts with the
delegate's answer. Prints one line per event, then a summary.
"""

import datetime
import json
import re
import sys

RESOURCE_EXHAUSTED = 8
HINT = "0.300s"


def seconds(duration: str) -> float:
    """A protojson Duration ("0.300s") in seconds."""
    if not re.fullmatch(r"-?\d+(\.\d+)?s", duration):
        raise ValueError(f"not a duration: {duration!r}")
    return float(duration[:-1])


def instant(timestamp: str) -> float:
    """A protojson Timestamp ("2026-01-02T03:04:05.123456789Z") in seconds
    since the epoch (a float: to about a microsecond)."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z", timestamp)
    if not m:
        raise ValueError(f"not a timestamp: {timestamp!r}")
    whole = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    return whole.timestamp() + float(m.group(2) or 0)


def snake(value):
    """value with its keys in the .proto's snake_case: `stubborn run -json`
    prints protojson's JSON names (runId, attemptFinished)."""
    if isinstance(value, dict):
        return {re.sub(r"(?<!^)([A-Z])", r"_\1", k).lower(): snake(v) for k, v in value.items()}
    if isinstance(value, list):
        return [snake(v) for v in value]
    return value


def main(path: str) -> int:
    events = [snake(json.loads(line)) for line in open(path) if line.strip()]
    kinds = [next(k for k in e if k not in ("run_id", "seq", "time", "path", "status")) for e in events]
    for e, kind in zip(events, kinds):
        print(f"  {e['seq']:>3} {kind} {json.dumps(e[kind], sort_keys=True)[:160]}")
    problems = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            problems.append(what)

    def only(kind, pred=lambda v: True):
        found = [e[kind] for e, k in zip(events, kinds) if k == kind and pred(e[kind])]
        check(len(found) == 1, f"{len(found)} {kind} events where 1 was expected")
        return found[0] if found else {}

    check([int(e["seq"]) for e in events] == list(range(1, len(events) + 1)), "seq is not 1, 2, 3, …")
    first = only("attempt_finished", lambda v: v["attempt"]["number"] == 1)["attempt"] if events else {}
    err = first.get("error", {})
    check(first.get("outcome") == "ATTEMPT_OUTCOME_ERROR", f"attempt 1 outcome {first.get('outcome')}")
    check(err.get("code") == RESOURCE_EXHAUSTED, f"attempt 1 code {err.get('code')}, want 8 (RESOURCE_EXHAUSTED)")
    check(err.get("http_status") == 429, f"attempt 1 http_status {err.get('http_status')}, want 429")
    check(err.get("retry_hint") == HINT, f"attempt 1 retry_hint {err.get('retry_hint')}, want {HINT}")
    failure = only("failure_analyzed")
    check(failure.get("will_retry") is True, "attempt 1's failure was not retried")
    check(failure.get("failure", {}).get("transient") is True, "attempt 1's failure was not transient")
    backoff = only("backoff_scheduled")
    check(backoff.get("from_hint") is True, "the backoff did not come from the delegate's hint")
    check(backoff.get("wait") == HINT, f"backoff wait {backoff.get('wait')}, want {HINT}")
    second = only("attempt_started", lambda v: v["attempt"]["number"] == 2).get("attempt", {})
    check(second.get("wait_before") == HINT, f"attempt 2 wait_before {second.get('wait_before')}, want {HINT}")
    waited = None
    if first.get("end_time") and second.get("start_time"):
        waited = instant(second["start_time"]) - instant(first["end_time"])
        check(waited >= seconds(HINT), f"attempt 2 started {waited:.3f}s after attempt 1 ended, before the hint's {HINT}")
    state = only("run_finished").get("state", {})
    check(state.get("status") == "RUN_STATUS_SUCCEEDED", f"run ended {state.get('status')}")
    check(state.get("attempts") == 2, f"run took {state.get('attempts')} attempts, want 2")
    text = state.get("result", {}).get("text", "")
    check(text.startswith("done: ") and "(attempt 2)" in text, f"result {text!r}")

    if problems:
        for p in problems:
            print(f"{path}: {p}", file=sys.stderr)
        return 1
    print(
        f"{path}: attempt 1 RESOURCE_EXHAUSTED, HTTP 429, hint {HINT}; backoff {backoff['wait']} from the hint; "
        f"attempt 2 {waited:.3f}s later; SUCCEEDED {text!r}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
