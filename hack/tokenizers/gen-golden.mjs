#!/usr/bin/env node
// gen-golden.mjs: golden token ids from the reference implementation, HuggingFace
// `tokenizers` (Rust, npm package tokenizers@0.23.2 with prebuilt native binaries),
// for kvindex's pure-Go tokenizer parity tests.
//
// Usage (from the repo root, after hack/tokenizers/setup.sh):
//   node hack/tokenizers/gen-golden.mjs [model ...]
// Reads   $KVINDEX_TOKENIZERS_DIR/<model>/{tokenizer.json,tokenizer_config.json}
// Writes  tokenization/testdata/golden/<model>.jsonl.gz   lines {"text","add_special_tokens","ids"}
//         tokenization/testdata/golden/<model>.meta.json  generator, seed, counts, file hashes
//         tokenization/testdata/bench_mixed_90k.txt.gz    the shared 90 KB benchmark text
//
// Every text is encoded twice (add_special_tokens false and true). Output is a pure
// function of the seed, the tokenizer files and the tokenizers version.
import fs from "node:fs";
import path from "node:path";
import zlib from "node:zlib";
import crypto from "node:crypto";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import { prng, fnv1a, fuzzString, mixedText, SPACES } from "./textgen.mjs";

const require = createRequire(import.meta.url);
const { Tokenizer, templateProcessing } = require("tokenizers");
const TOKENIZERS_VERSION = require("tokenizers/package.json").version;

export const GENERATOR_VERSION = 1;
export const BASE_SEED = 20261122;
export const FUZZ_PER_MODEL = 2000;
export const BENCH_SEED = 90000;
export const BENCH_SIZE = 90 * 1024;
const TEXT20K_SEED = 20000;
const LONG_RUN_SEED = 30000;
export const LONG_RUN_CHARS = 10000;

// One unbroken run of random CJK ideographs: a single pre-token, so a single BPE
// word of tens of thousands of symbols (the merge loop's worst case).
function longRun(seed, n) {
  const r = prng(seed);
  let s = "";
  for (let i = 0; i < n; i++) s += String.fromCodePoint(r.range(0x4e00, 0x9fff));
  return s;
}

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "../..");
const tokDir = process.env.KVINDEX_TOKENIZERS_DIR || path.join(repo, ".cache/tokenizers");
const outDir = path.join(repo, "tokenization/testdata/golden");
const MODELS = ["qwen3", "llama3_1", "deepseek_v3", "gemma3", "llama2"];

const sha256 = (buf) => crypto.createHash("sha256").update(buf).digest("hex");

// transformers' LlamaTokenizerFast / GemmaTokenizerFast (what vLLM loads for these
// tokenizer_class values) rebuild the post-processor in __init__ from add_bos_token /
// add_eos_token (update_post_processor), replacing tokenizer.json's. We apply the same
// rebuild so the golden ids are what vLLM produces, not what tokenizer.json alone gives.
const REBUILD_CLASSES = new Set([
  "LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer", "CodeLlamaTokenizerFast",
  "GemmaTokenizer", "GemmaTokenizerFast",
]);

function tokenContent(t) {
  if (t == null) return null;
  return typeof t === "string" ? t : t.content;
}

function postProcessorOverride(cfg, tok) {
  if (!cfg || !REBUILD_CLASSES.has(cfg.tokenizer_class)) return null;
  const addBos = cfg.add_bos_token ?? true; // class defaults
  const addEos = cfg.add_eos_token ?? false;
  const bos = tokenContent(cfg.bos_token);
  const eos = tokenContent(cfg.eos_token);
  if (addBos && bos == null) throw new Error("add_bos_token without bos_token");
  if (addEos && eos == null) throw new Error("add_eos_token without eos_token");
  const single = `${addBos ? bos + ":0 " : ""}$A:0${addEos ? " " + eos + ":0" : ""}`;
  const pair = `${single}${addBos ? " " + bos + ":1" : ""} $B:1${addEos ? " " + eos + ":1" : ""}`;
  const special = [];
  if (addBos) special.push([bos, tok.tokenToId(bos)]);
  if (addEos) special.push([eos, tok.tokenToId(eos)]);
  return { single, pair, special };
}

