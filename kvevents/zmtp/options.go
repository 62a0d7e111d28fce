package zmtp

import (
	"math"
	"sync/atomic"
	"time"
)

// Defaults for the zero Options. Each is documented in docs/security.md
// section "Security and limits".
const (
	DefaultMaxMessageSize   = 64 << 20
	DefaultMaxFrames        = 64
	DefaultHandshakeTimeout = 5 * time.Second
	DefaultWriteTimeout     = 10 * time.Second
	DefaultMaxConns         = 1024
	DefaultRecvQueue        = 256
	// DefaultMaxBufferedBytes is the default of Options.MaxBufferedBytes:
	// four messages of the default maximum size.
	DefaultMaxBufferedBytes = 4 * DefaultMaxMessageSize
	// DefaultMessageTimeout is the default of Options.MessageTimeout: a
	// 64 MiB message needs 6.7 MB/s to make it.
	DefaultMessageTimeout = 10 * time.Second
	// DefaultEvictIdleAfter is the default of Options.EvictIdleAfter.
	DefaultEvictIdleAfter = 30 * time.Second
	// SmallMessageBytes is the size up to which a message being read may
	// draw on the whole buffer budget; a larger one draws only on the
	// part of it large messages share (see Options.MaxBufferedBytes).
	SmallMessageBytes = 1 << 20
)

// Options bound what a peer can make a socket do. The zero value means
// every default.
type Options struct {
	// MaxMessageSize caps the sum of a message's frame sizes (and so every
	// single frame). A frame whose header declares more than what is left
	// of the cap closes the connection before anything is allocated.
	// Default 64 MiB.
	MaxMessageSize int64
	// MaxFrames caps the frames in one message. Default 64.
	MaxFrames int
	// MaxBufferedBytes caps the bytes held by all connections of a socket
	// together: messages being read plus messages queued for Recv. A
	// connection whose next read would exceed it is closed. Default 256 MiB;
	// raised to MaxMessageSize if lower.
	//
	// A message larger than SmallMessageBytes may grow only while the
	// socket's buffers stay within three quarters of the budget (never less
	// than MaxMessageSize): a few peers declaring huge frames cannot take
	// the last quarter, which keeps ordinary messages (every engine's KV
	// events) flowing.
	MaxBufferedBytes int64
	// MessageTimeout bounds how long a message may take to arrive once its
	// first byte has (a deadline, not a per-read timeout): a peer that
	// starts a large frame and goes quiet gives its share of the budget
	// back. Default 10 s.
	MessageTimeout time.Duration
	// HandshakeTimeout bounds the whole greeting and READY exchange of a
	// connection (a deadline, not a per-read timeout: dribbling bytes does
	// not extend it). Default 5 s.
	HandshakeTimeout time.Duration
	// WriteTimeout bounds each write (subscriptions, PONG, PING, a Send
	// without an earlier context deadline). Default 10 s.
	WriteTimeout time.Duration
	// HeartbeatInterval, when positive, sends a PING that often on ZMTP 3.1
	// connections and closes a connection that sends nothing (no frame, no
	// PONG) for HeartbeatTimeout. ZMTP 3.0 peers have no PING and are
	// exempt. Default 0: off (the kernel's TCP keepalive still runs).
	HeartbeatInterval time.Duration
	// HeartbeatTimeout defaults to three HeartbeatIntervals.
	HeartbeatTimeout time.Duration
	// MaxConns caps a bound socket's connections, handshaking or not.
	// When they are all taken, a new connection first evicts the
	// handshaked connection idle the longest, if one delivered nothing for
	// EvictIdleAfter and is not in the middle of a message; else it is
	// closed at once. The last MaxConns/8 slots are kept for hosts that
	// have delivered a message before (known engines): a host that never
	// did cannot take them. Default 1024.
	MaxConns int
	// EvictIdleAfter is how long a handshaked connection of a full bound
	// socket may deliver nothing before a new connection may take its
	// slot. An evicted engine reconnects (libzmq does by itself) and loses
	// nothing: it had nothing in flight. Default 30 s.
	EvictIdleAfter time.Duration
	// UsefulMarks makes a bound Sub's consumer the judge of which
	// messages count as delivered: only those passed to Sub.MarkUseful
	// make a connection busy (not evictable for EvictIdleAfter) and its
	// host known (allowed the reserved slots). A peer that only sends
	// messages the consumer has no use for (empty batches every few
	// seconds) is then as evictable as a silent one, and never earns a
	// reserved slot. Default false: every message counts.
	UsefulMarks bool
	// RecvQueue is how many received messages wait for Recv before the
	// connections stop reading (TCP then pushes back on the peers).
	// Default 256.
	RecvQueue int
	// Counters, when set, receives this socket's counts, so several
	// sockets (a redialled connection, one per endpoint) can share one set.
	// Default: a set of the socket's own.
	Counters *Counters
	// OnDisconnect, when set, is called once for every connection that
	// ends, with the peer's address and why (nil after Close). It runs on
	// the connection's goroutine and must not block.
	OnDisconnect func(peer string, err error)
}

