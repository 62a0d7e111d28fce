#!/usr/bin/python3
"""kvpublisher.py: a vLLM/SGLang/TensorRT-LLM KV-event publisher on real libzmq (pyzmq).

Used by kvindex's interop and end-to-end tests, and handy to poke a running
kvindexd by hand. Needs Debian's python3-zmq and python3-msgpack; run it with
/usr/bin/python3.

Usage:
  /usr/bin/python3 hack/kvpublisher.py --endpoint tcp://127.0.0.1:PORT --mode connect|bind
                                       [--replay-endpoint tcp://127.0.0.1:PORT] [--replay-legacy]
                                       [--buffer-steps N] [--no-wait]

  --mode bind     the publisher binds ENDPOINT and kvindexd connects (per-pod topology,
                  like vLLM with endpoint "tcp://*:5557")
  --mode connect  the publisher connects to ENDPOINT where kvindexd's SUB is bound
                  (central topology, like vLLM with endpoint "tcp://indexer:5557")
  --snapshot-endpoint  also bind a ROUTER serving SGLang's snapshot-v1 protocol: the
                  publisher mirrors the blocks of every "sglang" batch (published or not);
                  on ["", "snapshot-v1"] it publishes an empty barrier batch at the next seq
                  with topic <topic of the last batch> + "\x00sgl-kv-snapshot=<id>" and
                  answers ["", "header", [1, epoch, rank, resume_seq, barrier_seq, id, n]],
                  ["", "chunk", [[parent, [hash]], ...]], ["", "end", ""]. --epoch names the
                  epoch in the header (topics carry it as the test writes them).
  --replay-endpoint  also bind a ROUTER serving vLLM's replay protocol for everything
                  published: request [b"", start_seq(8B BE)], replies
                  [b"", topic, seq8, payload] (vLLM >= 0.26) or, with --replay-legacy,
                  [b"", seq8, payload] (vLLM <= 0.25), then an end marker seq8 = ff*8 with
                  an empty payload (and an empty topic in the >= 0.26 format).

The socket is an XPUB so the script knows when a subscriber is attached: it prints
"ready" on stdout once the first subscription arrives (nothing is lost to the ZeroMQ
slow-joiner problem), then reads JSON lines on stdin, one action per line. With
--no-wait it reads them at once and prints nothing (an engine that published before
any subscriber: live batches go nowhere, the replay buffer and snapshot mirror keep
them); {"echo": "ready"} and {"wait_subscriber": true} then synchronise.

  {"topic": "kv@pod-a@model", "seq": 0, "form": "array"|"map"|"sglang",
   "bytes_hashes": false, "ts": 0.0, "dp_rank": 0 | null, "omit_dp_rank": false,
   "skip_live": false,
   "events": [
     {"type": "BlockStored", "block_hashes": [...], "parent_block_hash": null,
      "token_ids": [...], "block_size": 16, "medium": "GPU", "lora_name": null,
      "lora_id": null, "extra_keys": null, "group_idx": null, "cache_salt": null},
     {"type": "BlockRemoved", "block_hashes": [...], "medium": null},
     {"type": "AllBlocksCleared"}]}
      publish one batch as [topic, seq (8B BE), msgpack payload].
      form "array": vLLM <= 0.23 tagged arrays; "map": vLLM >= 0.24 maps; "sglang":
      SGLang arrays (hashes as signed int64, {"cache_salt": ...} 8th element).
      Like vLLM's msgspec omit_defaults, None-valued trailing array fields and
      None-valued map fields are left out.
      Hashes are ints (any size/sign) or hex strings (sent as bytes). With
      "bytes_hashes": true int hashes go out as 32-byte digests whose last 8 bytes
      are the value (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0).
      "skip_live": true records the batch for replay but does not publish it
      (simulates a message lost on the live stream).
      SGLang page hashes (form "sglang"): an event with "hash_tokens": true gets its
      hashes computed here from token_ids, as SGLang does (python/sglang/srt/mem_cache/
      utils.py get_hash_str + hash_str_to_int64: SHA-256 over the parent page's digest,
      none for a chain's first page, then each token as uint32 LE; the first 8 digest
      bytes as a signed int64), pages of block_size tokens continuing the chain of
      "prefix_tokens" (default []); it is sent as one event per page, as SGLang's
      _record_store_event sends them (BlockStored with the page's parent and tokens,
      BlockRemoved with the page's hash).
      form "trtllm": TensorRT-LLM's ZMQ streaming publisher (NVIDIA/TensorRT-LLM
      tensorrt_llm/_torch/pyexecutor/kv_cache_events.py, PR #17023): events are maps
      tagged "type" (msgspec tag=True, omit_defaults), BlockStored with exactly
      type, block_hashes, parent_block_hash, token_ids, block_size, lora_id (nil),
      medium ("GPU"), lora_name (nil); BlockRemoved with type, block_hashes, medium;
      the batch [ts, events, data_parallel_rank]; hashes signed int64. With
      "hash_tokens": true the block keys are computed here from token_ids as its KV
      cache manager V2 does (tensorrt_llm/runtime/kv_cache_manager_v2/
      _block_radix_tree.py: SHA-256(parent key + uint32 LE tokens) from the root key
      SHA-256(b"\x00"), or with "cache_salt" the salted root (salt id: BLAKE3, from
      blockkeys/testdata/trt_salt_ids.json); the wire hash is the
      first 8 key bytes as a signed int64, StreamingEventSink::wireHash), continuing
      "prefix_tokens"; consecutive blocks go in one BlockStored, as it coalesces them.
      Replay for it is the >= 0.26 layout (with the topic).
      form "llmd-storage": llm-d's filesystem offload connector (llm-d/llm-d-kv-cache
      kv_connectors/llmd_fs_backend/llmd_fs_backend/event_publisher.py,
      StorageEventPublisher; PR #571): the batch is [ts, [bin, ...]] with no DP rank,
      each bin holding one msgpack-encoded event array; BlockStored is
      ["BlockStored", [hash, ...], 0 (parent), [] (no tokens), 0 (block size), nil,
      medium], BlockRemoved ["BlockRemoved", [hash, ...], medium]; medium
      "SHARED_STORAGE" (default) or "OBJECT_STORE"; hashes are the low 64 bits of the
      offload key's block hash, unsigned (_hash_to_uint64). Its topic is
      kv@<MEDIUM>@<model> and its seq starts at 1: the test writes both.
      Map form only (vLLM >= 0.24 maps, vllm/distributed/kv_events.py): "session_id"
      (vllm-project/vllm PR #51381: optional, on GPU BlockStored of prefix-cache stores
      and reuse reports, the triggering request's session) and "ownership" (PR #52067)
      are sent as BlockStored keys after the other optional fields, left out when None
      as msgspec's omit_defaults does; "extra_fields" {key: value} adds keys kvindex
      does not know (e.g. "event_version"), which it must skip.
  {"sleep": seconds}
  {"echo": "word"}               print word on stdout once every earlier line is done
  {"wait_subscriber": true}      block until a subscription arrives (with --no-wait)
  {"raw_frames": ["hex", ...]}   send these frames as one multipart message
                                 (malformed-input tests)

When stdin ends it flushes, prints "done" and exits.
"""

