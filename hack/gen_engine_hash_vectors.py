#!/usr/bin/python3
"""Generate blockkeys/testdata/engine_hash_vectors.json: block hashes of the
engines other than vLLM, computed with hashlib from each engine's published
hashing rules (vLLM's own vectors come from hack/gen_blockhash_vectors.py).

Run:  /usr/bin/python3 hack/gen_engine_hash_vectors.py > blockkeys/testdata/engine_hash_vectors.json

SGLang (sgl-project/sglang, python/sglang/srt/mem_cache/utils.py: get_hash_str
and hash_str_to_int64; the native python/sglang/srt/mem_cache/cpp_utils/
hash_binding.cpp hash_page computes the same bytes):
  page digest = SHA-256([parent page's 32-byte digest, only if there is a
  parent] + each token as 4 bytes little-endian unsigned); the first page of
  a chain hashes no parent bytes at all. The event's hash is the first 16 hex
  characters of the digest (first 8 bytes, big-endian) as a SIGNED int64.
  No seed, salt or LoRA enters the hash.

TensorRT-LLM (NVIDIA/TensorRT-LLM, KV cache manager V2: tensorrt_llm/runtime/
kv_cache_manager_v2/_block_radix_tree.py Hasher, reuse_scope_to_bytes,
RootBlock.make_key, Block.make_key; C++ mirror cpp/tensorrt_llm/batch_manager/
kv_cache_manager_v2/blockRadixTree.cpp; the ZMQ publisher's wire hash
StreamingEventSink::wireHash, tensorrt_llm/_torch/pyexecutor/kv_cache_events.py):
  root key = SHA-256(ReuseScope bytes: one mask byte, bit 0 = LoRA task id
  present, bit 1 = salt present, then each present value as uint64 LE); no
  LoRA and no salt = SHA-256(b"\x00"). Salt id = the first 8 bytes of
  BLAKE3(UTF-8 cache_salt) read little-endian (tensorrt_llm/runtime/
  kv_cache_hash.py get_cache_salt_id; the router builds ReuseScope(salt=id)).
  BLAKE3 is not in hashlib: the ids come from blockkeys/testdata/
  trt_salt_ids.json, written by hack/blake3/gen-salt-vectors.mjs with npm
  hash-wasm's BLAKE3. Block key = SHA-256(parent key (32 bytes; the root key
  for the first block) + each token as 4 bytes little-endian). The wire hash is
  the first 8 key bytes big-endian as a SIGNED int64.

Each vector: {"block_size": B, "tokens": [...], "keys": [...]} where keys are
the wire values (signed int64) of every full block, in order; TensorRT-LLM
vectors may name a "cache_salt".
"""

import hashlib
import json
import os
import random

with open(os.path.join(os.path.dirname(__file__), "..", "blockkeys", "testdata", "trt_salt_ids.json")) as f:
    SALT_IDS = {c["salt"]: int(c["salt_id"]) for c in json.load(f)["trtllm_salt_ids"]}


def sglang_get_hash_str(token_ids, prior_hash=None):
    # As get_hash_str: the prior digest only when there is one.
    h = hashlib.sha256()
    if prior_hash:
        h.update(bytes.fromhex(prior_hash))
    for t in token_ids:
        h.update(t.to_bytes(4, byteorder="little", signed=False))
    return h.hexdigest()


def hash_str_to_int64(hash_str):
    v = int(hash_str[:16], 16)
    return v - 2**64 if v >= 2**63 else v


def trt_root(lora_id=None, salt=None):
    mask, tail = 0, b""
    if lora_id is not None:
        mask |= 1
        tail += lora_id.to_bytes(8, "little")
    if salt is not None:
        mask |= 2
        tail += SALT_IDS[salt].to_bytes(8, "little")
    return hashlib.sha256(bytes([mask]) + tail).digest()


def trt_wire(digest):
    v = int.from_bytes(digest[:8], "big")
    return v - 2**64 if v >= 2**63 else v


def trt_digests(tokens, block, salt=None, lora_id=None):
    out, parent = [], trt_root(lora_id, salt)
    for i in range(0, len(tokens) - block + 1, block):
        h = hashlib.sha256(parent)
        for t in tokens[i:i + block]:
            h.update(t.to_bytes(4, "little"))
        parent = h.digest()
        out.append(parent)
    return out


def trt_keys(tokens, block, salt=None):
    return [trt_wire(d) for d in trt_digests(tokens, block, salt)]


def sglang_keys(tokens, page):
    keys, prior = [], None
    for i in range(0, len(tokens) - page + 1, page):
        prior = sglang_get_hash_str(tokens[i:i + page], prior)
        keys.append(hash_str_to_int64(prior))
    return keys


def main():
    rnd = random.Random(25)
    cases = [
        (4, list(range(1, 9))),        # the worked example of docs/wire-formats.md
        (1, [0, 1, 2**31, 2**32 - 1]),  # every byte of a uint32, page size 1 (SGLang's default)
        (16, [rnd.randrange(0, 152064) for _ in range(16 * 5 + 7)]),  # a trailing partial page: not hashed
        (64, [rnd.randrange(0, 2**32) for _ in range(64 * 3)]),
        (3, []),
    ]
    out = {"sglang": [{"block_size": b, "tokens": t, "keys": sglang_keys(t, b)} for b, t in cases]}
    trt = [{"block_size": b, "tokens": t, "keys": trt_keys(t, b)} for b, t in cases]
    trt.append({"block_size": 4, "tokens": [1, 2, 3, 4, 5, 6, 7, 8], "cache_salt": "tenant-a",
                "keys": trt_keys([1, 2, 3, 4, 5, 6, 7, 8], 4, "tenant-a")})
    trt.append({"block_size": 32, "tokens": cases[2][1][:64], "cache_salt": "ü-salt",
                "keys": trt_keys(cases[2][1][:64], 32, "ü-salt")})
    out["trtllm"] = trt
    json.dump(out, fp=__import__("sys").stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