// Hand-picked strings that broke or nearly broke tokenizers before.
function tricky(specials) {
  const s = [
    "", " ", "  ", "\n", "\r\n", "\t", "\u00a0", "\u3000", "\u2028", "Hello world", " Hello world", "Hello  world",
    "hello\n\nworld", "   \n\n   x", "a\u00a0b", "x\u3000y", "line1\u2028line2\u2029line3",
    "'s", "'S", "I'M", "DON'T", "we'RE", "they'Ve", "it's it'S IT's", "don't'll've",
    "1", "12", "123", "1234", "1234567890123", "3.14159", "1,000,000", "\uff11\uff12\uff13",
    "\uff48\uff45\uff4c\uff4c\uff4f", "e\u0301", "\u00e9", "\u212b", "\u1e9b\u0323", "\ufb01nance", "\u2460\u2461",
    "\u{1F468}\u200d\u{1F469}\u200d\u{1F467}\u200d\u{1F466}", "\u{1F1FA}\u{1F1F8}\u{1F1EF}\u{1F1F5}", "\u{1F44D}\u{1F3FD}",
    "\u4f60\u597d", "\u3053\u3093\u306b\u3061\u306f", "\u0645\u0631\u062d\u0628\u0627", "\u0928\u092e\u0938\u094d\u0924\u0947",
    "\u2581", "\u2581\u2581hello", " \u2581 ", "<0x41>", "<unk>", "<s>", "</s>",
    "a".repeat(3000), "ab".repeat(1000), "\u4e00".repeat(2000), "\u{1F600}".repeat(300),
    " ".repeat(100), " ".repeat(1000), "\n".repeat(1000), "\t".repeat(500), " \n".repeat(500),
    " ".repeat(100000), "\n".repeat(100000),
    "x" + " ".repeat(50) + "y", "x" + " ".repeat(50), " ".repeat(50) + "y",
    "\r\n\r\n\r\n", "\r\r\n\n", "\n\r", "a\rb", "trailing   ", "   leading",
    "\u0000", "a\u0000b", "\u0085x", "\u200bzero\u200bwidth", "\ufeffbom", "\u{10FFFF}", "\u{E0001}",
    "def f():\n\treturn 1\n", "    indented\n        more\n", "foo.bar(baz)[0]->qux;",
  ];
  for (const t of specials.slice(0, 60)) {
    s.push(t, " " + t, t + " ", " " + t + " ", "a" + t + "b", t + t, t + "\n" + t, t.slice(0, -1), t.slice(1), "<" + t + ">");
  }
  if (specials.length >= 2) {
    s.push(specials.join(""), specials.slice(0, 200).join(" "), specials.slice(0, 200).join("\n"));
  }
  return s;
}

// Every added token appears in at least one string: cycle through them, a few per text,
// in varied surroundings.
function addedCoverage(r, specials) {
  const out = [];
  const per = 6;
  for (let i = 0; i < specials.length; i += per) {
    let s = "";
    for (const t of specials.slice(i, i + per)) {
      s += r.pick(["", " ", "x", "\n", " hello ", r.pick(SPACES)]) + t;
    }
    out.push(s + r.pick(["", " ", ".", " end"]));
  }
  return out;
}