import argparse
import json
import queue
import sys
import threading
import time

import msgpack
import zmq

END_SEQ = b"\xff" * 8
U64 = (1 << 64) - 1


def vllm_hash(h, bytes_hashes):
    if isinstance(h, str):
        return bytes.fromhex(h)
    if bytes_hashes:
        return (h & U64).to_bytes(32, "big")
    if h >= (1 << 64) or h < -(1 << 63):
        return h & U64  # msgpack ints are 64-bit; vLLM sends digest & (2**64-1)
    return h


def sglang_hash(h):
    if isinstance(h, str):
        return bytes.fromhex(h)
    h &= U64
    return h - (1 << 64) if h >= (1 << 63) else h


def sglang_pages(tokens, page, prefix):
    """(parent, hash, page tokens) of each page of tokens after prefix (hashlib)."""
    import hashlib
    out, prior, parent = [], None, None
    allt = list(prefix) + list(tokens)
    for i in range(0, len(allt) - page + 1, page):
        h = hashlib.sha256()
        if prior:
            h.update(prior)
        for t in allt[i:i + page]:
            h.update(t.to_bytes(4, byteorder="little", signed=False))
        prior = h.digest()
        v = int.from_bytes(prior[:8], "big")
        v = v - (1 << 64) if v >= 1 << 63 else v
        if i >= len(prefix):
            out.append((parent, v, allt[i:i + page]))
        parent = v
    return out


