// Package zmtp is a small ZeroMQ transport (ZMTP 3.0 and 3.1 over TCP and
// IPC, NULL security) with the socket types kvindexd needs: SUB, bound
// (engines' PUB sockets connect to it) or dialled (to one engine's PUB),
// and DEALER (to vLLM's replay ROUTER); plus PUB and ROUTER for the test
// publishers, the demo and the load generator. It interoperates with libzmq
// 4.x, which the engines publish through (pyzmq), and is tested against it.
//
// # Why our own transport
//
// The KV-event port is reachable by anything that can reach the daemon, so
// its parser is an attack surface. The pure-Go library used before
// allocated whatever size a frame header declared (a 2^50-byte frame was a
// "makeslice" panic), sliced READY metadata without bounds checks, and ran
// handshakes inline in its accept loop without a deadline (one silent
// connection stalled every later engine). The panics happened on the
// library's own goroutines, where no recover of ours could reach. The
// choices were:
//
//   - a guarding wrapper around that library: it could not stop panics
//     raised on goroutines it does not own, and still inherits the
//     library's allocation and scheduling behaviour;
//   - libzmq through cgo, with ZMQ_MAXMSGSIZE and ZMQ_HANDSHAKE_IVL: sound,
//     but it ends the single `go build` (a C toolchain and libzmq headers
//     on every build machine, static linking for the image);
//   - this package: about 1,500 lines of Go where every length is
//     checked against a cap before anything is allocated, buffers grow only
//     as bytes actually arrive, every handshake has a deadline on its own
//     goroutine, and a per-connection failure closes only that connection.
//
// We took the last: one `go build`, no third-party goroutine that can
// panic, and allocation bounded by Options (docs/security.md, "Transport
// limits", lists every cap and default).
//
// # What a peer can and cannot do
//
// A peer can send well-formed messages up to Options.MaxMessageSize and
// Options.MaxFrames; anything else (a frame larger than what is left of the
// cap, a malformed greeting or command, a wrong socket type, a handshake
// slower than Options.HandshakeTimeout) closes its connection and
// increments one of the Stats counters. A bound socket holds at most
// Options.MaxConns connections (evicting a peer idle past
// Options.EvictIdleAfter to admit a new one, and keeping the last eighth
// for hosts that have delivered a message); together they buffer at most
// Options.MaxBufferedBytes, of which messages over SmallMessageBytes share
// three quarters, and a message has Options.MessageTimeout from its first
// byte to arrive. A connection that ends mid-message reports ErrMessageLost
// to OnDisconnect. A subscriber can make a Pub hold at most 1024
// subscriptions of at most 4 KiB each. A recovered panic (which would be a bug here)
// closes the connection and is counted in Stats.Panics.
//
// NULL security authenticates nobody: protect the port with network
// policy, or prefer dialling the engines (per-pod topology) over binding.
//
// # Not implemented
//
// CURVE and PLAIN security, ZMTP 1.0/2.0 peers, the other socket types
// (REQ, REP, PUSH, PULL, PAIR, XPUB, XSUB), automatic reconnection (callers redial, with their own
// backoff and signals), and the peer's PING TTL (our own heartbeat settings
// apply instead).
package zmtp
