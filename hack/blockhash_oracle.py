#!/usr/bin/python3
"""Reference block hashes on demand, for kvindex's differential hashing test.

Reads JSON lines {"algo", "seed", "block_size", "token_ids", "lora_name",
"cache_salt"} on stdin (the last two optional) and writes {"keys": [...]} per
line: the 64-bit wire keys vLLM publishes for every full block, computed with
the reference encoders and the vLLM glue of gen_blockhash_vectors.py (CPython's
C pickle, cbor2, msgpack, hashlib, python-xxhash from Debian).
"""

import json
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the work tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_blockhash_vectors as ref  # noqa: E402


def main():
    nones = {}
    for line in sys.stdin:
        c = json.loads(line)
        fn = ref.ALGOS[c["algo"]]
        key = (c["algo"], c["seed"])
        if key not in nones:
            nones[key] = ref.none_hash(fn, c["seed"])
        ds = ref.request_block_hashes(fn, nones[key], c["block_size"], c["token_ids"],
                                      c.get("lora_name") or None, c.get("cache_salt"))
        sys.stdout.write(json.dumps({"keys": [ref.wire(d) for d in ds]}) + "\n")


if __name__ == "__main__":
    main()