def expand_sglang(events):
    out = []
    for ev in events:
        if not ev.get("hash_tokens"):
            out.append(ev)
            continue
        pages = sglang_pages(ev.get("token_ids", []), ev["block_size"], ev.get("prefix_tokens", []))
        for parent, h, toks in pages:
            e = {k: v for k, v in ev.items() if k not in ("hash_tokens", "prefix_tokens")}
            e["block_hashes"] = [h]
            if ev["type"] == "BlockStored":
                e["parent_block_hash"], e["token_ids"] = parent, toks
            else:
                e.pop("token_ids", None)
                e.pop("block_size", None)
            out.append(e)
    return out


def trt_blocks(tokens, block, prefix, salt=None):
    """(parent wire hash or None, wire hash) of each block of tokens after prefix."""
    import hashlib
    scope = b"\x00"
    if salt is not None:
        # The salt id is the first 8 bytes of BLAKE3(salt), read LE
        # (kv_cache_hash.py get_cache_salt_id). hashlib has no BLAKE3: the
        # ids come from blockkeys/testdata/trt_salt_ids.json (npm hash-wasm,
        # hack/blake3/gen-salt-vectors.mjs); other salts are refused.
        import os
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "blockkeys", "testdata",
                               "trt_salt_ids.json")) as f:
            ids = {c["salt"]: int(c["salt_id"]) for c in json.load(f)["trtllm_salt_ids"]}
        if salt not in ids:
            raise ValueError("no BLAKE3 salt id for %r in trt_salt_ids.json" % salt)
        scope = b"\x02" + ids[salt].to_bytes(8, "little")
    key = hashlib.sha256(scope).digest()
    out, parent = [], None
    allt = list(prefix) + list(tokens)
    for i in range(0, len(allt) - block + 1, block):
        h = hashlib.sha256(key)
        for t in allt[i:i + block]:
            h.update(t.to_bytes(4, "little"))
        key = h.digest()
        v = int.from_bytes(key[:8], "big")
        v = v - (1 << 64) if v >= 1 << 63 else v
        if i >= len(prefix):
            out.append((parent, v))
        parent = v
    return out


def expand_trtllm(events):
    out = []
    for ev in events:
        if not ev.get("hash_tokens"):
            out.append(ev)
            continue
        blocks = trt_blocks(ev.get("token_ids", []), ev["block_size"], ev.get("prefix_tokens", []),
                            ev.get("cache_salt"))
        e = {k: v for k, v in ev.items() if k not in ("hash_tokens", "prefix_tokens", "cache_salt")}
        e["block_hashes"] = [h for _, h in blocks]
        if ev["type"] == "BlockStored":
            e["parent_block_hash"] = blocks[0][0] if blocks else None
        out.append(e)
    return out


def encode_trtllm(ev):
    kind = ev["type"]
    hashes = [sglang_hash(h) for h in ev.get("block_hashes", [])]
    if kind == "BlockStored":
        parent = ev.get("parent_block_hash")
        out = {"type": kind, "block_hashes": hashes, "parent_block_hash": None if parent is None else sglang_hash(parent),
               "token_ids": ev.get("token_ids", []), "block_size": ev.get("block_size", 0), "lora_id": None,
               "medium": ev.get("medium") or "GPU", "lora_name": None}
        for k in ("mm_keys", "group_idx", "locality"):
            if ev.get(k) is not None:
                out[k] = ev[k]
        return out
    if kind == "BlockRemoved":
        return {"type": kind, "block_hashes": hashes, "medium": ev.get("medium") or "GPU"}
    return {"type": kind}


def encode_llmd_storage(ev):
    kind = ev["type"]
    hashes = [h & U64 for h in ev.get("block_hashes", [])]
    medium = ev.get("medium") or "SHARED_STORAGE"
    if kind == "BlockStored":
        out = [kind, hashes, 0, [], 0, None, medium]
    elif kind == "BlockRemoved":
        out = [kind, hashes, medium]
    else:
        out = [kind]
    # events are packed, then the list of packed bytes is packed again
    return msgpack.packb(out, use_bin_type=True)


