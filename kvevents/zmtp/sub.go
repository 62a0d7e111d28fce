package zmtp

import (
	"context"
	"net"
)

// Sub is a SUB socket: it receives the messages of PUB/XPUB peers whose
// first frame starts with one of its topic prefixes. A Sub made by
// ListenSub accepts any number of publishers (up to MaxConns); one made by
// DialSub has exactly one and reports its end through Recv (redialling is
// the caller's choice).
type Sub struct{ sock *socket }

// ListenSub binds endpoint (tcp://host:port, tcp://*:port, ipc://path) and
// subscribes every publisher that connects to topics ("" = everything; no
// topic = nothing). A connection that fails (handshake, limits, protocol)
// is closed and counted; the others and the socket go on.
func ListenSub(endpoint string, opts Options, topics ...string) (*Sub, error) {
	s := newSocket("SUB", opts, topics)
	if err := s.listen(endpoint); err != nil {
		return nil, err
	}
	return &Sub{s}, nil
}

// DialSub connects to a publisher's endpoint, completes the handshake and
// subscribes to topics before returning. ctx bounds the connect and the
// handshake (as does Options.HandshakeTimeout), not the connection's life.
func DialSub(ctx context.Context, endpoint string, opts Options, topics ...string) (*Sub, error) {
	s, _, err := dial(ctx, endpoint, "SUB", opts, topics)
	if err != nil {
		return nil, err
	}
	return &Sub{s}, nil
}

// Recv returns the next message. For a dialled Sub, once the connection has
// ended and its queued messages are read, Recv returns why it ended. After
// Close it returns ErrClosed.
func (s *Sub) Recv(ctx context.Context) (Message, error) { return s.sock.recv(ctx) }

// Addr is the bound address (the real port when bound to port 0), or nil
// for a dialled Sub.
func (s *Sub) Addr() net.Addr {
	if s.sock.ln == nil {
		return nil
	}
	return s.sock.ln.Addr()
}

// MarkUseful records that m, received from this Sub, was of use (with
// Options.UsefulMarks): its connection is not idle, and its host is known
// from now on. It may be called on any goroutine, also after the
// connection ended.
func (s *Sub) MarkUseful(m Message) {
	if m.from != nil && m.from.bound {
		s.sock.delivered(m.from)
	}
}

// Stats reads the socket's counters (shared ones when Options.Counters was
// set).
func (s *Sub) Stats() Stats { return s.sock.counters.Read() }

// Close ends the listener and every connection and waits for their
// goroutines. It always returns nil; calling it again does nothing.
func (s *Sub) Close() error {
	s.sock.close()
	return nil
}
