package zmtp

import (
	"context"
	"net"
	"slices"
)

// Pub is a PUB socket: each message goes to every connected SUB/XSUB peer
// subscribed to a prefix of its first frame. Tests, the demo and the load
// generator publish through it; kvindexd only subscribes.
type Pub struct{ sock *socket }

// ListenPub binds endpoint; subscribers connect to it.
func ListenPub(endpoint string, opts Options) (*Pub, error) {
	s := newSocket("PUB", opts, nil)
	if err := s.listen(endpoint); err != nil {
		return nil, err
	}
	return &Pub{s}, nil
}

// DialPub connects to a subscriber's endpoint and completes the handshake
// before returning.
func DialPub(ctx context.Context, endpoint string, opts Options) (*Pub, error) {
	s, _, err := dial(ctx, endpoint, "PUB", opts, nil)
	if err != nil {
		return nil, err
	}
	return &Pub{s}, nil
}

// Send writes frames to every subscribed peer, one after the other. Like
// ZeroMQ's PUB it does not fail for want of subscribers; unlike it, it
// waits for a slow peer (up to WriteTimeout or ctx) and then drops that
// peer's connection rather than the message alone.
func (p *Pub) Send(ctx context.Context, frames ...[]byte) error {
	if len(frames) == 0 {
		return errNoFrames
	}
	p.sock.mu.Lock()
	var to []*conn
	for c := range p.sock.conns {
		if c.ready.Load() && c.wants(frames[0]) {
			to = append(to, c)
		}
	}
	p.sock.mu.Unlock()
	for _, c := range to {
		_ = c.writeMessage(ctx, frames) // a failed peer is closed and counted
	}
	if p.sock.closed() {
		return ErrClosed
	}
	return ctx.Err()
}

// Topics lists the prefixes connected peers are subscribed to.
func (p *Pub) Topics() []string {
	p.sock.mu.Lock()
	defer p.sock.mu.Unlock()
	var out []string
	for c := range p.sock.conns {
		if !c.ready.Load() {
			continue
		}
		c.subsMu.Lock()
		for t := range c.subs {
			out = append(out, t)
		}
		c.subsMu.Unlock()
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Addr is the bound address, or nil for a dialled Pub.
func (p *Pub) Addr() net.Addr {
	if p.sock.ln == nil {
		return nil
	}
	return p.sock.ln.Addr()
}

// Stats reads the socket's counters.
func (p *Pub) Stats() Stats { return p.sock.counters.Read() }

// Close ends every connection and waits for their goroutines.
func (p *Pub) Close() error {
	p.sock.close()
	return nil
}
