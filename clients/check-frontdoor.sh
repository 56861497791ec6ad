#!/usr/bin/env bash
# The front doors (Chat Completions, Responses, Anthropic Messages) driven by clients
# nobody here wrote: the official `openai` and `@anthropic-ai/sdk` npm
# packages (clients/frontdoor-node, pinned in its package-lock.json,
# installed with npm ci) and the official OpenAI Go SDK (clients/frontdoor-go,
# a Go module of its own, so openai-go and the cloud SDKs it requires stay
# out of the main go.mod; its dependencies come through the Go proxy). Each
# is changed in nothing but its base URL and API key.
#
# Every server is a process of its own on loopback ports the kernel picks:
# fake models (clients/frontdoor-go/fakemodel), each speaking both Chat
# Completions and Anthropic Messages: busy answers 503, failing 500, good
# "The answer is 42." as JSON or streamed (n choices in Chat Completions),
# breaks drops the connection after "The answer ", throttle answers 429
# with Retry-After: 1, stall never answers, tools calls get_weather and
# answers its result with "It is sunny in Paris." (recording the result's
# id at /last), rejects answers 400 about temperature. First the fake
# itself goes under openai-go (go test ./fakemodel) and the Node SDKs
# (clients/frontdoor-node/fake.mjs), without Stubborn. Then `stubborn serve
# -memory -http-listen` with `openai` delegates over them (busy, good,
# breaks, throttle, stall, failing, tools, rejects) and `anthropic` ones
# (failing-anthropic, tools-anthropic, rejects-anthropic), the presets
#   smart              = fallback_chain [busy, good]
#   patient            = fallback_chain [stall, good]  (stall's first output is due in 500ms)
#   brittle            = fallback_chain [breaks, good]
#   throttled          = retry of throttle, 1 retry, then fail
#   tools-to-anthropic = fallback_chain [failing, tools-anthropic]
#   tools-to-openai    = fallback_chain [failing-anthropic, tools]
#   choices            = fallback_chain [failing, good]
# and two tenants: app (no limits) and a tenant per SDK with one run start
# (run_starts_per_second 0.001: its burst is 1, the next start is 429).
#
# Each SDK program asserts (and exits non-zero on the first failure): models
# listed; a completion from smart with good's text and the run id as its id
# and Stubborn-Run-Id; the same streamed in chunks (and, in Node, through the
# SDK's stream helper over patient; in Go, through its accumulator); brittle
# answers good's text when not streamed and, streamed, "The answer " then an
# error event naming the run that the SDK raises as its own error; a wrong
# key is the SDK's 401 error, an unknown model its 404; throttled is a 503
# with x-should-retry: false that the SDK does not retry; the limited tenant's
# second run is the SDK's 429 error with Retry-After. Then the model's whole
# answer: the OpenAI SDKs' get_weather tool over tools-to-anthropic is
# tool_calls with JSON arguments, plain and streamed, and the second turn's
# role "tool" result reaches the anthropic model as a tool_result with the
# same id; the Anthropic SDK's over tools-to-openai is a tool_use block, plain
# and streamed, and its tool_result reaches the openai model with the same
# id; n: 2 over choices is two choices with their own texts; a model's 400
# (rejects, rejects-anthropic) is the SDK's BadRequestError with the model's
# message. The Responses API (clients/frontdoor-node/responses.mjs, the
# Go program's responses.go): responses.create and responses.stream(...)
# .finalResponse() (Go: Responses.New and NewStreaming, its events
# accumulated) over smart are good's text with the run id as the response's
# id; a get_weather function tool over tools-to-anthropic comes back as a
# function_call item, plain and streamed, and the second turn's
# function_call_output reaches the anthropic model as a tool_result with the
# same call id; brittle streamed is "The answer " then the SDK's own error
# naming the run; previous_response_id, store: true and background are the
# SDK's BadRequestError naming the field. Then this script reads the runs
# back with `stubborn get`: the 503, then good's answer.
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
# The SDKs read these whatever they are told; nothing here may come from the
# caller's environment.
unset OPENAI_API_KEY OPENAI_BASE_URL OPENAI_ORG_ID OPENAI_PROJECT_ID OPENAI_CUSTOM_HEADERS \
  OPENAI_ADMIN_KEY OPENAI_WEBHOOK_SECRET OPENAI_LOG STUBBORN_ADDR STUBBORN_TOKEN \
  ANTHROPIC_API_KEY ANTHROPIC_AUTH_TOKEN ANTHROPIC_BASE_URL ANTHROPIC_CUSTOM_HEADERS ANTHROPIC_LOG ANTHROPIC_WEBHOOK_SIGNING_KEY