def trim(fields):
    while fields and fields[-1] is None:
        fields.pop()
    return fields


def encode_event(ev, form, bytes_hashes):
    kind = ev["type"]
    if form == "trtllm":
        return encode_trtllm(ev)
    if form == "llmd-storage":
        return encode_llmd_storage(ev)
    if form == "sglang":
        hashes = [sglang_hash(h) for h in ev.get("block_hashes", [])]
        if kind == "BlockStored":
            parent = ev.get("parent_block_hash")
            out = [kind, hashes, None if parent is None else sglang_hash(parent),
                   ev.get("token_ids", []), ev.get("block_size", 0), ev.get("lora_id"),
                   ev.get("medium")]
            if ev.get("cache_salt") is not None:
                out.append({"cache_salt": ev["cache_salt"]})
            return out
        if kind == "BlockRemoved":
            return [kind, hashes, ev.get("medium")]
        return [kind]
    hashes = [vllm_hash(h, bytes_hashes) for h in ev.get("block_hashes", [])]
    if kind == "BlockStored":
        parent = ev.get("parent_block_hash")
        names = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                 "medium", "lora_name", "extra_keys", "group_idx"]
        values = [hashes, None if parent is None else vllm_hash(parent, bytes_hashes),
                  ev.get("token_ids", []), ev.get("block_size", 0), ev.get("lora_id"),
                  ev.get("medium"), ev.get("lora_name"), ev.get("extra_keys"), ev.get("group_idx")]
        if form == "map":
            names += ["ownership", "session_id"]
            values += [ev.get("ownership"), ev.get("session_id")]
    elif kind == "BlockRemoved":
        names = ["block_hashes", "medium", "group_idx"]
        values = [hashes, ev.get("medium"), ev.get("group_idx")]
    else:
        names, values = [], []
    if form == "map":
        out = {"type": kind}
        for n, v in zip(names, values):
            if v is not None or n == "parent_block_hash" and kind == "BlockStored":
                out[n] = v
        out.update(ev.get("extra_fields") or {})
        return out
    return [kind] + trim(values)


