#!/usr/bin/python3
"""zmtp_fuzz_seeds.py: writes the seed corpus of zmtp's fuzz targets.

Run from the repository root: /usr/bin/python3 hack/zmtp_fuzz_seeds.py
It (re)creates kvevents/zmtp/testdata/fuzz/{FuzzGreeting,FuzzCommand,FuzzStream}/ in
Go's corpus format. The seeds follow ZMTP 3.0/3.1 (rfc.zeromq.org 23 and 37):
well-formed exchanges as libzmq sends them, and the malformed frames that
crashed a pure-Go ZeroMQ implementation (frame sizes of 2^50 and 2^62, READY
metadata cut short).
"""
import os
import shutil
import struct


def greeting(major=3, minor=1, mech=b"NULL"):
    return b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([major, minor]) + mech.ljust(20, b"\x00") + b"\x00" * 32


def command(body):
    if len(body) > 255:
        return b"\x06" + struct.pack(">Q", len(body)) + body
    return b"\x04" + bytes([len(body)]) + body


def prop(name, value):
    return bytes([len(name)]) + name + struct.pack(">I", len(value)) + value


def ready(socket_type=b"PUB", extra=b""):
    return command(b"\x05READY" + prop(b"Socket-Type", socket_type) + extra)


def long_header(flags, size):
    return bytes([flags | 0x02]) + struct.pack(">Q", size)


def message(*frames):
    out = b""
    for i, f in enumerate(frames):
        more = 0x01 if i < len(frames) - 1 else 0
        out += (long_header(more, len(f)) if len(f) > 255 else bytes([more, len(f)])) + f
    return out


VLLM = message(b"kv@pod-a@model", struct.pack(">Q", 7), b"\x93\xcb" + b"\x00" * 40)

SEEDS = {
    "FuzzGreeting": {
        "zmtp31": greeting(),
        "zmtp30": greeting(minor=0),
        "zmtp40": greeting(major=4, minor=0),
        "zmtp20": greeting(major=2),
        "curve": greeting(mech=b"CURVE"),
        "short": greeting()[:30],
    },
    "FuzzCommand": {
        "ready_pub": b"\x05READY" + prop(b"Socket-Type", b"PUB"),
        "ready_router_identity": b"\x05READY" + prop(b"Socket-Type", b"ROUTER") + prop(b"Identity", b""),
        "ready_truncated": b"\x05READY\x0bSocket-Type\x00\x00\x00\x03PU",
        "ready_value_2p32": b"\x05READY\x0bSocket-Type\xff\xff\xff\xffPUB",
        "ready_name_past_end": b"\x05READY\xffSocket-Type",
        "ping": b"\x04PING\x00\x0aabc",
        "ping_long_context": b"\x04PING\x00\x0a" + b"x" * 17,
        "error": b"\x05ERROR\x04nope",
        "error_truncated": b"\x05ERROR\x40no",
        "subscribe": b"\x09SUBSCRIBEkv@",
        "name_past_end": b"\x20READY",
    },
    "FuzzStream": {
        "vllm_message": greeting() + ready() + VLLM,
        "zmtp30_message": greeting(minor=0) + ready() + VLLM,
        "xpub_two_messages": greeting() + ready(b"XPUB") + VLLM + VLLM,
        "ping_mid_message": greeting() + ready() + b"\x01\x03kv@" + command(b"\x04PING\x00\x0a") + b"\x00\x01x",
        "long_frame": greeting() + ready() + message(b"kv@a", b"y" * 300),
        "cmd_2p50_before_ready": greeting() + long_header(0x04, 1 << 50),
        "cmd_2p62_before_ready": greeting() + long_header(0x04, 1 << 62),
        "msg_2p50_after_ready": greeting() + ready() + long_header(0, 1 << 50),
        "msg_2p62_after_ready": greeting() + ready() + long_header(0, 1 << 62),
        "ready_truncated": greeting() + command(b"\x05READY\x0bSocket-Type\x00\x00\x00\x03PU"),
        "ready_value_2p32": greeting() + command(b"\x05READY\x0bSocket-Type\xff\xff\xff\xffPUB"),
        "too_many_frames": greeting() + ready() + b"\x01\x00" * 6 + b"\x00\x00",
        "reserved_flags": greeting() + ready() + b"\x80\x00",
        "error_command": greeting() + command(b"\x05ERROR\x04nope"),
        "ready_with_metadata": greeting() + ready(extra=prop(b"X-Pod", b"a" * 300)) + VLLM,
    },
}


def go_literal(b):
    return "".join("\\x%02x" % c for c in b)


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kvevents", "zmtp", "testdata", "fuzz")
    for target, seeds in SEEDS.items():
        d = os.path.join(root, target)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        for name, data in seeds.items():
            with open(os.path.join(d, name), "w") as f:
                f.write('go test fuzz v1\n[]byte("%s")\n' % go_literal(data))


if __name__ == "__main__":
    main()