func (o Options) withDefaults() Options {
	if o.MaxMessageSize <= 0 {
		o.MaxMessageSize = DefaultMaxMessageSize
	}
	o.MaxMessageSize = min(o.MaxMessageSize, math.MaxInt) // sizes become ints
	if o.MaxFrames <= 0 {
		o.MaxFrames = DefaultMaxFrames
	}
	if o.MaxBufferedBytes <= 0 {
		o.MaxBufferedBytes = DefaultMaxBufferedBytes
	}
	o.MaxBufferedBytes = max(o.MaxBufferedBytes, o.MaxMessageSize)
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if o.MessageTimeout <= 0 {
		o.MessageTimeout = DefaultMessageTimeout
	}
	if o.EvictIdleAfter <= 0 {
		o.EvictIdleAfter = DefaultEvictIdleAfter
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.HeartbeatInterval > 0 && o.HeartbeatTimeout <= 0 {
		o.HeartbeatTimeout = 3 * o.HeartbeatInterval
	}
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.RecvQueue <= 0 {
		o.RecvQueue = DefaultRecvQueue
	}
	return o
}

// Stats are a socket's counters since it was created. Every field but Open
// only grows, so each maps onto a Prometheus counter.
type Stats struct {
	Accepted          uint64 // connections accepted by a bound socket
	Rejected          uint64 // connections closed at once: MaxConns reached (or the slots left are kept for known hosts)
	Evicted           uint64 // idle connections closed to make room for a new one (EvictIdleAfter)
	MessageTimeouts   uint64 // connections closed: a message took longer than MessageTimeout
	MessagesLost      uint64 // connections that ended in the middle of a message (ErrMessageLost), whatever the cause
	Handshakes        uint64 // handshakes completed
	HandshakeTimeouts uint64 // connections closed: HandshakeTimeout passed
	HeartbeatTimeouts uint64 // connections closed: HeartbeatTimeout passed
	Oversized         uint64 // connections closed: MaxMessageSize, MaxFrames or command size exceeded
	BudgetExceeded    uint64 // connections closed: MaxBufferedBytes reached
	ProtocolErrors    uint64 // connections closed: malformed greeting, command or frame, wrong socket type
	PeerErrors        uint64 // connections the peer ended with an ERROR command
	Panics            uint64 // connections closed by a recovered panic (a bug: report it)
	Messages          uint64 // messages delivered to Recv
	Filtered          uint64 // messages dropped: topic matches no subscription
	Open              int64  // connections open now
}

// Counters accumulate Stats; share one across sockets through
// Options.Counters. The zero value is ready to use.
type Counters struct {
	accepted, rejected, handshakes, handshakeTimeouts, heartbeatTimeouts atomic.Uint64
	oversized, budget, protocol, peerErrors, panics, messages, filtered  atomic.Uint64
	evicted, messageTimeouts, messagesLost                               atomic.Uint64
	open                                                                 atomic.Int64
}

// Read reads every counter.
func (c *Counters) Read() Stats {
	return Stats{
		Accepted:          c.accepted.Load(),
		Rejected:          c.rejected.Load(),
		Evicted:           c.evicted.Load(),
		MessageTimeouts:   c.messageTimeouts.Load(),
		MessagesLost:      c.messagesLost.Load(),
		Handshakes:        c.handshakes.Load(),
		HandshakeTimeouts: c.handshakeTimeouts.Load(),
		HeartbeatTimeouts: c.heartbeatTimeouts.Load(),
		Oversized:         c.oversized.Load(),
		BudgetExceeded:    c.budget.Load(),
		ProtocolErrors:    c.protocol.Load(),
		PeerErrors:        c.peerErrors.Load(),
		Panics:            c.panics.Load(),
		Messages:          c.messages.Load(),
		Filtered:          c.filtered.Load(),
		Open:              c.open.Load(),
	}
}

// budget is a socket-wide allowance of buffered bytes.
type budget struct {
	used  atomic.Int64
	limit int64
	// large is what the budget may reach when the reservation is for a
	// message larger than SmallMessageBytes: the rest is kept for small
	// messages, so peers holding large partial messages cannot starve the
	// others.
	large int64
}

func newBudget(o Options) budget {
	return budget{limit: o.MaxBufferedBytes,
		large: min(o.MaxBufferedBytes, max(o.MaxBufferedBytes-o.MaxBufferedBytes/4, o.MaxMessageSize))}
}

// take reserves n bytes for a message that then holds total bytes, or
// reports false without reserving.
func (b *budget) take(n, total int64) bool {
	limit := b.limit
	if total > SmallMessageBytes {
		limit = b.large
	}
	for {
		u := b.used.Load()
		if u+n > limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

func (b *budget) give(n int64) { b.used.Add(-n) }
