#!/usr/bin/python3
"""Generate blockkeys/testdata/sglang_eagle_vectors.json: SGLang's page
hashes and KV events with EAGLE speculative decoding (bigram keys).

Run:  /usr/bin/python3 hack/gen_sglang_eagle_vectors.py > blockkeys/testdata/sglang_eagle_vectors.json

Nothing here is a reimplementation of a hash: every digest is CPython's
hashlib fed exactly the calls SGLang makes (sgl-project/sglang):

  - python/sglang/srt/mem_cache/utils.py convert_to_bigram_key (read at
    00c380981d6122389a1634d2aed388030b90c8a2): [t0..t_{n-1}] ->
    [(t0,t1), (t1,t2), ..., (t_{n-2},t_{n-1})].
  - radix_cache.py (read at 006b0e3d317f1cd4a7300e919a4eaa878b1947e7):
    cache_unfinished_req / cache_finished_req convert the request's tokens
    to bigram keys when is_eagle and page-align them (page_align_keys);
    compute_node_hash_values hashes each page with get_hash_str(page_tokens,
    prior_hash=parent's last page hash, None for the root's children);
    _record_store_event publishes one BlockStored per page:
    block_hashes=[hash_str_to_int64(h)], parent_block_hash=previous page's
    int64 (None for the first), token_ids=the page's keys (the bigram
    tuples), block_size=len(page), medium="GPU".
  - get_hash_str (mem_cache/hicache_storage.py, the tuple branch; moved to
    mem_cache/utils.py and to the native cpp_utils/hash_binding.cpp
    fill_bigram_page, read at 30a90c4f837192e0aa4dafcc12e38c315fb4185c, which
    writes the same uint32 words): sha256(); update(bytes.fromhex(prior)) if
    prior; then for each key, for each element of the tuple,
    update(elem.to_bytes(4, "little", signed=False)). hash_str_to_int64: the
    first 16 hex digits as a signed int64.
  - The events go out as msgspec msgpack, array_like with the tag first
    (disaggregation/kv_events.py): [ts, [events], dp_rank]; a tuple is a
    msgpack array. python3-msgpack writes the same bytes for these values.

Each vector: page size P, the prompt's tokens, "keys" (the int64 of every
full page: floor((n-1)/P) of them) and "payload" (hex of the KVEventBatch the
engine publishes when it caches the prompt).
"""

import hashlib
import json
import random
import sys

import msgpack


def convert_to_bigram_key(tokens):
    if len(tokens) < 2:
        return []
    return [(tokens[i], tokens[i + 1]) for i in range(len(tokens) - 1)]


def page_align_keys(key, page_size):
    if page_size == 1:
        return key
    return key[: len(key) // page_size * page_size]


def get_hash_str(token_ids, prior_hash=None):
    hasher = hashlib.sha256()
    if prior_hash:
        hasher.update(bytes.fromhex(prior_hash))
    for t in token_ids:
        if isinstance(t, tuple):
            for elem in t:
                hasher.update(elem.to_bytes(4, byteorder="little", signed=False))
        else:
            hasher.update(t.to_bytes(4, byteorder="little", signed=False))
    return hasher.hexdigest()


def hash_str_to_int64(hash_str):
    v = int(hash_str[:16], 16)
    return v - 2**64 if v >= 2**63 else v


def cache_request(tokens, page):
    """The pages SGLang caches for tokens and the events it publishes."""
    keys = page_align_keys(convert_to_bigram_key(tokens), page)
    events, out, prior, parent = [], [], None, None
    for start in range(0, len(keys), page):
        page_keys = keys[start:start + page]
        prior = get_hash_str(page_keys, prior)
        h = hash_str_to_int64(prior)
        out.append(h)
        events.append(["BlockStored", [h], parent, [list(p) for p in page_keys], len(page_keys), None, "GPU"])
        parent = h
    payload = msgpack.packb([1764000000.5, events, 0], use_bin_type=True)
    return out, payload.hex()


def main():
    rnd = random.Random(32)
    cases = [
        (4, list(range(1, 10))),  # 9 tokens, 8 pairs: exactly 2 pages
        (4, list(range(1, 9))),   # 8 tokens, 7 pairs: 1 page (the 8th token only closes the 7th pair)
        (1, [0, 1, 2**31, 2**32 - 1]),  # every byte of a uint32, page size 1 (SGLang's default)
        (16, [rnd.randrange(0, 152064) for _ in range(16 * 4 + 1)]),
        (16, [rnd.randrange(0, 2**32) for _ in range(16 * 3 + 9)]),
        (3, [7]),  # one token: no pair, no page
    ]
    vecs = []
    for page, tokens in cases:
        keys, payload = cache_request(tokens, page)
        assert len(keys) == max(0, (len(tokens) - 1) // page)
        vecs.append({"block_size": page, "tokens": tokens, "keys": keys, "payload": payload})
    json.dump({"sglang_eagle": vecs}, fp=sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
