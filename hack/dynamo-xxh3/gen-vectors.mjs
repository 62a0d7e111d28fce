// Writes indexer/testdata/dynamo_local_hashes.json: NVIDIA Dynamo's
// LocalBlockHash of token blocks, computed with an XXH3 we did not write
// (npm hash-wasm, pinned in package-lock.json).
//
//   (cd hack/dynamo-xxh3 && npm ci) && node hack/dynamo-xxh3/gen-vectors.mjs > indexer/testdata/dynamo_local_hashes.json
//
// What Dynamo computes (ai-dynamo/dynamo lib/kv-router/src/protocols.rs,
// compute_block_hash_for_seq, the version the standalone indexer at
// bc2583516003 calls with (token_ids, block_size, None, lora_name)):
// the tokens are cut into full blocks of block_size (a partial last block
// is dropped); each block's u32 token ids are laid out little-endian, 4
// bytes each, and hashed with XXH3-64 under seed 1337 (XXH3_SEED). A
// non-empty lora_name changes the seed to 1337 + xxh3_64(lora_name bytes,
// seed 0), wrapping at 2^64. Hashes are unsigned 64-bit; Dynamo's
// /query_by_hash takes them as i64 (the same bits), so both forms are written.
import { xxhash3 } from "hash-wasm";

const SEED = 1337n;
const MASK = (1n << 64n) - 1n;

async function xxh3(bytes, seed) {
  const lo = Number(seed & 0xffffffffn);
  const hi = Number((seed >> 32n) & 0xffffffffn);
  return BigInt("0x" + (await xxhash3(bytes, lo, hi)));
}

async function blockHashes(tokens, blockSize, lora) {
  let seed = SEED;
  if (lora) seed = (SEED + (await xxh3(new TextEncoder().encode(lora), 0n))) & MASK;
  const out = [];
  for (let start = 0; start + blockSize <= tokens.length; start += blockSize) {
    const buf = Buffer.alloc(blockSize * 4);
    for (let i = 0; i < blockSize; i++) buf.writeUInt32LE(tokens[start + i], i * 4);
    out.push(await xxh3(buf, seed));
  }
  return out;
}

const docPrompt = [2610, 525, 264, 10950, 17847, 13, 8116, 5612, 551, 279, 2701, 1895, 304, 2326, 17432, 3501,
  11, 1221, 1140, 279, 1787, 4755, 13, 13655, 432, 1212, 825, 7739, 4244, 323, 1977, 892];
const seq = (n, f) => Array.from({ length: n }, (_, i) => f(i));
const cases = [
  { tokens: docPrompt, block_size: 16 },
  { tokens: docPrompt, block_size: 16, lora_name: "sql-adapter" },
  { tokens: docPrompt.slice(0, 20), block_size: 16 },
  { tokens: seq(12, (i) => i + 1), block_size: 4 },
  { tokens: seq(3, (i) => i), block_size: 1 },
  { tokens: seq(130, (i) => (i * 2654435761) % 4294967296), block_size: 64 },
  { tokens: [4294967295, 0, 2147483648, 1], block_size: 2, lora_name: "ü-lora" },
  { tokens: seq(8, () => 7), block_size: 8 },
];
const out = [];
for (const c of cases) {
  const h = await blockHashes(c.tokens, c.block_size, c.lora_name);
  out.push({ ...c, local_hashes: h.map(String), local_hashes_i64: h.map((v) => String(BigInt.asIntN(64, v))) });
}
process.stdout.write(JSON.stringify({ reference: "npm hash-wasm 4.13.0 xxhash3", dynamo_local_hashes: out }, null, 1) + "\n");
