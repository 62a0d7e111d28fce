#!/usr/bin/env node
// bench.mjs: encode time of the reference HuggingFace tokenizers (Rust, npm
// tokenizers@0.23.2) on tokenization/testdata/bench_mixed_90k.txt.gz, the same text
// the Go benchmarks read, so the two numbers are comparable on one machine.
//
// Usage: node hack/tokenizers/bench.mjs [--iters N] [--no-special-tokens] [model ...]
// Encodes with add_special_tokens=true like the Go BenchmarkEncode90KB (warm-up first, as
// the Go benchmark warms its word cache). Models default to every fetched model
// ($KVINDEX_TOKENIZERS_DIR), qwen3 falling back to the committed fixture.
// Prints one line per model: ns/op, MB/s, tokens, plus the load time of tokenizer.json.
import fs from "node:fs";
import path from "node:path";
import zlib from "node:zlib";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const require = createRequire(import.meta.url);
const { Tokenizer } = require("tokenizers");
const version = require("tokenizers/package.json").version;

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "../..");
const tokDir = process.env.KVINDEX_TOKENIZERS_DIR || path.join(repo, ".cache/tokenizers");

let iters = 50;
let addSpecial = true;
const models = [];
const args = process.argv.slice(2);
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--iters") iters = parseInt(args[++i], 10);
  else if (args[i] === "--no-special-tokens") addSpecial = false;
  else if (args[i] === "--add-special-tokens") addSpecial = true;
  else models.push(args[i]);
}
if (models.length === 0) {
  for (const m of ["qwen3", "llama3_1", "deepseek_v3", "gemma3", "llama2"]) {
    if (m === "qwen3" || fs.existsSync(path.join(tokDir, m, "tokenizer.json"))) models.push(m);
  }
}

function readTokenizerJSON(model) {
  const p = path.join(tokDir, model, "tokenizer.json");
  if (fs.existsSync(p)) return fs.readFileSync(p, "utf8");
  const fixture = path.join(repo, "tokenization/testdata", model, "tokenizer.json.gz");
  if (fs.existsSync(fixture)) return zlib.gunzipSync(fs.readFileSync(fixture)).toString("utf8");
  throw new Error(`no tokenizer.json for ${model} (run hack/tokenizers/fetch.sh)`);
}

const text = zlib.gunzipSync(fs.readFileSync(path.join(repo, "tokenization/testdata/bench_mixed_90k.txt.gz"))).toString("utf8");
const bytes = Buffer.byteLength(text, "utf8");

for (const model of models) {
  const json = readTokenizerJSON(model);
  const t0 = process.hrtime.bigint();
  const tok = Tokenizer.fromString(json);
  const loadNs = Number(process.hrtime.bigint() - t0);
  let n = 0;
  for (let i = 0; i < 5; i++) n = (await tok.encode(text, null, { addSpecialTokens: addSpecial })).getIds().length; // warm-up
  const times = [];
  for (let i = 0; i < iters; i++) {
    const s = process.hrtime.bigint();
    await tok.encode(text, null, { addSpecialTokens: addSpecial });
    times.push(Number(process.hrtime.bigint() - s));
  }
  times.sort((a, b) => a - b);
  const mean = times.reduce((a, b) => a + b, 0) / times.length;
  const median = times[times.length >> 1];
  console.log(
    `rust tokenizers@${version} ${model}: ${bytes} bytes, ${n} tokens, add_special_tokens=${addSpecial}, iters=${iters}, ` +
      `mean ${Math.round(mean)} ns/op, median ${median} ns/op, ${(bytes / (mean / 1e9) / 1e6).toFixed(2)} MB/s, ` +
      `load ${(loadNs / 1e6).toFixed(1)} ms`,
  );
}
