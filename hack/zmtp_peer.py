#!/usr/bin/python3
"""zmtp_peer.py: real-libzmq peers (Debian python3-zmq) for the zmtp interop tests.

Usage: /usr/bin/python3 hack/zmtp_peer.py MODE [ENDPOINT]

  pub-connect ENDPOINT  an XPUB connects to ENDPOINT (our bound SUB)
  pub-bind              an XPUB binds tcp://127.0.0.1 on a free port, prints "port N"
  router-bind           a ROUTER binds tcp://127.0.0.1 on a free port, prints "port N"

Publishers print "sub <hex>" for the first subscription message libzmq hands
the XPUB (so the test sees how libzmq understood our SUBSCRIBE), then publish
what vLLM publishes, [topic, seq (8 bytes big-endian), payload]:
  seq 0..4 on "kv@pod-a@model" with payload(seq, 1000 + seq),
  between them a message on "other@pod-b" that a "kv@" subscriber must not get,
  seq 5 with a 10 MB payload(5, 10_000_000),
then print "sent".

The ROUTER prints "got <hex frame>,<hex frame>,..." for the first request
(routing id left out) and answers it like vLLM's replay socket:
[b"", topic, seq8, payload(seq, 100 + seq)] for seq 0..2, then seq 3 with
payload(3, 10_000_000), then the end marker [b"", b"", ff*8, b""]; then "sent".

  sub-connect ENDPOINT N  a SUB subscribed to "kv@" connects to ENDPOINT (our bound PUB)
  sub-bind N              a SUB subscribed to "kv@" binds tcp://127.0.0.1 on a free port,
                          prints "port N"
  dealer-connect ENDPOINT a DEALER connects to ENDPOINT (our bound ROUTER)

Subscribers print "got <topic hex> <frame count> <sha256 of the last frame>" for each of
the first N messages they receive, then "done".

The DEALER sends vLLM's replay request [b"", seq8(42)], then prints "got ..." (as above,
with the topic being the first frame) for every reply until one whose last frame is empty,
then "done".

payload(seq, n) is bytes 0..255 repeated, rotated left by seq, cut to n bytes.
Every mode then waits for stdin to close, so the test decides when it ends.
"""
import hashlib
import sys

import zmq

TOPIC = b"kv@pod-a@model"


def payload(seq, n):
    block = bytes(range(256))
    block = block[seq % 256:] + block[:seq % 256]
    return (block * (n // 256 + 1))[:n]


def seq8(seq):
    return seq.to_bytes(8, "big")


def publish(sock):
    sub = sock.recv()
    print("sub", sub.hex(), flush=True)
    for seq in range(5):
        sock.send_multipart([b"other@pod-b", seq8(seq), b"not for kv@"])
        sock.send_multipart([TOPIC, seq8(seq), payload(seq, 1000 + seq)])
    sock.send_multipart([TOPIC, seq8(5), payload(5, 10_000_000)])
    print("sent", flush=True)


def serve_replay(sock):
    frames = sock.recv_multipart()
    ident, req = frames[0], frames[1:]
    print("got", ",".join(f.hex() for f in req), flush=True)
    for seq in range(3):
        sock.send_multipart([ident, b"", TOPIC, seq8(seq), payload(seq, 100 + seq)])
    sock.send_multipart([ident, b"", TOPIC, seq8(3), payload(3, 10_000_000)])
    sock.send_multipart([ident, b"", b"", b"\xff" * 8, b""])
    print("sent", flush=True)


def report(frames):
    print("got", frames[0].hex(), len(frames), hashlib.sha256(frames[-1]).hexdigest(), flush=True)


def receive(sock, n):
    for _ in range(n):
        report(sock.recv_multipart())
    print("done", flush=True)


def main():
    mode = sys.argv[1]
    ctx = zmq.Context()
    if mode == "pub-connect":
        sock = ctx.socket(zmq.XPUB)
        sock.connect(sys.argv[2])
        publish(sock)
    elif mode == "pub-bind":
        sock = ctx.socket(zmq.XPUB)
        print("port", sock.bind_to_random_port("tcp://127.0.0.1"), flush=True)
        publish(sock)
    elif mode == "router-bind":
        sock = ctx.socket(zmq.ROUTER)
        print("port", sock.bind_to_random_port("tcp://127.0.0.1"), flush=True)
        serve_replay(sock)
    elif mode == "sub-connect":
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"kv@")
        sock.connect(sys.argv[2])
        receive(sock, int(sys.argv[3]))
    elif mode == "sub-bind":
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"kv@")
        print("port", sock.bind_to_random_port("tcp://127.0.0.1"), flush=True)
        receive(sock, int(sys.argv[2]))
    elif mode == "dealer-connect":
        sock = ctx.socket(zmq.DEALER)
        sock.connect(sys.argv[2])
        sock.send_multipart([b"", seq8(42)])
        while True:
            frames = sock.recv_multipart()
            report(frames)
            if not frames[-1]:
                break
        print("done", flush=True)
    else:
        sys.exit("unknown mode " + mode)
    sys.stdin.read()
    sock.close(linger=0)
    ctx.term()


if __name__ == "__main__":
    main()
