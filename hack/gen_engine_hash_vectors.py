#!/usr/bin/python3
"""Generate kvindex/testdata/engine_hash_vectors.json: block hashes of the
engines other than vLLM, computed with hashlib from each engine's published
hashing rules (vLLM's own vectors come from hack/gen_blockhash_vectors.py).

Run:  /usr/bin/python3 hack/gen_engine_hash_vectors.py > kvindex/testdata/engine_hash_vectors.json

SGLang (sgl-project/sglang, python/sglang/srt/mem_cache/utils.py: get_hash_str
and hash_str_to_int64; the native python/sglang/srt/mem_cache/cpp_utils/
hash_binding.cpp hash_page computes the same bytes):
  page digest = SHA-256([parent page's 32-byte digest, only if there is a
  parent] + each token as 4 bytes little-endian unsigned); the first page of
  a chain hashes no parent bytes at all. The event's hash is the first 16 hex
  characters of the digest (first 8 bytes, big-endian) as a SIGNED int64.
  No seed, salt or LoRA enters the hash.

Each vector: {"block_size": B, "tokens": [...], "keys": [...]} where keys are
the wire values (signed int64) of every full block, in order.
"""

import hashlib
import json
import random


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
    json.dump(out, fp=__import__("sys").stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
