#!/usr/bin/python3
"""Generate blockkeys/testdata/blockhash_vectors.json: golden vLLM block hashes.

Run:  /usr/bin/python3 hack/gen_blockhash_vectors.py > blockkeys/testdata/blockhash_vectors.json

The reference implementations are CPython's own pickle (C _pickle module),
cbor2, msgpack, hashlib and python-xxhash (Debian: python3, python3-cbor2,
python3-msgpack, python3-xxhash). We did not write them; this script only
re-states vLLM's one-line glue around them so that no vLLM install (torch,
CUDA) is needed:

  - the six algorithms mirror vllm/utils/hashing.py:
        sha256(x)         = hashlib.sha256(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)).digest()
        sha256_cbor(x)    = hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()
        sha256_msgpack(x) = hashlib.sha256(msgspec.msgpack.Encoder().encode(x)).digest()
        xxhash(x)         = xxhash.xxh3_128_digest(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL))
        xxhash_cbor(x)    = xxhash.xxh3_128_digest(cbor2.dumps(x, canonical=True))
        xxhash_msgpack(x) = xxhash.xxh3_128_digest(msgspec.msgpack.Encoder().encode(x))
    vLLM encodes msgpack with msgspec, which Debian does not package. For the
    values a block-hash input holds (bytes, str, int, bool, None, tuple/list)
    msgspec and msgpack.packb (use_bin_type=True, its default) write the same
    bytes: shortest int form (fixint, uint8..64, int8..64), fixstr/str8/16/32,
    bin8/16/32, fixarray/array16/32, nil, true/false. So msgpack.packb is the
    reference here.
  - none_hash mirrors vllm/v1/core/kv_cache_utils.py init_none_hash:
        NONE_HASH = hash_fn(os.getenv("PYTHONHASHSEED"))   (the seed as a str)
    and resolve_none_hash_seed (vllm-project/vllm PR #51875): with
    PYTHONHASHSEED unset, the sha256 family hashes DEFAULT_NONE_HASH_SEED =
    "vllm-none-hash" the same way (one of SEEDS; kvindexd's default seed).
  - hash_block_tokens mirrors kv_cache_utils.hash_block_tokens and
    hashing.get_block_hash_fn:
        hash_fn((parent or NONE_HASH, tuple(block_token_ids), extra_keys))
    (the msgpack algorithms skip the tuple() copy: tuples and lists are the
    same msgpack array)
  - request_block_hashes mirrors kv_cache_utils.get_request_block_hasher with
    generate_block_hash_extra_keys for a text request: extra keys are
    lora keys ([lora_name] if a LoRA) + cache-salt keys ([cache_salt] on the
    block starting at token 0, if the salt is truthy), None when empty.
  - the wire key mirrors kv_cache_utils.maybe_convert_block_hash:
        int.from_bytes(digest, "big") & (2**64 - 1)

Strings are re-decoded (s.encode().decode()) so each request field is its own
object, as in vLLM where they come from separate decoded fields: pickle's memo
then behaves as it does in the engine (only CPython's interned 1-char/empty
strings are shared).
"""

import hashlib
import importlib.metadata
import json
import pickle
import sys

import cbor2
import msgpack
import xxhash as _xxhash


# --- vllm/utils/hashing.py -------------------------------------------------
def sha256(x):
    return hashlib.sha256(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def sha256_cbor(x):
    return hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()


def xxhash(x):
    return _xxhash.xxh3_128_digest(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL))


def xxhash_cbor(x):
    return _xxhash.xxh3_128_digest(cbor2.dumps(x, canonical=True))


def sha256_msgpack(x):
    return hashlib.sha256(msgpack.packb(x)).digest()


def xxhash_msgpack(x):
    return _xxhash.xxh3_128_digest(msgpack.packb(x))


ALGOS = {"sha256": sha256, "sha256_cbor": sha256_cbor, "sha256_msgpack": sha256_msgpack,
         "xxhash": xxhash, "xxhash_cbor": xxhash_cbor, "xxhash_msgpack": xxhash_msgpack}
MSGPACK_ALGOS = (sha256_msgpack, xxhash_msgpack)


# --- vllm/v1/core/kv_cache_utils.py ----------------------------------------
def none_hash(fn, seed):
    return fn(seed)


