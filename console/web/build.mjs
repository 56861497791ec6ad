// Builds the console into one directory (default ../dist, or the first
// argument): app.js (src/main.ts and what it imports, the generated API code
// of clients/typescript/src/gen included, bundled and minified by esbuild),
// app.css (minified) and index.html, which names both with their content
// hash (app.js?v=…) so the Go handler can let browsers keep them.
//
// The output depends only on files of the repository (src, this package's
// locked packages, clients/typescript/src/gen and, for what may be left out
// of the bundle, clients/typescript/package.json's "sideEffects"), not on
// the machine or the directory, so `make checkconsole` can rebuild into a
// temporary directory and compare with the committed console/dist.

import { createHash } from "node:crypto";
import { mkdir, readFile, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";

const here = path.dirname(fileURLToPath(import.meta.url));
const out = path.resolve(process.argv[2] ?? path.join(here, "..", "dist"));

const common = {
  absWorkingDir: here,
  bundle: true,
  minify: true,
  write: false,
  charset: "utf8",
  legalComments: "none",
  logLevel: "warning",
  target: ["chrome109", "firefox115", "safari16"],
  // This tsconfig for every file, the generated ones included (esbuild
  // would take clients/typescript's for those).
  tsconfig: "tsconfig.json",
  // The generated code in clients/typescript imports @bufbuild/protobuf:
  // resolved here (from console/web/node_modules, so this package-lock
  // pins it), not from clients/typescript's node_modules, whether that is
  // installed or not.
  alias: {
    "@bufbuild/protobuf": "@bufbuild/protobuf",
    "@connectrpc/connect": "@connectrpc/connect",
    "@connectrpc/connect-web": "@connectrpc/connect-web",
  },
};

const [js, css] = await Promise.all([
  esbuild.build({ ...common, entryPoints: ["src/main.ts"], outfile: "app.js", format: "iife", platform: "browser" }),
  esbuild.build({ ...common, entryPoints: ["src/app.css"], outfile: "app.css" }),
]);

const hash = (b) => createHash("sha256").update(b).digest("hex").slice(0, 16);
const files = {
  "app.js": js.outputFiles[0].contents,
  "app.css": css.outputFiles[0].contents,
};
let html = await readFile(path.join(here, "src", "index.html"), "utf8");
for (const [name, body] of Object.entries(files)) {
  html = html.replace(`{{${name}}}`, `${name}?v=${hash(body)}`);
}
if (html.includes("{{")) throw new Error("index.html: a placeholder is left");

await rm(out, { recursive: true, force: true });
await mkdir(out, { recursive: true });
await Promise.all([
  ...Object.entries(files).map(([name, body]) => writeFile(path.join(out, name), body)),
  writeFile(path.join(out, "index.html"), html),
]);
for (const [name, body] of Object.entries({ ...files, "index.html": html })) {
  console.log(`${path.relative(process.cwd(), path.join(out, name)) || name}\t${Buffer.byteLength(body)} bytes`);
}
