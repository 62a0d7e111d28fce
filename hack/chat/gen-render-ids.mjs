#!/usr/bin/env node
// gen-render-ids.mjs: reference token ids for `kvindexd render`'s test.
//
// Encodes the Jinja2 golden renders of the Qwen3 chat template
// (tokenization/chattemplate/testdata/parity/golden/qwen3.jsonl, from gen_golden.py) with
// HuggingFace tokenizers (Rust, npm tokenizers, pinned in
// hack/tokenizers/package.json) and the committed Qwen3 tokenizer, with
// add_special_tokens=false as vLLM tokenizes a rendered chat. A render with
// media in Qwen3's "string"-format template holds vLLM's generic marker
// (<##IMAGE##>) where the model's placeholder goes: its reference is the text
// before the marker and its ids without the last one (which the unknown
// placeholder might merge with), as kvindex scores it.
//
// With the Gemma 3 tokenizer fetched (hack/tokenizers/setup.sh), it also
// writes gemma3_media_ids.jsonl: for each render with media of Gemma 3's
// "openai"-format template (vLLM's exact prompt), the ids before the first
// <start_of_image> token, where vLLM's multimodal processor starts the image.
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
  if (g.media) {
    const prefix = g.prompt.slice(0, g.prompt.indexOf("<##"));
    const ids = Array.from((await tok.encode(prefix, null, { addSpecialTokens: false })).getIds()).slice(0, -1);
    out.push(JSON.stringify({ case: g.case, ids, prompt: prefix }));
    continue;
  }
  const enc = await tok.encode(g.prompt, null, { addSpecialTokens: false });
  out.push(JSON.stringify({ case: g.case, ids: Array.from(enc.getIds()) }));
}
const gemmaDir = path.join(process.env.KVINDEX_TOKENIZERS_DIR || path.join(repo, ".cache/tokenizers"), "gemma3");
if (fs.existsSync(path.join(gemmaDir, "tokenizer.json"))) {
  const gtok = Tokenizer.fromString(fs.readFileSync(path.join(gemmaDir, "tokenizer.json"), "utf8"));
  const boi = gtok.tokenToId("<start_of_image>");
  const gold = fs.readFileSync(path.join(repo, "tokenization/chattemplate/testdata/parity/golden/gemma3.jsonl"), "utf8")
    .split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l)).filter((g) => g.media && g.prompt !== undefined);
  const lines = [];
  for (const g of gold) {
    const ids = Array.from((await gtok.encode(g.prompt, null, { addSpecialTokens: false })).getIds());
    const at = ids.indexOf(boi);
    lines.push(JSON.stringify({ case: g.case, ids: at < 0 ? ids : ids.slice(0, at), media_token: at >= 0 }));
  }
  fs.writeFileSync(path.join(repo, "tokenization/chattemplate/testdata/parity/gemma3_media_ids.jsonl"), lines.join("\n") + "\n");
  console.error(`gemma3_media_ids.jsonl: ${lines.length} renders with media encoded`);
}
fs.writeFileSync(path.join(repo, "tokenization/chattemplate/testdata/parity/qwen3_ids.jsonl"), out.join("\n") + "\n");
console.error(`qwen3_ids.jsonl: ${out.length} renders encoded`);