def hash_block_tokens(fn, none, parent, tokens, extra):
    if not parent:
        parent = none
    if fn in MSGPACK_ALGOS:
        return fn((parent, list(tokens), extra))
    return fn((parent, tuple(tokens), extra))


def fresh(s):
    return None if s is None else s.encode("utf-8").decode("utf-8")


def request_block_hashes(fn, none, block_size, tokens, lora_name=None, cache_salt=None):
    lora_name, cache_salt = fresh(lora_name), fresh(cache_salt)
    out, parent = [], None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        extra = ([lora_name] if lora_name is not None else []) + (
            [cache_salt] if (start == 0 and cache_salt) else []
        )
        d = hash_block_tokens(fn, none, parent, tokens[start:start + block_size], tuple(extra) if extra else None)
        out.append(d)
        parent = d
    return out


def wire(d):
    return int.from_bytes(d, "big") & ((1 << 64) - 1)


# Token generator shared with the Go test (kept trivial on purpose): token i is
# (start + i*step) mod 2**32. Used for long inputs so the JSON stays small.
def gen_tokens(g):
    return [(g["start"] + i * g["step"]) % (1 << 32) for i in range(g["n"])]


def to_py(v):
    """Tagged JSON -> Python value: {"s":str} {"b":hex} {"i":int} {"t":[...]} {"bool":b} null."""
    if v is None:
        return None
    if "s" in v:
        return fresh(v["s"])
    if "b" in v:
        return bytes.fromhex(v["b"])
    if "i" in v:
        return int(v["i"])
    if "bool" in v:
        return bool(v["bool"])
    if "t" in v:
        return tuple(to_py(x) for x in v["t"])
    raise ValueError(v)


REFERENCE = ("CPython %s pickle (C _pickle), cbor2 %s, msgpack %s, hashlib, python-xxhash %s; vLLM glue restated "
             "from vllm/utils/hashing.py and vllm/v1/core/kv_cache_utils.py" % (
                 sys.version.split()[0], importlib.metadata.version("cbor2"),
                 ".".join(map(str, msgpack.version)), _xxhash.VERSION))

SEEDS = ["0", "12345", "", "random", "vllm-none-hash", "h\u00e4sh-\u79cd\u5b50-\U0001f511"]
BIG = [1 << 16, (1 << 16) + 1, (1 << 31) - 1, 1 << 31, (1 << 31) + 7, (1 << 32) - 1]


