// Package enginepub plays the engine side of the KV-event wire for tests,
// the demo and the load generator: a pure-Go ZeroMQ PUB socket with the
// engines' framing and encoders of vLLM's and SGLang's msgpack batches. It is
// scaffolding, not API: the daemon only ever decodes (package kvevents), and
// interop with real engines is pinned by tests against hack/kvpublisher.py
// (libzmq and the reference msgpack), not by these encoders.
package enginepub

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/kvindex/kvindex/kvevents/zmtp"
)

// Publisher is a pure-Go ZeroMQ PUB socket that speaks the engines' framing
// [topic, seq(8B BE), payload]. Tests and the demo use it; interop with real
// libzmq is covered by hack/kvpublisher.py.
type Publisher struct {
	sock *zmtp.Pub
	addr string
}

// NewPublisher binds (bind=true) or connects endpoint. A bound "tcp://host:0"
// picks a free port; Addr reports it. Connecting completes the handshake (or
// fails) within zmtp.DefaultHandshakeTimeout.
func NewPublisher(endpoint string, bind bool) (*Publisher, error) {
	var sock *zmtp.Pub
	var err error
	if bind {
		sock, err = zmtp.ListenPub(endpoint, zmtp.Options{})
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), zmtp.DefaultHandshakeTimeout)
		sock, err = zmtp.DialPub(ctx, endpoint, zmtp.Options{})
		cancel()
	}
	if err != nil {
		return nil, fmt.Errorf("enginepub: publisher %s: %w", endpoint, err)
	}
	p := &Publisher{sock: sock, addr: endpoint}
	if bind {
		p.addr = dialable(endpoint, sock.Addr())
	}
	return p, nil
}

// dialable turns a bound tcp endpoint into one a local peer can connect to:
// the listener's real address (port 0 resolved) with a wildcard host
// (tcp://*:N, 0.0.0.0, ::) replaced by 127.0.0.1. Other transports are
// returned as they are. (kvevents resolves its bind address the same way; a
// shared helper would make production code import test scaffolding.)
func dialable(endpoint string, a net.Addr) string {
	if !strings.HasPrefix(endpoint, "tcp://") || a == nil {
		return endpoint
	}
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return endpoint
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "tcp://" + net.JoinHostPort(host, port)
}

// Addr is the endpoint (for a bound socket: with the port actually chosen).
func (p *Publisher) Addr() string { return p.addr }

// Publish sends one engine message.
func (p *Publisher) Publish(topic string, seq uint64, payload []byte) error {
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	return p.SendFrames([]byte(topic), s[:], payload)
}

// SendFrames sends an arbitrary multipart message (malformed-input tests).
func (p *Publisher) SendFrames(frames ...[]byte) error {
	return p.sock.Send(context.Background(), frames...)
}

// WaitSubscribed blocks until a subscriber whose filter matches topic is
// attached (ZeroMQ drops what a PUB sends before that: the slow joiner).
func (p *Publisher) WaitSubscribed(ctx context.Context, topic string) error {
	for {
		for _, sub := range p.sock.Topics() {
			if strings.HasPrefix(topic, sub) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Close closes the socket.
func (p *Publisher) Close() {
	p.sock.Close()
}
