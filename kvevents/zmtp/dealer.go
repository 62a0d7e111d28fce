package zmtp

import "context"

// Dealer is a DEALER socket connected to one ROUTER, DEALER or REP peer:
// what a client of vLLM's replay ROUTER needs. Sends and receives are
// independent; a ROUTER peer sees Dealer's frames behind its routing id.
type Dealer struct {
	sock *socket
	conn *conn
}

// DialDealer connects to endpoint and completes the handshake before
// returning; ctx bounds the connect and the handshake.
func DialDealer(ctx context.Context, endpoint string, opts Options) (*Dealer, error) {
	s, c, err := dial(ctx, endpoint, "DEALER", opts, nil)
	if err != nil {
		return nil, err
	}
	return &Dealer{sock: s, conn: c}, nil
}

// Send writes frames as one multipart message. It returns when the bytes
// are with the kernel, ctx ends, or WriteTimeout passes; a failed send ends
// the connection (its frames may be half written).
func (d *Dealer) Send(ctx context.Context, frames ...[]byte) error {
	return d.conn.writeMessage(ctx, frames)
}

// Recv returns the next message; once the connection has ended and queued
// messages are read, why it ended; after Close, ErrClosed.
func (d *Dealer) Recv(ctx context.Context) (Message, error) { return d.sock.recv(ctx) }

// Stats reads the socket's counters.
func (d *Dealer) Stats() Stats { return d.sock.counters.Read() }

// Close ends the connection and waits for its goroutines. It always returns
// nil; calling it again does nothing.
func (d *Dealer) Close() error {
	d.sock.close()
	return nil
}
