#!/usr/bin/python3
"""kvevents_hostile_seeds.py: hostile seeds for kvevents' FuzzDecode corpus.

Run from the repository root: /usr/bin/python3 hack/kvevents_hostile_seeds.py
It writes kvevents/testdata/fuzz/FuzzDecode/hostile_* in Go's corpus format
(and touches no other seed). The payloads are encoded with the reference
msgpack implementation (python3-msgpack) where they are valid msgpack, and
by hand where a header lies about what follows: array counts of 2^32-1,
deep nesting, hashes of every width, invalid UTF-8 in strings. (The cap on
elements per message is tested in limits_test.go: its seed would be 16 MB.)
"""
import os
import struct

import msgpack

STORED = ["BlockStored", [1, 2], None, list(range(32)), 16, None, "GPU"]


def pack(v):
    return msgpack.packb(v, use_bin_type=True)


def array32(n):
    return b"\xdd" + struct.pack(">I", n)


SEEDS = {
    # a count far beyond the bytes that follow
    "hostile_events_2p32": b"\x92\xcb" + b"\x00" * 8 + array32(0xFFFFFFFF) + b"\x90",
    "hostile_hashes_2p32": b"\x92\xcb" + b"\x00" * 8 + b"\x91\x93\xabBlockStored" + array32(0xFFFFFFFF) + b"\x01",
    # extra keys nested deeper than the decoder follows
    "hostile_deep_extra_keys": pack([0.0, [STORED[:7] + [None, [[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]),
    # a longer legal event: 1000 hashes of every integer width
    "hostile_1000_hashes": pack([0.0, [["BlockRemoved", [((i * 7919) << (i % 50)) % (1 << 64) - (1 << 63) * (i % 2) for i in range(1000)], "GPU"]]]),
    # invalid UTF-8 where strings are expected
    "hostile_invalid_utf8_medium": pack([0.0, [["BlockRemoved", [1], b"\xff\xfe".decode("latin-1")]]]).replace(
        b"\xc3\xbf\xc3\xbe", b"\xff\xfe\xff\xfe"),
    "hostile_map_batch_unknown_keys": pack({"ts": 0.0, "events": [STORED], "\xff": [1] * 300, "dp_rank": 1 << 40}),
}


def go_literal(b):
    return "".join("\\x%02x" % c for c in b)


def main():
    d = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kvevents", "testdata", "fuzz", "FuzzDecode")
    os.makedirs(d, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(d, name), "w") as f:
            f.write('go test fuzz v1\n[]byte("%s")\n' % go_literal(data))


if __name__ == "__main__":
    main()
