#!/usr/bin/python3
"""Generate blockkeys/testdata/llmd_hash_vectors.json: the CBOR inputs of
llm-d's block hashes, as cbor2 (canonical) encodes them.

Run:  /usr/bin/python3 hack/gen_llmd_hash_vectors.py > blockkeys/testdata/llmd_hash_vectors.json

llm-d (llm-d/llm-d-kv-cache pkg/kvcache/kvblock/token_processor.go,
chunkedTokenDatabase.hash and getInitHash, used by llm-d-inference-sim)
hashes FNV-64a(cbor canonical encoding of [parent, tokens, extra]) with
fxamacker/cbor's CanonicalEncOptions; the root is hash(FNV-64a(seed), nil,
model name) and a text block's extra is nil. This script only asks cbor2 for
those encodings (its canonical mode and fxamacker's agree on unsigned ints,
arrays, null and text); the test hashes them with Go's hash/fnv, so the
vectors rest on cbor2 and Go's standard library, neither ours. The root
input's first element is FNV-64a of the seed bytes, computed here from the
FNV specification (offset basis 0xcbf29ce484222325, prime 0x100000001b3,
xor then multiply per byte); the test checks it against hash/fnv as well.
"""

import json
import random
import sys

import cbor2


def fnv64a(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & (2**64 - 1)
    return h


def main():
    rnd = random.Random(32)
    out = []
    for seed, model, tokens in [
        ("", "org/model", list(range(1, 17))),
        ("0", "Qwen/Qwen3-8B", [rnd.randrange(0, 152064) for _ in range(16)]),
        ("vllm-none-hash", "m", [0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1]),
    ]:
        out.append({
            "seed": seed, "model": model, "tokens": tokens,
            "fnv_seed": fnv64a(seed.encode()),
            "root_cbor": cbor2.dumps([fnv64a(seed.encode()), None, model], canonical=True).hex(),
            "block_cbor_with_parent_1": cbor2.dumps([1, tokens, None], canonical=True).hex(),
            "block_cbor_with_parent_max": cbor2.dumps([2**64 - 1, tokens, None], canonical=True).hex(),
        })
    json.dump({"llmd": out}, fp=sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