# wait_for SECONDS COMMAND...: runs COMMAND every 0.1s until it succeeds.
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { echo "timed out waiting for: $*" >&2; return 1; }
    sleep 0.1
  done
}

start=$SECONDS
echo "== front door: building stubborn, the fake models and the Go SDK program; npm ci for the Node one"
go build -o "$work/stubborn" ./cmd/stubborn
stubborn=$work/stubborn
(
  cd clients/frontdoor-go
  go vet ./...
  go test -count=1 ./fakemodel # the fake under openai-go, without Stubborn
  out=$(gofmt -l .)
  [[ -z $out ]] || { printf 'gofmt needed in clients/frontdoor-go:\n%s\n' "$out" >&2; exit 1; }
  go build -o "$work/fakemodel" ./fakemodel
  go build -o "$work/frontdoor-go" .
)
(cd clients/frontdoor-node && npm ci --no-audit --no-fund --loglevel=error)
node -e 'const v = (p) => require("./clients/frontdoor-node/node_modules/" + p + "/package.json").version; console.log("openai (npm)", v("openai"), "and @anthropic-ai/sdk", v("@anthropic-ai/sdk"), "on node", process.version)'
(cd clients/frontdoor-go && go list -m -f 'openai-go {{.Version}}' github.com/openai/openai-go/v3)

# The fake models, each serving both APIs; sets url_NAME.
fakes=(busy good breaks throttle stall tools failing rejects)
fake_args() {
  case $1 in
    failing) echo -mode busy -status 500 ;;
    rejects) echo -mode bad-request ;;
    *) echo -mode "$1" ;;
  esac
}
for name in "${fakes[@]}"; do
  # shellcheck disable=SC2046 # the flags are words
  "$work/fakemodel" $(fake_args "$name") >"$work/$name.out" 2>"$work/$name.log" &
  pids+=($!)
done
for name in "${fakes[@]}"; do
  wait_for 20 grep -q 'serving on' "$work/$name.out" || { sed "s/^/  $name: /" "$work/$name.log" >&2; exit 1; }
  declare "url_$name=$(sed -n 's/.*serving on \(http:[^ ]*\).*/\1/p' "$work/$name.out" | head -1)"
done

# The fake itself under the SDKs, without Stubborn: what the scenarios
# expect through the door is what the SDKs parse from the fake.
echo "== front door: the fake models under the openai npm package and @anthropic-ai/sdk"
FAKE_TOOLS_URL=$url_tools FAKE_GOOD_URL=$url_good FAKE_BAD_REQUEST_URL=$url_rejects timeout 60 node clients/frontdoor-node/fake.mjs ||
  { for f in tools good rejects; do sed "s/^/  $f: /" "$work/$f.log" >&2; done; exit 1; }

