#!/usr/bin/python3
"""Generate blockkeys/testdata/blockhash_edge_vectors.json.gz: vLLM block hashes
at every encoder edge (pickle framing and memo, CBOR and msgpack heads).

Run:  /usr/bin/python3 hack/gen_blockhash_edge_vectors.py | gzip -9n > blockkeys/testdata/blockhash_edge_vectors.json.gz

The hash functions, NONE_HASH and the per-request extra keys are the ones of
hack/gen_blockhash_vectors.py (CPython's C pickle, cbor2, msgpack, hashlib,
python-xxhash from Debian, glued as vLLM glues them). This script only picks
inputs that sit on, just before and just after each place where an encoder
changes what it writes:

  pickle (sha256, xxhash), as CPython's C pickler (Modules/_pickle.c) writes
  protocol 5:
    - frames: a frame is committed when, at the START of saving an object, it
      already holds >= 64 KiB; a str/bytes payload >= 64 KiB is written outside
      any frame. Every string length (and mix of 1/2/3-byte UTF-8) from well
      below the point where a LoRA name / cache_salt first fills the frame up to
      past 64 KiB, and every block size whose token tuple fills it;
    - memo: BINGET (index < 256) vs LONG_BINGET for repeated interned strings;
    - SHORT_BINUNICODE / SHORT_BINBYTES (< 256 bytes) vs BINUNICODE / BINBYTES,
      MARK..TUPLE vs TUPLE1-3, BININT1/BININT2/BININT/LONG1.
    - BINUNICODE8 / BINBYTES8 need a string of 4 GiB: not generated.
  CBOR heads: 23/24, 255/256, 65535/65536 for string, byte and array lengths
  and for ints (negative ones too).
  msgpack: fixint 127/128, negative fixint -32/-33, int8..64, uint8..64,
  fixstr 31/32, str8/16/32, bin8/16/32, fixarray 15/16, array16/32.

Strings are stored as [[piece, count], ...] (concatenated, each piece repeated
count times) so 64 KiB inputs stay small in the file; generic extra keys use
the tagged values of gen_blockhash_vectors.py plus {"rep": that form} for str,
{"brep": [hex, count]} for bytes and {"u": n} for unsigned 64-bit ints.
"""

import hashlib
import json
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the work tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_blockhash_vectors as ref  # noqa: E402

PICKLE = ("sha256", "xxhash")
FRAME = 64 * 1024


def build(spec):
    return None if spec is None else "".join(p * n for p, n in spec)


