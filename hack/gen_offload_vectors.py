#!/usr/bin/python3
"""Events of vLLM's offloading connector, as its self-describing tracker emits them.

Source: vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/offloading/
events.py (OffloadingEventsTracker, read 2026-11-27). What it publishes:

  - a stored chunk is one BlockStored naming the chunk's constituent per-block
    hashes (_build_event_metadata: req.block_hashes[chunk_idx*hashes_per_chunk :
    (chunk_idx+1)*hashes_per_chunk]), the chunk's tokens, block_size =
    tokens_per_block, parent = the request's hash before the chunk (None for
    chunk 0), its group_idx and kv_cache_spec_kind, medium "CPU" or "STORAGE";
  - its eviction is one BlockRemoved fanning out to the same hashes (hashes
    of several chunks of one group in one event);
  - chunks are aligned per request, so two requests sharing a prefix that
    ends inside a chunk each announce the shared hashes with their own chunk
    (the chunks' keys, their last hashes, differ): the module docstring asks
    consumers to reference-count repeated store/remove announcements;
  - a chunk it has no metadata for (non-full-attention groups, a promotion
    not seen as a primary-tier hit) is a placeholder (_placeholder_stored):
    BlockStored with ONE hash, get_offload_block_hash(key) = the chunk's last
    block's hash, no parent, token_ids [], block_size 0; its removal names the
    same one hash. It proves that one block on that medium, nothing of the
    chunk's other blocks, its parent or its tokens.

Scenario of issue 32: requests A and B share 3 blocks, 2 blocks per chunk
(block size 4, 8 tokens per chunk). A offloads its two chunks; B's first
chunk is A's (the manager finds it stored and does not store it again), its
second chunk [a2, b3] re-announces a2; evicting A's second chunk removes a2
and a3, yet B's chunk still holds a2: the CPU tier holds B's 4 blocks. Then
A's second chunk comes back to the CPU unobserved (a placeholder naming a3
only) and goes again (a placeholder removal of a3): a2 stays.

Hashes: the reference block hashing of gen_blockhash_vectors.py (sha256_cbor,
PYTHONHASHSEED "0", block size 4), payloads packed with Debian's
python3-msgpack in vLLM >= 0.24's map form (gen_kvevent_fixtures.py's
encoders). Writes kvevents/testdata/offload/step<N>.msgpack and manifest.json
(per step the CPU keys the pod must hold exactly afterwards).

Run: /usr/bin/python3 hack/gen_offload_vectors.py
"""

import json
import os
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_kvevent_fixtures as fx  # noqa: E402

OUT = os.path.join(HERE, "..", "kvevents", "testdata", "offload")
BS = fx.BS
HASHES_PER_CHUNK = 2
TOKENS_A = list(range(1, 4 * BS + 1))                      # 4 blocks
TOKENS_B = TOKENS_A[:3 * BS] + list(range(101, 101 + BS))  # shares 3 blocks


def chunk_store(tokens, hashes, chunk):
    lo, hi = chunk * HASHES_PER_CHUNK, (chunk + 1) * HASHES_PER_CHUNK
    return fx.stored("map", block_hashes=hashes[lo:hi], parent_block_hash=hashes[lo - 1] if lo else None,
                     token_ids=tokens[lo * BS:hi * BS], block_size=BS, lora_id=None, medium="CPU",
                     lora_name=None, group_idx=0, kv_cache_spec_kind="full_attention")


def chunk_remove(hashes, chunk):
    lo, hi = chunk * HASHES_PER_CHUNK, (chunk + 1) * HASHES_PER_CHUNK
    return fx.removed("map", block_hashes=hashes[lo:hi], medium="CPU", group_idx=0)


def main():
    os.makedirs(OUT, exist_ok=True)
    a, b = fx.keys(fx.chain(TOKENS_A)), fx.keys(fx.chain(TOKENS_B))
    assert a[:3] == b[:3] and a[3] != b[3]
    placeholder_a3 = fx.stored("map", block_hashes=[a[3]], parent_block_hash=None, token_ids=[], block_size=0,
                               lora_id=None, medium="CPU", lora_name=None, group_idx=0)
    steps = [
        ("A offloads chunks 0 and 1", [chunk_store(TOKENS_A, a, 0), chunk_store(TOKENS_A, a, 1)], a),
        ("B offloads its chunk 1 [a2, b3]; chunk 0 is A's", [chunk_store(TOKENS_B, b, 1)], a + [b[3]]),
        ("A's chunk 1 evicted: a2 and a3 removed once", [chunk_remove(a, 1)], b),
        ("A's chunk 1 back, unobserved: a placeholder naming a3", [placeholder_a3], b + [a[3]]),
        ("the placeholder chunk evicted: a3 removed", [fx.removed("map", block_hashes=[a[3]], medium="CPU",
                                                                   group_idx=0)], b),
    ]
    manifest = []
    for i, (what, events, cpu) in enumerate(steps):
        name = "step%d" % i
        with open(os.path.join(OUT, name + ".msgpack"), "wb") as f:
            f.write(fx.batch(events))
        manifest.append({"name": name, "what": what, "cpu": cpu})
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump({"generator": "hack/gen_offload_vectors.py", "hash": "sha256_cbor", "seed": "0",
                   "block_size": BS, "tokens_a": TOKENS_A, "tokens_b": TOKENS_B, "steps": manifest}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
