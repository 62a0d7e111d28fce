#!/usr/bin/python3
"""Wire fixtures of every engine version and event shape kvindex decodes.

Writes kvevents/testdata/fixtures/<name>.msgpack (the payload frame of one
ZeroMQ message) and kvevents/testdata/fixtures/manifest.json (per fixture: the
topic, seq, engine and the index contents expected after applying it: the
block keys each (pod, tier) must hold, computed here with the reference block
hashing of gen_blockhash_vectors.py, sha256_cbor, PYTHONHASHSEED "0", block
size 4). Payloads are packed with Debian's python3-msgpack the way msgspec
encodes the engines' structs:

  - array_like structs (vLLM <= 0.23, SGLang): [tag, field1, field2, ...], the
    trailing fields that equal their default dropped (omit_defaults);
  - map structs (vLLM >= 0.24): {"type": tag, field: value, ...} in declaration
    order, fields with a default dropped when equal to it, fields without a
    default (lora_id, medium, lora_name) always written, None included.

Run: /usr/bin/python3 hack/gen_kvevent_fixtures.py  (kvevents/interop tests
replay the committed files through real libzmq via hack/kvpublisher.py).
"""

import json
import os
import sys

import msgpack

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_blockhash_vectors as ref  # noqa: E402
import gen_engine_hash_vectors as engines  # noqa: E402
import gen_sglang_eagle_vectors as eagle  # noqa: E402

OUT = os.path.join(HERE, "..", "kvevents", "testdata", "fixtures")
FUZZ = os.path.join(HERE, "..", "kvevents", "testdata", "fuzz", "FuzzDecode")
FN = ref.ALGOS["sha256_cbor"]
NONE = ref.none_hash(FN, "0")
BS = 4
TOKENS = list(range(1, 9))  # two blocks