def mixed(n, variant):
    """A str spec of exactly n UTF-8 bytes: ASCII, 2-byte or 3-byte runs."""
    if variant == 0:
        return [["x", n]]
    if variant == 1:
        return [["\u00e9", n // 2], ["x", n % 2]]
    return [["\u65e5", n // 3], ["y", n % 3]]


def main():
    cases = []
    nones = {}

    def add(name, algo, bs, tokens=None, token_gen=None, lora=None, salt=None, seed="0"):
        fn = ref.ALGOS[algo]
        if (algo, seed) not in nones:
            nones[(algo, seed)] = ref.none_hash(fn, seed).hex()
        none = bytes.fromhex(nones[(algo, seed)])
        toks = tokens if tokens is not None else ref.gen_tokens(token_gen)
        ds = ref.request_block_hashes(fn, none, bs, toks, build(lora), build(salt))
        c = {"name": name, "algo": algo, "seed": seed, "block_size": bs}
        if tokens is not None:
            c["token_ids"] = tokens
        else:
            c["token_gen"] = token_gen
        if lora is not None:
            c["lora"] = lora
        if salt is not None:
            c["salt"] = salt
        c["keys"] = [ref.wire(d) for d in ds]
        cases.append(c)

    # --- pickle frame edge reached by a LoRA name or cache_salt -------------
    # The frame holds the parent, the token tuple and then the string: the
    # first commit point moves with the block size and the token widths, so
    # scan from (64 KiB - that prefix - slack) to just past 64 KiB.
    for algo in PICKLE:
        dlen = len(ref.ALGOS[algo](""))
        for bs, start, step in ((1, 1, 1), (16, 1, 1), (16, 70000, 7919), (128, 1 << 20, 1)):
            tg = {"start": start, "step": step, "n": 2 * bs + 1}
            toks = ref.gen_tokens(tg)[:bs]
            prefix = len(ref.pickle.dumps((b"\0" * dlen, tuple(toks), None), protocol=5))
            lo = FRAME - prefix - 24
            lengths = set(range(lo, FRAME + 8))
            for field in ("lora", "salt"):
                for n in sorted(lengths):
                    spec = mixed(n, n % 3)
                    kw = {field: spec}
                    add(f"{algo}/frame-edge/{field}/bs={bs}/start={start}/len={n}", algo, bs, token_gen=tg, **kw)
        # salt after a 43,690-byte LoRA name: the edge is reached inside the
        # second string of the extra-keys tuple
        tg = {"start": 1, "step": 1, "n": 33}
        for n in range(21700, 21860):
            add(f"{algo}/frame-edge/salt-after-lora/len={n}", algo, 16, token_gen=tg,
                lora=[["\u00e9", 21845]], salt=mixed(n, n % 3))
        for name, lora, salt in (
            ("lora=21845xe-acute+21845xri", [["\u00e9", 21845], ["\u65e5", 21845]], None),
            ("salt=21845xe-acute+21845xri", None, [["\u00e9", 21845], ["\u65e5", 21845]]),
            ("lora=21845xe-acute/salt=21845xri", [["\u00e9", 21845]], [["\u65e5", 21845]]),
            ("lora=21845xri/salt=21845xe-acute", [["\u65e5", 21845]], [["\u00e9", 21845]]),
            ("lora=21845xri/salt=21845xri", [["\u65e5", 21845]], [["\u65e5", 21845]]),
            ("lora=32767xe-acute", [["\u00e9", 32767]], None),
        ):
            add(f"{algo}/frame-edge/{name}", algo, 16, token_gen=tg, lora=lora, salt=salt)

    # --- pickle frame edge reached inside the token tuple --------------------
    # ids of one opcode width (BININT1 2 B, BININT2 3 B, BININT 5 B, LONG1 7 B):
    # the block sizes around the one whose tuple fills the frame exactly.
    for algo in PICKLE:
        dlen = len(ref.ALGOS[algo](""))
        head = 2 + dlen + 1 + 1  # SHORT_BINBYTES parent, MEMOIZE, MARK
        for width, first in ((2, 7), (3, 300), (5, 1 << 20), (7, (1 << 31) + 5)):
            exact = (FRAME - head + width - 1) // width
            for bs in range(exact - 3, exact + 4):
                tg = {"start": first, "step": 0, "n": 2 * bs}
                add(f"{algo}/frame-edge/tokens/width={width}/bs={bs}", algo, bs, token_gen=tg)
                add(f"{algo}/frame-edge/tokens/width={width}/bs={bs}/lora", algo, bs, token_gen=tg, lora=[["L", 3]])

    # --- heads and opcode widths, every algorithm ----------------------------
    for algo in ref.ALGOS:
        for n in (1, 22, 23, 24, 25, 31, 32, 33, 254, 255, 256, 257, 300, 65534, 65535, 65536, 65537):
            tg = {"start": 1, "step": 1, "n": 40}
            add(f"{algo}/str-len/lora={n}", algo, 16, token_gen=tg, lora=[["a", n]])
            add(f"{algo}/str-len/salt={n}", algo, 16, token_gen=tg, salt=mixed(n, n % 3))
        for bs in (1, 15, 16, 17, 23, 24, 25, 255, 256, 257, 65535, 65536):
            blocks = 2 if bs < 1000 else 1
            add(f"{algo}/array-len/bs={bs}", algo, bs, token_gen={"start": 3, "step": 1, "n": blocks * bs})
        ids = [0, 1, 23, 24, 127, 128, 255, 256, 65535, 65536, (1 << 31) - 1, 1 << 31, (1 << 32) - 2, (1 << 32) - 1]
        for bs in (1, 16, 64, 128):
            toks = (ids * (2 * bs // len(ids) + 2))[: 2 * bs]
            add(f"{algo}/ids/bs={bs}", algo, bs, tokens=toks)
            add(f"{algo}/ids/bs={bs}/lora+salt", algo, bs, tokens=toks, lora=[["lo", 2]], salt=[["sa", 3]])
        # CPython's interned 1-char strings: lora "a" then salt "a" (BINGET)
        add(f"{algo}/same-1char", algo, 16, token_gen={"start": 1, "step": 1, "n": 32}, lora=[["\u00ff", 1]],
            salt=[["\u00ff", 1]])

    # --- generic extra keys (as published in BlockStored.extra_keys) -------
    def s(v):
        return {"s": v}

    def rep(piece, n):
        return {"rep": [[piece, n]]}

    ints = [0, 1, 23, 24, 127, 128, 255, 256, 65535, 65536, (1 << 32) - 1, 1 << 32, (1 << 63) - 1,
            -1, -24, -25, -32, -33, -128, -129, -256, -257, -32768, -32769, -65536, -65537,
            -(1 << 31), -(1 << 31) - 1, -(1 << 32), -(1 << 32) - 1, -(1 << 63)]
    extras = [
        [{"i": v} for v in ints],
        [{"u": (1 << 63)}, {"u": (1 << 64) - 1}, {"u": (1 << 63) + 1}],
        # tuples of every length class, nested
        [{"t": [s("k%d" % i) for i in range(n)]} for n in (0, 1, 2, 3, 4, 15, 16, 23, 24)],
        [{"t": [{"t": [{"t": [s("deep"), {"i": 7}]}, {"t": []}]}, s("x")]}],
        [{"t": [s("img%d" % i), {"i": i * 64}]} for i in range(20)],
        # bytes and str lengths around every head
        [{"b": "ab" * n} for n in (0, 1, 23, 24, 31, 32, 255, 256)],
        [{"brep": ["cd", 65535]}, {"brep": ["ef", 65536]}],
        [s(""), s("a"), s("a" * 23), s("a" * 24), s("a" * 31), s("a" * 32), rep("b", 255), rep("b", 256)],
        [rep("c", 65535), rep("d", 65536)],
        # more distinct interned singletons than a small table holds, repeated
        [s(c) for c in "abcdefghij"] + [s(c) for c in "jihgfedcba"] + [s(""), s("\u00ff"), s(""), s("\u00ff")],
    ]
    # memo indexes 254..258 for a repeated singleton: parent is memo 0, the
    # token tuple 1, then every str / non-empty tuple takes the next index
    for n in range(250, 258):
        extras.append([s("m%03d" % i) for i in range(n)] + [s("z"), s("z")])
    for n in range(124, 130):  # (str, tuple) pairs: two memo entries each
        extras.append([{"t": [s("p%03d" % i)]} for i in range(n)] + [s("z"), {"t": [s("z")]}])
    generic = []

    def add_generic(algo, ek, parent=None, tokens=None):
        fn = ref.ALGOS[algo]
        none = ref.none_hash(fn, "0")
        tokens = tokens or list(range(1000, 1016))
        d = ref.hash_block_tokens(fn, none, parent, tokens, tuple(to_py(x) for x in ek))
        generic.append({"algo": algo, "seed": "0", "parent": None if parent is None else parent.hex(),
                        "token_ids": tokens, "extra_keys": ek, "digest": d.hex(), "key": ref.wire(d)})

    for algo in ref.ALGOS:
        for ek in extras:
            add_generic(algo, ek)
        add_generic(algo, extras[2], parent=hashlib.sha256(b"p").digest()[: len(ref.ALGOS[algo](""))])
    # frame edge right before a memo reference: ("x"*n, "a", "a")
    for algo in PICKLE:
        for n in range(FRAME - 100, FRAME + 4):
            add_generic(algo, [rep("x", n), s("a"), s("a")])
            add_generic(algo, [{"t": [rep("y", n)]}, s("a"), {"t": [s("a")]}])

    json.dump({
        "generator": "hack/gen_blockhash_edge_vectors.py",
        "reference": ref.REFERENCE,
        "none_hashes": [{"algo": a, "seed": sd, "none_hash": h} for (a, sd), h in sorted(nones.items())],
        "cases": cases,
        "generic_extra_keys": generic,
    }, sys.stdout, separators=(",", ":"), ensure_ascii=True)
    sys.stdout.write("\n")


def to_py(v):
    """ref.to_py plus {"rep": [[piece, n], ...]} str, {"brep": [hex, n]} bytes
    and {"u": int} ints (unsigned 64-bit)."""
    if isinstance(v, dict) and "brep" in v:
        return bytes.fromhex(v["brep"][0]) * v["brep"][1]
    if isinstance(v, dict) and "rep" in v:
        return ref.fresh(build(v["rep"]))
    if isinstance(v, dict) and "u" in v:
        return int(v["u"])
    if isinstance(v, dict) and "t" in v:
        return tuple(to_py(x) for x in v["t"])
    return ref.to_py(v)


if __name__ == "__main__":
    main()
