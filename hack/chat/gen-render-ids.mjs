#!/usr/bin/env node
// gen-render-ids.mjs: reference token ids for `kvindexd render`'s test.
//
// Encodes the Jinja2 golden renders of the Qwen3 chat template
// (tokenization/chattemplate/testdata/parity/golden/qwen3.jsonl, from gen_golden.py) with
// HuggingFace tokenizers (Rust, npm tokenizers, pinned in
// hack/tokenizers/package.json) and the committed Qwen3 tokenizer, with
// add_special_tokens=false as vLLM tokenizes a rendered chat.
//
// Usage (repo root, after `cd hack/tokenizers && npm ci`):
//   node hack/chat/gen-render-ids.mjs   (writes tokenization/chattemplate/testdata/parity/qwen3_ids.jsonl)
import fs from "node:fs";
import path from "node:path";
import zlib from "node:zlib";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "../..");
const require = createRequire(path.join(repo, "hack/tokenizers/package.json"));
const { Tokenizer } = require("tokenizers");

const json = zlib.gunzipSync(fs.readFileSync(path.join(repo, "tokenization/testdata/qwen3/tokenizer.json.gz"))).toString("utf8");
const tok = Tokenizer.fromString(json);
const golden = fs.readFileSync(path.join(repo, "tokenization/chattemplate/testdata/parity/golden/qwen3.jsonl"), "utf8")
  .split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l));
const out = [];
for (const g of golden) {
  if (g.prompt === undefined) continue;
  const enc = await tok.encode(g.prompt, null, { addSpecialTokens: false });
  out.push(JSON.stringify({ case: g.case, ids: Array.from(enc.getIds()) }));
}
fs.writeFileSync(path.join(repo, "tokenization/chattemplate/testdata/parity/qwen3_ids.jsonl"), out.join("\n") + "\n");
console.error(`qwen3_ids.jsonl: ${out.length} renders encoded`);