def chain(tokens, extras=None):
    """Digests of tokens' full blocks; extras[i] is block i's extra-keys tuple."""
    out, parent = [], None
    for i in range(0, len(tokens) - BS + 1, BS):
        e = extras[i // BS] if extras else None
        d = ref.hash_block_tokens(FN, NONE, parent, tokens[i:i + BS], e)
        out.append(d)
        parent = d
    return out


def keys(ds):
    return [ref.wire(d) for d in ds]


# BlockStored fields in declaration order, with their msgspec defaults
# (REQUIRED = no default: always written).
REQUIRED = object()
STORED = [("block_hashes", REQUIRED), ("parent_block_hash", REQUIRED), ("token_ids", REQUIRED),
          ("block_size", REQUIRED), ("lora_id", REQUIRED), ("medium", REQUIRED), ("lora_name", REQUIRED),
          ("extra_keys", None), ("group_idx", None), ("kv_cache_spec_kind", None),
          ("kv_cache_spec_sliding_window", None), ("locality", None), ("ownership", None)]
REMOVED = [("block_hashes", REQUIRED), ("medium", REQUIRED), ("group_idx", None),
           ("remaining_copy_counts", None)]


def ev_map(tag, spec, **kw):
    out = {"type": tag}
    for name, default in spec:
        v = kw.get(name, None)
        if default is REQUIRED or v != default:
            out[name] = v
    return out


def ev_array(tag, spec, **kw):
    vals = [kw.get(name, None) for name, _ in spec]
    defaults = [d for _, d in spec]
    while vals and defaults[len(vals) - 1] is not REQUIRED and vals[-1] == defaults[len(vals) - 1]:
        vals.pop()
    return [tag] + vals


def stored(form, **kw):
    return (ev_map if form == "map" else ev_array)("BlockStored", STORED, **kw)


def removed(form, **kw):
    return (ev_map if form == "map" else ev_array)("BlockRemoved", REMOVED, **kw)


def batch(events, dp_rank=0, omit_rank=False):
    b = [1700000000.5, events]
    if not omit_rank:
        b.append(dp_rank)
    return msgpack.packb(b, use_bin_type=True)


def s64(h):
    return h - (1 << 64) if h >= 1 << 63 else h


def main():
    os.makedirs(OUT, exist_ok=True)
    os.makedirs(FUZZ, exist_ok=True)
    fixtures = []
    h = keys(chain(TOKENS))

    def add(name, version, payload, expect, parity, topic=None, engine="vllm"):
        with open(os.path.join(OUT, name + ".msgpack"), "wb") as f:
            f.write(payload)
        # The same payload seeds the decoder's fuzz corpus (go test fuzz v1).
        with open(os.path.join(FUZZ, name), "w") as f:
            f.write('go test fuzz v1\n[]byte("%s")\n' % "".join("\\x%02x" % c for c in payload))
        fixtures.append({"name": name, "engine_version": version, "engine": engine,
                         "topic": topic or ("kv@pod-%s@model-a" % name), "expect": expect,
                         "parity_matches": parity[0], "parity_unverified": parity[1]})

    def want(tier, ks, pod=None):
        return {"tier": tier, "keys": ks, **({"pod": pod} if pod else {})}

    # vLLM ~0.10-0.23: tagged arrays, [ts, events] without a DP rank.
    add("vllm_0_10_array", "vLLM 0.10-0.23 (array_like)", batch([
        stored("array", block_hashes=h, parent_block_hash=None, token_ids=TOKENS, block_size=BS, medium="GPU"),
    ], omit_rank=True), [want("gpu", h)], (2, 0))

    # vLLM >= 0.24: maps with "type", omit_defaults; a removal.
    add("vllm_0_24_map", "vLLM >= 0.24 (map, omit_defaults)", batch([
        stored("map", block_hashes=h, parent_block_hash=None, token_ids=TOKENS, block_size=BS, medium="GPU"),
        removed("map", block_hashes=h[1:], medium="GPU"),
    ]), [want("gpu", h[:1])], (2, 0))

    # Typed extra keys (LoRA, multimodal) and one key nobody knows yet.
    lora = keys(chain(TOKENS, [("sql-lora",), ("sql-lora",)]))
    mm = keys(chain(TOKENS[:4], [(("img-A", 0),)]))
    future = 0x1234567890ABCDEF
    add("vllm_typed_extra_keys", "vLLM typed extra_keys (tagged maps)", batch([
        stored("map", block_hashes=lora, parent_block_hash=None, token_ids=TOKENS, block_size=BS, lora_id=1,
               medium="GPU", lora_name="sql-lora",
               extra_keys=[[{"type": "lora", "name": "sql-lora"}], [{"type": "lora", "name": "sql-lora"}]]),
        stored("map", block_hashes=mm, parent_block_hash=None, token_ids=TOKENS[:4], block_size=BS, medium="GPU",
               extra_keys=[[{"type": "mm", "modality": "image", "hash": "img-A", "block_offset": 0}]]),
        stored("map", block_hashes=[future], parent_block_hash=None, token_ids=TOKENS[:4], block_size=BS,
               medium="GPU", extra_keys=[[{"type": "speculative_future_key", "weight": 0.5}]]),
    ]), [want("gpu", lora + mm + [future])], (3, 1))

    # Legacy raw tuples (vLLM 0.17+ extra_keys): LoRA name as a bare string.
    add("vllm_legacy_extra_keys", "vLLM 0.17+ extra_keys (raw tuples)", batch([
        stored("array", block_hashes=lora, parent_block_hash=None, token_ids=TOKENS, block_size=BS, lora_id=1,
               medium="GPU", lora_name="sql-lora", extra_keys=[["sql-lora"], ["sql-lora"]]),
    ]), [want("gpu", lora)], (2, 0))

    # Hybrid: group 0 full attention, group 1 sliding window.
    add("vllm_hybrid_groups", "vLLM hybrid (group_idx, kv_cache_spec_kind)", batch([
        stored("map", block_hashes=h, parent_block_hash=None, token_ids=TOKENS, block_size=BS, medium="GPU",
               group_idx=0, kv_cache_spec_kind="full_attention"),
        stored("map", block_hashes=h, parent_block_hash=None, token_ids=TOKENS, block_size=BS, medium="GPU",
               group_idx=1, kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=4),
        removed("map", block_hashes=h[:1], medium="GPU", group_idx=1),  # out of window: match unchanged
        removed("map", block_hashes=h[1:], medium="GPU", group_idx=0),  # full attention evicts block 1
    ]), [want("gpu", h[:1])], (2, 0))

    # Copies: block 0 stored twice, removed once; block 1 removed with an
    # explicit remaining count of 0.
    add("vllm_copies", "vLLM remaining_copy_counts and duplicate copies", batch([
        stored("map", block_hashes=h, parent_block_hash=None, token_ids=TOKENS, block_size=BS, medium="GPU"),
        stored("map", block_hashes=h[:1], parent_block_hash=None, token_ids=TOKENS[:4], block_size=BS, medium="GPU"),
        removed("map", block_hashes=h[:1], medium="GPU"),
        removed("map", block_hashes=h[1:], medium="GPU", remaining_copy_counts=[0]),
    ]), [want("gpu", h[:1])], (3, 0))

    # Locality and media.
    add("vllm_locality_media", "vLLM locality/ownership, connector media", batch([
        stored("map", block_hashes=h, parent_block_hash=None, token_ids=TOKENS, block_size=BS, medium="GPU",
               locality="REMOTE", ownership="pod-b"),
        stored("map", block_hashes=h[:1], parent_block_hash=None, token_ids=[], block_size=0, medium="CPU_PINNED"),
        stored("map", block_hashes=h[1:], parent_block_hash=None, token_ids=[], block_size=0,
               medium="SHARED_STORAGE"),
    ]), [want("cpu", h[:1]), want("external", h[1:])], (0, 2))

    # llm-d storage-tier publisher: events packed as msgpack bytes.
    packed = [msgpack.packb(stored("array", block_hashes=h, parent_block_hash=None, token_ids=TOKENS,
                                   block_size=BS, medium="DISK"), use_bin_type=True)]
    add("llmd_packed_events", "llm-d storage-tier publisher (pre-packed events)", batch(packed),
        [want("disk", h)], (2, 0))

    # SGLang with snapshots enabled (epoch in the topic), one BlockStored per
    # page, a salted request's metadata map; hashes are SGLang's own (signed
    # int64, gen_engine_hash_vectors.py), which the salt does not enter:
    # both pages match.
    sg = engines.sglang_keys(TOKENS, BS)
    add("sglang_epoch_salt", "SGLang (array_like, epoch topic, page events, cache_salt)", batch([
        ["BlockStored", [sg[0]], None, TOKENS[:BS], BS, None, "GPU", {"cache_salt": "salt-1"}],
        ["BlockStored", [sg[1]], sg[0], TOKENS[BS:], BS, None, "GPU"],
    ]), [want("gpu", [k & (2**64 - 1) for k in sg], pod="pod-sg")], (2, 0),
        topic="kv@pod-sg@model-a\x00sgl-kv-epoch=e1", engine="sglang")
    # EAGLE token pairs (bigram keys of TOKENS + [9]): SGLang hashes both
    # tokens of every pair, one BlockStored per page; the pages are rehashed
    # from the pairs and match.
    pairs = [[t, t + 1] for t in TOKENS]
    eg, _ = eagle.cache_request(TOKENS + [TOKENS[-1] + 1], BS)
    add("sglang_eagle", "SGLang (EAGLE token pairs)", batch([
        ["BlockStored", [eg[0]], None, pairs[:BS], BS, None, "GPU"],
        ["BlockStored", [eg[1]], eg[0], pairs[BS:], BS, None, "GPU"],
    ]), [want("gpu", [k & (2**64 - 1) for k in eg], pod="pod-sge")], (2, 0),
        topic="kv@pod-sge@model-a\x00sgl-kv-epoch=e1", engine="sglang")

    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump({"generator": "hack/gen_kvevent_fixtures.py", "hash": "sha256_cbor", "seed": "0",
                   "block_size": BS, "fixtures": fixtures}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