app_token=$("$stubborn" token | tee "$work/app.token" | sed -n 's/^token: *//p')
app_hash=$(sed -n 's/^token_sha256: *//p' "$work/app.token")
node_token=$("$stubborn" token | tee "$work/node.token" | sed -n 's/^token: *//p')
go_token=$("$stubborn" token | tee "$work/go.token" | sed -n 's/^token: *//p')
anthropic_token=$("$stubborn" token | tee "$work/anthropic.token" | sed -n 's/^token: *//p')
broke_token=$("$stubborn" token | tee "$work/broke.token" | sed -n 's/^token: *//p')
hash() { printf '%s\n' "$1" | "$stubborn" token -hash; }
[[ $(hash "$app_token") == "$app_hash" ]] || { echo "FAIL: stubborn token -hash disagrees with stubborn token" >&2; exit 1; }

cat >"$work/stubborn.yaml" <<EOF
delegates:
  - {name: busy, openai: {base_url: "$url_busy/v1", model: busy-model}, read_only: true, timeout: 10s}
  - {name: good, openai: {base_url: "$url_good/v1", model: good-model}, read_only: true, timeout: 10s}
  - {name: priced-good, openai: {base_url: "$url_good/v1", model: good-model}, read_only: true, timeout: 10s, price: {per_call: 1}}
  - {name: breaks, openai: {base_url: "$url_breaks/v1", model: breaks-model}, read_only: true, timeout: 10s}
  - {name: throttle, openai: {base_url: "$url_throttle/v1", model: throttle-model}, read_only: true, timeout: 10s}
  - {name: stall, openai: {base_url: "$url_stall/v1", model: stall-model}, read_only: true, timeout: 10s, first_output_timeout: 500ms}
  - {name: failing, openai: {base_url: "$url_failing/v1", model: failing-model}, read_only: true, timeout: 10s}
  - {name: failing-anthropic, anthropic: {base_url: "$url_failing", model: failing-claude}, read_only: true, timeout: 10s}
  - {name: tools, openai: {base_url: "$url_tools/v1", model: tools-model}, read_only: true, timeout: 10s}
  - {name: tools-anthropic, anthropic: {base_url: "$url_tools", model: tools-claude}, read_only: true, timeout: 10s}
  - {name: rejects, openai: {base_url: "$url_rejects/v1", model: rejects-model}, read_only: true, timeout: 10s}
  - {name: rejects-anthropic, anthropic: {base_url: "$url_rejects", model: rejects-claude}, read_only: true, timeout: 10s}
presets:
  - name: smart
    fallback_chain: {chain: [busy, good]}
  - name: patient
    fallback_chain: {chain: [stall, good]}
  - name: brittle
    fallback_chain: {chain: [breaks, good]}
  - name: throttled
    retry: {target: throttle, attempts: 1, base_wait: 100ms, max_wait: 5s, on_exhausted: fail}
  - name: tools-to-anthropic
    fallback_chain: {chain: [failing, tools-anthropic]}
  - name: tools-to-openai
    fallback_chain: {chain: [failing-anthropic, tools]}
  - name: choices
    fallback_chain: {chain: [failing, good]}
tenants:
  - name: app
    token_sha256: [$app_hash]
  - name: limited-node
    token_sha256: [$(hash "$node_token")]
    limits: {run_starts_per_second: 0.001}
  - name: limited-go
    token_sha256: [$(hash "$go_token")]
    limits: {run_starts_per_second: 0.001}
  - name: limited-anthropic
    token_sha256: [$(hash "$anthropic_token")]
    limits: {run_starts_per_second: 0.001}
  - name: broke
    token_sha256: [$(hash "$broke_token")]
    spend_limit: {max_cost: 0.5, period: day}
EOF

"$stubborn" serve -config "$work/stubborn.yaml" -listen 127.0.0.1:0 -http-listen 127.0.0.1:0 -memory \
  -output-flush-interval 10ms -log-format json >"$work/serve.log" 2>&1 &
