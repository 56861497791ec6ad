#!/usr/bin/env bash
# Runs the clients as their users would, from their packages, against live
# Stubborn servers, and checks what they printed. Needs what
# clients/install-deps.sh installs.
#
# Python: clients/python is pip-installed into a venv over Debian's
# python3-grpcio, python3-protobuf and python3-setuptools (no index, no build
# isolation: PyPI is not needed), and everything Python below runs from that
# venv with -P, so `stubborn` comes from the installed package, never from
# the source tree:
#   1. the package's metadata and files, and the delegate kit's unittests;
#   2. the client example (check-example-output.sh checks its output);
#   3. the delegate example as a delegate of `stubborn serve`, under a
#      `stubborn run` of the retry control (check-delegate-run.py: the 429
#      and its retry hint crossed to Stubborn, which waited the hint and
#      retried to SUCCEEDED), then stopped with SIGTERM (exit 0);
#   4. the streaming delegate example (a generator) the same way
#      (check-stream-delegate-run.py: its failure mid-answer retried, the
#      answer its pieces joined; and, when Stubborn streamed it, each
#      attempt's output in order, the failed one's discarded).
# TypeScript:
#   5. the client example, with tsx from the source;
#   6. the npm package: `npm pack`, installed into a scratch project that
#      type-checks and runs a run (typescript/test-package.sh).
# Ruby and C++, generated from proto/ here (not committed; their build
# output is git-ignored and rebuilt only when proto/ or the example changes):
#   7. the Ruby client example (clients/ruby, `make` then ruby), its address
#      from STUBBORN_ADDR;
#   8. the C++ client example (clients/cpp, `make` builds build/example).
# Every client example's output is checked by check-example-output.sh.
# Each gets its own fresh `stubborn serve` (and `stubborn delegates`:
# flaky-api counts its calls per process) on free loopback ports; everything
# started here is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

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
passed=0

# wait_for SECONDS COMMAND...: runs COMMAND every 0.1s until it succeeds.
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { echo "timed out waiting for: $*" >&2; return 1; }
    sleep 0.1
  done
}

# serve NAME CONFIG: `stubborn serve` with CONFIG, on a port the kernel
# picks and a data directory of its own; sets addr.
serve() {
  local name=$1 config=$2
  "$stubborn" serve -config "$config" -listen 127.0.0.1:0 -data-dir "$work/$name.data" -log-format json \
    >"$work/$name.serve.log" 2>&1 &
  pids+=($!)
  wait_for 20 grep -q '"stubborn serving"' "$work/$name.serve.log"
  addr=$(sed -n 's/.*"stubborn serving".*"addr":"\([^"]*\)".*/\1/p' "$work/$name.serve.log" | head -1)
  wait_for 20 "$stubborn" list -addr "$addr"
}

# start_server NAME: fresh demo delegates and a server in front of them;
# sets addr.
start_server() {
  local name=$1
  # `stubborn delegates` prints a config for `stubborn serve` naming its ports.
  "$stubborn" delegates -listen 127.0.0.1:0 >"$work/$name.yaml" 2>"$work/$name.delegates.log" &
  pids+=($!)
  wait_for 20 grep -q 'name: unreachable' "$work/$name.yaml"
  serve "$name" "$work/$name.yaml"
  echo "== $name: stubborn serve on $addr, demo delegates from $work/$name.yaml"
}

stop_server() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
}

# run_example [-env] NAME COMMAND...: runs the client example against a
# fresh server, shows its output as it comes, and checks it. The example is
# given the server's address with --addr, or with -env in STUBBORN_ADDR.
run_example() {
  local from_env=0
  [[ $1 == -env ]] && { from_env=1; shift; }
  local name=$1; shift
  start_server "$name"
  local start=$SECONDS status=0
  if ((from_env)); then
    STUBBORN_ADDR=$addr timeout 60 "$@" | tee "$work/$name.out" || status=$?
  else
    timeout 60 "$@" --addr "$addr" | tee "$work/$name.out" || status=$?
  fi
  stop_server
  if ((status != 0)); then
    echo "FAIL: $name example exited $status" >&2
    sed 's/^/  serve: /' "$work/$name.serve.log" >&2
    return 1
  fi
  bash clients/check-example-output.sh "$work/$name.out"
  echo "== $name example passed in $((SECONDS - start))s"
  passed=$((passed + 1))
}

