// Writes blockkeys/testdata/trt_salt_ids.json: TensorRT-LLM's cache-salt ids
// computed with a BLAKE3 we did not write (npm hash-wasm, pinned in
// package-lock.json).
//
//   (cd hack/blake3 && npm ci) && node hack/blake3/gen-salt-vectors.mjs > blockkeys/testdata/trt_salt_ids.json
//
// TensorRT-LLM (NVIDIA/TensorRT-LLM tensorrt_llm/runtime/kv_cache_hash.py
// get_cache_salt_id, "the cache salt id used by request handling and
// cache-aware routing"; the router builds ReuseScope(salt=that id)):
// blake3(cache_salt.encode("utf-8")).digest(length=8), read little-endian
// as an unsigned 64-bit integer. BLAKE3's 8-byte output is the first 8
// bytes of its 32-byte digest (XOF prefix), so the id is computed here from
// the 32-byte digest hash-wasm returns.
import { blake3 } from "hash-wasm";

const salts = ["tenant-a", "ü-salt", "", "a", "x".repeat(1025), "租户-🔑"];
const out = [];
for (const salt of salts) {
  const hex = await blake3(new TextEncoder().encode(salt), 256);
  const first8 = Buffer.from(hex, "hex").subarray(0, 8);
  out.push({ salt, blake3: hex, salt_id: first8.readBigUInt64LE(0).toString() });
}
process.stdout.write(JSON.stringify({ reference: "npm hash-wasm 4.13.0 blake3", trtllm_salt_ids: out }, null, 1) + "\n");
