#!/usr/bin/env node
// shared-prefix-lengths.mjs: how long inference-perf's shared-prefix prompts
// really are, in the model's tokens and in bytes, measured with the reference
// tokenizer (HuggingFace `tokenizers`, npm), for sim/README.md's calibration.
//
// inference-perf (datagen/shared_prefix_datagen.py, Sep 2025) draws
// system_prompt_len and question_len random token ids below the tokenizer's
// vocab_size, decodes each to text, and sends system + " " + question as a
// /v1/completions prompt. The engine re-tokenizes that text, so the prompt it
// caches is not system_prompt_len + question_len tokens; GIE's approximate
// prefix scorer hashes the first 256 x 64 bytes of the same text.
//
// Usage (after hack/tokenizers/setup.sh): node hack/tokenizers/shared-prefix-lengths.mjs
// Prints one JSON line per benchmark shape. Deterministic (seeded).
import path from "node:path";
import fs from "node:fs";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import { prng } from "./textgen.mjs";

const require = createRequire(import.meta.url);
const { Tokenizer } = require("tokenizers");
const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "../..");
const tokDir = process.env.KVINDEX_TOKENIZERS_DIR || path.join(repo, ".cache/tokenizers");

// vocab_size as transformers reports it for these fast tokenizers: the base
// vocabulary without added tokens (Qwen2TokenizerFast 151,643; Llama 3's
// PreTrainedTokenizerFast 128,000). Ids below it are never special tokens.
const SHAPES = [
  { name: "73-capacity", model: "qwen3", vocab: 151643, bos: false, system: 6000, question: 1200 },
  { name: "37-capacity", model: "llama3_1", vocab: 128000, bos: true, system: 8000, question: 1000 },
];
const GIE_WINDOW_BYTES = 256 * 64;

for (const s of SHAPES) {
  const file = path.join(tokDir, s.model, "tokenizer.json");
  if (!fs.existsSync(file)) {
    console.error(`${file} missing: run hack/tokenizers/setup.sh`);
    process.exit(1);
  }
  const tok = await Tokenizer.fromFile(file);
  const rand = prng(0x5eed0000 + s.system);
  const ids = (n) => Array.from({ length: n }, () => rand.int(s.vocab));
  let sysTok = 0, qTok = 0, fullTok = 0, sysBytes = 0, n = 0, windowInSystem = 0;
  const groups = 12, prompts = 3; // a sample of groups and questions; the means settle well before this
  for (let g = 0; g < groups; g++) {
    const sys = await tok.decode(ids(s.system), true);
    const sysEnc = await tok.encode(sys, null, { addSpecialTokens: false });
    sysTok += sysEnc.getIds().length;
    const bytes = Buffer.byteLength(sys, "utf8");
    sysBytes += bytes;
    if (bytes >= GIE_WINDOW_BYTES) windowInSystem++;
    for (let p = 0; p < prompts; p++) {
      const q = await tok.decode(ids(s.question), true);
      qTok += (await tok.encode(q, null, { addSpecialTokens: false })).getIds().length;
      const full = await tok.encode(sys + " " + q, null, { addSpecialTokens: false });
      fullTok += full.getIds().length + (s.bos ? 1 : 0);
      n++;
    }
  }
  console.log(JSON.stringify({
    shape: s.name, model: s.model, system_ids: s.system, question_ids: s.question,
    system_tokens_mean: +(sysTok / groups).toFixed(1),
    question_tokens_mean: +(qTok / n).toFixed(1),
    prompt_tokens_mean: +(fullTok / n).toFixed(1),
    prompt_expansion: +(fullTok / n / (s.system + s.question + (s.bos ? 1 : 0))).toFixed(4),
    system_bytes_per_id: +(sysBytes / groups / s.system).toFixed(2),
    gie_window_inside_system_prompt: `${windowInSystem}/${groups}`,
  }));
}