# 1. The Python package. A copy of clients/python is built, without what a
# build in place leaves (build/, *.egg-info): setuptools' build/lib could
# slip files deleted since into the wheel.
echo "== python package: pip install into a venv over Debian's grpcio and protobuf"
export PYTHONDONTWRITEBYTECODE=1
mkdir "$work/python-src"
tar -C clients/python --exclude=./build --exclude=./dist --exclude='./*.egg-info' --exclude=__pycache__ -cf - . |
  tar -C "$work/python-src" -xf -
/usr/bin/python3 -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check --no-index --no-build-isolation "$work/python-src"
rm -rf "$work/python-src"
py=("$work/venv/bin/python" -P)
cmp -s clients/python/LICENSE LICENSE || { echo "FAIL: clients/python/LICENSE differs from LICENSE" >&2; exit 1; }
/usr/bin/python3 - <<'EOF'
import sys
for name in ("delegate.py", "stream_delegate.py"):
    example = open(f"clients/python/examples/{name}").read()
    if "```python\n" + example + "```\n" not in open("clients/python/README.md").read():
        sys.exit(f"FAIL: clients/python/README.md does not show clients/python/examples/{name} verbatim")
EOF
(cd "$work" && "${py[@]}" - <<'EOF'
import importlib.metadata as md
import sys

import stubborn
import stubborn.delegate

assert stubborn.__file__.startswith(sys.prefix + "/"), f"stubborn imported from {stubborn.__file__}, not the venv {sys.prefix}"
meta = md.metadata("stubborn-client")
assert meta["Version"] == stubborn.__version__, (meta["Version"], stubborn.__version__)
assert meta["License"] == "Apache-2.0", meta["License"]
files = {str(f) for f in md.files("stubborn-client")}
want = {
    "stubborn/__init__.py", "stubborn/delegate.py",
    "stubborn/v1/control_pb2.py", "stubborn/v1/control_pb2.pyi", "stubborn/v1/control_pb2_grpc.py",
    "stubborn/v1/delegate_pb2.py", "stubborn/v1/delegate_pb2.pyi", "stubborn/v1/delegate_pb2_grpc.py",
    "stubborn/_vendor/google/rpc/status_pb2.py", "stubborn/_vendor/google/rpc/error_details_pb2.py",
    "stubborn/_vendor/grpc/health/v1/health_pb2.py",
}
missing = want - files
assert not missing, f"not installed: {sorted(missing)}"
assert any(f.endswith(".dist-info/LICENSE") for f in files), "no LICENSE in the dist-info"
print(f"stubborn-client {meta['Version']} ({meta['License']}) installed in {sys.prefix}: {len(files)} files; "
      f"google.rpc from {stubborn.delegate.status_pb2.__name__.rsplit('.', 1)[0]}")
EOF
)
echo "== python delegate kit: unittest, from the venv"
(cd "$work" && "${py[@]}" -m unittest discover -s "$repo/clients/python/tests" -v)
passed=$((passed + 1))

# 2. The Python client example.
run_example python "${py[@]}" clients/python/example.py