def encode_batch(msg):
    form = msg.get("form", "array")
    events = [encode_event(e, form, msg.get("bytes_hashes", False)) for e in msg.get("events", [])]
    batch = [float(msg.get("ts", time.time())), events]
    if not msg.get("omit_dp_rank", False) and form != "llmd-storage":
        batch.append(msg.get("dp_rank", 0))
    return msgpack.packb(batch, use_bin_type=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--mode", choices=["connect", "bind"], required=True)
    ap.add_argument("--replay-endpoint")
    ap.add_argument("--replay-legacy", action="store_true")
    ap.add_argument("--snapshot-endpoint")
    ap.add_argument("--epoch", default="e1")
    ap.add_argument("--buffer-steps", type=int, default=10000,
                    help="batches the replay buffer keeps (vLLM's buffer_steps, default 10000)")
    ap.add_argument("--no-wait", action="store_true", help="do not wait for a subscriber before reading stdin")
    args = ap.parse_args()

    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.SNDHWM, 100000)
    if args.mode == "bind":
        pub.bind(args.endpoint)
    else:
        pub.connect(args.endpoint)
    router = None
    if args.replay_endpoint:
        router = ctx.socket(zmq.ROUTER)
        router.bind(args.replay_endpoint)

    buffered = []  # (seq, topic, payload), like vLLM's replay buffer
    snap = None
    if args.snapshot_endpoint:
        snap = ctx.socket(zmq.ROUTER)
        snap.bind(args.snapshot_endpoint)
    mirror = {}  # SGLang's placement mirror: hash -> [parent, [hash]]
    state = {"next_seq": 0, "topic": b"", "rank": 0}

    def mirror_apply(events):
        for ev in events:
            kind = ev["type"]
            if kind == "BlockStored":
                parent = ev.get("parent_block_hash")
                parent = None if parent is None else sglang_hash(parent)
                for h in ev.get("block_hashes", []):
                    h = sglang_hash(h)
                    mirror[h] = [parent, [h]]
                    parent = h
            elif kind == "BlockRemoved":
                for h in ev.get("block_hashes", []):
                    mirror.pop(sglang_hash(h), None)
            else:
                mirror.clear()

    def serve_snapshot():
        while snap is not None and snap.poll(0):
            frames = snap.recv_multipart()
            if len(frames) != 3 or frames[1] != b"" or frames[2] != b"snapshot-v1":
                continue
            client = frames[0]
            barrier_seq = state["next_seq"]
            barrier_id = "cut-%d" % barrier_seq
            topic = state["topic"] + b"\x00sgl-kv-snapshot=" + barrier_id.encode()
            payload = msgpack.packb([time.time(), [], state["rank"]], use_bin_type=True)
            pub.send_multipart([topic, barrier_seq.to_bytes(8, "big"), payload])
            buffered.append((barrier_seq, topic, payload))
            state["next_seq"] = barrier_seq + 1
            records = list(mirror.values())
            header = [1, args.epoch, state["rank"], barrier_seq + 1, barrier_seq, barrier_id, len(records)]
            snap.send_multipart([client, b"", b"header", msgpack.packb(header, use_bin_type=True)])
            for i in range(0, len(records), 2):
                snap.send_multipart([client, b"", b"chunk", msgpack.packb(records[i:i + 2], use_bin_type=True)])
            snap.send_multipart([client, b"", b"end", b""])

    def serve_replay():
        while router is not None and router.poll(0):
            frames = router.recv_multipart()
            if len(frames) != 3:
                print("replay: ignoring %d-frame request" % len(frames), file=sys.stderr)
                continue
            client, _, start = frames
            start_seq = int.from_bytes(start, "big")
            for seq, topic, payload in buffered:
                if seq >= start_seq:
                    s8 = seq.to_bytes(8, "big")
                    if args.replay_legacy:
                        router.send_multipart([client, b"", s8, payload])
                    else:
                        router.send_multipart([client, b"", topic, s8, payload])
            if args.replay_legacy:
                router.send_multipart([client, b"", END_SEQ, b""])
            else:
                router.send_multipart([client, b"", b"", END_SEQ, b""])

    def wait_subscriber():
        # XPUB delivers a subscription as b"\x01<prefix>".
        while True:
            serve_replay()
            serve_snapshot()
            if pub.poll(10):
                sub = pub.recv()
                if sub[:1] == b"\x01":
                    return

    if not args.no_wait:
        wait_subscriber()
        print("ready", flush=True)

    lines = queue.Queue()

    def reader():
        for line in sys.stdin:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=reader, daemon=True).start()
    while True:
        serve_replay()
        serve_snapshot()
        try:
            line = lines.get(timeout=0.01)
        except queue.Empty:
            continue
        if line is None:
            break
        line = line.strip()
        if not line:
            continue
        msg = json.loads(line)
        if "sleep" in msg:
            end = time.time() + float(msg["sleep"])
            while time.time() < end:
                serve_replay()
                serve_snapshot()
                time.sleep(0.005)
            continue
        if "echo" in msg:
            print(msg["echo"], flush=True)
            continue
        if msg.get("wait_subscriber"):
            wait_subscriber()
            continue
        if "raw_frames" in msg:
            pub.send_multipart([bytes.fromhex(f) for f in msg["raw_frames"]])
            continue
        if msg.get("form") == "sglang":
            msg["events"] = expand_sglang(msg.get("events", []))
        elif msg.get("form") == "trtllm":
            msg["events"] = expand_trtllm(msg.get("events", []))
        topic = msg["topic"].encode()
        seq = int(msg["seq"])
        payload = encode_batch(msg)
        buffered.append((seq, topic, payload))
        del buffered[:-args.buffer_steps]
        state["next_seq"] = max(state["next_seq"], seq + 1)
        state["topic"] = topic.split(b"\x00sgl-kv-snapshot=")[0]
        state["rank"] = msg.get("dp_rank", 0) or 0
        if msg.get("form") == "sglang":
            mirror_apply(msg.get("events", []))
        if not msg.get("skip_live", False):
            pub.send_multipart([topic, seq.to_bytes(8, "big"), payload])

    pub.close(linger=5000)
    if router is not None:
        router.close(linger=1000)
    if snap is not None:
        snap.close(linger=1000)
    ctx.term()
    print("done", flush=True)


if __name__ == "__main__":
    main()