async function genModel(model) {
  const dir = path.join(tokDir, model);
  const tjPath = path.join(dir, "tokenizer.json");
  const cfgPath = path.join(dir, "tokenizer_config.json");
  if (!fs.existsSync(tjPath)) throw new Error(`${tjPath} missing: run hack/tokenizers/fetch.sh`);
  const tjBuf = fs.readFileSync(tjPath);
  const cfgBuf = fs.existsSync(cfgPath) ? fs.readFileSync(cfgPath) : null;
  const cfg = cfgBuf ? JSON.parse(cfgBuf) : null;
  const tok = Tokenizer.fromString(tjBuf.toString("utf8"));
  const override = postProcessorOverride(cfg, tok);
  if (override) {
    tok.setPostProcessor(templateProcessing(override.single, override.pair, override.special));
  }
  // Added tokens in id order (tokenizer.json order), deduplicated.
  const specials = [...new Set(JSON.parse(tjBuf).added_tokens.map((t) => t.content))];

  const seed = (BASE_SEED ^ fnv1a(model)) >>> 0;
  const r = prng(seed);
  const texts = [];
  const kinds = { tricky: 0, fuzz: 0, added_tokens: 0, text20k: 0, long_run: 0 };
  for (const t of tricky(specials)) { texts.push(t); kinds.tricky++; }
  for (let i = 0; i < FUZZ_PER_MODEL; i++) { texts.push(fuzzString(r, specials)); kinds.fuzz++; }
  for (const t of addedCoverage(r, specials)) { texts.push(t); kinds.added_tokens++; }
  texts.push(mixedText(TEXT20K_SEED, 20 * 1024)); kinds.text20k++;
  texts.push(longRun(LONG_RUN_SEED, LONG_RUN_CHARS)); kinds.long_run++;

  const lines = [];
  for (const text of texts) {
    for (const add of [false, true]) {
      const enc = await tok.encode(text, null, { addSpecialTokens: add });
      lines.push(JSON.stringify({ text, add_special_tokens: add, ids: enc.getIds() }));
    }
  }
  fs.mkdirSync(outDir, { recursive: true });
  const gz = zlib.gzipSync(Buffer.from(lines.join("\n") + "\n", "utf8"), { level: 9 });
  fs.writeFileSync(path.join(outDir, `${model}.jsonl.gz`), gz);
  const meta = {
    model,
    generator: "hack/tokenizers/gen-golden.mjs",
    generator_version: GENERATOR_VERSION,
    reference: `npm tokenizers@${TOKENIZERS_VERSION} (HuggingFace tokenizers, Rust)`,
    seed,
    base_seed: BASE_SEED,
    source: fs.existsSync(path.join(dir, "SOURCE")) ? fs.readFileSync(path.join(dir, "SOURCE"), "utf8").trim().split("\n") : null,
    tokenizer_json_sha256: sha256(tjBuf),
    tokenizer_config_json_sha256: cfgBuf ? sha256(cfgBuf) : null,
    post_processor_override: override
      ? { reason: `transformers ${cfg.tokenizer_class.replace(/Fast$/, "")}Fast.update_post_processor from add_bos_token/add_eos_token`, single: override.single, pair: override.pair, special_tokens: override.special }
      : null,
    texts: texts.length,
    lines: lines.length,
    kinds,
    added_tokens: specials.length,
  };
  fs.writeFileSync(path.join(outDir, `${model}.meta.json`), JSON.stringify(meta, null, 2) + "\n");
  console.log(`${model}: ${texts.length} texts, ${lines.length} lines, ${gz.length} bytes gz${override ? ", post-processor rebuilt: " + override.single : ""}`);
}

async function main() {
  const models = process.argv.slice(2).length ? process.argv.slice(2) : MODELS;
  for (const m of models) await genModel(m);
  const bench = mixedText(BENCH_SEED, BENCH_SIZE);
  const benchPath = path.join(repo, "tokenization/testdata/bench_mixed_90k.txt.gz");
  fs.writeFileSync(benchPath, zlib.gzipSync(Buffer.from(bench, "utf8"), { level: 9 }));
  console.log(`bench text: ${Buffer.byteLength(bench, "utf8")} bytes UTF-8 -> ${benchPath}`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