pids+=($!)
wait_for 20 grep -q '"http api serving"' "$work/serve.log" || { sed 's/^/  serve: /' "$work/serve.log" >&2; exit 1; }
addr=$(sed -n 's/.*"stubborn serving".*"addr":"\([^"]*\)".*/\1/p' "$work/serve.log" | head -1)
http=$(sed -n 's/.*"http api serving".*"url":"\([^"]*\)".*/\1/p' "$work/serve.log" | head -1)
export STUBBORN_TOKEN=$app_token
wait_for 20 "$stubborn" list -addr "$addr"
echo "== front door: stubborn serve, gRPC $addr, HTTP $http; fake models$(for n in "${fakes[@]}"; do v=url_$n; printf ' %s %s' "$n" "${!v}"; done)"

export FRONTDOOR_BASE_URL=$http/v1 FRONTDOOR_API_KEY=$app_token FRONTDOOR_BROKE_API_KEY=$broke_token FRONTDOOR_THROTTLE_HITS_URL=$url_throttle/hits FRONTDOOR_TOOLS_URL=$url_tools
failed=0
# sdk NAME KEY KINDS COMMAND...: runs COMMAND, then reads back the runs it
# printed as "run KIND ID" for each of KINDS.
sdk() {
  local name=$1 key=$2 kinds=$3; shift 3
  echo "== front door: $name"
  local status=0 t=$SECONDS
  FRONTDOOR_LIMITED_API_KEY=$key timeout 90 "$@" | tee "$work/$name.out" || status=$?
  if ((status != 0)); then
    echo "FAIL: $name exited $status" >&2
    failed=1
  fi
  # The runs it made, read back over gRPC: the 503, then good's answer
  # (also when a later check failed: what passed is said).
  local kind id
  for kind in $kinds; do
    id=$(sed -n "s/^run $kind //p" "$work/$name.out")
    if ! "$stubborn" get -addr "$addr" -json "$id" >"$work/$name.$kind.json" ||
      ! node - "$work/$name.$kind.json" <<'EOF'; then
const st = JSON.parse(require("fs").readFileSync(process.argv[2], "utf8"));
const log = (st.attemptLog ?? []).map((a) => `${a.delegate}:${a.outcome}${a.error?.httpStatus ? ":" + a.error.httpStatus : ""}`);
const want = ["busy:ATTEMPT_OUTCOME_ERROR:503", "good:ATTEMPT_OUTCOME_SUCCEEDED"];
if (st.status !== "RUN_STATUS_SUCCEEDED" || st.winner !== "good" || JSON.stringify(log) !== JSON.stringify(want) ||
    st.result?.text !== "The answer is 42." || st.tenant !== "app") {
  console.error(`FAIL: run ${st.runId}: ${st.status}, winner ${st.winner}, tenant ${st.tenant}, attempts ${JSON.stringify(log)}, text ${JSON.stringify(st.result?.text)}; want SUCCEEDED, good, app, ${JSON.stringify(want)}`);
  process.exit(1);
}
console.log(`ok: stubborn get ${st.runId}: ${st.status}, winner ${st.winner}, attempts ${log.join(", ")}`);
EOF
      echo "FAIL: $name: the $kind run $id is not the chain's 503 then good's answer" >&2
      failed=1
      return
    fi
  done
  ((status != 0)) || echo "== front door: $name passed in $((SECONDS - t))s"
}
sdk openai-node "$node_token" "nonstreamed streamed" node clients/frontdoor-node/check.mjs
sdk openai-node-responses "$app_token" "responses responses-streamed" node clients/frontdoor-node/responses.mjs
sdk openai-go "$go_token" "nonstreamed streamed responses responses-streamed" "$work/frontdoor-go"
sdk anthropic-node "$anthropic_token" "nonstreamed streamed" node clients/frontdoor-node/anthropic.mjs

if ((failed)); then
  for f in serve "${fakes[@]}"; do
    sed "s/^/  $f: /" "$work/$f.log" >&2
  done
  exit 1
fi
echo "== front door: the openai npm package (Chat Completions, Responses), openai-go and @anthropic-ai/sdk passed in $((SECONDS - start))s"