# 3. The Python delegate example, live: a retry run over it.
delegate_example() {
  local name=python-delegate start=$SECONDS
  "${py[@]}" clients/python/examples/delegate.py 127.0.0.1:0 2>"$work/$name.log" &
  local delegate=$!
  pids+=("$delegate")
  wait_for 20 grep -q 'serving on' "$work/$name.log"
  local target
  target=$(sed -n 's/.*serving on \(127\.0\.0\.1:[0-9]*\).*/\1/p' "$work/$name.log" | head -1)
  cat >"$work/$name.yaml" <<EOF
delegates:
  - {name: py, target: "$target", idempotent: true, timeout: 10s}
EOF
  serve "$name" "$work/$name.yaml"
  echo "== $name: clients/python/examples/delegate.py on $target, stubborn serve on $addr"
  # base_wait 20s: without the hint, the wait would be drawn from [0, 20s].
  local status=0
  timeout 60 "$stubborn" run -addr "$addr" -json -control retry -target py -brief "fetch the quarterly numbers" \
    -attempts 3 -base-wait 20s -max-wait 30s -on-exhausted fail >"$work/$name.out" || status=$?
  kill -TERM "$delegate"
  local stopped=0
  wait "$delegate" || stopped=$?
  stop_server
  sed 's/^/  delegate: /' "$work/$name.log"
  if ((status != 0)); then
    echo "FAIL: stubborn run exited $status" >&2
    sed 's/^/  run: /' "$work/$name.out" >&2
    sed 's/^/  serve: /' "$work/$name.serve.log" >&2
    return 1
  fi
  /usr/bin/python3 clients/check-delegate-run.py "$work/$name.out"
  if ((stopped != 0)) || ! grep -q 'SIGTERM: health NOT_SERVING' "$work/$name.log" || ! grep -q 'stopped$' "$work/$name.log"; then
    echo "FAIL: the delegate did not stop gracefully on SIGTERM (exit $stopped)" >&2
    return 1
  fi
  echo "== $name example passed in $((SECONDS - start))s"
  passed=$((passed + 1))
}
delegate_example

# 4. The Python streaming delegate example, live: a retry run over it. With
# the registry's default stream: auto, Stubborn calls ExecuteStream; a
# Stubborn that does not stream would call Execute, which the kit answers
# with the pieces joined; --streamed requires the stream (attempt_output
# events, the first attempt's output discarded).
stream_delegate_example() {
  local name=python-stream-delegate start=$SECONDS brief="fetch the quarterly numbers"
  "${py[@]}" clients/python/examples/stream_delegate.py 127.0.0.1:0 2>"$work/$name.log" &
  pids+=($!)
  wait_for 20 grep -q 'serving on' "$work/$name.log"
  local target
  target=$(sed -n 's/.*serving on \(127\.0\.0\.1:[0-9]*\).*/\1/p' "$work/$name.log" | head -1)
  cat >"$work/$name.yaml" <<EOF
delegates:
  - {name: model, target: "$target", idempotent: true, timeout: 10s}
EOF
  serve "$name" "$work/$name.yaml"
  echo "== $name: clients/python/examples/stream_delegate.py on $target, stubborn serve on $addr"
  local status=0
  timeout 60 "$stubborn" run -addr "$addr" -json -control retry -target model -brief "$brief" \
    -attempts 3 -base-wait 20s -max-wait 30s -on-exhausted fail >"$work/$name.out" || status=$?
  stop_server
  sed 's/^/  delegate: /' "$work/$name.log"
  if ((status != 0)); then
    echo "FAIL: stubborn run exited $status" >&2
    sed 's/^/  run: /' "$work/$name.out" >&2
    sed 's/^/  serve: /' "$work/$name.serve.log" >&2
    return 1
  fi
  /usr/bin/python3 clients/check-stream-delegate-run.py --streamed "$brief" "$work/$name.out"
  echo "== $name example passed in $((SECONDS - start))s"
  passed=$((passed + 1))
}
stream_delegate_example

# 5. The TypeScript client example.
run_example typescript clients/typescript/node_modules/.bin/tsx clients/typescript/src/example.ts

# 6. The npm package, in a scratch project.
start_server typescript-package
start=$SECONDS
bash clients/typescript/test-package.sh "$addr"
stop_server
echo "== typescript package passed in $((SECONDS - start))s"
passed=$((passed + 1))

# 7. The Ruby client example: the client generated from proto/ into
# clients/ruby/lib (make -C clients/ruby: protoc and grpc_ruby_plugin), run
# by Debian's ruby over ruby-grpc, the address in STUBBORN_ADDR.
echo "== ruby client: generated into clients/ruby/lib"
make -s -C clients/ruby
run_example -env ruby ruby clients/ruby/example.rb

# 8. The C++ client example: the client generated from proto/ into
# clients/cpp/build/gen and compiled with the example against Debian's
# libgrpc++ (make -C clients/cpp, pkg-config), before its server starts.
start=$SECONDS
make -s -C clients/cpp -j2
echo "== cpp client: generated and built into clients/cpp/build in $((SECONDS - start))s"
run_example cpp clients/cpp/build/example

echo "$passed passed, 0 failed"
