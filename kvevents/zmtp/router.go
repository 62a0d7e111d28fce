package zmtp

import (
	"context"
	"fmt"
	"net"
)

// Router is a bound ROUTER socket: Recv returns each message with the
// sending peer's routing id as first frame; Send takes the id first and
// writes the rest to that peer. vLLM's replay socket is one; tests stand in
// for it with this.
type Router struct{ sock *socket }

// ListenRouter binds endpoint; DEALER/REQ/ROUTER peers connect to it.
func ListenRouter(endpoint string, opts Options) (*Router, error) {
	s := newSocket("ROUTER", opts, nil)
	if err := s.listen(endpoint); err != nil {
		return nil, err
	}
	return &Router{s}, nil
}

// Recv returns the next message, [routing id, frames...]. After Close it
// returns ErrClosed.
func (r *Router) Recv(ctx context.Context) (Message, error) { return r.sock.recv(ctx) }

// Send writes frames[1:] to the peer whose routing id is frames[0]. Unlike
// libzmq's default it reports an unknown id instead of dropping silently.
func (r *Router) Send(ctx context.Context, frames ...[]byte) error {
	if len(frames) < 2 {
		return fmt.Errorf("zmtp: ROUTER send needs a routing id and at least one frame")
	}
	r.sock.mu.Lock()
	c := r.sock.routes[string(frames[0])]
	r.sock.mu.Unlock()
	if c == nil {
		return fmt.Errorf("zmtp: no peer with routing id %x", frames[0])
	}
	return c.writeMessage(ctx, frames[1:])
}

// Addr is the bound address.
func (r *Router) Addr() net.Addr { return r.sock.ln.Addr() }

// Stats reads the socket's counters.
func (r *Router) Stats() Stats { return r.sock.counters.Read() }

// Close ends every connection and waits for their goroutines.
func (r *Router) Close() error {
	r.sock.close()
	return nil
}
