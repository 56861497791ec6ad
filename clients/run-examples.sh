#!/usr/bin/env bash
# Runs the Python and the TypeScript example against a live Stubborn server and
# checks what each printed (check-example-output.sh). Each example gets its own
# fresh `stubborn delegates` (flaky-api counts its calls per process) and
# `stubborn serve`, on free loopback ports; everything started here is stopped
# on exit. Needs what clients/install-deps.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

go build -o "$work/stubborn" ./cmd/stubborn
stubborn=$work/stubborn

# wait_for SECONDS COMMAND...: runs COMMAND every 0.1s until it succeeds.
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { echo "timed out waiting for: $*" >&2; return 1; }
    sleep 0.1
  done
}

# start_server NAME: fresh demo delegates and a server in front of them, each
# on ports the kernel picks; sets addr.
start_server() {
  local name=$1
  # `stubborn delegates` prints a config for `stubborn serve` naming its ports.
  "$stubborn" delegates -listen 127.0.0.1:0 >"$work/$name.yaml" 2>"$work/$name.delegates.log" &
  pids+=($!)
  wait_for 20 grep -q 'name: unreachable' "$work/$name.yaml"
  "$stubborn" serve -config "$work/$name.yaml" -listen 127.0.0.1:0 -log-format json >"$work/$name.serve.log" 2>&1 &
  pids+=($!)
  wait_for 20 grep -q '"stubborn serving"' "$work/$name.serve.log"
  addr=$(sed -n 's/.*"stubborn serving".*"addr":"\([^"]*\)".*/\1/p' "$work/$name.serve.log" | head -1)
  wait_for 20 "$stubborn" list -addr "$addr"
  echo "== $name: stubborn serve on $addr, demo delegates from $work/$name.yaml"
}

stop_server() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
}

# run_example NAME COMMAND...: runs the example against a fresh server,
# shows its output as it comes, and checks it.
run_example() {
  local name=$1; shift
  start_server "$name"
  local start=$SECONDS status=0
  timeout 60 "$@" --addr "$addr" | tee "$work/$name.out" || status=$?
  stop_server
  if ((status != 0)); then
    echo "FAIL: $name example exited $status" >&2
    sed 's/^/  serve: /' "$work/$name.serve.log" >&2
    return 1
  fi
  bash clients/check-example-output.sh "$work/$name.out"
  echo "== $name example passed in $((SECONDS - start))s"
}

PYTHONDONTWRITEBYTECODE=1 run_example python /usr/bin/python3 clients/python/example.py
run_example typescript clients/typescript/node_modules/.bin/tsx clients/typescript/src/example.ts
echo "2 passed, 0 failed"