def main():
    cases = []

    def add(name, algo, seed, bs, tokens=None, token_gen=None, lora=None, salt=None, lora_repeat=None):
        fn = ALGOS[algo]
        none = none_hash(fn, seed)
        toks = tokens if tokens is not None else gen_tokens(token_gen)
        ds = request_block_hashes(fn, none, bs, toks, lora * lora_repeat if lora_repeat else lora, salt)
        c = {"name": name, "algo": algo, "seed": seed, "block_size": bs}
        if tokens is not None:
            c["token_ids"] = tokens
        else:
            c["token_gen"] = token_gen
        if lora is not None:
            c["lora_name"] = lora
        if lora_repeat:
            c["lora_repeat"] = lora_repeat  # lora_name repeated this many times
        if salt is not None:
            c["cache_salt"] = salt
        c["none_hash"] = none.hex()
        c["digests"] = [d.hex() for d in ds]
        c["keys"] = [wire(d) for d in ds]
        cases.append(c)

    for algo in ALGOS:
        for seed in SEEDS:
            for bs in (1, 16, 64, 128):
                add(f"{algo}/seed={seed!r}/bs={bs}/chain", algo, seed, bs,
                    token_gen={"start": 1, "step": 1, "n": 3 * bs + bs // 2})
        for bs in (1, 16, 64, 128):
            # every int opcode / CBOR head width, ids above 2^16 and 2^31 (< 2^32)
            toks = [0, 1, 23, 24, 255, 256, 65535] + BIG
            toks = (toks * (2 * bs // len(toks) + 2))[: 2 * bs]
            add(f"{algo}/bs={bs}/wide-ids", algo, "0", bs, tokens=toks)
            add(f"{algo}/bs={bs}/lora+salt", algo, "12345", bs,
                token_gen={"start": 100000, "step": 7919, "n": 3 * bs}, lora="sql-lora", salt="tenant-42")
        for bs in (2, 3, 4):  # TUPLE2/TUPLE3 vs MARK..TUPLE in pickle
            add(f"{algo}/bs={bs}/small-tuples", algo, "0", bs, tokens=list(range(300, 300 + 3 * bs)))
        add(f"{algo}/lora-only", algo, "0", 16, token_gen={"start": 5, "step": 3, "n": 48}, lora="my_adapter")
        add(f"{algo}/salt-only", algo, "0", 16, token_gen={"start": 5, "step": 3, "n": 48}, salt="s\u00e4lt")
        add(f"{algo}/empty-salt-is-none", algo, "0", 16, token_gen={"start": 5, "step": 3, "n": 32}, salt="")
        add(f"{algo}/unicode-lora", algo, "0", 16, token_gen={"start": 9, "step": 1, "n": 32}, lora="\u00fcber-\u00e9-\U0001f600")
        # CPython's interned 1-char strings: the second "a" is a memo reference (BINGET)
        add(f"{algo}/same-1char-lora-and-salt", algo, "0", 4, tokens=list(range(8)), lora="a", salt="a")
        add(f"{algo}/long-lora-300", algo, "0", 16, token_gen={"start": 1, "step": 1, "n": 32}, lora="L" * 300)
        add(f"{algo}/ids<2^31", algo, "0", 16, token_gen={"start": (1 << 31) - 20, "step": 1, "n": 32})
        # huge block: pickle splits into several 64 KiB FRAMEs
        add(f"{algo}/bs=20000/frames", algo, "0", 20000,
            token_gen={"start": (1 << 31) - 5000, "step": 1, "n": 40000})
        # a LoRA name >= 64 KiB is written outside pickle frames
        add(f"{algo}/lora-70000", algo, "0", 16, token_gen={"start": 1, "step": 1, "n": 32}, lora="x", lora_repeat=70000)

    # Generic extra keys exactly as an engine may publish them in BlockStored
    # extra_keys: LoRA name, multimodal (identifier, offset) tuples, cache_salt,
    # prompt-embeds digest. One block each, parent = NONE_HASH or a given digest.
    extras = [
        [{"s": "lora1"}],
        [{"s": "lora1"}, {"t": [{"s": "mmhash-abc"}, {"i": 3}]}, {"s": "salt"}],
        [{"t": [{"s": "img0"}, {"i": -5}]}, {"t": [{"s": "img1"}, {"i": 12}]}],
        [{"b": hashlib.sha256(b"embeds").hexdigest()}],
        [{"i": 0}, {"i": 255}, {"i": 256}, {"i": 65535}, {"i": 65536}, {"i": -1}, {"i": -256},
         {"i": (1 << 31) - 1}, {"i": -(1 << 31)}, {"i": 1 << 31}, {"i": -(1 << 31) - 1},
         {"i": (1 << 63) - 1}, {"i": -(1 << 63)}, {"i": 1 << 40}, {"i": -(1 << 40)}],
        [{"t": []}, {"t": [{"s": "x"}]}, {"t": [{"s": "ab"}, {"s": "cd"}, {"s": "ef"}, {"s": "gh"}]}],
        [{"bool": True}, {"bool": False}, None],
        [{"s": "a"}, {"s": "a"}, {"s": ""}, {"s": ""}, {"s": "\u00e9"}, {"s": "\u00e9"}],
    ]
    generic = []
    for algo, fn in ALGOS.items():
        none = none_hash(fn, "0")
        for i, ek in enumerate(extras):
            for parent in (None, hashlib.sha256(b"parent").digest()[: len(none)]):
                tokens = list(range(1000, 1016))
                d = hash_block_tokens(fn, none, parent, tokens, tuple(to_py(x) for x in ek))
                generic.append({
                    "algo": algo, "seed": "0", "parent": None if parent is None else parent.hex(),
                    "token_ids": tokens, "extra_keys": ek, "digest": d.hex(), "key": wire(d),
                })

    json.dump({
        "generator": "hack/gen_blockhash_vectors.py",
        "reference": REFERENCE,
        "cases": cases,
        "generic_extra_keys": generic,
    }, sys.stdout, indent=1, ensure_ascii=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
