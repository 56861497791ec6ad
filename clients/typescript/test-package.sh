#!/usr/bin/env bash
# test-package.sh ADDR: the npm package as a user gets it. Packs
# clients/typescript (`npm pack`, whose prepack builds dist/ with tsc), checks
# what the tarball holds, installs it into a scratch project in a temp
# directory (from the npm registry: the tarball's dependencies, and the
# TypeScript and @types/node versions this package pins), type-checks a
# script that imports it (strict, NodeNext), compiles it and runs it with
# node against the Stubborn server at ADDR: a retry run of the demo delegate
# echo must end SUCCEEDED with echo's answer.
set -euo pipefail
cd "$(dirname "$0")"
here=$PWD
addr=$1

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

tarball=$tmp/$(npm pack --silent --pack-destination "$tmp" | tail -n1)
tar -tzf "$tarball" | sort >"$tmp/files"
for f in package.json LICENSE README.md dist/index.js dist/index.d.ts \
  dist/gen/stubborn/v1/control_pb.js dist/gen/stubborn/v1/control_pb.d.ts \
  dist/gen/stubborn/v1/delegate_pb.js dist/gen/stubborn/v1/delegate_pb.d.ts; do
  grep -qx "package/$f" "$tmp/files" || { echo "FAIL: $(basename "$tarball") has no $f" >&2; exit 1; }
done
if grep -v -e '^package/dist/' -e '^package/package.json$' -e '^package/LICENSE$' -e '^package/README.md$' "$tmp/files"; then
  echo "FAIL: $(basename "$tarball") holds more than dist/, package.json, LICENSE and README.md (above)" >&2
  exit 1
fi
cmp -s "$here/LICENSE" ../../LICENSE || { echo "FAIL: clients/typescript/LICENSE differs from LICENSE" >&2; exit 1; }
echo "$(basename "$tarball"): $(wc -l <"$tmp/files") files, dist/ with .js and .d.ts"

mkdir "$tmp/scratch"
cd "$tmp/scratch"
pinned() { node -p "require('$here/package.json').devDependencies['$1']"; }
cat >package.json <<'JSON'
{ "name": "scratch", "version": "0.0.0", "private": true, "type": "module" }
JSON
npm install --no-audit --no-fund --prefer-offline --loglevel=error \
  "$tarball" "typescript@$(pinned typescript)" "@types/node@$(pinned @types/node)"
cat >tsconfig.json <<'JSON'
{
  "compilerOptions": {
    "target": "ES2022",
    "module": "NodeNext",
    "moduleResolution": "NodeNext",
    "strict": true,
    "outDir": "out",
    "types": ["node"]
  },
  "files": ["main.ts"]
}
JSON
cat >main.ts <<'TS'
import {
  createControlClient,
  OnExhausted,
  RunStatus,
  type ControlClient,
  type ControlState,
} from "@stubbornhq/stubborn-client";

const client: ControlClient = createControlClient(process.argv[2]);
const brief = "a run from the npm package";
let final: ControlState | undefined;
for await (const { event } of client.run({
  taskBrief: brief,
  retry: { target: "echo", attempts: 0, onExhausted: OnExhausted.FAIL },
})) {
  console.log(`  ${event?.seq} ${event?.kind.case}`);
  if (event?.kind.case === "runFinished") final = event.kind.value.state;
}
if (final?.status !== RunStatus.SUCCEEDED || !final.result?.text.includes(brief)) {
  console.error("FAIL: the run did not succeed with echo's answer:", final);
  process.exit(1);
}
console.log(`package ok: run ${final.runId} ${RunStatus[final.status]}, result ${JSON.stringify(final.result.text)}`);
TS
node_modules/.bin/tsc -p .
node out/main.js "$addr"
